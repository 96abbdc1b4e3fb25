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

This module knows nothing of Ray: a :class:`ShardSet` carries the calls. :class:`LocalShards`
runs the shards' code in this process (for tests and debugging); ``runs.ray_shards`` runs each
shard as a Ray actor.
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

ShardBy = Callable[[Role, int], "int | None"]
"""Which of ``shards`` shards a role runs on (``None``: on the driver, e.g. a moderator whose state
an intervention reads); called as ``shard_by(role, shards)``."""

Entry = Message | int | tuple[Message, str]
"""What a shard delivers: a message to route, the index of a shared broadcast, or a message for one role."""

Step = tuple[str, str, Any, int]

DRIVER = -1
"""Where a role pinned to the driver lives (in the driver's address map)."""


# -- shipping roles -------------------------------------------------------------------------------


_HOST: ContextVar[dict[str, Any]] = ContextVar("metaroles_shard_host")


def _hosted(key: str) -> Any:
    """What a pickled reference to the environment (or its ledger, or clock) means where it is loaded."""
    return _HOST.get()[key]


def dumps_roles(env: Environment, roles: Sequence[Role], pickler: type[pickle.Pickler] = pickle.Pickler) -> bytes:
    """Pickle ``roles`` without their environment: references to ``env``, its ledger and clock travel as names.

    ``pickler`` may be a cloudpickle Pickler, which also carries classes defined in a notebook.
    """
    shared = {id(env): "env", id(env.ledger): "ledger", id(env._clock): "clock"}
    fallback = getattr(pickler, "reducer_override", None)

    class _Pickler(pickler):  # type: ignore[misc,valid-type]
        def reducer_override(self, obj: Any) -> Any:  # not called for str, int, dict, list...: cheap
            key = shared.get(id(obj))
            if key is not None:
                return _hosted, (key,)
            return NotImplemented if fallback is None else fallback(self, obj)

    buffer = io.BytesIO()
    _Pickler(buffer, protocol=5).dump(list(roles))
    return buffer.getvalue()


def loads_roles(data: bytes, env: Environment) -> list[Role]:
    """The roles :func:`dumps_roles` pickled, now referring to ``env``, its ledger and clock."""
    token = _HOST.set({"env": env, "ledger": env.ledger, "clock": env._clock})
    try:
        roles: list[Role] = pickle.loads(data)
    finally:
        _HOST.reset(token)
    return roles


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


class _Seen:
    """A message known by id only (the news of a remote sender, for the event log)."""

    __slots__ = ("id",)

    def __init__(self, message_id: str) -> None:
        self.id = message_id


class _ActionRef:
    """An action known by id only (a remote turn's ``think`` step)."""

    __slots__ = ("_action_id",)

    def __init__(self, action_id: str) -> None:
        self._action_id = action_id


class _Forward:
    """A stand-in's buffer: what it receives goes to its shard's inbox (once per message and shard)."""

    __slots__ = ("inbox",)

    def __init__(self, inbox: list[Entry]) -> None:
        self.inbox = inbox

    def push(self, message: Message) -> bool:
        inbox = self.inbox
        if not inbox or inbox[-1] is not message:
            inbox.append(message)
        return False  # the shard marks its role ready, not the driver

    def empty(self) -> bool:
        return True


class _RemoteContext:
    __slots__ = ("msg_buffer", "news", "watch")

    def __init__(self, inbox: list[Entry], watch: frozenset[str]) -> None:
        self.msg_buffer = _Forward(inbox)
        self.news: list[Any] = []
        self.watch = watch


class RemoteRole:
    """The driver's stand-in for a role that runs on a shard: its name, addresses and place."""

    __slots__ = ("_env_index", "_ready", "addresses", "name", "profile", "rc", "shard")

    def __init__(self, role: Role, shard: int, inbox: list[Entry]) -> None:
        """Stand in for ``role``, whose deliveries go to ``inbox``."""
        self.name = role.name
        self.profile = role.profile
        self.addresses = role.addresses
        self._env_index = role._env_index
        self._ready = False
        self.shard = shard
        self.rc = _RemoteContext(inbox, frozenset(role.rc.watch))

    @property
    def is_idle(self) -> bool:
        """Whether the role did not speak in the last round (what the driver can tell of a remote role)."""
        return not self.rc.news

    def put_message(self, message: Message) -> None:
        """Deliver ``message`` to this role alone (an intervention decided it per recipient)."""
        self.rc.msg_buffer.inbox.append((message, self.name))

    def __repr__(self) -> str:
        """Say where the role runs."""
        return f"RemoteRole({self.name!r}, shard={self.shard})"


# -- a shard -------------------------------------------------------------------------------------------


@dataclass
class StepResult:
    """What a shard returns for a round."""

    outbox: list[tuple[int, Message]]
    """What its roles published, ``(place, message)`` in publish order."""
    trace: list[Step] = field(default_factory=list)
    ledger: list[LedgerEntry] = field(default_factory=list)
    failures: list[tuple[int, str, str, str]] = field(default_factory=list)
    """``(place, exception type, str, repr)`` of each turn that raised."""
    news: dict[str, list[str]] = field(default_factory=dict)
    """The news ids of each role that published (the event log's ``caused_by``)."""
    ready: int = 0
    """Roles with buffered messages after the round (before its deliveries)."""
    readdressed: dict[str, list[str]] = field(default_factory=dict)
    """The new addresses of roles that changed theirs in the round."""
    busy_s: float = 0.0
    """How long the shard worked on the round (delivering and running turns), for diagnostics."""


class ShardHost:
    """A shard: the roles it was given, in an Environment of their own, run a round at a time.

    Args:
        total: How many roles the whole run has (what others publish ranks after them all).
        concurrency: Roles mid-turn at once on this shard.
    """

    def __init__(self, *, total: int, concurrency: int = 32, shards: int = 1) -> None:
        """Create an empty shard (one of ``shards``)."""
        self.shards = shards
        self.env = Environment(concurrency=concurrency, on_role_error="record")
        self.total = total
        self.readdressed: dict[str, list[str]] = {}
        self.env.reindex = self._reindexed  # type: ignore[method-assign]

    def _reindexed(self, role: Role) -> None:
        """A role here changed its addresses: index them, and tell the driver with the round's result."""
        Environment.reindex(self.env, role)
        self.readdressed[role.name] = sorted(role.addresses)

    def load(self, data: bytes) -> int:
        """Host the roles ``dumps_roles`` pickled; return how many of them have buffered messages.

        A model with limits (``LimitedLLM``) keeps to this shard's share of them, so the cluster
        as a whole stays within what the user set.
        """
        env = self.env
        roles = loads_roles(data, env)
        env.adopt_roles(roles, total=self.total)
        shared: dict[int, Any] = {}
        for role in roles:
            for llm in (role.llm, *(action.llm for action in role.actions)):
                if hasattr(llm, "shard_share"):
                    shared[id(llm)] = llm
        for llm in shared.values():
            llm.shard_share(self.shards)
        return len(env._ready)

    def deliver(self, inbox: Sequence[Entry], broadcasts: Sequence[Message]) -> None:
        """Put what the driver routed here into the buffers of this shard's recipients, in order."""
        env = self.env
        route, ready, roles = env._book.route, env._ready, env.roles
        for entry in inbox:
            if type(entry) is int:
                message = broadcasts[entry]
            elif type(entry) is tuple:
                roles[entry[1]].put_message(entry[0])
                continue
            else:
                message = entry  # type: ignore[assignment]
            for role in route(message.send_to):
                if role.rc.msg_buffer.push(message) and not role._ready:
                    role._ready = True
                    ready.append(role)

    async def step(
        self, round_no: int, inbox: Sequence[Entry], broadcasts: Sequence[Message], *, trace: bool, news: bool
    ) -> StepResult:
        """Deliver ``inbox``, then run round ``round_no``'s turns of this shard's ready roles."""
        started = time.perf_counter()
        self.deliver(inbox, broadcasts)
        env = self.env
        env.round = round_no
        env._clock.set(round_no)
        env.trace = [] if trace else None
        ready = env._take_ready()
        failures: list[tuple[Role, Exception]] = []
        spent = len(env.ledger.entries)
        env._in_round = True
        try:
            if ready:
                on_error = partial(env._fail, failures=failures)
                await run_roles(ready, round_no, concurrency=env.concurrency, on_error=on_error)
        finally:
            env._in_round = False
        outbox, env._pending = env._pending, []
        calls = env.ledger.entries[spent:]
        del env.ledger.entries[spent:]
        result = StepResult(
            outbox=outbox,
            ledger=calls,
            failures=[(role._env_index, type(exc).__name__, str(exc), repr(exc)) for role, exc in failures],
            ready=len(env._ready),
            readdressed=self.readdressed,
            busy_s=time.perf_counter() - started,
        )
        self.readdressed = {}
        if env.trace:
            result.trace = [_portable(step) for step in env.trace]
        if news:
            roles = env.roles
            for _, message in outbox:
                sender = roles.get(message.sent_from)
                if sender is not None and sender.name not in result.news:
                    result.news[sender.name] = [m.id for m in sender.rc.news]
        return result

    def states(self, inbox: Sequence[Entry], broadcasts: Sequence[Message]) -> list[RoleState]:
        """Deliver ``inbox``, then the state of each role here, in place order."""
        self.deliver(inbox, broadcasts)
        return [role.state_dict() for role in self.env._members]

    def parts(self, fn: Callable[[list[Role]], Any]) -> Any:
        """``fn`` of this shard's roles, in place order (a scenario's metrics, computed where the roles are)."""
        return fn(list(self.env._members))

    def release(self, inbox: Sequence[Entry], broadcasts: Sequence[Message], pickler: type[pickle.Pickler]) -> bytes:
        """Deliver ``inbox``, then give the roles back, pickled as :func:`dumps_roles` does."""
        self.deliver(inbox, broadcasts)
        return dumps_roles(self.env, self.env._members, pickler)


def _portable(step: Step) -> Step:
    """A turn step the driver's event log reads: messages and actions by id where it needs only that."""
    kind, name, detail, remembered = step
    if kind == "observe":
        return kind, name, [_Seen(m.id) for m in detail], remembered
    if kind == "think":
        return kind, name, None if detail is None else _ActionRef(detail._action_id), remembered
    return step


# -- carrying calls ----------------------------------------------------------------------------------


class ShardSet(Protocol):
    """The shards of one run and the calls the driver makes to them (each one batched call per shard)."""

    count: int

    async def load(self, blobs: list[bytes], *, total: int, concurrency: int) -> list[int]:
        """Start the shards (one per blob) with their roles; return each one's count of ready roles."""
        ...

    async def step(
        self, round_no: int, inboxes: list[list[Entry]], broadcasts: list[Message], *, trace: bool, news: bool
    ) -> list[StepResult | None]:
        """Run a round on every shard that has something to do (``None`` for the others)."""
        ...

    async def states(self, inboxes: list[list[Entry]], broadcasts: list[Message]) -> list[list[RoleState]]:
        """Each shard's role states, after delivering its inbox."""
        ...

    async def parts(self, fn: Callable[[list[Role]], Any]) -> list[Any]:
        """``fn`` of each shard's roles."""
        ...

    async def release(self, inboxes: list[list[Entry]], broadcasts: list[Message]) -> list[bytes]:
        """Each shard's roles, pickled, after delivering its inbox; the shards are done."""
        ...

    async def close(self) -> None:
        """Stop the shards (after a failure: nothing is given back)."""
        ...


class LocalShards:
    """Shards as objects in this process: the shards' very code, without Ray (tests, debugging).

    Roles are still pickled to their shard and back, so a run here exercises what a cluster does.
    """

    def __init__(self, count: int) -> None:
        """Prepare ``count`` shards."""
        self.count = count
        self.hosts: list[ShardHost] = []
        self.calls = 0
        """Calls made to shards so far (one per shard per round at most)."""

    async def load(self, blobs: list[bytes], *, total: int, concurrency: int) -> list[int]:
        """Start the shards with their roles."""
        self.hosts = [ShardHost(total=total, concurrency=concurrency, shards=len(blobs)) for _ in blobs]
        return [host.load(blob) for host, blob in zip(self.hosts, blobs, strict=True)]

    async def step(
        self, round_no: int, inboxes: list[list[Entry]], broadcasts: list[Message], *, trace: bool, news: bool
    ) -> list[StepResult | None]:
        """Run the round on each shard in turn (the merge makes the order irrelevant)."""
        results: list[StepResult | None] = []
        for host, inbox in zip(self.hosts, inboxes, strict=True):
            if inbox is None:
                results.append(None)
                continue
            self.calls += 1
            results.append(await host.step(round_no, inbox, broadcasts, trace=trace, news=news))
        return results

    async def states(self, inboxes: list[list[Entry]], broadcasts: list[Message]) -> list[list[RoleState]]:
        """Each shard's role states."""
        return [host.states(inbox, broadcasts) for host, inbox in zip(self.hosts, inboxes, strict=True)]

    async def parts(self, fn: Callable[[list[Role]], Any]) -> list[Any]:
        """``fn`` of each shard's roles."""
        return [host.parts(fn) for host in self.hosts]

    async def release(self, inboxes: list[list[Entry]], broadcasts: list[Message]) -> list[bytes]:
        """Each shard's roles, pickled."""
        pairs = zip(self.hosts, inboxes, strict=True)
        blobs = [host.release(inbox, broadcasts, pickle.Pickler) for host, inbox in pairs]
        self.hosts = []
        return blobs

    async def close(self) -> None:
        """Drop the shards."""
        self.hosts = []


# -- the driver ------------------------------------------------------------------------------------------


class _RemoteFailure(Exception):
    """A turn that raised on a shard, as the driver reports it (same type name, text and repr)."""

    text = ""
    shown = ""

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return self.shown


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first exception a task group gathered (a group inside a group is opened)."""
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first


def _remote_failure(kind: str, text: str, shown: str) -> Exception:
    failure = type(kind, (_RemoteFailure,), {"text": text, "shown": shown})()
    return failure  # type: ignore[no-any-return]


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
