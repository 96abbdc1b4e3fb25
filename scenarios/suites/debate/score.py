"""Scores a debate: whether the judge gave it to the motion's side, and how sure it was; across seeds, its agreement."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from metaroles.scenarios.debate import Config, summary

from metaroles import EnvironmentState
from metaroles.project.scoring import Task

STOP = frozenset("should their there these those with from that this they them have will would about into".split())


def score(run_dir: Path, task: Task) -> dict[str, Any]:
    """The winner, 1 if it is the motion's side (``pro``), the judge's confidence, and the debate's quality.

    Quality: whether the verdict validated, and the share of speeches on the motion (naming one of its
    words, not asking what the topic is).
    """
    verdict = summary(run_dir)
    config = Config(**task.options)
    words = {w for w in re.findall(r"[a-z]+", config.topic.lower()) if len(w) > 3 and w not in STOP}
    state = EnvironmentState.model_validate_json((run_dir / "state.json").read_text(encoding="utf-8"))
    speeches = [(m.content or "").lower() for m in state.history if m.sent_from in (config.pro, config.con)]
    on = [bool(words & set(re.findall(r"[a-z]+", s))) and "topic" not in s for s in speeches]
    return {
        "winner": verdict["winner"],
        "pro_wins": int(verdict["winner"] == config.pro),
        "confidence": verdict["confidence"],
        "verdict_valid": int(verdict["winner"] is not None),
        "on_motion": round(sum(on) / len(on), 6) if on else None,
    }


def across(rows: list[dict[str, Any]]) -> dict[str, float]:
    """``agreement``: per motion, the share of seeds whose verdict is that motion's most common one, averaged."""
    by_task: dict[str, list[Any]] = {}
    for row in rows:
        by_task.setdefault(str(row["task"]), []).append(row.get("winner"))
    shares = [Counter(winners).most_common(1)[0][1] / len(winners) for winners in by_task.values() if winners]
    return {"agreement": round(sum(shares) / len(shares), 6)} if shares else {}
