"""A run as a panel: one row per role and round, the form social scientists analyse (``export --format panel``).

Each row says what a role did in a round — messages delivered to it (``heard``), observed, sent,
the actions it chose, its model calls, tokens and cost — and, from ``metrics.jsonl``, the
scenario's per-agent figures at that round: every field of the round's metrics that maps role
names to values (a study's ``answers`` and ``conditions``, a game's ``offers``) becomes a column
holding this role's value (as JSON). Every role appears in every round (zeros where it did
nothing), so ``GROUP BY role`` and ``GROUP BY round`` both mean what they say. The events are
read a round at a time; the table is Parquet, written beside its place and renamed, for DuckDB,
polars or pandas.

The roles' own state at each round's end (:data:`STATE`: stage, memory, buffer, news, and their
scalar attributes and kept state as JSON) is not in the log: :func:`replayed_states` runs the
run again in memory from its first checkpoint with its model's recorded answers (its cassette,
or an offline model), reading every role after every round — the same rounds, since a run is
determined by its seed and its answers. Nothing is written into the run directory.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metaroles.bus.role import Role
from metaroles.core.exceptions import ConfigError
from metaroles.llm.protocol import LLM
from metaroles.project.interview import attributes_of, stood_at
from metaroles.project.metrics import read_metrics
from metaroles.project.rundir import CHECKPOINTS, read_manifest
from metaroles.project.scenario import rebuilt_team
from metaroles.record.eventread import Event, iter_rounds
from metaroles.record.numbering import numbered
from metaroles.record.restore import restore_checkpoint

COUNTS = ("heard", "observed", "sent", "acted", "model_calls", "tokens")
"""The whole-number columns, each a count of the role's events of the round."""
STATE = ("stage", "memory", "buffer", "news", "working_memory")
"""A role's own state at the round's end: its stage (``rc.state``), and the messages its memory holds, its
buffer (delivered, not yet observed), its news (observed in the round) and its working memory (a plan's)."""
States = AsyncIterator[tuple[int, dict[str, dict[str, Any]]]]
"""Rounds in order, each with every role's :func:`state_of` at its end."""
_KIND = {"deliver": "heard", "publish": "sent", "act": "acted", "llm_call": "model_calls"}
_TURNS = frozenset({"observe", "think", "act"})
"""The events of a role's turn, logged unless the run said ``log_turns=False``."""


async def write_panel(run_dir: Path, log: Path, target: Path, states: Callable[[int], States] | None = None) -> int:
    """Write the run's panel into ``target`` (Parquet); return its rows.

    With ``states`` (:func:`replayed_states` but for the last round, which it is given), the
    :data:`STATE` columns and ``attributes`` hold each role's own state at the round's end; without,
    they are empty.

    Raises:
        ConfigError: Without pyarrow, saying how to install it.
        RunDirCorrupt: If the log or the metrics are damaged (named by file and line).
    """
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("a panel is Parquet, which needs pyarrow: pip install 'metaroles[analysis]'") from None
    roles, last, turns = _roles(iter_rounds(log))
    figures = _figures(run_dir / "metrics.jsonl", roles)
    columns = sorted({name for by_round in figures.values() for name in by_round})
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    rows = 0
    try:
        schema = _schema(pa, columns)
        ahead = _Ahead(None if states is None else states(last))
        with pq.ParquetWriter(partial, schema) as writer:
            for number, table in _rounds(iter_rounds(log), roles):
                if not turns:
                    table.update(dict.fromkeys(("observed", "acted", "actions"), [None] * len(roles)))
                now = await ahead.at(number)
                for name in (*STATE, "attributes"):
                    table[name] = [now.get(role, {}).get(name) for role in roles]
                for name in columns:
                    table[name] = [figures.get(number, {}).get(name, {}).get(role) for role in roles]
                writer.write_table(pa.table(table, schema=schema))
                rows += len(roles)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return rows


def _schema(pa: Any, columns: list[str]) -> Any:
    """The panel's columns: the round and role, the counts, the state, then the scenario's figures."""
    return pa.schema(
        [("round", pa.int64()), ("role", pa.string()), *((c, pa.int64()) for c in COUNTS), ("cost", pa.float64())]
        + [("actions", pa.list_(pa.string()))]
        + [*((c, pa.int64()) for c in STATE), ("attributes", pa.string())]
        + [(c, pa.string()) for c in columns]
    )


def _roles(rounds: Iterator[list[Event]]) -> tuple[list[str], int, bool]:
    """Every role the log names, in the order it first appears (the user who starts a run is not a role).

    Also the log's last round, and whether it logged the roles' turns (else ``observed``, ``acted`` and
    ``actions`` are not known: empty, not zero).
    """
    seen: dict[str, None] = {}
    last, turns = 0, False
    for chunk in rounds:
        for event in chunk:
            if isinstance(event.get("role"), str) and event["role"] != "Human":
                seen.setdefault(event["role"], None)
            if isinstance(event.get("round"), int):
                last = max(last, event["round"])
            turns = turns or event["kind"] in _TURNS
    return list(seen), last, turns


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


async def replayed_states(run_dir: Path, llm: LLM, role_llms: dict[str, LLM], *, through: int) -> States:
    """Every role's state at its first checkpoint and after each round since, up to ``through``, the run run again.

    ``llm`` and ``role_llms`` must answer as the run's models did without asking one (its cassette
    replayed, or its offline model): the rounds are then the run's own. The run directory is only read.

    Raises:
        ConfigError: If the run has no readable checkpoint.
        CassetteMiss: If the answers lack a call the run made (the cassette is not this run's).
    """
    marks = numbered(run_dir / CHECKPOINTS, "round")
    if not marks:
        raise ConfigError(f"{str(run_dir)!r} kept no checkpoint, so its roles' state cannot be read back")
    with tempfile.TemporaryDirectory(prefix="metaroles-panel-") as scratch:  # what the roles write goes here
        team = rebuilt_team(read_manifest(run_dir), llm, Path(scratch), role_llms)
        restore_checkpoint(run_dir / CHECKPOINTS, team.env, through_round=marks[0][0])
        yield team.env.round, {role.name: state_of(role) for role in team.env.members}
        while team.env.round < through:
            before = team.env.round
            await team.run(1)
            if team.env.round == before:  # every role idle, or a budget crossed: the run stopped here too
                return
            yield team.env.round, {role.name: state_of(role) for role in team.env.members}


def state_of(role: Role) -> dict[str, Any]:
    """A role's :data:`STATE` columns and its ``attributes`` (as JSON), as it stands now."""
    state = role_state(role)
    del state["readings"]
    state["attributes"] = json.dumps(state["attributes"], ensure_ascii=False, sort_keys=True, default=str)
    return state


def role_state(role: Role) -> dict[str, Any]:
    """A role's :data:`STATE`, its ``attributes`` (:func:`~metaroles.project.interview.attributes_of`), ``readings``."""
    rc = role.rc
    return {
        "stage": rc.state,
        "memory": len(rc.memory),
        "buffer": len(rc.msg_buffer.peek_all()),
        "news": len(rc.news),
        "working_memory": len(rc.working_so_far.storage),
        "attributes": attributes_of(role),
        "readings": {name: getattr(role, name) for name in type(role).readings},
    }


async def states_at(
    run_dir: Path, at_round: int, llm: LLM, role_llms: dict[str, LLM], *, again: bool = True
) -> tuple[int, dict[str, dict[str, Any]]]:
    """Every role's :func:`role_state` after ``at_round`` (``again=False``: at the checkpoint up to it), and that round.

    ``llm`` and ``role_llms`` answer the rounds since the checkpoint again, as :func:`replayed_states`
    needs them to. The run directory is only read.

    Raises:
        ConfigError: If the run has no checkpoint up to ``at_round``.
    """
    with tempfile.TemporaryDirectory(prefix="metaroles-state-") as scratch:
        team, restored = await stood_at(run_dir, at_round, llm, role_llms, Path(scratch), again=again)
        return (team.env.round if again else restored), {role.name: role_state(role) for role in team.env.members}


class _Ahead:
    """The replayed states read in step with the log's rounds (one round read ahead when the log skips it)."""

    def __init__(self, states: States | None) -> None:
        self._states = states
        self._next: tuple[int, dict[str, dict[str, Any]]] | None = None

    async def at(self, number: int) -> dict[str, dict[str, Any]]:
        """The roles' state after round ``number`` (empty if the states hold no such round)."""
        while self._states is not None:
            if self._next is None:
                try:
                    self._next = await anext(self._states)
                except StopAsyncIteration:
                    self._states = None
                    break
            at, now = self._next
            if at > number:
                return {}
            self._next = None
            if at == number:
                return now
        return {}
