"""Acceptance tests of the run_length_of_ones task (hidden from the company)."""

from solution import longest_run


def test_runs():
    assert longest_run("110111010") == 3
    assert longest_run("0000") == 0
    assert longest_run("1") == 1
