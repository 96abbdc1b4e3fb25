"""Reading checkpoints back (written by :mod:`metaroles.record.checkpoint`) into a live Environment.

:func:`restore_checkpoint` loads the newest complete full snapshot into the environment, then
replays each delta after it with the roles' own code: a replayable role takes the same
observation and remembers the same answer; every message reaches the same buffers; roles with
an entry get that state. A torn or unreadable round file is skipped with a warning, and the
state of the round before it is used (a delta needs every delta before it).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from warnings import warn

from metaroles.bus.environment import Environment
from metaroles.bus.record import EnvEvent
from metaroles.bus.role import Role
from metaroles.bus.state import EnvironmentState, RoleState, set_rng_state
from metaroles.core.exceptions import ConfigError, RunDirCorrupt
from metaroles.core.files import read_text
from metaroles.core.heap import paused_gc
from metaroles.llm.ledger import LedgerEntry
from metaroles.messages.memory import Memory
from metaroles.messages.message import Message
from metaroles.record.checkpoint import MESSAGES, READABLE, Restored
from metaroles.record.numbering import numbered


def restore_checkpoint(folder: Path, env: Environment, *, through_round: int | None = None) -> Restored:
    """Load the newest complete checkpoint in ``folder`` (up to ``through_round``) into ``env``.

    ``env`` must hold the same roles, built the same way (a scenario rebuilds them from its config).

    Raises:
        ConfigError: If the folder holds no readable checkpoint (up to ``through_round``).
    """
    with paused_gc():  # many objects, no garbage: collections would walk every one made so far (O(state²))
        return _restored(folder, env, through_round)


def _restored(folder: Path, env: Environment, through_round: int | None) -> Restored:
    chain, table = _chain(folder, through_round)
    rows = _rows(folder / MESSAGES, table[: chain[-1][1]["rows"]])
    sharded = max((n for n, (_, checkpoint) in enumerate(chain) if "parts" in checkpoint), default=-1)
    for n, (path, checkpoint) in enumerate(chain):
        try:
            if n:
                _replay(env, checkpoint, rows)
            else:
                env.load_state(_snapshot(checkpoint, rows))
            if n == sharded:  # the shards' roles as their parts hold them (later checkpoints build on that)
                _restore_parts(folder, env, checkpoint)
        except (IndexError, KeyError, TypeError) as exc:  # a place or a name the run does not have
            raise RunDirCorrupt(
                f"{path}: the checkpoint names what this run does not have ({type(exc).__name__}: {exc}); "
                "restore the checkpoints folder, or fork from an earlier round (metaroles fork DIR --from-round N)"
            ) from None
    env.drive.rebuild_ready()
    return Restored(
        round=chain[-1][1]["round"],
        path=chain[-1][0],
        rows=rows,
        full_round=chain[0][1]["round"],
        deltas=len(chain) - 1,
    )


def checkpoint_history(folder: Path, *, through_round: int | None = None) -> list[Message]:
    """The history (every published message, in order) at the newest complete checkpoint, without roles.

    With ``through_round``, at the newest checkpoint up to that round.
    """
    chain, table = _chain(folder, through_round)
    rows = _rows(folder / MESSAGES, table[: chain[-1][1]["rows"]])
    history: list[Message] = []
    for path, checkpoint in chain:
        if "history" in checkpoint:
            history = [rows[r] for r in checkpoint["history"]]
        history.extend(rows[r] for r in checkpoint.get("history_add", ()))
        deliveries, i = checkpoint.get("deliveries", []), 0
        try:
            while i < len(deliveries):
                history.append(rows[deliveries[i]])
                i += 2 + deliveries[i + 1]
        except IndexError:
            raise RunDirCorrupt(f"{path}: 'deliveries' names rows past the table; the checkpoint is damaged") from None
    return history


def _chain(folder: Path, through_round: int | None) -> tuple[list[tuple[Path, dict[str, Any]]], list[str]]:
    """The newest readable full snapshot and the unbroken deltas after it."""
    paths = [p for n, p in numbered(folder, "round") if through_round is None or n <= through_round]
    table = _read_table(folder / MESSAGES)
    chain: list[tuple[Path, dict[str, Any]]] = []
    best: list[tuple[Path, dict[str, Any]]] = []
    for path in paths:
        checkpoint = _read_checkpoint(path, len(table))
        follows = (
            chain and checkpoint is not None and checkpoint.get("after", chain[-1][1]["round"]) == chain[-1][1]["round"]
        )
        if checkpoint is None or (checkpoint["kind"] == "delta" and not follows):
            chain = []  # broken (a checkpoint torn, unreadable or missing) until the next full snapshot
            continue
        chain = [(path, checkpoint)] if checkpoint["kind"] == "full" else [*chain, (path, checkpoint)]
        best = chain
    if not best:
        upto = "" if through_round is None else f" up to round {through_round}"
        raise ConfigError(f"no readable checkpoint in {str(folder)!r}{upto}; run with checkpoints=... first")
    return best, table


def _restore_parts(folder: Path, env: Environment, checkpoint: dict[str, Any]) -> None:
    """Give the roles of a sharded round's parts (``record.parts``) their state at that round.

    Raises:
        RunDirCorrupt: If a part lacks that round (a driver's file is written only after its parts).
    """
    for name in checkpoint["parts"]:
        part = folder / name
        try:
            chain, table = _chain(part, checkpoint["round"])
        except ConfigError:
            chain, table = [], []
        if not chain or chain[-1][1]["round"] != checkpoint["round"]:
            raise RunDirCorrupt(
                f"{part}: the shard's part of the checkpoint of round {checkpoint['round']} is missing or damaged; "
                "restore the checkpoints folder, or fork from an earlier round (metaroles fork DIR --from-round N)"
            )
        rows = _rows(part / MESSAGES, table[: chain[-1][1]["rows"]], known=env.history.keyed)
        for _, step in chain:
            for role_name, entry in step["roles"].items():
                role = env.roles[role_name]
                _apply_entry(role, entry, rows)
                env.reindex(role)


def _read_table(path: Path) -> list[str]:
    if not path.exists():
        return []
    lines = read_text(path).split("\n")
    lines.pop()  # "" after the last newline, or a torn last row that no complete checkpoint refers to
    return lines


def _rows(path: Path, lines: list[str], *, known: Mapping[str, Message] | None = None) -> list[Message]:
    """The messages of the table's first rows (those the chosen checkpoint refers to).

    A shard's part names the messages of the driver's history by id (``{"ref": id}``): they are
    taken from ``known``, the restored history.

    Raises:
        RunDirCorrupt: If one of them is not a message (or names one the history lacks).
    """
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            if known is not None and line.startswith('{"ref":'):
                rows.append(known[json.loads(line)["ref"]])
                continue
            data = json.loads(line)
            if not isinstance(data, dict) or not {"id", "content"} <= data.keys():
                raise ValueError("a message row has its id and its content")
            rows.append(Message.model_validate(data))
        except (ValueError, KeyError):
            raise RunDirCorrupt(
                f"{path}: line {number} is not a message ({line[:60]!r}); the checkpoints' message table is damaged"
            ) from None
    return rows


def _read_checkpoint(path: Path, table_rows: int) -> dict[str, Any] | None:
    """The round file at ``path``, checked whole (:func:`_check_checkpoint`); ``None``, with a warning, if it is not."""
    try:
        checkpoint = json.loads(path.read_bytes().decode("utf-8"))
        if (
            not isinstance(checkpoint, dict)
            or checkpoint.get("version") not in READABLE
            or type(checkpoint.get("rows")) is not int
        ):
            raise ValueError("not a checkpoint of this format")
        if checkpoint["rows"] > table_rows or type(checkpoint.get("round")) is not int or "kind" not in checkpoint:
            raise ValueError(f"rows {checkpoint['rows']} beyond the table, or no round")
        _check_checkpoint(checkpoint)
    except (OSError, ValueError) as exc:
        warn(f"checkpoint {path.name} is unreadable ({exc}); using an earlier one", stacklevel=4)
        return None
    return checkpoint


_ROW_LISTS = ("history", "history_add", "dead_letters_add")
_ENTRY_ROWS = ("buffer", "news", "memory", "memory_add", "working_memory")


def _check_checkpoint(checkpoint: dict[str, Any]) -> None:
    """Check a round file against what restoring it reads: every field there, of its type, every row in the table.

    Role places (in ``ops`` and ``deliveries``) are checked against the environment when replayed.

    Raises:
        ValueError: Naming the first field that is wrong.
    """
    rows = checkpoint["rows"]
    if checkpoint["kind"] not in ("full", "delta") or (checkpoint["kind"] == "full" and "history" not in checkpoint):
        raise ValueError(f"kind {checkpoint['kind']!r} (or a full snapshot without its history)")
    for key, kind in (("roles", dict), ("events_add", list), ("ledger_add", list), ("dead_letters_add", list)):
        if not isinstance(checkpoint.get(key), kind):
            raise ValueError(f"{key!r} missing or not a {kind.__name__}")
    if not _rng_state(checkpoint.get("rng")):
        raise ValueError("'rng' is not a random source's state")
    for key in _ROW_LISTS:
        if key in checkpoint and not _rows_in(checkpoint[key], rows):
            raise ValueError(f"{key!r} names rows past the table's {rows}")
    if not _within(checkpoint.get("deliveries", []), 0, None) or not _within(checkpoint.get("ops", []), -1, None):
        raise ValueError("'deliveries' or 'ops' is not a list of numbers")
    _check_roles(checkpoint["roles"], rows)
    if "parts" in checkpoint and not _names(checkpoint["parts"]):
        raise ValueError("'parts' is not a list of folder names")


def _check_roles(roles: dict[str, Any], rows: int) -> None:
    """Check a round file's role entries: each a state, naming rows of the table."""
    for name, entry in roles.items():
        if not isinstance(entry, dict) or not (isinstance(entry.get("state_dict"), dict) or "state" in entry):
            raise ValueError(f"the entry of role {name!r} is not a role's state")
        if "state_dict" not in entry and not all(_rows_in(entry.get(key, []), rows) for key in _ENTRY_ROWS):
            raise ValueError(f"the entry of role {name!r} names rows past the table's {rows}")


def _within(values: object, low: int, high: int | None) -> bool:
    """Whether ``values`` is a list of numbers from ``low`` up to (not including) ``high`` (min and max: C speed)."""
    if not isinstance(values, list):
        return False
    try:
        return not values or (min(values) >= low and (high is None or max(values) < high))
    except TypeError:  # a string among them
        return False


def _rows_in(values: object, rows: int) -> bool:
    return _within(values, 0, rows)


def _names(values: object) -> bool:
    """Whether ``values`` are folders inside the checkpoints (``parts/SSSS-K``): relative, never climbing out."""
    return isinstance(values, list) and all(
        isinstance(v, str) and v and not v.startswith("/") and ".." not in v.split("/") for v in values
    )


def _rng_state(state: object) -> bool:
    """Whether ``state`` is what :func:`~metaroles.bus.state.rng_state` writes (a random source takes it)."""
    if not (isinstance(state, list) and len(state) == 3 and _within(state[1], 0, 1 << 32)):
        return False
    try:
        set_rng_state(random.Random(), state)
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def _snapshot(checkpoint: dict[str, Any], rows: list[Message]) -> EnvironmentState:
    """A full snapshot as an EnvironmentState."""
    roles = []
    for name, entry in checkpoint["roles"].items():
        if "state_dict" in entry:
            roles.append(entry["state_dict"])
            continue
        roles.append(
            {
                "name": name,
                "cls": entry.get("cls", ""),
                "addresses": entry["addresses"],
                "watch": entry["watch"],
                "state": entry["state"],
                **{key: [rows[r] for r in entry[key]] for key in ("buffer", "memory", "working_memory")},
                "news": [rows[r] for r in entry["news"]],
            }
        )
    return EnvironmentState.model_validate(
        {
            "round": checkpoint["round"],
            "roles": roles,
            "history": [rows[r] for r in checkpoint["history"]],
            "dead_letters": [rows[r] for r in checkpoint["dead_letters_add"]],
            "events": checkpoint["events_add"],
            "ledger": checkpoint["ledger_add"],
            "rng": checkpoint["rng"],
            "id_key": checkpoint.get("id_key"),
        }
    )


def _replay(env: Environment, checkpoint: dict[str, Any], rows: list[Message]) -> None:
    """Apply one delta to the live environment: turns, deliveries, then the roles' entries."""
    roles = env.members  # a population's role is built as an op or a delivery reaches it, fresh
    ops, i = checkpoint.get("ops", []), 0
    deliveries, delivered = checkpoint.get("deliveries", []), 0
    while i < len(ops):
        if ops[i] == 2:  # a round ended: its deliveries come before the next round's turns
            delivered = _deliver(env, roles, rows, deliveries, delivered, ops[i + 1])
            i += 2
            continue
        role = roles[ops[i + 1]]
        if ops[i] == 0:
            role.take_news()  # the role's observation, replayed
            i += 2
            continue
        if ops[i + 2] >= 0:
            role.rc.memory.add(rows[ops[i + 2]])
        role.rc.state, role.rc.todo = -1, None
        i += 3
    if "history" in checkpoint:
        env.history = Memory([rows[r] for r in checkpoint["history"]])
    env.history.add_batch(rows[r] for r in checkpoint.get("history_add", ()))
    _deliver(env, roles, rows, deliveries, delivered, len(deliveries))
    env.dead_letters.extend(rows[r] for r in checkpoint["dead_letters_add"])
    env.events.extend(EnvEvent.model_validate(e) for e in checkpoint["events_add"])
    env.ledger.reset([*env.ledger.entries, *(LedgerEntry(**e) for e in checkpoint["ledger_add"])])
    env.round = checkpoint["round"]
    set_rng_state(env.rng, checkpoint["rng"])
    for name, entry in checkpoint["roles"].items():
        _apply_entry(env.roles[name], entry, rows)


def _deliver(
    env: Environment, roles: Sequence[Role], rows: list[Message], deliveries: list[int], i: int, end: int
) -> int:
    """Replay ``deliveries[i:end]`` (row, count, then the count recipients' places, per message); return ``end``."""
    while i < end:
        message, count = rows[deliveries[i]], deliveries[i + 1]
        env.history.add(message)
        for index in deliveries[i + 2 : i + 2 + count]:
            roles[index].rc.msg_buffer.push(message)
        i += 2 + count
    return end


def _apply_entry(role: Role, entry: dict[str, Any], rows: list[Message]) -> None:
    """Give ``role`` the state an entry describes (whole, or the rows it added to memory)."""
    if "state_dict" in entry:
        role.load_state(RoleState.model_validate(entry["state_dict"]))
        return
    rc = role.rc
    if "memory" in entry:
        memory = [rows[r] for r in entry["memory"]]
    else:
        memory = [*rc.memory, *(rows[r] for r in entry.get("memory_add", ()))]
    working = entry.get("working_memory")
    state = RoleState(
        name=role.name,
        cls=entry.get("cls", ""),
        addresses=entry.get("addresses", sorted(role.addresses)),
        watch=entry.get("watch", sorted(rc.watch)),
        state=entry["state"],
        buffer=[rows[r] for r in entry["buffer"]],
        memory=memory,
        working_memory=list(rc.working_so_far.storage) if working is None else [rows[r] for r in working],
        news=[rows[r] for r in entry["news"]],
    )
    role.load_state(state)
