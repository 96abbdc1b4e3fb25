"""Where a Team's rounds run, behind one protocol: this process, or shards (:class:`Runtime`).

A Team speaks to its runtime and never asks which one it has: it runs a round, asks whether
anyone is left with something to do, has the round's metric parts measured, checkpoints, and hands
over the rest of recording a round (:meth:`Runtime.then`). :class:`OneProcess` runs the rounds on
the Environment itself; :class:`Sharded` on a sharded run's driver (``sharding.driver``), where
recording round N while the shards run round N+1, checkpoint parts written by the shards and
the history taken in late are its own business. :func:`runtime_for` picks one from the backend.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from metaroles.bus.environment import Environment
from metaroles.bus.role import Role
from metaroles.core.exceptions import RunError
from metaroles.record.checkpoint import CheckpointWriter
from metaroles.record.eventlog import EventLog
from metaroles.sharding.backends import Backend, ShardBy
from metaroles.sharding.cast import Cast
from metaroles.sharding.driver import RemoteRole, ShardedRun
from metaroles.sharding.session import sharded

__all__ = ["OneProcess", "Runtime", "Sharded", "runtime_for"]

Commit = Callable[[Sequence[Path]], object]
"""Writes the round's checkpoint file once the files given are durable (:meth:`Runtime.prepare_checkpoint`'s)."""

Part = Callable[[list[Role]], Any]
"""A function of some of the run's roles whose results a round metric combines (``Team.metric_parts``)."""


class Runtime(Protocol):
    """The rounds of a Team's run, wherever they run (see the module)."""

    env: Environment
    stay: bool
    """Leave the roles where they ran when the run ends (its last checkpoint holds them all)."""

    @property
    def is_idle(self) -> bool:
        """True when no role anywhere has anything buffered or on its way."""
        ...

    @property
    def stranded(self) -> bool:
        """Whether roles were lost where they ran (a shard failed): the run's last checkpoint stands for them."""
        ...

    async def run_round(self) -> None:
        """Run the next round: every role with news takes its turn, then what they published is delivered."""
        ...

    def gathered(self, fn: Part) -> list[Any]:
        """``fn`` of the run's roles, one part per place they run in (:meth:`measure` made the parts)."""
        ...

    async def measure(self, fns: list[Part]) -> None:
        """Compute each of ``fns`` of the roles where they are, for :meth:`gathered` (the round just run)."""
        ...

    def catch_up(self) -> None:
        """Make the history whole up to the round just run (its messages may still be where they were published)."""
        ...

    async def prepare_checkpoint(self, writer: CheckpointWriter, meanwhile: Callable[[], None]) -> Commit:
        """Get the round's checkpoint ready (``meanwhile()`` runs as it does); what writes its file, last."""
        ...

    async def final_checkpoint(self, writer: CheckpointWriter, after: Sequence[Path]) -> None:
        """Write the checkpoint of the round the run stopped at, once the files ``after`` are durable."""
        ...

    def note(self, writer: CheckpointWriter) -> None:
        """Let ``writer`` take in a round that gets no checkpoint file (the next one is a delta over it)."""
        ...

    def then(self, record: Callable[[], None], *, now: bool) -> None:
        """Run ``record`` (the rest of recording the round): at once if ``now``, else when this runtime may."""
        ...

    def recorded(self) -> None:
        """Run what :meth:`then` left for later, now (the run is about to stop)."""
        ...


class OneProcess:
    """The rounds run on the Environment itself, in this process."""

    def __init__(self, env: Environment) -> None:
        """Run ``env``'s rounds."""
        self.env = env
        self.stay = False

    @property
    def is_idle(self) -> bool:
        """True when no role has anything buffered."""
        return self.env.is_idle

    @property
    def stranded(self) -> bool:
        """Never: every role is here."""
        return False

    async def run_round(self) -> None:
        """Run the Environment's next round."""
        await self.env.run_round()

    def gathered(self, fn: Part) -> list[Any]:
        """One part: ``fn`` of every role."""
        return [fn(list(self.env.roles.values()))]

    async def measure(self, fns: list[Part]) -> None:
        """Nothing to do ahead: :meth:`gathered` reads the roles here."""

    def catch_up(self) -> None:
        """Nothing to do: the history is whole as each round ends."""

    async def prepare_checkpoint(self, writer: CheckpointWriter, meanwhile: Callable[[], None]) -> Commit:
        """``meanwhile()``; the file is the writer's of the whole environment."""
        meanwhile()
        return partial(self._write, writer)

    def _write(self, writer: CheckpointWriter, after: Sequence[Path]) -> None:
        writer.write(self.env, after=after)

    async def final_checkpoint(self, writer: CheckpointWriter, after: Sequence[Path]) -> None:
        """The whole environment's checkpoint."""
        writer.write(self.env, after=after)

    def note(self, writer: CheckpointWriter) -> None:
        """Its turns and deliveries, which the next delta replays."""
        writer.note(self.env)

    def then(self, record: Callable[[], None], *, now: bool) -> None:
        """``record()`` at once: nothing runs meanwhile."""
        record()

    def recorded(self) -> None:
        """Nothing is left for later."""


class Sharded:
    """The rounds run on shards, driven from here (``sharding.driver.ShardedRun``)."""

    def __init__(self, run: ShardedRun) -> None:
        """Drive ``run``."""
        self.run = run
        self.env = run.env
        self.failed = False
        """Whether the run ended by an error (roles still on shards are then stranded)."""
        self._parts: dict[Part, list[Any]] = {}

    @property
    def stay(self) -> bool:
        """Leave the roles on their shards when the run ends (its last checkpoint holds them all)."""
        return self.run.stay

    @stay.setter
    def stay(self, value: bool) -> None:
        self.run.stay = value

    @property
    def is_idle(self) -> bool:
        """True when no role on any shard or here has anything buffered or on its way."""
        return self.run.is_idle

    @property
    def stranded(self) -> bool:
        """Whether a shard failed, or the run failed while roles were on shards."""
        return self.run.broken or (self.failed and any(isinstance(r, RemoteRole) for r in self.env.members))

    async def run_round(self) -> None:
        """One call per shard; recording the round before runs while they work."""
        await self.run.run_round()

    def gathered(self, fn: Part) -> list[Any]:
        """The parts the shards (and this process) measured.

        Raises:
            RunError: If ``fn`` was not measured (it is not in ``Team.metric_parts``).
        """
        parts = self._parts.get(fn)
        if parts is None:
            raise RunError(
                f"{getattr(fn, '__name__', fn)!r} reads roles that live on shards; add it to Team.metric_parts "
                "(a scenario: METRIC_PARTS) so each shard computes its part"
            )
        return parts

    async def measure(self, fns: list[Part]) -> None:
        """Each shard computes its parts (one call); the history is taken in meanwhile."""
        self._parts = await self.run.measure(fns, self.run.catch_up)

    def catch_up(self) -> None:
        """Take in the rounds' outboxes still on the shards (a reader wants the history)."""
        self.run.catch_up()

    async def prepare_checkpoint(self, writer: CheckpointWriter, meanwhile: Callable[[], None]) -> Commit:
        """Each shard writes its part (``meanwhile()`` as they do); this process's file, naming them, comes last."""
        parts = await self.run.checkpoint(writer.folder, meanwhile)
        return partial(writer.write_driver, self.env, self.run.pinned, parts)

    async def final_checkpoint(self, writer: CheckpointWriter, after: Sequence[Path]) -> None:
        """The shards' parts, then this process's file."""
        writer.write_driver(self.env, self.run.pinned, await self.run.checkpoint(writer.folder), after)

    def note(self, writer: CheckpointWriter) -> None:
        """The history's new rows (the shards keep their roles' turns)."""
        writer.note_history(self.env)

    def then(self, record: Callable[[], None], *, now: bool) -> None:
        """``record()`` at once if ``now``, else while the shards run the next round (or as the run ends)."""
        if now:
            record()
        else:
            self.run.later = record

    def recorded(self) -> None:
        """Run the recording left for the next round, now."""
        self.run.take_later()()


@asynccontextmanager
async def runtime_for(
    env: Environment,
    backend: Backend | None,
    *,
    shard_by: ShardBy | None = None,
    casts: Sequence[tuple[int, Cast]] = (),
    keep: bool = True,
    log: EventLog | None = None,
    read_between: bool = True,
) -> AsyncIterator[Runtime]:
    """The runtime ``backend`` says (``None``: this process) for ``env``'s rounds inside the block.

    On shards the roles move when the block starts and come back (or stay: :attr:`Runtime.stay`) when
    it ends; ``casts``, ``keep`` and ``shard_by`` say how (``sharding.session.sharded``). ``log``: what
    the shards send for the event log; ``read_between``: someone reads the history between rounds (a log,
    a checkpoint, a hook), else it is taken in as the run closes.
    """
    if backend is None:
        yield OneProcess(env)
        return
    shards, shard_by = backend.shard_set(), backend.shard_by or shard_by
    runtime: Sharded | None = None
    try:
        async with sharded(env, shards, shard_by, casts, behind=True, keep=keep) as run:
            runtime = Sharded(run)
            run.record_for(log)
            run.backlog.lazy = not read_between
            try:
                yield runtime
            finally:
                run.take_later()()  # the round before a failure was complete: its recording too
    except BaseException:
        if runtime is not None:
            runtime.failed = True
        raise
