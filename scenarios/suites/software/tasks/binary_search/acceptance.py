"""Acceptance tests of the binary_search task (hidden from the company)."""

from solution import binary_search


def test_found():
    assert binary_search([1, 3, 5, 7, 9], 7) == 3
    assert binary_search([1, 3, 5, 7, 9], 1) == 0


def test_absent():
    assert binary_search([1, 3, 5], 4) == -1
    assert binary_search([], 4) == -1
