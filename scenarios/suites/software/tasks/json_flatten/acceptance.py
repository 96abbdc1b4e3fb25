"""Acceptance tests of the json_flatten task (hidden from the company)."""

from solution import flatten


def test_nested():
    assert flatten({"a": {"b": 1, "c": {"d": 2}}, "e": 3}) == {"a.b": 1, "a.c.d": 2, "e": 3}


def test_flat():
    assert flatten({}) == {}
    assert flatten({"x": [1, 2]}) == {"x": [1, 2]}
