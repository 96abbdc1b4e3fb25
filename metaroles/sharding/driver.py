"""One Environment's roles on several shards, run in lock-step so the run is the one-process run.

The driver (the process that holds the Team) keeps the bus: the history, the address index, dead
letters, events, the ledger, interventions and the roles pinned to it. Every other role goes to
a shard when the run starts — built there if a cast made it (``sharding.cast``), else shipped pickled
(``sharding.transfer``) — and the driver keeps a stand-in
(:class:`RemoteRole`: name, addresses, place). A round is one call per shard (``sharding.worker``):
the shard delivers what reached it — what it kept for its own roles, the parts other shards sent
it, the driver's own messages — merged by the publishing role's place, runs its ready roles, and
routes what they published itself. The driver merges the outboxes in that same order into the
history, records dead letters and delivers to its own roles; when an address changed in the round
or interventions decide per recipient, it routes the whole round itself instead (the shards then
drop their own routing). Ids depend on the run, the round and the role's place (``core.ids``), so
every file of the run directory is the one-process run's, byte for byte; each shard writes its
roles' part of a checkpoint (``record.parts``), and a run resumes on any number of shards.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from metaroles.bus.environment import Environment, Round
from metaroles.bus.role import Role
from metaroles.bus.routing import Member
from metaroles.core.exceptions import RunError
from metaroles.core.heap import paused_gc
from metaroles.messages.message import Message
from metaroles.record.eventlog import EventLog
from metaroles.record.parts import part_name
from metaroles.sharding import transfer
from metaroles.sharding.backends import each_of
from metaroles.sharding.merging import Backlog, own_messages, route_all, take_in
from metaroles.sharding.shardset import (
    Checkpoint,
    Delivery,
    Entry,
    Measure,
    Measured,
    OutboxEntry,
    Release,
    Released,
    RoundDone,
    RunRound,
    Sent,
    ShardSet,
    shared_broadcasts,
)
from metaroles.sharding.standins import RemoteRole, _first, _remote_failure
from metaroles.sharding.transfer import RolesIn, dumps_roles
from metaroles.sharding.worker import DRIVER, interned

__all__ = ["RemoteRole", "ShardedRun"]


def _nothing() -> None: ...


def _shipped(role: Role) -> None:
    """No seat: the role is shipped as it is."""
    return None


@dataclass(slots=True)
class _Round:
    """A sharded round while it runs: the shards' calls, what failed meanwhile, their results."""

    sent: Sent
    failed: list[BaseException] = field(default_factory=list)
    results: list[RoundDone | None] = field(default_factory=list)
    moved: bool = False
    """Whether an address changed in the round (the driver then routes it)."""


class ShardedRun:
    """The driver's side of a sharded run: an Environment whose remote roles are stand-ins (:func:`sharded`)."""

    number = None  # as a RoundWay: the driver's next round
    cut_short_ends = False  # a shard lost, or recording the last round failed: the run stops at its checkpoint

    def __init__(
        self,
        env: Environment,
        shards: ShardSet,
        places: list[int | None],
        seat: Callable[[Role], Any] | None = None,
    ) -> None:
        """Drive ``env`` on ``shards``; ``places`` gives each role's shard (``None``: the driver).

        ``seat(role)`` says how a shard builds ``role`` itself (``sharding.cast``), or ``None``: it is shipped
        (without ``seat``, every role is).
        """
        self.env, self.shards, self.places = env, shards, places
        self._seat: Callable[[Role], Any] = seat or _shipped
        self.kept: dict[int, Role] = {}
        """By place, roles of this process that come back as their state (``transfer``; see :func:`sharded`)."""
        self.inboxes: list[list[Entry]] = [[] for _ in range(shards.count)]
        self.ready = [0] * shards.count
        self.held = [0] * shards.count
        """Messages each shard keeps for its own roles from the last round (delivered before the next)."""
        self.ranked: list[list[tuple[int, Message]]] | None = None
        """When the shards routed the last round: the driver's own messages for each, by rank."""
        self.crossing: list[list[tuple[int, Any]]] = [[] for _ in range(shards.count)]
        """Per shard, ``(source shard, handle)`` of the parts other shards' outboxes hold for it."""
        self._moved = False
        """Whether the address map changed since the shards last had it."""
        self._sets: dict[frozenset[str], frozenset[str]] = {}
        self.broken = False
        self.spoke: set[str] = set()
        """The remote roles that published with news in the last round taken in (their stand-ins' ``is_idle``)."""
        self.said = self.steps = True
        """Whether shards send what each sender said of its messages (the log's ``caused_by``); and their turn steps."""
        self.where: dict[str, tuple[int, ...]] = {}
        """Address → the shards whose roles receive on it (``DRIVER`` for the driver's own roles)."""
        self._pinned: list[tuple[Role, frozenset[str]]] = []
        self.segment = env.round
        """The round this sharded stretch of the run started from (it names the checkpoint parts)."""
        self.stay = False
        """Leave the roles on their shards when the run ends (its last checkpoint holds them all)."""
        self.backlog = Backlog()
        """The rounds whose outboxes the history has not taken in yet, and when it takes them (:meth:`catch_up`)."""
        self.later: Callable[[], None] = _nothing
        """The rest of recording the last round (a Team's), run while the shards run the next: :meth:`take_later`."""
        self._round: _Round | None = None
        """The round that runs (between :meth:`begin` and :meth:`deliver`)."""
        self._settle: Callable[[], None] | None = None
        """What the first round does with the roles shipped at open: collect those dropped, or keep those kept."""

    @property
    def shard_map(self) -> dict[str, int | None]:
        """Role name → its shard (``None``: the driver)."""
        return {role.name: place for role, place in zip(self.env.members, self.places, strict=True)}

    async def open(self) -> None:
        """Ship every remote role to its shard (or how to build it there) and put stand-ins in their places."""
        env, count, seat = self.env, self.shards.count, self._seat
        total = len(env.members)
        self.shards.start(total=total, concurrency=env.concurrency, key=env.id_key)  # processes start meanwhile
        parts: list[list[Any]] = [[] for _ in range(count)]
        stand_ins: dict[int, Member] = {}
        with paused_gc():  # a stand-in and a seat per role, no cycles: collections would scan every role
            for role, place in zip(list(env.members), self.places, strict=True):
                if place is not None:
                    parts[place].append(seat(role) or role)
                    stand_ins[role.place] = RemoteRole(role, place, self.inboxes[place], self.spoke)
        history = env.history.keyed
        pickler = getattr(self.shards, "pickler", pickle.Pickler)  # Ray's shards carry cloudpickle's

        def pickled() -> Iterator[bytes]:  # one part at a time: a shard loads its part while the next is pickled
            for part in parts:
                with paused_gc():  # a pass over many roles: no garbage to find, and collections would scan them all
                    blob = dumps_roles(env, part, pickler, history=history)
                yield blob

        self._index_addresses()  # the same addresses as the stand-ins'
        self.ready = await self.shards.load(pickled(), addresses=(self.where, self._everyone))
        self._moved = False
        with paused_gc():
            env.drive.swap_roles(stand_ins)
        self._pinned = [(r, r.addresses) for r, p in zip(env.members, self.places, strict=True) if p is None]
        dropped = len(stand_ins) > len(self.kept)  # garbage cycles now, for a full pass; else nothing to find
        self._settle = partial(env.settle_heap, full=True) if dropped else env.keep_heap

    def _index_addresses(self) -> None:
        """Which shards receive on each address (rebuilt when a role changes its addresses)."""
        where: dict[str, set[int]] = {}
        shared: dict[tuple[int, ...], tuple[int, ...]] = {}  # one tuple per set of shards: every shard gets the map
        with paused_gc():  # a set per address, no cycles: collections would scan every role
            for role, place in zip(self.env.members, self.places, strict=True):
                for address in role.addresses:
                    where.setdefault(address, set()).add(DRIVER if place is None else place)
            self.where = {address: shared.setdefault(t := tuple(sorted(s)), t) for address, s in where.items()}
        self._pinned = [(r, r.addresses) for r, p in zip(self.env.members, self.places, strict=True) if p is None]
        self._everyone = tuple(sorted({DRIVER if p is None else p for p in self.places}))
        self._moved = True

    @property
    def is_idle(self) -> bool:
        """True when no role anywhere has anything buffered or on its way."""
        pending = any(self.inboxes) or any(self.held) or any(self.crossing) or any(self.ranked or ())
        return self.env.is_idle and not any(self.ready) and not pending

    def _take_deliveries(self) -> tuple[list[Delivery], list[Message]]:
        """What each shard is to deliver before its next round (or states, or roles); a broadcast once for all."""
        inboxes, broadcasts = shared_broadcasts(self.inboxes)
        addresses = (self.where, self._everyone) if self._moved else None
        ranked, crossing = self.ranked, self.crossing
        deliveries = [
            Delivery(
                inbox=inbox,
                ranked=None if ranked is None else ranked[shard],
                sources=[source for source, _ in crossing[shard]],
                crossed=[handle for _, handle in crossing[shard]],
                addresses=addresses,
            )
            for shard, inbox in enumerate(inboxes)
        ]
        self.ranked, self.crossing, self._moved = None, [[] for _ in inboxes], False
        return deliveries, broadcasts

    def take_later(self) -> Callable[[], None]:
        """:attr:`later`, handed over once (after that, there is nothing left to run)."""
        later, self.later = self.later, _nothing
        return later

    async def run_round(self) -> None:
        """Run one round on the driver and every shard; deliver as one process does (see the module).

        The bus's round loop runs it (``Environment.run_round``), this run being its way: :meth:`begin`,
        :meth:`turns`, :meth:`deliver`.
        """
        await self.env.run_round(self)

    @property
    def going(self) -> _Round:
        """The round that runs (between :meth:`begin` and :meth:`deliver`)."""
        assert self._round is not None, "no sharded round runs: Environment.run_round(this run) begins one"
        return self._round

    def begin(self) -> None:
        """Send each shard its round; while they work, what the last round left (:attr:`later`).

        If that fails, the error is raised once the shards have answered: the run stops and the shards'
        roles stay there (a resume starts from the last checkpoint).
        """
        self._round = _Round(self._send_round())
        try:
            self._meanwhile()
        except BaseException as exc:  # raised once the shards' calls are answered
            self.going.failed.append(exc)

    async def turns(self, this: Round) -> None:
        """The driver's roles take their turns as the shards' replies come; their results join the round."""
        going = self.going
        try:
            async with anyio.create_task_group() as tg:
                if this.ready and not going.failed:
                    tg.start_soon(this.run_turns)
                try:
                    going.results = await going.sent.replies()
                except Exception as exc:
                    raise self._lost(this.number, exc) from exc
        except BaseExceptionGroup as group:  # the driver's roles report their own errors: this is a shard's
            raise _first(group) from None
        if going.failed:
            self.broken = True  # the shards ran a round the driver did not take in: their roles stay there
            raise going.failed[0]
        with paused_gc():  # a round's worth of records, no cycles: collections would walk the whole history
            going.moved = self._merge(going.results, this.failures)

    @property
    def behind(self) -> bool:
        """Whether the round just delivered is still to be taken into the history (:meth:`catch_up`)."""
        return bool(self.backlog.rounds)

    def deliver(self, this: Round) -> None:
        """Deliver the round: left to the shards' routing, or the driver's (see :meth:`_route_round`)."""
        with paused_gc():
            self._route_round(this, self.going.results, self.going.moved)
        self.backlog.late = True  # what is still to take in belongs to the record that closes now

    def _send_round(self) -> Sent:
        """Send each shard with something to do its request for the next round."""
        env = self.env
        if env.in_round:
            raise RunError(f"round {env.round} of this environment is still running; await it before starting another")
        deliveries, broadcasts = self._take_deliveries()
        busy = [d if (d or self.ready[n] or self.held[n]) else None for n, d in enumerate(deliveries)]
        self.held = [0] * len(deliveries)
        steps = env.steps is not None and self.steps  # a checkpoint's steps are of no use here: shards write parts
        said, outbox, number = steps or self.said, self._reads_rounds, env.round + 1
        requests = [None if d is None else RunRound(d, number, steps, said, outbox) for d in busy]
        try:
            return self.shards.send(requests, broadcasts)
        except Exception as exc:
            raise self._lost(number, exc) from exc

    def _meanwhile(self) -> None:
        """While the shards work, before the round begins here: what the last round left to do."""
        if self._settle is not None:  # while the shards work, not before: the round's end freezes what is left
            settle, self._settle = self._settle, None
            settle()
        self.catch_up()
        self.take_later()()

    def _lost(self, round_no: int, exc: Exception) -> RunError:
        """The run's error for a shard that failed in round ``round_no``: the run is broken (it stops)."""
        self.broken = True
        first_line = (str(exc).strip().splitlines() or [""])[0][:200]
        return RunError(
            f"a shard failed in round {round_no} ({type(exc).__name__}: {first_line}); the run stops at its "
            "last checkpoint — resume it (metaroles resume DIR)"
        )

    def _route_round(self, this: Round, results: list[RoundDone | None], moved: bool) -> None:
        """Deliver the round: left to the shards' own routing, unless an address changed or interventions decide.

        Either way each shard gets the parts other shards' outboxes hold for it (it drops them when
        the driver routed the round, but reads them: they number the sets of recipients it is sent).
        """
        env = self.env
        for source, stepped in enumerate(results):
            for shard, handle in enumerate(() if stepped is None else stepped.outgoing):
                if handle is not None:
                    self.crossing[shard].append((source, handle))
        if any(role.addresses is not seen for role, seen in self._pinned):
            self._index_addresses()
            moved = True
        if not moved and not env.interventions:
            self._as_routed(this, results)
            return
        self.catch_up(force=True)  # the rounds before this one go first
        self.spoke.clear()
        for stepped in results:  # the shards' routing may be stale: the driver routes it all, as it would alone
            if stepped is not None:
                outbox = self._outbox_of(stepped)
                this.add_published((rank, message, said) for rank, message, _, said in outbox)
        if env.interventions:
            this.deliver_published()  # hooks decide per recipient: the bus routes to stand-ins one by one
        else:
            route_all(env, this, self.inboxes, (self.where, self._everyone))

    def _as_routed(self, this: Round, results: list[RoundDone | None]) -> None:
        """The round as the shards routed it: what each shard holds and sends, then the history (maybe behind)."""
        own, self.ranked = own_messages(this.take_published(), (self.where, self._everyone), self.shards.count)
        flagged = any(flag for _, _, flag, _ in own)
        for source, stepped in enumerate(results):
            if stepped is not None:
                flagged = flagged or stepped.result.flagged > 0
                self.held[source] = stepped.result.held
        self.backlog.rounds.append((own, results))
        self.backlog.late = False
        if (
            flagged or not self.backlog.behind
        ):  # a dead letter or a delivery to the driver's roles: the next round needs it
            self.catch_up(force=True)

    def catch_up(self, *, force: bool = False) -> None:
        """Take the rounds not taken in yet into the history: messages, dead letters, the driver's roles' deliveries.

        Behind (:class:`~metaroles.sharding.merging.Backlog`), a round without either is taken in while the
        shards run the next one (``run_round``'s ``later`` and everything that reads the history come after
        this); lazy (and no record kept), only when forced: the run closes, or a round needs it.
        The collector waits meanwhile (the messages hold no cycles), and what came in is frozen at once
        (``core.heap``): the round's own end then has only its own objects to walk, not 100,000 messages more.
        """
        backlog = self.backlog
        if not backlog.rounds or not (force or self._reads_rounds):
            return
        unmerged, backlog.rounds = backlog.rounds, []
        self.env.settle_heap()  # the garbage so far goes first: what comes in below lives on, and no pass walks it
        with paused_gc():
            for number, (merged, results) in enumerate(unmerged, 1):
                self.spoke.clear()
                for stepped in (s for s in results if s is not None):
                    merged += self._outbox_of(stepped)
                take_in(self.env, merged, late=backlog.late or number < len(unmerged))
        self.env.keep_heap()

    @property
    def _reads_rounds(self) -> bool:
        """Whether something here reads each round as it ends (else the backlog waits: lazy, no record kept)."""
        return not self.backlog.lazy or self.env.record is not None

    def record_for(self, log: EventLog | None) -> None:
        """Have the shards send what ``log`` writes (``None``: nothing): what senders said, and turn steps if logged."""
        self.said, self.steps = log is not None, log is not None and log.turns

    def _outbox_of(self, stepped: RoundDone) -> list[OutboxEntry]:
        """A shard's outbox of the round, taken in: its sets of recipients shared, its senders with news noted."""
        outbox = stepped.result.open().outbox
        interned(outbox, self._sets)
        self.spoke.update(message.sent_from for _, message, _, said in outbox if said[0])  # with news: caused_by
        return outbox

    def _merge(self, results: list[RoundDone | None], failures: list[tuple[Any, Exception]]) -> bool:
        """Take in the shards' results (ledger, failures, steps, news, addresses); whether an address changed."""
        env = self.env
        members, steps, moved = env.members, env.steps, False
        roles: Mapping[str, Any] = env.roles
        for shard, stepped in enumerate(results):
            if stepped is None:
                continue
            result = stepped.result
            self.ready[shard] = result.ready
            env.ledger.entries.extend(result.ledger)
            for place, kind, text, shown in result.failures:
                failures.append((members[place], _remote_failure(kind, text, shown)))
            if steps is not None and result.steps is not None:
                steps.extend(result.steps)
            for name, addresses in result.readdressed.items():
                roles[name].addresses = frozenset(addresses)
                env.reindex(roles[name])
                moved = True
        if moved:
            self._index_addresses()
        return moved

    async def checkpoint(self, folder: Path, meanwhile: Callable[[], None] = _nothing) -> list[str]:
        """Have every shard write its roles' part of this round's checkpoint (after the round's deliveries).

        Returns the parts' folders, relative to ``folder`` (``record.parts``): the driver's file names them.
        ``meanwhile()`` runs while the shards write.
        """
        deliveries, broadcasts = self._take_deliveries()
        names = [part_name(self.segment, shard) for shard in range(self.shards.count)]
        pairs = zip(deliveries, names, strict=True)
        sent = self.shards.send([Checkpoint(d, str(folder / n), self.env.round) for d, n in pairs], broadcasts)
        meanwhile()
        self.ready = await sent.replies()
        self.held = [0] * len(deliveries)
        return names

    @property
    def pinned(self) -> list[Role]:
        """The roles that run on the driver."""
        return [role for role, _ in self._pinned]

    async def measure(
        self, fns: list[Callable[[Sequence[Role]], Any]], meanwhile: Callable[[], None] = _nothing
    ) -> dict[Any, Any]:
        """Each of ``fns`` of each shard's roles (one call; ``meanwhile()`` as they work), then of the driver's."""
        if not fns:
            meanwhile()
            return {}
        deliveries, broadcasts = self._take_deliveries()
        sent = self.shards.send([Measure(d, partial(each_of, fns)) for d in deliveries], broadcasts)
        meanwhile()
        remote: list[Measured] = await sent.replies()
        self.held, self.ready = [0] * len(deliveries), [measured.ready for measured in remote]
        local = [r for r, p in zip(self.env.members, self.places, strict=True) if p is None]
        return {fn: [*(measured.value[n] for measured in remote), fn(local)] for n, fn in enumerate(fns)}

    async def close(self) -> None:
        """Bring the roles back (unless a shard failed, or they :attr:`stay`: the checkpoint has them); stop shards."""
        env, kept, self.kept = self.env, self.kept, {}
        if not self.broken:
            self.catch_up(force=True)
        self.spoke.clear()
        if self.broken or self.stay:
            await self.shards.close()
            return
        deliveries, broadcasts = self._take_deliveries()
        back: dict[int, Member] = {}
        readers = [RolesIn(env, kept=kept) for _ in range(self.shards.count)]
        with paused_gc():
            requests = [Release(d, transfer.PIECE, by_state=bool(kept)) for d in deliveries]
            released: list[Released] = await self.shards.send(requests, broadcasts).replies()
            for shard, reply in enumerate(released):  # every shard's first piece, then the others as they come
                back.update((role.place, role) for role in readers[shard].load(reply.first))
            async for shard, piece in self.shards.pieces([reply.pieces for reply in released]):
                back.update((role.place, role) for role in readers[shard].load(piece))
            await self.shards.close()
            env.drive.swap_roles(back)
            env.drive.rebuild_ready()
            env.keep_heap()  # the roles are back to stay: no young pass over every object they brought
