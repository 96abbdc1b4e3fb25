"""Where a Team's roles run: which shard each role goes to, and shards in this process.

A backend gives a sharded run its shards (a :class:`~metaroles.sharding.worker.ShardSet`):
:class:`LocalBackend` runs the shards' code in this process (tests, debugging);
``sharding.ray.RayBackend`` runs each shard as a Ray actor.
"""

from __future__ import annotations

import pickle
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from functools import partial
from typing import Any, Protocol

from metaroles.bus.role import Role
from metaroles.core.exceptions import InvalidValueError
from metaroles.messages.message import Message
from metaroles.sharding.shardset import Addresses, Request, RoundDone, RunRound, ShardSet
from metaroles.sharding.worker import ShardHost

__all__ = ["Backend", "LocalBackend", "LocalShards", "ShardBy", "check_shards", "placement"]

ShardBy = Callable[[Role, int], "int | None"]
"""Which of ``shards`` shards a role runs on (``None``: on the driver, e.g. a moderator whose state
an intervention reads); called as ``shard_by(role, shards)``."""


def _given(value: Any) -> Any:
    return value


def each_of(fns: Sequence[Callable[[Sequence[Role]], Any]], roles: list[Role]) -> list[Any]:
    """Every one of ``fns`` of ``roles`` (a shard computes a round's metric parts in one call)."""
    return [fn(roles) for fn in fns]


def placement(roles: Sequence[Role], shards: int, shard_by: ShardBy | None) -> list[int | None]:
    """The shard of each role: ``shard_by(role, shards)`` if given, else its place modulo ``shards``.

    Raises:
        InvalidValueError: If ``shard_by`` answers something other than a shard number or ``None``.
    """
    placed: list[int | None] = []
    for role in roles:
        shard = role.place % shards if shard_by is None else shard_by(role, shards)
        if shard is not None and (isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < shards):
            raise InvalidValueError(
                f"shard_by({role.name!r}, {shards}) returned {shard!r}; return a shard number in 0..{shards - 1}, "
                "or None to keep the role on the driver"
            )
        placed.append(shard)
    return placed


class Backend(Protocol):
    """Where a Team's roles run: a :class:`ShardSet` per run, and which role goes where."""

    shard_by: ShardBy | None

    def shard_set(self) -> ShardSet:
        """Fresh shards for one run."""
        ...


def connect(backend: Backend | None) -> None:
    """Reach where the roles will run before a run changes anything (a backend's ``connect()``, if it has one).

    Raises:
        RunError: If it cannot be reached (Ray that does not start: ``ShardsUnavailable``).
    """
    reach = getattr(backend, "connect", None)
    if reach is not None:
        reach()


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


class _Answered:
    """Requests to shards in this process: each answered, in shard order, once the replies are awaited.

    What crosses to another shard is pickled, and a round's outbox comes back sealed, as a cluster's does.
    """

    def __init__(self, hosts: list[ShardHost], requests: list[Request | None], broadcasts: list[Message]) -> None:
        self.hosts, self.requests, self.broadcasts = hosts, requests, broadcasts

    async def replies(self) -> list[Any]:
        replies: list[Any] = []
        for host, request in zip(self.hosts, self.requests, strict=True):
            reply = None if request is None else await host.answer(request, self.broadcasts, request.delivery.crossed)
            if type(reply) is RoundDone:
                result = reply.result
                result.sealed, result.outbox = partial(_given, result.outbox), []
                reply = RoundDone(result, [pickle.dumps(part, 5) if part else None for part in reply.outgoing])
            replies.append(reply)
        return replies


class LocalShards:
    """Shards as objects in this process: the shards' very code, without Ray (tests, debugging).

    Roles are still pickled to their shard and back, and so is what crosses between shards, so a
    run here exercises what a cluster does.
    """

    def __init__(self, count: int) -> None:
        """Prepare ``count`` shards."""
        self.count = count
        self.hosts: list[ShardHost] = []
        self.calls = 0
        """Rounds asked of shards so far (one call per shard per round at most)."""

    def start(self, *, total: int, concurrency: int, key: str) -> None:
        """Make the shards, empty."""
        self.hosts = [
            ShardHost(total=total, concurrency=concurrency, shards=self.count, number=n, key=key)
            for n in range(self.count)
        ]

    async def load(self, blobs: Iterable[bytes], *, addresses: Addresses) -> list[int]:
        """Give the shards their roles."""
        return [host.load(blob, addresses) for host, blob in zip(self.hosts, blobs, strict=True)]

    def send(self, requests: Sequence[Request | None], broadcasts: list[Message]) -> _Answered:
        """The requests, answered when their replies are awaited: one shard after the other, in this process."""
        self.calls += sum(type(request) is RunRound for request in requests)
        return _Answered(self.hosts, list(requests), broadcasts)

    async def pieces(self, counts: list[int]) -> AsyncIterator[tuple[int, bytes]]:
        """The rest of each shard's released roles, one shard after the other; the shards are done."""
        hosts, self.hosts = self.hosts, []
        for n, (host, count) in enumerate(zip(hosts, counts, strict=True)):
            for number in range(1, count):
                yield n, host.release_more(number)

    async def close(self) -> None:
        """Drop the shards."""
        self.hosts = []
