"""A suite's own table (``table.md``): chosen columns per task and overall, per setting, with intervals.

The software suite's is the MetaGPT paper's SoftwareDev table: executability, running time, tokens,
code files and lines, tokens per line of code, fix attempts and cost; with ``--ablation`` a block per
setting of the company (the paper's table by role). Every column is a trial's figure from
``eval.jsonl`` but ``running_s``, the trial's wall time from the clock (``sweep.jsonl``): the one
figure a replay does not reproduce, so it stays out of the other tables and ``table.md`` is the
evaluation's only file that differs between a recorded run and its replay.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from statistics import fmean
from typing import Any, Protocol

from metaroles.project.sweep import read_table


class Suite(Protocol):
    """What the table needs of a suite (``evaluate.Suite``): its name, settings, tasks and columns."""

    @property
    def name(self) -> str:
        """The suite's name."""

    @property
    def settings(self) -> dict[str, dict[str, Any]]:
        """The settings compared, by name."""

    @property
    def tasks(self) -> list[Any]:
        """Its tasks (each with a ``name``)."""

    @property
    def table(self) -> list[str]:
        """The table's columns."""

    @property
    def per_task(self) -> list[str]:
        """Columns shown per task only (no mean over the tasks)."""


Row = dict[str, Any]
TABLE_MD = "table.md"
RUNNING = "running_s"


def interval(values: list[float], *, resamples: int = 2000, seed: int = 0) -> tuple[Any, Any, Any]:
    """Mean and 95 % percentile-bootstrap interval of ``values`` (a fixed seed: the same numbers every time)."""
    if not values:
        return None, None, None
    mean = fmean(values)
    if len(values) == 1:
        return round(mean, 6), None, None
    draw = random.Random(seed)
    means = sorted(fmean(draw.choices(values, k=len(values))) for _ in range(resamples))
    return round(mean, 6), round(means[int(0.025 * resamples)], 6), round(means[int(0.975 * resamples) - 1], 6)


def wall_times(out: Path) -> dict[tuple[Any, Any, Any], float]:
    """Each trial's wall time, as the sweep's table keeps it, by (task, setting, seed)."""
    return {
        (row.get("task"), row.get("setting"), row.get("seed")): float(row["wall_s"])
        for row in read_table(out)
        if isinstance(row.get("wall_s"), int | float)
    }


def suite_table(suite: Suite, rows: list[Row], times: Mapping[tuple[Any, Any, Any], float]) -> str:
    """The Markdown table: a block per setting, a line per task (its mean over seeds), then the overall mean."""
    timed = [{**row, RUNNING: times.get((row["task"], row["setting"], row["seed"]))} for row in rows]
    columns = suite.table
    text = [f"# {suite.name}: the table", "", "Per task, the mean over its seeds; overall, the mean [95 % interval]."]
    for setting in suite.settings:
        mine = [row for row in timed if row["setting"] == setting and row.get("status") == "done"]
        text += ["", f"## {setting}", "", f"| task | {' | '.join(columns)} |", "|---|" + "---|" * len(columns)]
        for task in suite.tasks:
            cells = [_mean([r for r in mine if r["task"] == task.name], column) for column in columns]
            text.append(f"| {task.name} | {' | '.join(cells)} |")
        overall = []
        for column in columns:
            mean, low, high = interval(_numbers(mine, column) if column not in suite.per_task else [])
            overall.append(
                ""
                if mean is None
                else f"**{_round(mean)}**" + (f" [{_round(low)}, {_round(high)}]" if low is not None else "")
            )
        text.append(f"| **all ({len(mine)} trials)** | {' | '.join(overall)} |")
    return "\n".join(text) + "\n"


def _numbers(rows: list[Row], column: str) -> list[float]:
    return [
        float(r[column]) for r in rows if isinstance(r.get(column), int | float) and not isinstance(r[column], bool)
    ]


def _mean(rows: list[Row], column: str) -> str:
    values = _numbers(rows, column)
    return str(_round(fmean(values))) if values else ""


def _round(value: float) -> float:
    return round(value, 2)
