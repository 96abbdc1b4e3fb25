"""Acceptance tests of the interval_merge task (hidden from the company)."""

from solution import merge_intervals


def test_merge():
    assert merge_intervals([[1, 3], [2, 6], [8, 10], [15, 18]]) == [[1, 6], [8, 10], [15, 18]]


def test_touching_and_unsorted():
    assert merge_intervals([[4, 5], [1, 4]]) == [[1, 5]]
    assert merge_intervals([]) == []
