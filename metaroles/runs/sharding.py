"""One Environment's roles on several shards, run in lock-step so the run is the one-process run.

The driver (the process that holds the Team) keeps the bus: the history, the address index,
dead letters, events, the ledger, interventions and the roles pinned to it. Every other role is
shipped to a shard (pickled once, when the run starts) and the driver keeps a stand-in in its
place (:class:`RemoteRole`: name, addresses, place), so routing, the event log, budgets and
``explain_route``'s delivery rule work unchanged. A round:

1. The driver sends each shard, in **one call**, what its roles received in the previous round
   (in delivery order; a broadcast is one entry shared by every shard) and the round number.
2. Each shard delivers those locally (its own address index gives its roles' share), runs its
   ready roles with the worker pool, and returns its outbox ``(place, message)`` in publish
   order, its turn steps, model calls and failures. The driver runs its pinned roles meanwhile.
3. The driver merges the outboxes by the sender's place (stable: one sender lives on one shard),
   puts the round's model calls and failures in role order (as one process does), and delivers
   through the bus: a message for a stand-in lands in its shard's inbox for the next round.

Ids, prompts and answers depend on the run, the round and the role's place only (``core.ids``),
so every file of the run directory is the one-process run's, byte for byte. A shard is an
execution detail: checkpoints hold whole role states, so a run resumes on any number of shards.

This module knows nothing of Ray: a :class:`ShardSet` carries the calls (``runs.shards`` has the
shard's side). :class:`LocalShards` runs the shards' code in this process (for tests and
debugging); ``runs.ray_shards`` runs each shard as a Ray actor.
"""

from __future__ import annotations

import io
import pickle
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import partial
from operator import itemgetter
from typing import Any, Protocol

import anyio

from metaroles.bus.environment import Environment
from metaroles.bus.role import Role
from metaroles.bus.rounds import run_roles
from metaroles.bus.state import RoleState
from metaroles.core.exceptions import InvalidValueError, RunError
from metaroles.core.schema import MESSAGE_ROUTE_TO_ALL
from metaroles.llm.ledger import LedgerEntry
from metaroles.messages.message import Message
from metaroles.runs.standins import RemoteRole, _first, _remote_failure
from metaroles.runs.shards import (
    Entry,
    LocalShards,
    ShardSet,
    StepResult,
    _ActionRef,
    _Seen,
    dumps_roles,
    loads_roles,
)

__all__ = ["Backend", "LocalBackend", "LocalShards", "RemoteRole", "ShardedRun", "StepResult", "sharded"]

ShardBy = Callable[[Role, int], "int | None"]
"""Which of ``shards`` shards a role runs on (``None``: on the driver, e.g. a moderator whose state
an intervention reads); called as ``shard_by(role, shards)``."""

DRIVER = -1
"""Where a role pinned to the driver lives (in the driver's address map)."""


def placement(roles: Sequence[Role], shards: int, shard_by: ShardBy | None) -> list[int | None]:
    """The shard of each role: ``shard_by(role, shards)`` if given, else its place modulo ``shards``.

    Raises:
        InvalidValueError: If ``shard_by`` answers something other than a shard number or ``None``.
    """
    placed: list[int | None] = []
    for role in roles:
        shard = role._env_index % shards if shard_by is None else shard_by(role, shards)
        if shard is not None and (isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < shards):
            raise InvalidValueError(
                f"shard_by({role.name!r}, {shards}) returned {shard!r}; return a shard number in 0..{shards - 1}, "
                "or None to keep the role on the driver"
            )
        placed.append(shard)
    return placed


# -- the driver's stand-ins ---------------------------------------------------------------------------


class ShardedRun:
    """The driver's side of a sharded run: an Environment whose remote roles are stand-ins.

    Use :func:`sharded` to open one; :meth:`run_round` replaces ``Environment.run_round``.
    """

    def __init__(self, env: Environment, shards: ShardSet, places: list[int | None]) -> None:
        """Drive ``env`` on ``shards``; ``places`` gives each role's shard (``None``: the driver)."""
        self.env = env
        self.shards = shards
        self.places = places
        self.inboxes: list[list[Entry]] = [[] for _ in range(shards.count)]
        self.ready = [0] * shards.count
        self.broken = False
        self._spoke: list[RemoteRole] = []
        self.news = True
        """Whether shards send the news of each sender (the event log's ``caused_by``)."""
        self.where: dict[str, tuple[int, ...]] = {}
        """Address → the shards whose roles receive on it (``DRIVER`` for the driver's own roles)."""
        self._pinned: list[tuple[Role, frozenset[str]]] = []

    @property
    def shard_map(self) -> dict[str, int | None]:
        """Role name → its shard (``None``: the driver)."""
        return {role.name: place for role, place in zip(self.env._members, self.places, strict=True)}

    async def open(self) -> None:
        """Ship every remote role to its shard and put stand-ins in their places."""
        env, count = self.env, self.shards.count
        parts: list[list[Role]] = [[] for _ in range(count)]
        stand_ins: dict[int, Any] = {}
        for role, place in zip(list(env._members), self.places, strict=True):
            if place is not None:
                parts[place].append(role)
                stand_ins[role._env_index] = RemoteRole(role, place, self.inboxes[place])
        blobs = [dumps_roles(env, part, self.pickler()) for part in parts]
        self.ready = await self.shards.load(blobs, total=len(env._members), concurrency=env.concurrency)
        env.swap_roles(stand_ins)
        self._index_addresses()

    def _index_addresses(self) -> None:
        """Which shards receive on each address (rebuilt when a role changes its addresses)."""
        where: dict[str, set[int]] = {}
        for role, place in zip(self.env._members, self.places, strict=True):
            for address in role.addresses:
                where.setdefault(address, set()).add(DRIVER if place is None else place)
        self.where = {address: tuple(sorted(shards)) for address, shards in where.items()}
        self._pinned = [(r, r.addresses) for r, p in zip(self.env._members, self.places, strict=True) if p is None]
        self._everyone = tuple(sorted({DRIVER if p is None else p for p in self.places}))

    def pickler(self) -> type[pickle.Pickler]:
        """The pickler roles travel with (a ShardSet may carry a cloudpickle one)."""
        return getattr(self.shards, "pickler", pickle.Pickler)

    @property
    def is_idle(self) -> bool:
        """True when no role anywhere has anything buffered or on its way."""
        return self.env.is_idle and not any(self.ready) and not any(self.inboxes)

    def _take_inboxes(self) -> tuple[list[list[Entry]], list[Message]]:
        """This round's deliveries per shard; a broadcast once, shared by all."""
        broadcasts: list[Message] = []
        shared: dict[int, int] = {}
        inboxes = []
        for inbox in self.inboxes:
            out: list[Entry] = []
            for entry in inbox:
                if type(entry) is Message and MESSAGE_ROUTE_TO_ALL in entry.send_to:
                    number = shared.get(id(entry))
                    if number is None:
                        number = shared[id(entry)] = len(broadcasts)
                        broadcasts.append(entry)
                    out.append(number)
                else:
                    out.append(entry)
            inboxes.append(out)
            inbox.clear()
        return inboxes, broadcasts

    async def run_round(self) -> None:
        """Run one round on the driver and every shard; deliver as one process does (see the module)."""
        env = self.env
        if env._in_round:
            raise RunError(f"round {env.round} of this environment is still running; await it before starting another")
        env.round += 1
        env._clock.set(env.round)
        if env.trace is not None:
            env.trace = []
        inboxes, broadcasts = self._take_inboxes()
        busy = [inbox if (inbox or ready) else None for inbox, ready in zip(inboxes, self.ready, strict=True)]
        ready = env._take_ready()
        failures: list[tuple[Any, Exception]] = []
        spent = env.ledger.mark()
        env._in_round = True
        results: list[StepResult | None] = []
        try:
            async with anyio.create_task_group() as tg:
                if ready:
                    on_error = partial(env._fail, failures=failures)
                    tg.start_soon(partial(run_roles, ready, env.round, concurrency=env.concurrency, on_error=on_error))
                results = await self._step(busy, broadcasts)
        except BaseExceptionGroup as group:  # the driver's roles report their own errors: this is a shard's
            raise _first(group) from None
        finally:
            env._in_round = False
        self._merge(results, failures)
        env._order_trace()
        env._settle(failures, spent)
        if env.interventions:
            env._flush()  # hooks decide per recipient: the bus routes to stand-ins one by one
        else:
            self._flush()
        env._raise_failures(failures)
        env._raise_undelivered()

    async def _step(self, busy: list[Any], broadcasts: list[Message]) -> list[StepResult | None]:
        env = self.env
        try:
            return await self.shards.step(
                env.round, busy, broadcasts, trace=env.trace is not None, news=env.trace is not None or self.news
            )
        except Exception as exc:
            self.broken = True
            first_line = (str(exc).strip().splitlines() or [""])[0][:200]
            raise RunError(
                f"a shard failed in round {env.round} ({type(exc).__name__}: {first_line}); the run stops at its "
                "last checkpoint — resume it (metaroles resume DIR)"
            ) from exc


    def _flush(self) -> None:
        """Deliver the round's messages as ``Environment._flush`` does, routing to shards, not to each stand-in.

        A message goes once into the inbox of every shard that has a recipient (the shard's own
        index finds which of its roles); the driver's own roles get theirs here. The cost is per
        address, not per recipient.
        """
        env = self.env
        if any(role.addresses is not seen for role, seen in self._pinned):
            self._index_addresses()
        pending, env._pending = env._pending, []
        pending.sort(key=itemgetter(0))
        remember, where, inboxes, everyone = env.history.add, self.where, self.inboxes, self._everyone
        for _, message in pending:
            remember(message)
            send_to = message.send_to
            if MESSAGE_ROUTE_TO_ALL in send_to:
                targets: tuple[int, ...] | set[int] = everyone
            elif len(send_to) == 1:
                for address in send_to:
                    targets = where.get(address, ())
            else:
                targets = {shard for address in send_to for shard in where.get(address, ())}
            if not targets:
                env._dead_letter(message)
                continue
            for shard in targets:
                if shard != DRIVER:
                    inboxes[shard].append(message)
                    continue
                for role in env._book.route(send_to):
                    if not isinstance(role, RemoteRole) and role.rc.msg_buffer.push(message):
                        env.mark_ready(role)

    def _merge(self, results: list[StepResult | None], failures: list[tuple[Any, Exception]]) -> None:
        env = self.env
        for stand_in in self._spoke:
            stand_in.rc.news = []
        self._spoke = []
        members, pending, trace = env._members, env._pending, env.trace
        for shard, result in enumerate(results):
            if result is None:
                continue
            self.ready[shard] = result.ready
            pending.extend(result.outbox)
            env.ledger.entries.extend(result.ledger)
            for place, kind, text, shown in result.failures:
                failures.append((members[place], _remote_failure(kind, text, shown)))
            if trace is not None:
                trace.extend(result.trace)
            roles: dict[str, Any] = env.roles
            for name, addresses in result.readdressed.items():
                roles[name].addresses = frozenset(addresses)
                env.reindex(roles[name])
            if result.readdressed:
                self._index_addresses()
            for name, ids in result.news.items():
                stand_in = roles[name]
                stand_in.rc.news = [_Seen(i) for i in ids]
                self._spoke.append(stand_in)

    async def role_states(self) -> list[RoleState]:
        """Every role's state in place order (remote ones from their shards, after this round's deliveries)."""
        inboxes, broadcasts = self._take_inboxes()
        remote = await self.shards.states(inboxes, broadcasts)
        states: dict[int, RoleState] = {}
        for shard, part in enumerate(remote):
            self.ready[shard] = sum(1 for s in part if s.buffer)
            hosted = [r for r, p in zip(self.env._members, self.places, strict=True) if p == shard]
            for role, state in zip(hosted, part, strict=True):
                states[role._env_index] = state
        for role, place in zip(self.env._members, self.places, strict=True):
            if place is None:
                states[role._env_index] = role.state_dict()
        return [states[i] for i in range(len(self.env._members))]

    async def parts(self, fn: Callable[[list[Role]], Any]) -> list[Any]:
        """``fn`` of the roles of each shard, then of the driver's (for metrics computed where roles live)."""
        local = [r for r, p in zip(self.env._members, self.places, strict=True) if p is None]
        return [*await self.shards.parts(fn), fn(local)]

    async def close(self) -> None:
        """Bring every role back into the driver's Environment (unless a shard failed), and stop the shards."""
        env = self.env
        if self.broken:
            await self.shards.close()
            return
        inboxes, broadcasts = self._take_inboxes()
        blobs = await self.shards.release(inboxes, broadcasts)
        await self.shards.close()
        back: dict[int, Any] = {}
        for blob in blobs:
            for role in loads_roles(blob, env):
                role._ready = False  # rebuild_ready below marks it again if its buffer holds news
                back[role._env_index] = role
        env.swap_roles(back)
        env.rebuild_ready()


@asynccontextmanager
async def sharded(env: Environment, shards: ShardSet, shard_by: ShardBy | None = None) -> AsyncIterator[ShardedRun]:
    """Run ``env``'s roles on ``shards`` inside the block; they come back into ``env`` when it ends.

    If the block raises, the roles stay where they were (a shard may be gone): the run's last
    checkpoint is what a resume starts from.
    """
    run = ShardedRun(env, shards, placement(env._members, shards.count, shard_by))
    await run.open()
    try:
        yield run
    except BaseException:
        run.broken = True
        with anyio.CancelScope(shield=True):
            await run.close()
        raise
    await run.close()


class Backend(Protocol):
    """Where a Team's roles run: a :class:`ShardSet` per run, and which role goes where."""

    shard_by: ShardBy | None

    def shard_set(self) -> ShardSet:
        """Fresh shards for one run."""
        ...


class LocalBackend:
    """Shards in this process (:class:`LocalShards`): a sharded run without Ray, for tests and debugging.

    Args:
        shards: How many shards.
        shard_by: Which shard a role runs on (``None`` from it: the driver); by place otherwise.
    """

    def __init__(self, shards: int = 2, *, shard_by: ShardBy | None = None) -> None:
        """Create the backend; see the class docstring for the arguments."""
        self.shards = check_shards(shards)
        self.shard_by = shard_by
        self.last: LocalShards | None = None
        """The shards of the last run (their call count)."""

    def shard_set(self) -> LocalShards:
        """Fresh in-process shards."""
        self.last = LocalShards(self.shards)
        return self.last


def check_shards(shards: object) -> int:
    """``shards`` if it is a positive number of shards.

    Raises:
        InvalidValueError: Otherwise, naming the value.
    """
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise InvalidValueError(f"shards={shards!r} must be a positive integer, e.g. shards=2")
    return shards
