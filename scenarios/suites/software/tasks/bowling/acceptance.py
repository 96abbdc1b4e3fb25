"""Acceptance tests of the bowling task (hidden from the company)."""

from solution import bowling_score


def test_gutter_and_all_ones():
    assert bowling_score([0] * 20) == 0
    assert bowling_score([1] * 20) == 20


def test_spare_strike_perfect():
    assert bowling_score([5, 5, 3] + [0] * 17) == 16
    assert bowling_score([10, 3, 4] + [0] * 16) == 24
    assert bowling_score([10] * 12) == 300
