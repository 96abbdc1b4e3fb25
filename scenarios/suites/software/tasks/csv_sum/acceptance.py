"""Acceptance tests of the csv_sum task (hidden from the company)."""

from solution import column_sums


def test_sums():
    assert column_sums("a,b\n1,2\n3,4.5\n") == {"a": 4.0, "b": 6.5}


def test_header_only():
    assert column_sums("x,y\n") == {"x": 0.0, "y": 0.0}
