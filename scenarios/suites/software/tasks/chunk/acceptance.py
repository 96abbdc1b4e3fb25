"""Acceptance tests of the chunk task (hidden from the company)."""

from solution import chunk


def test_chunks():
    assert chunk([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    assert chunk([], 3) == []


def test_exact():
    assert chunk([1, 2, 3], 3) == [[1, 2, 3]]
