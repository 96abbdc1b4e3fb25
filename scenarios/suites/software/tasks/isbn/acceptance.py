"""Acceptance tests of the isbn task (hidden from the company)."""

from solution import valid_isbn10


def test_valid():
    assert valid_isbn10("3-598-21508-8")
    assert valid_isbn10("3-598-21507-X")


def test_invalid():
    assert not valid_isbn10("3-598-21508-9")
    assert not valid_isbn10("3-598-2K507-0")
