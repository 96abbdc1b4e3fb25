"""Incremental, crash-safe checkpoints of an Environment, one per round (reading: ``restore``; shards: ``parts``).

A checkpoint folder holds ``messages.jsonl`` — every message a checkpoint refers to, once, in the
order first seen, named by its row (line number, from 0); appended as the rounds go and fsynced
before the round file that refers to it (rows past the last checkpoint are cut off on resume) —
and ``round-NNNN.json``, the state at the end of round NNNN, written
atomically (temp file, fsync, rename): a *full* snapshot every ``every`` checkpoints (and first),
otherwise a *delta* against the previous round file, so that a round costs what happened in it:

- ``ops`` and ``deliveries``: what the bus did — which roles took a default turn (observe, then
  remember their own answer) and which message reached whom; when a delta spans several rounds,
  an op ``2, n`` marks where a round ends (deliver up to position ``n`` first). Replaying these
  with the roles' own code rebuilds every *replayable* role (a default one-action turn, plain
  memory) exactly; the writer checks, per role, that its state is what the replay will give.
- ``roles``: an entry for every other role that changed (custom turns, long-term or brain
  memory, or anything touched outside the bus): the rows it added to memory, its buffer and
  news, its state.
- the ledger, events and dead letters appended since, and the random source's state.
"""

from __future__ import annotations

import json
import os
from collections import namedtuple
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import NamedTuple

from metaroles.bus.delivery import RecordReader
from metaroles.bus.environment import Environment
from metaroles.bus.record import Recipients, RoundRecord, Steps, names_of
from metaroles.bus.role import Role
from metaroles.bus.state import rng_state
from metaroles.core.confined import open_own
from metaroles.core.exceptions import ConfigError
from metaroles.core.files import append_text, sync_dir, truncate_lines, write_atomic
from metaroles.messages.memory import Memory
from metaroles.messages.message import Message
from metaroles.record.numbering import numbered, round_file
from metaroles.record.replayable import Expected, replayable, replays
from metaroles.record.rows import MessageRows, numbers_json

MESSAGES = "messages.jsonl"
FULL_EVERY = 25
FORMAT = 3
SHARDED = 4
"""The format of a sharded round's driver file (3 and the shards' ``parts``, the history's ``history_add``)."""
READABLE = (2, 3, 4)
"""The formats :func:`~metaroles.record.restore.restore_checkpoint` reads (3 added the round marks of a delta's ops)."""


@dataclass
class Restored:
    """What a restore read: the round, its file, and the message table (rows) it used."""

    round: int
    path: Path
    rows: list[Message] = field(default_factory=list)
    full_round: int | None = None
    """The round of the full snapshot the restored chain starts from."""
    deltas: int = 0
    """How many deltas follow that full snapshot in the chain."""


class _RoleMark(NamedTuple):
    """A role at the previous checkpoint (what its next entry is measured against)."""

    size: int
    """How many messages its memory held."""
    edits: int
    """Its memory's removals."""
    state: int
    working: int
    """How many messages its working memory held."""
    working_edits: int
    watch: frozenset[str]
    addresses: frozenset[str]
    news: object
    """Its news list if its buffer was empty (else None: an observation replaces ``rc.news``)."""


class _Target(NamedTuple):
    """A message's recipients (a round record's places), their places here and the replayable ones' expectations."""

    recipients: Recipients
    places: list[int]
    expected: list[Expected]


class _Places(dict[str, int]):
    """A role's place by name, looked up once (the roles named in ops and deliveries, not every role)."""

    __slots__ = ("roles",)

    def __init__(self, roles: Mapping[str, Role]) -> None:
        """Places of ``roles`` (an environment's, by name)."""
        super().__init__()
        self.roles = roles

    def __missing__(self, name: str) -> int:
        place = self[name] = self.roles[name].place
        return place


_EnvMark = namedtuple("_EnvMark", "history edits dead_letters events ledger", defaults=(-1, 0, 0, 0, 0))
"""The environment at the previous checkpoint: the lengths (and the history's edits) a delta starts from."""


class CheckpointWriter(MessageRows):
    """Writes an environment's checkpoints into ``folder``, one per round.

    Args:
        folder: The checkpoint folder.
        every: A full snapshot every this many checkpoints; deltas in between (a delta of a team that
            checkpoints every few rounds spans them, so this bounds the chain a restore reads).
        restored: What :func:`load_checkpoint` read, when continuing a run in the same folder.
        replay: ``False`` for a shard's part (``record.parts``): every delta lists the roles that changed.
        known: For a shard's part, the messages of the driver's history, which its rows name by id.
        each_name: Sync each round file's name as it is written (a shard's part: the driver's file names it);
            else :meth:`sync_names`, once. A power cut may lose the newest round files, never tear one.
    """

    def __init__(
        self,
        folder: Path,
        *,
        every: int = FULL_EVERY,
        restored: Restored | None = None,
        replay: bool = True,
        known: Mapping[str, Message] | None = None,
        each_name: bool = False,
    ) -> None:
        """Open the folder; when continuing, cut the message table back to what the checkpoint used."""
        self.folder = folder
        self.every = every
        self.replay = replay
        self.each_name = each_name
        self._names_unsynced = False
        super().__init__(known)
        self._roles: dict[str, _RoleMark] = {}
        self._env = _EnvMark()
        self._full_round: int | None = None
        self._deltas = 0
        self._expect: dict[str, Expected] = {}
        self._ops: list[int] = []
        self._deliveries: list[int] = []
        self._noted_history = 0
        self._records: RecordReader | None = None
        """The bus's round records, as this writer takes them in (``bus.record``), from its first note."""
        self._blind = True
        self._index = _Places({})
        self._unsynced = False  # rows appended since the last checkpoint, not yet fsynced
        self._files: dict[Path, None] = {}  # files of rounds without a checkpoint file, for the next one to sync
        self._targets: dict[int, _Target] = {}
        """Per recipients (a round record's places, by ``id``): places here and expectations, until a checkpoint."""
        self._rng: tuple[object, str] | None = None
        """The random source's last state and its JSON."""
        self.round: int | None = None
        """The round of the last checkpoint written (``None`` before the first)."""
        folder.mkdir(parents=True, exist_ok=True)
        table = folder / MESSAGES
        if restored is None:
            open_own(table, os.O_WRONLY | os.O_CREAT | os.O_TRUNC).close()
            return
        truncate_lines(table, len(restored.rows))
        for number, stale in numbered(folder, "round"):  # past the restored round: what this run now writes again
            if number > restored.round:
                stale.unlink()
        self.round = restored.round  # the next write is a full snapshot: nothing is expected yet
        for message in restored.rows:
            self._rows[id(message)] = len(self._held)
            self._held.append(message)

    def continue_after(self, env: Environment, restored: Restored) -> None:
        """Hold the marks the restored run's writer held after its checkpoint: a resumed run writes the same files."""
        held = len(self._held)
        self._role_index(env)
        self._env_parts(env, self._pending_rows, full=True)
        list(self._role_entries(env, self._pending_rows, replayed=False))  # the marks it makes
        if self._pending_rows:  # a message the table lacks: then no delta could refer to it, start afresh
            for message in self._held[held:]:
                del self._rows[id(message)]
            del self._held[held:]
            self._pending_rows.clear()
            self._full_round = None
            return
        self._records = env.record_reader()  # as the first note of the run did
        self._noted_history = len(env.history)
        self._full_round, self._deltas = restored.full_round, restored.deltas
        self._blind = False

    def note(self, env: Environment) -> None:
        """Take in the round that just ran (its turns and deliveries); idempotent: :meth:`write` calls it too."""
        self._role_index(env)
        if self._records is None:  # the records kept so far, if their turns were, and every one from now on
            self._blind = self._blind or env.record is None or env.record.steps is None
            self._records = env.record_reader(from_start=True)
            self._blind = self._blind or self._records.missed
        if env.interventions:
            self._blind = True  # a hook may have changed or dropped a delivery: replay would differ
        for record in self._records.take():
            if record.steps is None:
                self._blind = True  # its turns were not kept
            elif record.steps:
                if self._deliveries:  # an earlier round's deliveries come before this round's turns (code 2)
                    self._ops += (2, len(self._deliveries))
                self._note_turns(record.steps)
            self._note_deliveries(env, record)
        self._note_deliveries(env, None)  # what the records do not hold (kept from the first note on)
        self.write_rows()

    def write_rows(self) -> None:
        """Append the rows noted so far: written as the rounds go, synced by the checkpoint that names them."""
        if self._pending_rows:
            append_text(self.folder / MESSAGES, self._pending_rows)
            self._pending_rows.clear()
            self._unsynced = True

    def write(self, env: Environment, *, after: Sequence[Path] = ()) -> Path:
        """Write the checkpoint of ``env``'s round (between rounds), once the files ``after`` are durable."""
        self.note(env)
        full, parts = self.begin(env)
        new_rows = self._pending_rows
        parts.extend(self._env_parts(env, new_rows, full=full))
        self._blind = self._blind or not self.replay
        if not full and not self._blind:
            parts.append(f'"ops":{numbers_json(self._ops)}')
        roles = self._role_entries(env, new_rows, replayed=not (full or self._blind))
        self._blind = False
        return self._finish(env, parts, after, roles=roles)

    def note_history(self, env: Environment) -> None:
        """Give the messages the history grew by since the last note their rows (a sharded round not written).

        They are encoded and appended to the message table now, while the shards run the next round,
        not all at once when a checkpoint is due (rows past the last checkpoint's are cut on resume).
        """
        history = env.history
        if len(history) > self._noted_history:
            self._rows_of(history.storage[self._noted_history :], self._pending_rows)
        self._noted_history = len(history)
        self.write_rows()

    def write_driver(self, env: Environment, roles: list[Role], shards: list[str], after: Sequence[Path] = ()) -> Path:
        """Write a sharded round's driver file: the environment, the driver's own ``roles`` and the shards' parts.

        ``shards`` are the folders (relative to this writer's) where each shard just wrote its part
        (``record.parts``); this file, written last, is what makes the round's checkpoint complete.
        """
        full, parts = self.begin(env, SHARDED)
        names = {role.name for role in roles}
        self._roles = {name: mark for name, mark in self._roles.items() if name in names}  # the others: the parts'
        self.forget_expectations()
        rows = self._pending_rows
        parts.extend(self._env_parts(env, rows, full=full, appended=True))
        entries = [entry for entry in (self._role_entry(role, rows) for role in roles) if entry]
        parts.append(f'"roles":{{{",".join(entries)}}},"parts":{json.dumps(shards)}')
        self._noted_history = len(env.history)
        self._blind = True  # a later delta written in one process lists every role whole
        return self._finish(env, parts, after)

    def full_next(self) -> bool:
        """Whether the next checkpoint written is a full snapshot (the first, and one every ``every``)."""
        return self._full_round is None or self._deltas >= self.every - 1

    def begin(self, env: Environment, version: int = FORMAT) -> tuple[bool, list[str]]:
        """Whether the checkpoint of ``env``'s round is a full snapshot (which forgets every mark), and its head."""
        full = self.full_next()
        self._deltas = 0 if full else self._deltas + 1
        if full:
            self._full_round = env.round
            self._roles.clear()
            self.forget_expectations()
            self._env = _EnvMark()
        kind = '"full"' if full else f'"delta","after":{self.round}'  # a delta names the checkpoint it follows
        return full, [f'"version":{version},"round":{env.round},"kind":{kind}']

    def _finish(
        self, env: Environment, parts: list[str], after: Sequence[Path] = (), *, roles: Iterator[str] | None = None
    ) -> Path:
        """Write the round file once ``after`` (the round's event log) and the message rows are durable: complete.

        ``roles``: the role entries, made and written piece by piece after ``parts`` (a million roles'
        entries are hundreds of megabytes: never held at once, let alone joined into the whole file);
        the rows they add to the message table are appended after them, before the table is synced.
        """
        self._ops.clear()
        self._deliveries.clear()
        path = round_file(self.folder, env.round)
        if roles is None:
            rows_part = f'"rows":{len(self._held)}'
            self.write_rows()
            rows = [self.folder / MESSAGES] if self._unsynced else []
            text: str | Iterator[str] = "{" + ",".join([*parts, rows_part]) + "}\n"
        else:
            rows = [self.folder / MESSAGES]
            text = _pieces("{" + ",".join(parts) + ',"roles":{', roles, self._rows_written)
        files = [*dict.fromkeys([*self._files, *after]), *rows]
        write_atomic(path, text, after=files, sync_name=self.each_name)
        self._unsynced, self._names_unsynced, self._files = False, not self.each_name, {}
        self.round = env.round
        return path

    def _rows_written(self) -> str:
        """The round file's end once its role entries are written: their new rows appended, then counted."""
        self.write_rows()
        return f'}},"rows":{len(self._held)}}}\n'

    def hold(self, files: Sequence[Path]) -> None:
        """Files a round without a checkpoint file wrote unsynced: the next checkpoint makes them durable first."""
        self._files.update(dict.fromkeys(files))

    def sync_names(self, *, by: list[Path] | None = None) -> None:
        """Sync the folder once, so round files are found by name after a power cut; or add it to ``by`` (to sync)."""
        if self._names_unsynced:
            if by is None:
                sync_dir(self.folder)
            else:
                by.append(self.folder)
            self._names_unsynced = False

    # -- what the bus did -----------------------------------------------------------------------

    def _role_index(self, env: Environment) -> _Places:
        if self._index.roles is not env.roles:
            self._index, self._targets = _Places(env.roles), {}
        return self._index

    def _note_turns(self, steps: Steps) -> None:
        """Record the default turns of replayable roles: observe (code 0), act (code 1 with its row)."""
        expect, index, ops, rows = self._expect, self._index, self._ops, self._rows
        if not expect:  # none is expected of any role (before the first checkpoint): no turn to record
            return
        for kind, name, detail, remembered in zip(steps.kind, steps.role, steps.detail, steps.remembered, strict=True):
            if kind == "observe":
                expected = expect.get(name)
                if expected is not None:
                    ops += (0, index[name])
                    expected.remembered += remembered
                    expected.buffered, expected.last, expected.news = 0, None, detail
            elif kind == "act" and (expected := expect.get(name)) is not None:
                if detail is None:
                    ops += (1, index[name], -1)
                else:
                    row = rows.get(id(detail))
                    ops += (1, index[name], self._new_row(detail, self._pending_rows) if row is None else row)
                    expected.remembered += 1

    def _note_deliveries(self, env: Environment, record: RoundRecord | None) -> None:
        """Record each message published since the last note with the roles it reached (``record``: the round's).

        Without the round's record (a round was not noted), routing gives them, as the address index is now.
        When the next checkpoint is a full snapshot (the run's first, and every ``every``-th), it writes the
        history whole and reads no deliveries: the messages only get their rows, in the same order.
        """
        history = env.history
        if len(history) <= self._noted_history:
            self._noted_history = len(history)
            return
        if record is not None and not record.published:
            return
        delivered: Sequence[Recipients] | None = None
        if record is not None:
            messages, delivered = record.published, record.recipients
            if len(messages) > len(history) - self._noted_history:
                return  # an edited history: the checkpoint writes it whole
        else:
            messages = history.storage[self._noted_history :]
        if self.full_next():
            self._numbered(messages, self._pending_rows)
        else:
            self._note_reached(env, messages, [env.places(m) for m in messages] if delivered is None else delivered)
        self._noted_history += len(messages)

    def _note_reached(self, env: Environment, messages: Sequence[Message], delivered: Sequence[Recipients]) -> None:
        """Add each message's row and the places it reached to the deliveries; what replayable recipients now hold."""
        out, rows, targets = self._deliveries, self._rows, self._targets
        for message, recipients in zip(messages, delivered, strict=True):
            row = rows.get(id(message))
            out += (self._new_row(message, self._pending_rows) if row is None else row, len(recipients))
            known = targets.get(id(recipients))
            if known is None or known.recipients is not recipients:
                known = self._target(recipients, env.name_at)
            out += known.places
            for expected in known.expected:  # the buffer a replay gives each replayable recipient
                expected.buffered += 1
                expected.last = message

    def _target(self, recipients: Recipients, name_at: Callable[[int], str]) -> _Target:
        """The places of ``recipients`` (a round record's) here and the replayable ones' expectations.

        Kept per object (the record's places: one per set of addresses while the address book stays).
        """
        if len(self._targets) >= 1 << 18:
            self._targets.clear()
        index = self._index
        names = names_of(recipients, name_at)
        places = [index[name] for name in names]
        expected = [e for e in map(self._expected, names) if e is not None]
        known = self._targets[id(recipients)] = _Target(recipients, places, expected)
        return known

    def _expected(self, name: str) -> Expected | None:
        """What the writer expects of the role ``name``; a replayable one new since the last checkpoint: as built.

        A role with neither an expectation nor a mark did not exist at the last checkpoint (a
        population built it since: ``Bus.add_cast``); a restore builds it as its cast does, so the
        ops replayed from then on give it what they give a new role (else its entry is written).
        """
        expected = self._expect.get(name)
        if expected is None and self.replay and name not in self._roles and self._full_round is not None:
            role = self._index.roles[name]
            if replayable(role):
                rc = role.rc
                expected = self._expect[name] = Expected(news=rc.news, watching=len(rc.watch), addresses=role.addresses)
        return expected

    # -- the environment -------------------------------------------------------------------------

    def _env_parts(self, env: Environment, new_rows: list[str], *, full: bool, appended: bool = False) -> list[str]:
        mark, history = self._env, env.history
        parts = [f'"rng":{self._rng_json(env)},"id_key":{json.dumps(env.id_key)}']
        if full or history.edits != mark.edits or len(history) < mark.history:
            parts.append(f'"history":{self._rows_of(history, new_rows)}')
            self._blind = self._blind or not full  # an edited history: the deliveries do not tell the story
        elif appended:  # a sharded round: the shards delivered; the history grew by these
            parts.append(f'"history_add":{self._rows_of(history.storage[mark.history :], new_rows)}')
        else:
            parts.append(f'"deliveries":{numbers_json(self._deliveries)}')
        dead = env.dead_letters[mark.dead_letters :]
        parts.append(f'"dead_letters_add":{self._rows_of(dead, new_rows)}')
        events = [e.model_dump(mode="json") for e in env.events[mark.events :]]
        ledger = [e.saved() for e in env.ledger.entries[mark.ledger :]]
        parts.append(f'"events_add":{json.dumps(events)},"ledger_add":{json.dumps(ledger)}')
        self._env = _EnvMark(
            len(history), history.edits, len(env.dead_letters), len(env.events), len(env.ledger.entries)
        )
        return parts

    def _rng_json(self, env: Environment) -> str:
        """The random source's state as JSON, encoded again only when it moved (a round that draws nothing: 5 µs)."""
        state = env.rng.getstate()
        if self._rng is None or self._rng[0] != state:
            self._rng = (state, json.dumps(rng_state(env.rng)))
        return self._rng[1]

    # -- roles ----------------------------------------------------------------------------------

    def forget_expectations(self) -> None:
        """Drop what the writer expects of every replayable role (and the recipients' lists that point at it)."""
        self._expect.clear()
        self._targets = {}

    def _role_entries(self, env: Environment, new_rows: list[str], *, replayed: bool) -> Iterator[str]:
        """Entries for the roles a replay of ``ops`` and ``deliveries`` would not rebuild exactly, as written.

        Made one by one as the file is written: a million roles' entries are never held at once.
        Expectations are renewed in place: the recipients' lists (:meth:`_target`) hold them across rounds.
        """
        expect, changed = self._expect, False
        for role in env.built_roles():  # one a population has not built is as its cast builds it: no entry
            expected = expect.get(role.name)
            if replayed and expected is not None and replays(role, expected):
                continue
            if expected is not None:
                self._roles.pop(role.name, None)  # its mark predates the replayed rounds: write it whole
            entry = self._role_entry(role, new_rows)
            if entry:
                yield entry
            if self.replay and replayable(role):
                if expected is None:
                    expect[role.name], changed = Expected().take(role), True
                else:
                    expected.take(role)
            elif expect.pop(role.name, None) is not None:
                changed = True
        if changed:
            self._targets = {}

    def _role_entry(self, role: Role, new_rows: list[str]) -> str:
        """The role's JSON entry (``"name":{...}``) if it changed since the last checkpoint, else ``""``.

        Runs once per role per round, so it compares a few counters instead of contents: memory
        and working memory only ever grow between two checkpoints unless their edit counter moved.
        """
        rc = role.rc
        memory, working = rc.memory, rc.working_so_far
        if type(memory) is not Memory or role.brain_memory is not None or role.keeps_extra_state:
            self._roles.pop(role.name, None)  # long-term/brain memory or extra state: the role's full state each time
            return f'{self._enc(role.name)}:{{"state_dict":{role.state_dict().model_dump_json()}}}'
        buffer, news = rc.msg_buffer.peek_all(), rc.news
        size, edits, state, watch, addresses = len(memory), memory.edits, rc.state, rc.watch, role.addresses
        mark = self._roles.get(role.name)
        if (
            mark is not None
            and not buffer
            and mark.news is news
            and (mark.size, mark.edits, mark.state) == (size, edits, state)
            and (mark.working, mark.working_edits) == (len(working), working.edits)
            and mark.watch == watch
            and mark.addresses is addresses
        ):
            return ""
        parts, watched = self._changed_parts(role, mark, buffer, new_rows)
        self._roles[role.name] = _RoleMark(
            size, edits, state, len(working), working.edits, watched, addresses, None if buffer else news
        )
        return f"{self._enc(role.name)}:{{{','.join(parts)}}}"

    def _changed_parts(
        self, role: Role, mark: _RoleMark | None, buffer: list[Message], new_rows: list[str]
    ) -> tuple[list[str], frozenset[str]]:
        """The JSON fields of a role entry: buffer, news and stage always, the rest when it changed."""
        rc, rows = role.rc, self._rows_of
        memory, working, watch, addresses, news = rc.memory, rc.working_so_far, rc.watch, role.addresses, rc.news
        size, edits = len(memory), memory.edits
        held = f'"buffer":{rows(buffer, new_rows) if buffer else "[]"},"news":{rows(news, new_rows) if news else "[]"}'
        parts = [f'{held},"state":{rc.state}']
        if mark is None or edits != mark.edits or size < mark.size:
            cls = type(role)
            parts.append(f'"cls":{self._enc(f"{cls.__module__}.{cls.__qualname__}")},"memory":{rows(memory, new_rows)}')
        elif size > mark.size:
            parts.append(f'"memory_add":{rows(memory.get(size - mark.size), new_rows)}')
        if mark is None or (len(working), working.edits) != (mark.working, mark.working_edits):
            parts.append(f'"working_memory":{rows(working, new_rows) if working else "[]"}')
        watched = frozenset(watch) if mark is None or mark.watch != watch else mark.watch
        if mark is None or mark.watch != watch or mark.addresses is not addresses:
            parts.append(f'"watch":{_names_json(watch)},"addresses":{_names_json(addresses)}')
        return parts, watched


def _names_json(names: Iterable[str]) -> str:
    """``names`` sorted, as ``json.dumps`` writes a list of them (its separators, ASCII escapes), less its overhead."""
    return f"[{', '.join(map(encode_basestring_ascii, sorted(names)))}]"


def _pieces(head: str, entries: Iterator[str], tail: Callable[[], str]) -> Iterator[str]:
    """``head``, the ``entries`` comma-separated, then ``tail()``, asked after them."""
    yield head
    for at, entry in enumerate(entries):
        yield "," + entry if at else entry
    yield tail()


def fresh_writer(folder: Path) -> CheckpointWriter:
    """A writer for a new run's checkpoints in ``folder``, which must not hold a run already."""
    if any(folder.glob("round-*.json")):
        raise ConfigError(
            f"checkpoint folder {str(folder)!r} already holds a run; resume it (Team.resume) or pass an empty folder"
        )
    return CheckpointWriter(folder)
