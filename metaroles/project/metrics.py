"""``metrics.jsonl``: a line per round when the scenario measures its rounds (``round_metrics(team)``).

A round with model calls adds ``llm``: its calls and their prompt, cached and completion tokens
(the cached share of the prompt is what an engine's prefix cache served). Latencies are the
clock's, not the run's: each call's is in ``timings.jsonl``.

Each line is appended and synced before the round's checkpoint; a resumed run cuts the file back to
the rounds before it and writes them again, and refuses to go on when a row the checkpoint holds is lost.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from metaroles.core.exceptions import RunDirCorrupt
from metaroles.core.files import append_durably, write_atomic
from metaroles.project.rundir import METRICS, events_file
from metaroles.record.eventlog import ended, read_jsonl
from metaroles.team.team import Team


def metrics_recorder(module: ModuleType, out_dir: Path | None) -> Callable[[Team], None] | None:
    """A line in ``metrics.jsonl`` per round when the scenario has ``round_metrics(team)`` (``Team.on_record``).

    The first line written first cuts the file back to the rounds before it (atomically: a resumed
    run writes them again); each line is appended and synced before the round's checkpoint.
    """
    measure = getattr(module, "round_metrics", None)
    if measure is None or out_dir is None:
        return None
    path = out_dir / METRICS
    counted = -1  # the ledger's entries in the rows written (-1: not started)

    def record(team: Team) -> None:
        nonlocal counted
        if counted < 0:
            rows = read_metrics(path)
            kept = [(row, line) for row, line in rows if row["round"] < team.env.round]
            write_atomic(path, "".join(line + "\n" for _, line in kept))
            counted = sum(row.get("llm", {}).get("calls", 0) for row, _ in kept)
        row = {"round": team.env.round, **measure(team)}
        usage = team.env.ledger.usage_since(counted)
        if usage["calls"]:
            row["llm"] = usage
            counted += usage["calls"]
        append_durably(path, json.dumps(row) + "\n")

    return record


def check_metrics(module: ModuleType, run_dir: Path) -> Callable[[int], None] | None:
    """Refuse a resume whose ``metrics.jsonl`` lost a row of a round the checkpoint holds (it cannot be rebuilt)."""
    if getattr(module, "round_metrics", None) is None:
        return None

    def check(through_round: int) -> None:
        have = {row["round"] for row, _ in read_metrics(run_dir / METRICS)}
        log = read_jsonl(events_file(run_dir), _metric_row)
        rounds = {e["round"] for e, _ in log if ended(e)}
        missing = sorted(r for r in rounds - have if r <= through_round)
        if missing:
            raise RunDirCorrupt(
                f"{run_dir / METRICS}: the rows of round(s) {missing[:5]} are gone, and the checkpoint is of round "
                f"{through_round}; restore the file, or fork from round {max(0, missing[0] - 1)} "
                f"(metaroles fork {run_dir} --from-round {max(0, missing[0] - 1)})"
            )

    return check


def _metric_row(value: object) -> bool:
    return isinstance(value, dict) and type(value.get("round")) is int


def read_metrics(path: Path) -> list[tuple[dict[str, Any], str]]:
    """The rows of a ``metrics.jsonl`` with their lines (a torn last line skipped with a warning).

    Raises:
        RunDirCorrupt: If a line before the last is not a row with a ``round``.
    """
    return read_jsonl(path, _metric_row)
