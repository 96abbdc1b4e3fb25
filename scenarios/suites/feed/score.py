"""Scores a feed's end: polarization, the seeded post's spread and the largest cascade."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from metaroles.scenarios.feed import summary

from metaroles.project.scoring import Task


def score(run_dir: Path, task: Task) -> dict[str, Any]:
    """The last round's measures (``summary``)."""
    end = summary(run_dir)
    return {key: end[key] for key in ("polarization", "seed_reach", "seed_size", "largest_cascade")}
