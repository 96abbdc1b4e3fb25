"""Acceptance tests of the primes task (hidden from the company)."""

from solution import primes_up_to


def test_small():
    assert primes_up_to(20) == [2, 3, 5, 7, 11, 13, 17, 19]


def test_edges():
    assert primes_up_to(1) == []
    assert primes_up_to(2) == [2]
