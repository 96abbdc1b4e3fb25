"""Shards as Ray actors: ``Team(backend=RayBackend(shards=K))`` (the ``ray`` extra).

Each shard is one async Ray actor (``num_cpus=1`` by default) holding a :class:`ShardHost`; the
driver makes one call per shard per round (``answer``, with the round's ``sharding.shardset.Step``),
puts a round's broadcasts in the object store once for all shards, and otherwise only the messages
a shard's roles receive travel to it.
Nothing here is imported unless a run asks for Ray; ``ray.init`` runs once per process (a session
already open — a notebook's, a test suite's — is used as it is).
"""

from __future__ import annotations

import functools
import gc
import io
import math
import os
import pickle
import sys
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from types import ModuleType
from typing import Any

from metaroles.core.exceptions import ConfigError, RunError
from metaroles.core.heap import paused_gc, rare_full_passes
from metaroles.messages.message import Message
from metaroles.sharding.backends import ShardBy, check_shards
from metaroles.sharding.crossing import OutboxReader, OutboxWriter
from metaroles.sharding.ray_reaper import reap_with_this_process
from metaroles.sharding.shardset import Addresses, Release, Request, RoundDone, RoundResult, RunRound
from metaroles.sharding.transfer import FILE_SCENARIO, quick
from metaroles.sharding.worker import ShardHost


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

    def connect(self) -> Any:
        """Start or join Ray now, before a run changes anything (a run directory's files, a resume's log).

        A local cluster this process starts has a CPU for each shard (``num_cpus`` each) at least:
        three shards on two cores take turns rather than wait for ever for a CPU none frees. A
        cluster joined must have them.

        Raises:
            ShardsUnavailable: If Ray cannot start or reach the cluster, or it has too few CPUs for the shards.
        """
        init = dict(self.init)
        if self.address is None:
            init.setdefault("num_cpus", max(os.cpu_count() or 1, math.ceil(self.shards * self.num_cpus)))
        ray = ensure_ray(self.address, **init)
        cpus, need = float(ray.cluster_resources().get("CPU", 0)), self.shards * self.num_cpus
        if cpus < need:
            fits = int(cpus // self.num_cpus) if self.num_cpus > 0 else 0
            raise ShardsUnavailable(
                f"{self.shards} shards of num_cpus={self.num_cpus:g} need {need:g} CPUs and the Ray cluster has "
                f"{cpus:g}, so a shard would wait for ever; run on {max(fits, 1)} shard(s) (--shards), give each "
                "less (RayBackend(num_cpus=...)), or add CPUs to the cluster"
            )
        return ray


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("running on Ray needs the ray extra: pip install 'metaroles[ray]'") from None
    return ray


def ensure_ray(address: str | None = None, **init: Any) -> Any:
    """The ``ray`` module, connected: joins ``address`` (or starts a local cluster) unless already connected.

    Raises:
        ShardsUnavailable: If Ray cannot start or reach the cluster (nothing of the run has moved yet).
    """
    ray = _ray()
    if not ray.is_initialized():
        options = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False, **init}
        try:
            ray.init(address=address, **options)
        except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError... for one thing
            where = f"the cluster at {address!r}" if address else "a local Ray cluster"
            raise ShardsUnavailable(
                f"Ray could not start {where} ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                "check the address and that Ray runs here, or run in one process (--backend process)"
            ) from exc
        if address is None:
            reap_with_this_process()  # a cluster this process started ends with it, its agents too
    return ray


class ShardsUnavailable(RunError):
    """The shards could not be started (Ray did not come up); the run directory is as it was."""


def _packed(value: Any) -> bytes:
    """``value`` pickled for a shard: classes a worker cannot import (a notebook's) travel by value.

    Ray would pickle arguments itself; a round's messages travel as one ``bytes`` instead, which
    Ray moves without looking inside, and a message pickles as its fields (no generic walk).
    """
    buffer = io.BytesIO()
    _pickler()(buffer, protocol=5).dump(value)
    return buffer.getvalue()


@functools.cache
def _pickler() -> Any:
    from ray import cloudpickle

    return quick(cloudpickle.Pickler)


def _opened(ray: Any, ref: Any, reader: OutboxReader) -> Any:
    """The outbox behind ``ref`` (ready: its call has answered), read by the shard's ``reader``."""
    columns = _unpacked(ray.get(ref))
    with paused_gc():
        return reader.outbox(columns)


def _unpacked(data: bytes) -> Any:
    """What :func:`_packed` pickled (no garbage collection meanwhile: a round is many objects, no cycles)."""
    with paused_gc():
        return pickle.loads(data)


class _Actor:
    """The body of a shard actor: a :class:`ShardHost` behind async methods.

    The parts other shards' outboxes hold for this one arrive as the last arguments (Ray resolves
    them straight from its object store: they never pass through the driver).
    """

    def __init__(self, total: int, concurrency: int, shards: int, number: int, key: str) -> None:
        rare_full_passes()  # the process is the shard's; each step freezes what it kept: a full pass walks one round
        from ray import cloudpickle

        pickler = cloudpickle.Pickler
        self.host = ShardHost(
            total=total, concurrency=concurrency, shards=shards, number=number, key=key, pickler=pickler
        )
        self.outboxes = OutboxWriter()
        self.kept: list[Any] = []

    async def load(self, blob: bytes, addresses: bytes) -> int:
        with paused_gc():
            ready = self.host.load(blob, pickle.loads(addresses))
        gc.freeze()  # this process is the shard's: its roles live as long as it does, collections skip them
        return ready

    async def answer(self, request: bytes, broadcasts: bytes, *parts: bytes) -> Any:
        """The reply to ``request`` (``sharding.shardset``); a round's is several objects (``RayShards.send``)."""
        asked: Request = _unpacked(request)
        if type(asked) is Release:
            with paused_gc():
                return await self.host.answer(asked, _unpacked(broadcasts), parts)
        reply = await self.host.answer(asked, _unpacked(broadcasts), parts)
        if type(reply) is not RoundDone:
            gc.freeze()  # what a checkpoint's writer keeps stays: later collections skip it
            return reply
        assert type(asked) is RunRound
        result = reply.result
        heavy: bytes | None = None
        if asked.outbox:  # apart from the result: the driver takes it in when it needs it
            heavy = _packed(self.outboxes.columns(result.outbox))
        else:  # kept here until the driver asks (kept_outboxes): a round it does not read costs nothing more
            self.kept.append(result.outbox)
        result.outbox = []
        packed = (_packed(result), heavy, *(_packed(part) if part else None for part in reply.outgoing))
        gc.freeze()  # what the roles now remember stays: later collections skip it
        return packed

    async def kept_outboxes(self) -> bytes:
        """The outboxes of the rounds whose results went without them, in round order, as columns."""
        kept, self.kept = self.kept, []
        return _packed([self.outboxes.columns(outbox) for outbox in kept])

    async def release_more(self, number: int) -> bytes:
        with paused_gc():
            return self.host.release_more(number)

    async def pid(self) -> int:
        return os.getpid()


class _InFlight:
    """The shards' ``answer`` calls of one :meth:`RayShards.send`, read back as typed replies."""

    def __init__(self, shards: RayShards, requests: list[Request | None], calls: list[Any]) -> None:
        self.shards, self.requests, self.calls = shards, requests, calls

    async def replies(self) -> list[Any]:
        replies: list[Any] = []
        for shard, (request, refs) in enumerate(zip(self.requests, self.calls, strict=True)):
            if request is None:
                replies.append(None)
            elif type(request) is RunRound:
                replies.append(await self.shards.stepped(shard, request, refs))
            else:
                replies.append(await refs)
        return replies


class RayShards:
    """The shard actors of one run (a ``sharding.driver.ShardSet``)."""

    def __init__(self, backend: RayBackend) -> None:
        """Shards as ``backend`` says; the actors start in :meth:`load`."""
        self.backend = backend
        self.count = backend.shards
        self.actors: list[Any] = []
        self.readers: list[OutboxReader] = []
        self.kept: list[deque[tuple[Any, dict[str, list[str]]]]] = []
        """Per shard, outboxes it kept (``step`` without ``outbox``) fetched and not yet taken in."""
        """Per shard, what reads its outboxes (the sets of recipients it sent so far)."""
        self.calls = 0
        """Calls made to shards so far: at most one per shard per round, one to start, one per piece given back."""
        self.ray = backend.connect()
        from ray import cloudpickle

        by_value: Callable[[Any], None] = cloudpickle.register_pickle_by_value  # (ray's cloudpickle is untyped)
        for module in list(sys.modules.values()):  # a scenario from a file: no worker can import it
            if isinstance(module, ModuleType) and vars(module).get(FILE_SCENARIO):
                by_value(module)
        self.pickler: type[pickle.Pickler] = cloudpickle.Pickler

    def start(self, *, total: int, concurrency: int, key: str) -> None:
        """Start one actor per shard (their processes come up while the driver prepares their roles)."""
        actor = self.ray.remote(num_cpus=self.backend.num_cpus)(_Actor)
        self.actors = [actor.remote(total, concurrency, self.count, n, key) for n in range(self.count)]
        self.readers = [OutboxReader() for _ in range(self.count)]
        self.kept = [deque[tuple[Any, dict[str, list[str]]]]() for _ in range(self.count)]

    async def load(self, blobs: Iterable[bytes], *, addresses: Addresses) -> list[int]:
        """Give each started actor its roles (a shard loads its part while the next is pickled)."""
        shared = self.ray.put(_packed(addresses))
        refs = [a.load.remote(blob, shared) for a, blob in zip(self.actors, blobs, strict=True)]
        return [await ref for ref in refs]

    def send(self, requests: Sequence[Request | None], broadcasts: list[Message]) -> _InFlight:
        """One ``answer`` call per shard with a request, all in flight at once (broadcasts stored once for all).

        A round's reply comes as several objects: its result; its outbox (the driver takes
        them in when it needs them: ``RoundResult.open``; without ``outbox``, the shard keeps them until
        then); and its parts for the other shards, of which the driver keeps only the handles and
        passes them to the next call of the shard they are for.
        """
        shared = self.ray.put(_packed(broadcasts))  # once, whatever the number of shards
        calls: list[Any] = []
        for actor, request in zip(self.actors, requests, strict=True):
            if request is None:
                calls.append(None)
                continue
            handles, request.delivery.crossed = request.delivery.crossed, []
            returns = self.count + 2 if type(request) is RunRound else 1
            calls.append(actor.answer.options(num_returns=returns).remote(_packed(request), shared, *handles))
        self.calls += sum(type(request) is RunRound for request in requests)
        return _InFlight(self, list(requests), calls)

    async def stepped(self, shard: int, request: RunRound, refs: list[Any]) -> RoundDone:
        """The reply to a round: its result (the outbox sealed: fetched when opened), its parts' handles."""
        result: RoundResult = _unpacked(await refs[0])
        if request.outbox:
            result.sealed = functools.partial(_opened, self.ray, refs[1], self.readers[shard])
        else:
            result.sealed = functools.partial(self._next_kept, shard)
        return RoundDone(result, [ref if n else None for ref, n in zip(refs[2:], result.crossing, strict=True)])

    def _next_kept(self, shard: int) -> Any:
        """The next outbox ``shard`` kept (``kept_outboxes``: all it holds, fetched when the last is used up)."""
        queue = self.kept[shard]
        if not queue:
            queue.extend(_unpacked(self.ray.get(self.actors[shard].kept_outboxes.remote())))
            self.calls += 1
        columns = queue.popleft()
        with paused_gc():
            return self.readers[shard].outbox(columns)

    async def pieces(self, counts: list[int]) -> AsyncIterator[tuple[int, bytes]]:
        """The rest of each shard's released roles: every shard's second piece, then their thirds... (asked at once)."""
        more = [[a.release_more.remote(k) for k in range(1, n)] for a, n in zip(self.actors, counts, strict=True)]
        self.calls += sum(map(len, more))
        for k in range(max(map(len, more), default=0)):
            for n, refs in enumerate(more):
                if k < len(refs):
                    yield n, await refs[k]

    async def pids(self) -> list[int]:
        """The process id of each shard actor (to watch or kill one)."""
        refs = [a.pid.remote() for a in self.actors]
        return [await ref for ref in refs]

    async def close(self) -> None:
        """Stop the actors."""
        for a in self.actors:
            self.ray.kill(a)
        self.actors = []
