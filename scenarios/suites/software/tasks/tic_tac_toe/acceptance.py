"""Acceptance tests of the tic_tac_toe task (hidden from the company)."""

from solution import winner


def test_rows_and_diagonals():
    assert winner(["XXX", "O.O", "..."]) == "X"
    assert winner(["O.X", ".OX", "X.O"]) == "O"


def test_column_and_none():
    assert winner(["X.O", "X.O", ".XO"]) == "O"
    assert winner(["XOX", "XOO", "OXX"]) is None
