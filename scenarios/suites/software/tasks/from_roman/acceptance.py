"""Acceptance tests of the from_roman task (hidden from the company)."""

from solution import from_roman


def test_values():
    assert from_roman("XLII") == 42
    assert from_roman("MCMXCIV") == 1994


def test_single():
    assert from_roman("I") == 1
