"""Acceptance tests of the matrix_transpose task (hidden from the company)."""

from solution import transpose


def test_rectangle():
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_empty():
    assert transpose([]) == []
