"""Incremental, crash-safe checkpoints of an Environment, one per round.

A checkpoint folder holds:

- ``messages.jsonl``: every message a checkpoint refers to, once, in the order first seen; a
  message is named by its row (line number, from 0). Appended and fsynced before the round file
  that refers to it.
- ``round-NNNN.json``: the state at the end of round NNNN, written atomically (temp file, fsync,
  rename). A *full* snapshot every ``every`` rounds (and first); otherwise a *delta* against the
  previous round file: the rows each changed role added to its memory, its buffer and news, the
  history, ledger and events appended since. So a round costs what changed in it, not the size
  of the whole run.

:func:`load_checkpoint` replays the newest full snapshot and the deltas after it. A torn or
unreadable round file is skipped with a warning, and the state of the round before it is used.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any
from warnings import warn

from metaroles.environment import Environment, EnvironmentState, rng_state
from metaroles.exceptions import ConfigError
from metaroles.memory import Memory
from metaroles.message import Message
from metaroles.role import Role

MESSAGES = "messages.jsonl"
FULL_EVERY = 25
FORMAT = 2


def round_file(folder: Path, round_no: int) -> Path:
    """The checkpoint file of ``round_no`` in ``folder``."""
    return folder / f"round-{round_no:04d}.json"


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a crash leaves either the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _plain(message: Message) -> bool:
    return (
        message.instruct_content is None
        and not message.metadata
        and message.tool_calls is None
        and message.name is None
        and message.tool_call_id is None
        and message.base64_image is None
    )


_RoleMark = tuple[int, int, int, int, int, frozenset[str], frozenset[str], object]
"""What a role looked like at the previous checkpoint: memory length and edits, state, working
memory length and edits, watch, addresses, and its news list if its buffer was empty (else None;
a role's observation replaces ``rc.news`` rather than changing it in place)."""


@dataclass
class _EnvMark:
    history: int = -1
    edits: int = 0
    dead_letters: int = 0
    events: int = 0
    ledger: int = 0


class CheckpointWriter:
    """Writes an environment's checkpoints into ``folder``, one per round.

    Args:
        folder: The checkpoint folder.
        every: A full snapshot every this many rounds; deltas in between.
        restored: What :func:`load_checkpoint` read, when continuing a run in the same folder.
    """

    def __init__(self, folder: Path, *, every: int = FULL_EVERY, restored: Restored | None = None) -> None:
        """Open the folder; when continuing, cut the message table back to what the checkpoint used."""
        self.folder = folder
        self.every = every
        self._rows: dict[int, int] = {}
        self._held: list[Message] = []
        self._text: dict[str, str] = {}
        self._roles: dict[str, _RoleMark] = {}
        self._env = _EnvMark()
        self._full_round: int | None = None
        self.round: int | None = None
        """The round of the last checkpoint written (``None`` before the first)."""
        folder.mkdir(parents=True, exist_ok=True)
        table = folder / MESSAGES
        if restored is None:
            table.write_bytes(b"")
            return
        _truncate_lines(table, len(restored.rows))
        self.round = restored.round
        for message in restored.rows:
            self._rows[id(message)] = len(self._held)
            self._held.append(message)

    def write(self, env: Environment) -> Path:
        """Write the checkpoint of ``env``'s current round (call between rounds)."""
        full = self._full_round is None or env.round - self._full_round >= self.every
        if full:
            self._full_round = env.round
            self._roles.clear()
            self._env = _EnvMark()
        new_rows: list[str] = []
        parts = [f'"version":{FORMAT},"round":{env.round},"kind":"{"full" if full else "delta"}"']
        parts.extend(self._env_parts(env, new_rows))
        roles = [entry for role in env.roles.values() if (entry := self._role_entry(role, new_rows))]
        parts.append('"roles":{' + ",".join(roles) + "}")
        parts.append(f'"rows":{len(self._held)}')
        if new_rows:
            with (self.folder / MESSAGES).open("a", encoding="utf-8") as handle:
                handle.write("".join(new_rows))
                handle.flush()
                os.fsync(handle.fileno())
        path = round_file(self.folder, env.round)
        write_atomic(path, "{" + ",".join(parts) + "}\n")
        self.round = env.round
        return path

    # -- encoding --------------------------------------------------------------------------------

    def _enc(self, text: str) -> str:
        """JSON of a name that recurs (role, action, address), memoised."""
        encoded = self._text.get(text)
        if encoded is None:
            encoded = self._text[text] = encode_basestring(text)
        return encoded

    def _row(self, message: Message, new_rows: list[str]) -> int:
        row = self._rows.get(id(message))
        if row is None:
            row = self._rows[id(message)] = len(self._held)
            self._held.append(message)  # keeps id(message) from being reused
            new_rows.append(self._encode(message) + "\n")
        return row

    def _rows_of(self, messages: Any, new_rows: list[str]) -> str:
        found, row = self._rows.get, self._row
        numbers = [found(id(m)) for m in messages]
        if None in numbers:
            numbers = [row(m, new_rows) for m in messages]
        return f"[{','.join(map(str, numbers))}]"

    def _encode(self, message: Message) -> str:
        if not _plain(message):
            return message.model_dump_json()
        enc = self._enc
        send_to = ",".join([enc(a) for a in sorted(message.send_to)])
        return (
            f'{{"id":{encode_basestring(message.id)},"content":{encode_basestring(message.content)},'
            f'"role":"{message.role.value}","cause_by":{enc(message.cause_by)},"sent_from":{enc(message.sent_from)},'
            f'"send_to":[{send_to}]}}'
        )

    def _env_parts(self, env: Environment, new_rows: list[str]) -> list[str]:
        mark, history = self._env, env.history
        parts = [f'"rng":{json.dumps(rng_state(env.rng))}']
        if mark.history < 0 or history._edits != mark.edits or len(history) < mark.history:
            parts.append(f'"history":{self._rows_of(history, new_rows)}')
        elif len(history) > mark.history:
            parts.append(f'"history_add":{self._rows_of(history.get(len(history) - mark.history), new_rows)}')
        dead = env.dead_letters[mark.dead_letters :]
        parts.append(f'"dead_letters_add":{self._rows_of(dead, new_rows)}')
        events = [e.model_dump(mode="json") for e in env.events[mark.events :]]
        ledger = [asdict(e) for e in env.ledger.entries[mark.ledger :]]
        parts.append(f'"events_add":{json.dumps(events)},"ledger_add":{json.dumps(ledger)}')
        self._env = _EnvMark(
            len(history), history._edits, len(env.dead_letters), len(env.events), len(env.ledger.entries)
        )
        return parts

    def _role_entry(self, role: Role, new_rows: list[str]) -> str:
        """The role's JSON entry (``"name":{...}``) if it changed since the last checkpoint, else ``""``.

        Runs once per role per round, so it compares a few counters instead of contents: memory
        and working memory only ever grow between two checkpoints unless their edit counter moved.
        """
        rc = role.rc
        memory, working = rc.memory, rc.working_memory
        if type(memory) is not Memory or role.brain_memory is not None:
            self._roles.pop(role.name, None)  # long-term or brain memory: the role's full state each time
            return f'{self._enc(role.name)}:{{"state_dict":{role.state_dict().model_dump_json()}}}'
        buffer, news = rc.msg_buffer.peek_all(), rc.news
        size, edits, state, watch, addresses = len(memory), memory._edits, rc.state, rc.watch, role.addresses
        mark = self._roles.get(role.name)
        if (
            mark is not None
            and not buffer
            and mark[7] is news
            and mark[:5] == (size, edits, state, len(working), working._edits)
            and mark[5] == watch
            and mark[6] is addresses
        ):
            return ""
        rows = self._rows_of
        parts = [f'"buffer":{rows(buffer, new_rows)},"news":{rows(news, new_rows)},"state":{state}']
        if mark is None or edits != mark[1] or size < mark[0]:
            cls = f"{type(role).__module__}.{type(role).__qualname__}"
            parts.append(f'"cls":{encode_basestring(cls)},"memory":{rows(memory, new_rows)}')
        elif size > mark[0]:
            parts.append(f'"memory_add":{rows(memory.get(size - mark[0]), new_rows)}')
        if mark is None or (len(working), working._edits) != mark[3:5]:
            parts.append(f'"working_memory":{rows(working, new_rows)}')
        watched = frozenset(watch) if mark is None or mark[5] != watch else mark[5]
        if mark is None or mark[5] != watch or mark[6] is not addresses:
            parts.append(f'"watch":{json.dumps(sorted(watch))},"addresses":{json.dumps(sorted(addresses))}')
        self._roles[role.name] = (
            size,
            edits,
            state,
            len(working),
            working._edits,
            watched,
            addresses,
            None if buffer else news,
        )
        return f"{self._enc(role.name)}:{{{','.join(parts)}}}"


# -- reading ---------------------------------------------------------------------------------------


@dataclass
class Restored:
    """A checkpoint read back: the state, its round, and the message table it used."""

    state: EnvironmentState
    round: int
    path: Path
    rows: list[Message] = field(default_factory=list)


@dataclass
class _Replay:
    """The state being rebuilt from a full snapshot and the deltas after it."""

    record: dict[str, Any]
    roles: dict[str, dict[str, Any]]


def load_checkpoint(folder: Path, *, through_round: int | None = None) -> Restored:
    """The newest complete checkpoint in ``folder`` (up to ``through_round``); torn ones are skipped with a warning.

    Raises:
        ConfigError: If the folder holds no readable checkpoint (up to ``through_round``).
    """
    paths = sorted(folder.glob("round-*.json"))
    if through_round is not None:
        paths = [p for p in paths if int(p.stem.partition("-")[2]) <= through_round]
    table = _read_table(folder / MESSAGES)
    replay: _Replay | None = None
    best: tuple[_Replay, Path, int] | None = None
    for path in paths:
        record = _read_record(path, len(table))
        if record is None or (record["kind"] == "delta" and replay is None):
            replay = None  # the chain is broken until the next full snapshot
            continue
        replay = _apply(replay, record)
        best = (_copy(replay), path, record["rows"])
    if best is None:
        upto = "" if through_round is None else f" up to round {through_round}"
        raise ConfigError(f"no readable checkpoint in {str(folder)!r}{upto}; run with checkpoints=... first")
    done, path, used = best
    rows = [Message.model_validate(json.loads(line)) for line in table[:used]]
    return Restored(state=_materialise(done, rows), round=done.record["round"], path=path, rows=rows)


def _read_table(path: Path) -> list[str]:
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    elif lines:
        lines.pop()  # a torn last row: no complete checkpoint refers to it
    return lines


def _read_record(path: Path, table_rows: int) -> dict[str, Any] | None:
    try:
        record: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        if record.get("version") != FORMAT or record["rows"] > table_rows:
            raise ValueError(f"format {record.get('version')!r} or rows {record['rows']} beyond the table")
    except (OSError, ValueError, KeyError) as exc:
        warn(f"checkpoint {path.name} is unreadable ({type(exc).__name__}); using an earlier one", stacklevel=3)
        return None
    return record


def _apply(replay: _Replay | None, record: dict[str, Any]) -> _Replay:
    if record["kind"] == "full" or replay is None:
        replay = _Replay(record={"history": [], "dead_letters": [], "events": [], "ledger": []}, roles={})
    state = replay.record
    state["round"], state["rng"] = record["round"], record["rng"]
    if "history" in record:
        state["history"] = list(record["history"])
    for key in ("history", "dead_letters", "events", "ledger"):
        state[key] = state[key] + record.get(f"{key}_add", [])
    for name, entry in record["roles"].items():
        if "state_dict" in entry:
            replay.roles[name] = {"state_dict": entry["state_dict"]}
            continue
        role = replay.roles.setdefault(name, {})
        role.pop("state_dict", None)
        added = entry.pop("memory_add", None)
        role.update(entry)
        if added:
            role["memory"] = role["memory"] + added
    return replay


def _copy(replay: _Replay) -> _Replay:
    return _Replay(record=dict(replay.record), roles={name: dict(role) for name, role in replay.roles.items()})


def _materialise(replay: _Replay, rows: list[Message]) -> EnvironmentState:
    state = replay.record
    roles = []
    for name, role in replay.roles.items():
        if "state_dict" in role:
            roles.append(role["state_dict"])
            continue
        roles.append(
            {
                "name": name,
                "cls": role.get("cls", ""),
                "addresses": role["addresses"],
                "watch": role["watch"],
                "state": role["state"],
                **{key: [rows[r] for r in role[key]] for key in ("buffer", "memory", "working_memory")},
                "news": [rows[r].id for r in role["news"]],
            }
        )
    return EnvironmentState.model_validate(
        {
            "round": state["round"],
            "roles": roles,
            "history": [rows[r] for r in state["history"]],
            "dead_letters": [rows[r] for r in state["dead_letters"]],
            "events": state["events"],
            "ledger": state["ledger"],
            "rng": state["rng"],
        }
    )


def _truncate_lines(path: Path, count: int) -> None:
    """Keep the first ``count`` lines of ``path`` (drops rows no kept checkpoint refers to)."""
    if not path.exists():
        path.write_bytes(b"")
        return
    data = path.read_bytes()
    end = 0
    for _ in range(count):
        end = data.index(b"\n", end) + 1
    with path.open("r+b") as handle:
        handle.truncate(end)
        handle.flush()
        os.fsync(handle.fileno())
