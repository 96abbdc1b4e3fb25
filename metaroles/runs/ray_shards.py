"""Shards as Ray actors: ``Team(backend=RayBackend(shards=K))`` (the ``ray`` extra).

Each shard is one async Ray actor (``num_cpus=1`` by default) holding a :class:`ShardHost`; the
driver makes one call per shard per round (``step``), puts a round's broadcasts in the object
store once for all shards, and otherwise only the messages a shard's roles receive travel to it.
Nothing here is imported unless a run asks for Ray; ``ray.init`` runs once per process (a session
already open — a notebook's, a test suite's — is used as it is).
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Callable
from typing import Any

from metaroles.bus.role import Role
from metaroles.bus.state import RoleState
from metaroles.core.exceptions import ConfigError
from metaroles.messages.message import Message
from metaroles.runs.sharding import ShardBy, check_shards
from metaroles.runs.shards import Entry, ShardHost, StepResult


class RayBackend:
    """Run a Team's roles on ``shards`` Ray actors.

    Args:
        shards: How many shard actors.
        address: The Ray cluster: ``None`` starts a local one (unless this process already joined
            one), ``"auto"`` joins the running local cluster, ``"ray://host:port"`` a remote one.
        num_cpus: CPUs each shard actor reserves.
        shard_by: Which shard a role runs on (``None`` from it: the driver); by place otherwise.
        init: More keyword arguments for ``ray.init`` (e.g. ``num_cpus`` of a local cluster).
    """

    def __init__(
        self,
        shards: int = 2,
        *,
        address: str | None = None,
        num_cpus: float = 1,
        shard_by: ShardBy | None = None,
        init: dict[str, Any] | None = None,
    ) -> None:
        """Create the backend; Ray starts when a run does."""
        self.shards = check_shards(shards)
        self.address = address
        self.num_cpus = num_cpus
        self.shard_by = shard_by
        self.init = dict(init or {})
        self.last: RayShards | None = None
        """The shards of the last run (their actors, while it runs)."""

    def shard_set(self) -> RayShards:
        """Fresh shard actors for one run."""
        self.last = RayShards(self)
        return self.last


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("running on Ray needs the ray extra: pip install 'metaroles[ray]'") from None
    return ray


def ensure_ray(address: str | None = None, **init: Any) -> Any:
    """The ``ray`` module, connected: joins ``address`` (or starts a local cluster) unless already connected."""
    ray = _ray()
    if not ray.is_initialized():
        options = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False, **init}
        ray.init(address=address, **options)
    return ray


def _packed(value: Any) -> bytes:
    """``value`` pickled for a shard: classes a worker cannot import (a notebook's) travel by value.

    Ray would pickle arguments itself; a round's messages travel as one ``bytes`` instead, which
    Ray moves without looking inside, and a message pickles as its fields (no generic walk).
    """
    buffer = io.BytesIO()
    _pickler()(buffer, protocol=5).dump(value)
    return buffer.getvalue()


def _pickler() -> Any:
    from ray import cloudpickle

    return cloudpickle.Pickler


class _Actor:
    """The body of a shard actor: a :class:`ShardHost` behind async methods."""

    def __init__(self, total: int, concurrency: int, shards: int) -> None:
        self.host = ShardHost(total=total, concurrency=concurrency, shards=shards)

    async def load(self, blob: bytes) -> int:
        return self.host.load(blob)

    async def step(self, round_no: int, inbox: bytes, broadcasts: bytes, trace: bool, news: bool) -> bytes:
        result = await self.host.step(round_no, pickle.loads(inbox), pickle.loads(broadcasts), trace=trace, news=news)
        return _packed(result)

    async def states(self, inbox: bytes, broadcasts: bytes) -> bytes:
        return _packed(self.host.states(pickle.loads(inbox), pickle.loads(broadcasts)))

    async def parts(self, fn: Callable[[list[Role]], Any]) -> Any:
        return self.host.parts(fn)

    async def release(self, inbox: bytes, broadcasts: bytes) -> bytes:
        from ray import cloudpickle

        return self.host.release(pickle.loads(inbox), pickle.loads(broadcasts), cloudpickle.Pickler)

    async def pid(self) -> int:
        return os.getpid()


class RayShards:
    """The shard actors of one run (a ``runs.sharding.ShardSet``)."""

    def __init__(self, backend: RayBackend) -> None:
        """Shards as ``backend`` says; the actors start in :meth:`load`."""
        self.backend = backend
        self.count = backend.shards
        self.actors: list[Any] = []
        self.calls = 0
        """Calls made to shards so far (at most one per shard per round, and one to start and end)."""
        self.ray = ensure_ray(backend.address, **backend.init)
        from ray import cloudpickle

        self.pickler: type[pickle.Pickler] = cloudpickle.Pickler

    async def load(self, blobs: list[bytes], *, total: int, concurrency: int) -> list[int]:
        """Start one actor per shard and give each its roles."""
        actor = self.ray.remote(num_cpus=self.backend.num_cpus)(_Actor)
        self.actors = [actor.remote(total, concurrency, len(blobs)) for _ in blobs]
        refs = [a.load.remote(blob) for a, blob in zip(self.actors, blobs, strict=True)]
        return [await ref for ref in refs]

    async def step(
        self, round_no: int, inboxes: list[list[Entry]], broadcasts: list[Message], *, trace: bool, news: bool
    ) -> list[StepResult | None]:
        """One ``step`` call per shard with something to do, all in flight at once."""
        shared = self.ray.put(_packed(broadcasts))  # once, whatever the number of shards
        refs = []
        for a, inbox in zip(self.actors, inboxes, strict=True):
            refs.append(None if inbox is None else a.step.remote(round_no, _packed(inbox), shared, trace, news))
        self.calls += sum(ref is not None for ref in refs)
        return [None if ref is None else pickle.loads(await ref) for ref in refs]

    async def states(self, inboxes: list[list[Entry]], broadcasts: list[Message]) -> list[list[RoleState]]:
        """Each shard's role states."""
        shared = self.ray.put(_packed(broadcasts))
        refs = [a.states.remote(_packed(inbox), shared) for a, inbox in zip(self.actors, inboxes, strict=True)]
        return [pickle.loads(await ref) for ref in refs]

    async def parts(self, fn: Callable[[list[Role]], Any]) -> list[Any]:
        """``fn`` of each shard's roles."""
        refs = [a.parts.remote(fn) for a in self.actors]
        return [await ref for ref in refs]

    async def release(self, inboxes: list[list[Entry]], broadcasts: list[Message]) -> list[bytes]:
        """Each shard's roles, pickled."""
        shared = self.ray.put(_packed(broadcasts))
        refs = [a.release.remote(_packed(inbox), shared) for a, inbox in zip(self.actors, inboxes, strict=True)]
        return [await ref for ref in refs]

    async def pids(self) -> list[int]:
        """The process id of each shard actor (to watch or kill one)."""
        refs = [a.pid.remote() for a in self.actors]
        return [await ref for ref in refs]

    async def close(self) -> None:
        """Stop the actors."""
        for a in self.actors:
            self.ray.kill(a)
        self.actors = []
