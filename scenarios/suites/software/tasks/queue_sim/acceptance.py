"""Acceptance tests of the queue_sim task (hidden from the company)."""

from solution import checkout_times


def test_queue():
    assert checkout_times([0, 1, 10], 3) == [3, 6, 13]


def test_none():
    assert checkout_times([], 5) == []
