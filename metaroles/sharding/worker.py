"""A shard of a sharded run: the roles it was given, run a round at a time, and the requests that reach it.

Roles travel pickled (``sharding.transfer``). A :class:`ShardHost` answers the driver's requests
(``sharding.shardset``: a round, its part of a checkpoint, a measure, the roles' return): each first
delivers what reached it since its last call. A round runs its ready roles with the worker pool and
routes what they published: a message for roles of this shard stays here (delivered before the next
round), one for roles elsewhere goes in that shard's part (one batch per shard and round), and the
driver gets the whole outbox for the history and the log (``sharding.driver`` has the driver's
side). Every message is delivered in the one-process order: the round's messages of all sources
merged by the publishing role's place. :class:`LocalShards` runs shards in this process;
``sharding.ray`` runs each as a Ray actor.
"""

from __future__ import annotations

import pickle
import time
from array import array
from collections.abc import Collection, Coroutine, Iterable, Sequence
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any

from metaroles.bus.environment import Environment, Round
from metaroles.bus.record import NOTHING_SAID, Said, Steps, said_by
from metaroles.bus.role import Role
from metaroles.bus.routing import reach
from metaroles.core.heap import paused_gc
from metaroles.messages.message import Message, share_recipients
from metaroles.record.checkpoint import CheckpointWriter
from metaroles.record.parts import part_writer
from metaroles.sharding.crossing import OutboxReader, OutboxWriter
from metaroles.sharding.shardset import (
    Addresses,
    Checkpoint,
    Delivery,
    Entry,
    Measure,
    Measured,
    OutboxEntry,
    Release,
    Released,
    Reply,
    Request,
    RoundDone,
    RoundResult,
    RunRound,
    Seen,
)
from metaroles.sharding.transfer import RolesOut, fingerprint, loads_roles

DRIVER = -1
"""Where a role pinned to the driver lives (in the address map)."""

DEAD, PINNED = 1, 2
"""Flags of an outbox entry: the message reaches no role; it reaches a role on the driver."""

_MAX_REMEMBERED = 1 << 18
"""Sets of recipients whose shards a shard remembers at most (then it starts afresh)."""


def targets(send_to: frozenset[str] | set[str], addresses: Addresses) -> Collection[int]:
    """The shards (``DRIVER`` included) with a recipient of a message sent to ``send_to`` (the bus's :func:`reach`)."""
    where, everyone = addresses
    return reach(send_to, where, everyone, lambda several: {shard for a in several for shard in where.get(a, ())})


_MESSAGE, _SEND_TO = itemgetter(1), attrgetter("send_to")


def interned(entries: Iterable[tuple[Any, ...]], sets: dict[frozenset[str], frozenset[str]]) -> None:
    """Let the messages of ``entries`` (``(rank, message, ...)``) share one object per set of recipients.

    A copy from another process brings its own ``send_to``; a sender writes to the same recipients
    round after round, so one set per sender is kept (``sets``), not one per message.
    """
    if len(sets) >= _MAX_REMEMBERED:
        sets.clear()
    share_recipients(map(_MESSAGE, entries), sets)


class _ActionRef:
    """An action known by id only (a remote turn's ``think`` step)."""

    __slots__ = ("cause_by",)

    def __init__(self, action_id: str) -> None:
        self.cause_by = action_id


# -- a shard -------------------------------------------------------------------------------------------


class ShardHost:
    """A shard: the roles it was given, in an Environment of their own, run a round at a time.

    Args:
        total: How many roles the whole run has (what others publish ranks after them all).
        concurrency: Roles mid-turn at once on this shard.
        shards: How many shards the run has.
        number: Which of them this is.
        key: The run's id key (``Environment.id_key``); the shard's environment takes it and seeds its
            random source from it, so its part of a checkpoint is the same in every process.
        pickler: What pickles the roles it gives back (a cluster's: one that takes a notebook's classes by value).
    """

    def __init__(
        self,
        *,
        total: int,
        key: str,
        concurrency: int = 32,
        shards: int = 1,
        number: int = 0,
        pickler: type[pickle.Pickler] = pickle.Pickler,
    ) -> None:
        """Create an empty shard."""
        self.pickler = pickler
        self.shards = shards
        self.number = number
        self.env = Environment(concurrency=concurrency, on_role_error="record")
        self.env.set_id_key(key)
        self.env.rng.seed(key)
        self.total = total
        self.readdressed: dict[str, list[str]] = {}
        self.env.reindex = self._reindexed  # type: ignore[method-assign]
        self.addresses: Addresses = ({}, ())
        self._targets: dict[frozenset[str], tuple[int, ...]] = {}
        """The shards of each set of recipients met so far (forgotten when the address map changes)."""
        self._sets: dict[frozenset[str], frozenset[str]] = {}
        """One object per set of recipients that crossed from another shard (see :func:`interned`)."""
        self.held: list[tuple[int, Message]] = []
        self.known: dict[str, Message] = {}
        """Messages the driver's history holds, by id (they go back by id)."""
        self.writer: CheckpointWriter | None = None
        """This shard's writer of its checkpoint parts."""
        self.out: RolesOut | None = None
        """The roles on their way back (:meth:`release`)."""
        self.seated = array("q", bytes(8 * total))
        """By place: the ``fingerprint`` of a role this shard built from its seat (``sharding.cast``), else 0."""
        self.ahead: dict[int, bytes] = {}
        """Pieces made before they were asked for (:meth:`release_more`)."""
        self._out = [OutboxWriter() for _ in range(shards)]
        self._in = [OutboxReader() for _ in range(shards)]
        """Per other shard, the parts sent to it and read from it (``sharding.crossing``: recipients sent once)."""

    def _reindexed(self, role: Role) -> None:
        """A role here changed its addresses: index them, and tell the driver with the round's result."""
        Environment.reindex(self.env, role)
        self.readdressed[role.name] = sorted(role.addresses)

    def load(self, data: bytes, addresses: Addresses) -> int:
        """Host the roles ``dumps_roles`` pickled (a ``sharding.cast.Seat`` is built here); return how many are ready.

        A model with limits (``LimitedLLM``) keeps to this shard's share of them, so the cluster
        as a whole stays within what the user set.
        """
        env, seated = self.env, self.seated
        self.addresses = addresses
        roles = []
        for role in loads_roles(data, env, known=self.known):
            if not isinstance(role, Role):
                role = role.build(env)
                seated[role.place] = fingerprint(role)
            roles.append(role)
        env.drive.adopt_roles(roles, total=self.total)
        shared: dict[int, Any] = {}
        for role in roles:
            for llm in (role.llm, *(action.llm for action in role.actions)):
                if hasattr(llm, "shard_share"):
                    shared[id(llm)] = llm
        for llm in shared.values():
            llm.shard_share(self.shards)
        return env.ready_count

    def take(self, delivery: Delivery, broadcasts: Sequence[Message], parts: Sequence[bytes]) -> None:
        """Deliver ``delivery`` (its ``parts`` unpickled), in the one-process order."""
        if delivery.addresses is not None:
            self.addresses = delivery.addresses
            self._targets = {}
        held, self.held = self.held, []
        crossed: dict[int, list[OutboxEntry]] = {}
        for source, part in zip(delivery.sources, parts, strict=True):
            crossed.setdefault(source, []).extend(self._crossed(source, part))
        if delivery.ranked is not None:  # else the driver routed the round: what was held or crossed is dropped
            flush: list[tuple[Any, ...]] = list(delivery.ranked)
            for shard in range(self.shards):  # the driver's first, then each shard's: as the driver merges
                flush += held if shard == self.number else crossed.get(shard, ())
            flush.sort(key=itemgetter(0))
            self.deliver([entry[1] for entry in flush], ())
        self.deliver(delivery.inbox, broadcasts)

    def _crossed(self, source: int, part: bytes) -> list[OutboxEntry]:
        """The part of ``source``'s outbox for this shard (read even when dropped: the numbering of its sets)."""
        with paused_gc():
            crossed = self._in[source].outbox(pickle.loads(part))
        interned(crossed, self._sets)
        return crossed

    def deliver(self, inbox: Sequence[Entry], broadcasts: Sequence[Message]) -> None:
        """Put messages into the buffers of this shard's recipients, in order."""
        env = self.env
        route, roles, known = env.route, env.roles, self.known
        messages: list[Message] = []
        for entry in inbox:
            if type(entry) is int:
                message = broadcasts[entry]
            elif type(entry) is tuple:  # to one role (an intervention decided it): after what came before it
                env.push_all(messages, map(route, map(_SEND_TO, messages)))
                messages = []
                roles[entry[1]].put_message(entry[0])
                continue
            else:
                message = entry  # type: ignore[assignment]
            known[message.id] = message
            messages.append(message)
        env.push_all(messages, map(route, map(_SEND_TO, messages)))

    async def answer(self, request: Request, broadcasts: Sequence[Message], parts: Sequence[bytes]) -> Reply:
        """Deliver what reached the shard (``request.delivery``, its ``parts`` unpickled), then what ``request`` asks.

        A :class:`RunRound`'s reply holds, per shard, the part of the outbox for its roles (as
        ``sharding.crossing`` columns; ``None``: nothing for that shard).
        """
        started = time.perf_counter()
        self.take(request.delivery, broadcasts, parts)
        if type(request) is RunRound:
            return await self._run_round(request, started)
        if type(request) is Checkpoint:
            if self.writer is None or str(self.writer.folder) != request.folder:
                self.writer = part_writer(Path(request.folder), self.known)
            self.env.round = request.round
            self.writer.write(self.env)
            return self.env.ready_count
        if type(request) is Measure:
            return Measured(request.fn(list(self.env.members)), self.env.ready_count)
        assert type(request) is Release, f"a shard answers a RunRound, Checkpoint, Measure or Release, not {request!r}"
        seated = self.seated if request.by_state else None
        out = RolesOut(self.env, self.env.members, self.pickler, known=self.known, piece=request.piece, seated=seated)
        self.out, self.ahead = out, {}
        return Released(out.next(), out.pieces)

    async def _run_round(self, request: RunRound, started: float) -> RoundDone:
        """Run the round's turns of this shard's ready roles (the bus's round loop); route what they published."""
        env, way = self.env, _ShardRound(self, request)
        await env.run_round(way)
        outbox, crossing, flagged = way.routed
        result = RoundResult(
            outbox=outbox,
            flagged=flagged,
            ledger=way.calls,
            failures=[(role.place, type(exc).__name__, str(exc), repr(exc)) for role, exc in way.failures],
            ready=env.ready_count,
            held=len(self.held),
            crossing=[len(part) for part in crossing],
            readdressed=self.readdressed,
            busy_s=time.perf_counter() - started,
        )
        self.readdressed = {}
        if request.steps:
            assert env.recorded is not None and env.recorded.steps is not None
            result.steps = _portable(env.recorded.steps)  # the shard's part of the round's record
        return RoundDone(result, [self._out[n].columns(part) if part else None for n, part in enumerate(crossing)])

    def route_published(
        self, pending: list[tuple[int, Message]], *, said: bool = False
    ) -> tuple[list[OutboxEntry], list[list[OutboxEntry]], int]:
        """The round's outbox (``pending``, in delivery order), flagged; what stays here is held, the rest by shard.

        ``said``: each entry carries what its sender said of it (``bus.record.said_by``). Also returns how many
        entries are flagged (the driver merges a round without any behind the next).
        """
        addresses, number, held, known, historic = self.addresses, self.number, self.held, self._targets, self.known
        crossing: list[list[OutboxEntry]] = [[] for _ in range(self.shards)]
        outbox: list[OutboxEntry] = []
        flagged, roles, senders = 0, self.env.roles, dict[str, Said]()
        for rank, message in pending:
            what = senders.get(message.sent_from) if said else NOTHING_SAID  # once per sender: a fan-out costs it once
            if what is None:
                sender = roles.get(message.sent_from)
                what = senders[message.sent_from] = NOTHING_SAID if sender is None else said_by(sender)
            historic[message.id] = message  # the driver's history will hold it
            flag = 0
            shards = known.get(message.send_to)
            if shards is None:  # a role sends to the same recipients round after round: once per recipients
                if len(known) >= _MAX_REMEMBERED:
                    known.clear()
                shards = known[message.send_to] = tuple(targets(message.send_to, addresses))
            if not shards:
                flag = DEAD
            for shard in shards:
                if shard == number:
                    held.append((rank, message))
                elif shard == DRIVER:
                    flag = PINNED
                else:
                    crossing[shard].append((rank, message, 0, NOTHING_SAID))
            outbox.append((rank, message, flag, what))
            flagged += flag != 0
        return outbox, crossing, flagged

    def release_more(self, number: int) -> bytes:
        """Piece ``number`` (the first is 0) of the roles a :class:`Release` gives back.

        One pickler makes the pieces, so they are made in their order whatever order they are asked
        in: an async Ray actor may run calls submitted together out of order, and a piece read
        before the one it follows names objects its reader has not met.
        """
        out = self.out
        assert out is not None and 0 < number < out.pieces, f"piece {number}: release first; pieces number 1 to n-1"
        while number not in self.ahead:
            made = out.at // out.piece
            assert made <= number, f"piece {number} was given already"
            self.ahead[made] = out.next()
        return self.ahead.pop(number)


class _ShardRound:
    """A shard's way through the bus's round loop (``Environment.run_round``): its round's number, its delivery.

    Its delivery routes what the round published (:meth:`ShardHost.route_published`): held here for its own
    roles, or in the part of each shard with a recipient; the round's model calls and failures go to
    the driver with its result.
    """

    cut_short_ends = False  # a shard lost mid-round: the driver stops the run at its last checkpoint
    behind = False

    def __init__(self, host: ShardHost, request: RunRound) -> None:
        self.host, self.steps, self.number, self.said = host, request.steps, request.round, request.said
        self.routed: tuple[list[OutboxEntry], list[list[OutboxEntry]], int] = ([], [], 0)
        self.calls: list[Any] = []
        self.failures: list[tuple[Role, Exception]] = []

    def begin(self) -> None:
        if self.steps:
            self.host.env.keep_records(steps=True)

    def turns(self, this: Round) -> Coroutine[Any, Any, None]:
        return this.run_turns()

    def deliver(self, this: Round) -> None:
        entries, spent = self.host.env.ledger.entries, this.spent[0]
        self.calls, self.failures = entries[spent:], this.failures
        del entries[spent:]  # the driver's ledger holds them (before the record closes: it starts after them)
        self.routed = self.host.route_published(this.take_published(), said=self.said)


def _portable(steps: Steps) -> Steps:
    """Turn steps the driver's event log reads: messages and actions by id where it needs only that."""
    steps.map_details("observe", lambda news: [Seen(m.id) for m in news])
    steps.map_details("think", lambda action: None if action is None else _ActionRef(action.cause_by))
    return steps
