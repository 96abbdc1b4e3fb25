"""Scores a debate: whether the judge gave it to the motion's side, and how sure it was; across seeds, its agreement."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from metaroles.scenarios.debate import Config, summary

from metaroles.project.scoring import Task


def score(run_dir: Path, task: Task) -> dict[str, Any]:
    """The winner, 1 if it is the side for the motion (``pro``), and the judge's confidence."""
    verdict = summary(run_dir)
    pro = Config(**task.options).pro
    return {"winner": verdict["winner"], "pro_wins": int(verdict["winner"] == pro), "confidence": verdict["confidence"]}


def across(rows: list[dict[str, Any]]) -> dict[str, float]:
    """``agreement``: per motion, the share of seeds whose verdict is that motion's most common one, averaged."""
    by_task: dict[str, list[Any]] = {}
    for row in rows:
        by_task.setdefault(str(row["task"]), []).append(row.get("winner"))
    shares = [Counter(winners).most_common(1)[0][1] / len(winners) for winners in by_task.values() if winners]
    return {"agreement": round(sum(shares) / len(shares), 6)} if shares else {}
