"""A run as a panel: one row per role and round, the form social scientists analyse (``export --format panel``).

Each row says what a role did in a round — messages delivered to it (``heard``), observed, sent,
the actions it chose, its model calls, tokens and cost — and, from ``metrics.jsonl``, the
scenario's per-agent figures at that round: every field of the round's metrics that maps role
names to values (a study's ``answers`` and ``conditions``, a game's ``offers``) becomes a column
holding this role's value (as JSON). Every role appears in every round (zeros where it did
nothing), so ``GROUP BY role`` and ``GROUP BY round`` both mean what they say. The events are
read a round at a time; the table is Parquet, written beside its place and renamed, for DuckDB,
polars or pandas.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metaroles.core.exceptions import ConfigError
from metaroles.project.metrics import read_metrics
from metaroles.record.eventread import Event, iter_rounds

COUNTS = ("heard", "observed", "sent", "acted", "model_calls", "tokens")
"""The whole-number columns, each a count of the role's events of the round."""
_KIND = {"deliver": "heard", "publish": "sent", "act": "acted", "llm_call": "model_calls"}


def write_panel(run_dir: Path, log: Path, target: Path) -> int:
    """Write the run's panel into ``target`` (Parquet); return its rows.

    Raises:
        ConfigError: Without pyarrow, saying how to install it.
        RunDirCorrupt: If the log or the metrics are damaged (named by file and line).
    """
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("a panel is Parquet, which needs pyarrow: pip install 'metaroles[analysis]'") from None
    roles = _roles(iter_rounds(log))
    figures = _figures(run_dir / "metrics.jsonl", roles)
    columns = sorted({name for by_round in figures.values() for name in by_round})
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    rows = 0
    try:
        schema = pa.schema(
            [("round", pa.int64()), ("role", pa.string()), *((c, pa.int64()) for c in COUNTS), ("cost", pa.float64())]
            + [("actions", pa.list_(pa.string()))]
            + [(c, pa.string()) for c in columns]
        )
        with pq.ParquetWriter(partial, schema) as writer:
            for number, table in _rounds(iter_rounds(log), roles):
                for name in columns:
                    table[name] = [figures.get(number, {}).get(name, {}).get(role) for role in roles]
                writer.write_table(pa.table(table, schema=schema))
                rows += len(roles)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return rows


def _roles(rounds: Iterator[list[Event]]) -> list[str]:
    """Every role the log names, in the order it first appears (the user who starts a run is not a role)."""
    seen: dict[str, None] = {}
    for chunk in rounds:
        for event in chunk:
            if isinstance(event.get("role"), str) and event["role"] != "Human":
                seen.setdefault(event["role"], None)
    return list(seen)


@dataclass
class _Did:
    """What one role did in one round."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    cost: float = 0.0
    actions: list[str] = field(default_factory=list)

    def add(self, event: Event) -> None:
        kind = event["kind"]
        if kind in _KIND:
            self.counts[_KIND[kind]] += 1
        if kind == "observe":
            self.counts["observed"] += len(event.get("message_ids") or ())
        elif kind == "think" and event.get("action"):
            self.actions.append(str(event["action"]).rsplit(".", 1)[-1])
        elif kind == "llm_call":
            self.counts["tokens"] += int(event.get("tokens") or 0)
            self.cost += float(event.get("cost") or 0.0)


def _rounds(rounds: Iterator[list[Event]], roles: list[str]) -> Iterator[tuple[int, dict[str, list[Any]]]]:
    """Each round's columns: a value per role."""
    for chunk in rounds:
        number = next((e["round"] for e in chunk if isinstance(e.get("round"), int)), None)
        if number is None:
            continue
        did = {role: _Did() for role in roles}
        for event in chunk:
            if (mine := did.get(str(event.get("role")))) is not None:
                mine.add(event)
        yield (
            number,
            {
                "round": [number] * len(roles),
                "role": list(roles),
                **{name: [did[r].counts[name] for r in roles] for name in COUNTS},
                "cost": [did[r].cost for r in roles],
                "actions": [did[r].actions for r in roles],
            },
        )


def _figures(path: Path, roles: list[str]) -> dict[int, dict[str, dict[str, str]]]:
    """Round → the metrics' per-role fields → role → the value as JSON."""
    if not path.is_file():
        return {}
    names = set(roles)
    found: dict[int, dict[str, dict[str, str]]] = {}
    for row, _ in read_metrics(path):
        for name, value in row.items():
            if isinstance(value, dict) and value and names.issuperset(value):
                found.setdefault(row["round"], {})[name] = {
                    role: json.dumps(v, ensure_ascii=False) for role, v in value.items()
                }
    return found
