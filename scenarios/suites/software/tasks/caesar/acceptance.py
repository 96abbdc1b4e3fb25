"""Acceptance tests of the caesar task (hidden from the company)."""

from solution import caesar


def test_shift():
    assert caesar("abc xyz", 3) == "def abc"


def test_case_and_punctuation():
    assert caesar("Hello, World!", 1) == "Ifmmp, Xpsme!"


def test_back():
    assert caesar(caesar("Secret", 11), -11) == "Secret"
