"""Acceptance tests of the rock_paper_scissors task (hidden from the company)."""

from solution import rps


def test_wins():
    assert rps("rock", "scissors") == 1
    assert rps("paper", "rock") == 1


def test_losses_and_draw():
    assert rps("scissors", "rock") == -1
    assert rps("paper", "paper") == 0
