"""Scores a society's end: how polarised (variance of the opinions), how many clusters, and whether it converged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from metaroles.scenarios.society import summary

from metaroles.project.scoring import Task


def score(run_dir: Path, task: Task) -> dict[str, Any]:
    """The last round's variance and clusters; ``converged`` is 1 when one cluster is left."""
    end = summary(run_dir)
    return {"variance": end["variance"], "clusters": end["clusters"], "converged": int(end["clusters"] == 1)}
