"""Acceptance tests of the word_count task (hidden from the company)."""

from solution import count_words


def test_words():
    assert count_words("the quick brown fox") == 4


def test_blank():
    assert count_words("") == 0
    assert count_words("   \n\t ") == 0


def test_many_spaces():
    assert count_words("  a   b\nc ") == 3
