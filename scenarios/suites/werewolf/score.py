"""Scores a werewolf game: which side won (1 or 0 for each, both 0 when the days ran out) and on which day."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from metaroles.scenarios.werewolf import MODERATOR, summary

from metaroles import EnvironmentState, UserRequirement
from metaroles.project.scoring import Task


def score(run_dir: Path, task: Task) -> dict[str, Any]:
    """The winning side as two 0/1 columns (their means are win rates), the game's last day, the answers.

    The players' structured answers: how many, and how many never validated (``failed_answers``).
    """
    ending = summary(run_dir)
    state = EnvironmentState.model_validate_json((run_dir / "state.json").read_text(encoding="utf-8"))
    answers = [m for m in state.history if m.sent_from != MODERATOR and m.cause_by != UserRequirement.action_id()]
    return {
        "answers": len(answers),
        "failed_answers": sum(1 for m in answers if "error" in m.metadata),
        "winner": ending["winner"],
        "villagers_win": int(ending["winner"] == "villagers"),
        "werewolves_win": int(ending["winner"] == "werewolves"),
        "days": ending["day"],
    }
