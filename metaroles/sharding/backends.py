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
from metaroles.sharding import transfer
from metaroles.sharding.shardset import Addresses, Delivery, ShardSet, Stepped
from metaroles.sharding.worker import ShardHost

__all__ = ["Backend", "LocalBackend", "LocalShards", "ShardBy", "check_shards", "placement"]

ShardBy = Callable[[Role, int], "int | None"]
"""Which of ``shards`` shards a role runs on (``None``: on the driver, e.g. a moderator whose state
an intervention reads); called as ``shard_by(role, shards)``."""


def _given(value: Any) -> Any:
    return value


def each_of(fns: Sequence[Callable[[list[Role]], Any]], roles: list[Role]) -> list[Any]:
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
        """Calls made to shards so far (one per shard per round at most)."""

    def start(self, *, total: int, concurrency: int, key: str) -> None:
        """Make the shards, empty."""
        self.hosts = [
            ShardHost(total=total, concurrency=concurrency, shards=self.count, number=n, key=key)
            for n in range(self.count)
        ]

    async def load(self, blobs: Iterable[bytes], *, addresses: Addresses) -> list[int]:
        """Give the shards their roles."""
        return [host.load(blob, addresses) for host, blob in zip(self.hosts, blobs, strict=True)]

    async def step(
        self,
        round_no: int,
        deliveries: list[Delivery | None],
        broadcasts: list[Message],
        *,
        steps: bool,
        news: bool,
        outbox: bool = True,
        meanwhile: Callable[[], None],
    ) -> list[Stepped | None]:
        """Run the round on each shard in turn (the merge makes the order irrelevant); ``meanwhile()`` first.

        The outboxes stay in this process either way (``outbox`` says when a cluster's would travel).
        """
        meanwhile()
        results: list[Stepped | None] = []
        for host, delivery in zip(self.hosts, deliveries, strict=True):
            if delivery is None:
                results.append(None)
                continue
            self.calls += 1
            result, crossing = await host.step(round_no, delivery, broadcasts, delivery.parts, steps=steps, news=news)
            result.sealed, result.outbox, result.news = partial(_given, (result.outbox, result.news)), [], {}
            results.append(Stepped(result, [pickle.dumps(part, 5) if part else None for part in crossing]))
        return results

    async def checkpoint(
        self,
        folders: list[str],
        round_no: int,
        deliveries: list[Delivery],
        broadcasts: list[Message],
        *,
        meanwhile: Callable[[], None],
    ) -> list[int]:
        """Each shard writes its part of the round's checkpoint; the ready counts (``meanwhile()`` first)."""
        meanwhile()
        pairs = zip(self.hosts, folders, deliveries, strict=True)
        return [host.checkpoint(folder, round_no, d, broadcasts, d.parts) for host, folder, d in pairs]

    async def measure(
        self,
        fn: Callable[[list[Role]], Any],
        deliveries: list[Delivery],
        broadcasts: list[Message],
        *,
        meanwhile: Callable[[], None],
    ) -> list[tuple[Any, int]]:
        """``fn`` of each shard's roles, and its count of ready roles (``meanwhile()`` first)."""
        meanwhile()
        return [host.measure(fn, d, broadcasts, d.parts) for host, d in zip(self.hosts, deliveries, strict=True)]

    async def release(
        self, deliveries: list[Delivery], broadcasts: list[Message], *, by_state: bool = False
    ) -> AsyncIterator[tuple[int, bytes]]:
        """Each shard's roles, pickled in pieces: ``(shard, piece)``, one shard after the other."""
        hosts, self.hosts = self.hosts, []
        for n, (host, delivery) in enumerate(zip(hosts, deliveries, strict=True)):
            parts = delivery.parts
            first, pieces = host.release(delivery, broadcasts, parts, pickle.Pickler, transfer.PIECE, by_state=by_state)
            yield n, first
            for number in range(1, pieces):
                yield n, host.release_more(number)

    async def close(self) -> None:
        """Drop the shards."""
        self.hosts = []
