"""A shard of a sharded run: the roles it was given, run a round at a time, and the calls that reach it.

Roles travel pickled (:func:`dumps_roles`): references to the environment they came from, its
ledger and clock travel as names and mean the shard's own where they land. A :class:`ShardHost`
delivers what the driver routed to it, runs its ready roles with the worker pool and returns its
outbox (``runs.sharding`` has the driver's side). :class:`LocalShards` runs shards in this
process; ``runs.ray_shards`` runs each as a Ray actor.
"""

from __future__ import annotations

import io
import pickle
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from metaroles.bus.environment import Environment
from metaroles.bus.role import Role
from metaroles.bus.rounds import run_roles
from metaroles.bus.state import RoleState
from metaroles.llm.ledger import LedgerEntry
from metaroles.messages.message import Message

Entry = Message | int | tuple[Message, str]
"""What a shard delivers: a message to route, the index of a shared broadcast, or a message for one role."""

Step = tuple[str, str, Any, int]


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
