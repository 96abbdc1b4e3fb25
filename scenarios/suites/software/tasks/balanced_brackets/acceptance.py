"""Acceptance tests of the balanced_brackets task (hidden from the company)."""

from solution import balanced


def test_balanced():
    assert balanced("a(b[c]{d})")
    assert balanced("")


def test_unbalanced():
    assert not balanced("(]")
    assert not balanced("((")
    assert not balanced(")(")
