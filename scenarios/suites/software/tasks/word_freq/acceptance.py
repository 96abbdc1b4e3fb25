"""Acceptance tests of the word_freq task (hidden from the company)."""

from solution import top_words


def test_top():
    assert top_words("b a b c a b", 2) == [("b", 3), ("a", 2)]


def test_ties_and_case():
    assert top_words("Dog cat dog CAT bird", 3) == [("cat", 2), ("dog", 2), ("bird", 1)]
