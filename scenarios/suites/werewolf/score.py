"""Scores a werewolf game: which side won (1 or 0 for each, both 0 when the days ran out) and on which day."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from metaroles.scenarios.werewolf import summary

from metaroles.project.scoring import Task


def score(run_dir: Path, task: Task) -> dict[str, Any]:
    """The winning side as two 0/1 columns (their means are win rates) and the game's last day."""
    ending = summary(run_dir)
    return {
        "winner": ending["winner"],
        "villagers_win": int(ending["winner"] == "villagers"),
        "werewolves_win": int(ending["winner"] == "werewolves"),
        "days": ending["day"],
    }
