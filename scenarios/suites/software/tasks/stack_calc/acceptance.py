"""Acceptance tests of the stack_calc task (hidden from the company)."""

from solution import rpn


def test_expressions():
    assert rpn("3 4 +") == 7
    assert rpn("5 1 2 + 4 * + 3 -") == 14


def test_division():
    assert rpn("7 2 /") == 3
    assert rpn("-7 2 /") == -3
