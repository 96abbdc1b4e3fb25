"""Where a Team's rounds run, behind one protocol: this process, or shards (:class:`Runtime`).

A Team speaks to its runtime and never asks which one it has, in six words: it runs a round
(:meth:`Runtime.run_round`), asks whether anyone is left with something to do (``is_idle``) or was
lost (``stranded``), has what needs the roles where they are read (:meth:`Runtime.measure`: metric
parts, checkpoint parts — a :class:`Measured`), hands over the round's commit
(:meth:`Runtime.commit`: a ``record.commit.RoundCommit``) and ends (``close``). :class:`OneProcess`
runs the rounds on the Environment itself; :class:`Sharded` on a sharded run's driver
(``sharding.driver``), where committing round N while the shards run round N+1, checkpoint parts
written by the shards and the history taken in late are its own business. :func:`runtime_for` picks
one from the backend.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
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

__all__ = ["Measured", "OneProcess", "Runtime", "Sharded", "runtime_for"]

RoleMetric = Callable[[Sequence[Role]], Any]
"""A role's metric: a function of some of the run's roles, measured where they run, whose parts a round metric
combines (``Team.metric_parts``)."""


def _nothing() -> None:
    """Nothing to take in: the history is whole as each round ends."""


@dataclass
class Measured:
    """What a runtime read of the round just run where the roles are: metric parts, and how to checkpoint the round."""

    parts: dict[RoleMetric, list[Any]]
    checkpoint: Callable[[Sequence[Path]], object] | None = None
    """Writes the round's checkpoint once the files given are durable (a round not due: the writer takes it in)."""
    take_in: Callable[[], None] = _nothing
    """Makes the history whole up to the round (on shards its messages may still be where they were published)."""
    here: Sequence[Role] | None = None
    """The roles, if they are all in this process (any function of them can be read now; a population's are
    built as the function reaches them: ``Bus.add_cast``)."""

    def gathered(self, fn: RoleMetric) -> list[Any]:
        """``fn`` of the run's roles: one part per place they run in.

        Raises:
            RunError: If the roles are on shards and ``fn`` was not measured (not in ``Team.metric_parts``).
        """
        parts = self.parts.get(fn)
        if parts is not None:
            return parts
        if self.here is not None:
            return [fn(self.here)]
        raise RunError(
            f"{getattr(fn, '__name__', fn)!r} reads roles that live on shards; add it to Team.metric_parts "
            "(a scenario: METRIC_PARTS) so each shard computes its part"
        )


def roles_here(env: Environment) -> Sequence[Role]:
    """``env``'s roles in place order, for a function of them: a copy, or the view that builds a population's."""
    roles = env.members
    return list(roles) if isinstance(roles, list) else roles


Meanwhile = Callable[[Measured], None]
"""The round's recording, run where a runtime can while its shards work, given what was measured."""


class Runtime(Protocol):
    """The rounds of a Team's run, wherever they run (see the module)."""

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

    async def measure(
        self,
        fns: list[RoleMetric],
        writer: CheckpointWriter | None = None,
        *,
        due: bool = False,
        meanwhile: Meanwhile | None = None,
    ) -> Measured:
        """Read the round just run where the roles are: each of ``fns``, and (``due``) the round's checkpoint parts.

        ``meanwhile(measured)`` (the round's recording: ``RoundCommit.record``) may run while shards write their
        parts, given the parts measured; the commit runs the recording otherwise.
        """
        ...

    def commit(self, commit: Callable[[], None], *, overlap: bool) -> None:
        """Run ``commit`` (a round's ``record.commit.RoundCommit``): now, or while the next round runs."""
        ...

    def close(self) -> None:
        """The rounds are over: what a commit left for later runs now (a last checkpoint may still be measured)."""
        ...


class OneProcess:
    """The rounds run on the Environment itself, in this process."""

    def __init__(self, env: Environment) -> None:
        """Run ``env``'s rounds."""
        self.env = env

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

    async def measure(
        self,
        fns: list[RoleMetric],
        writer: CheckpointWriter | None = None,
        *,
        due: bool = False,
        meanwhile: Meanwhile | None = None,
    ) -> Measured:
        """Nothing to read ahead (any function of the roles is read when asked); the writer's file of the whole bus."""
        checkpoint: Callable[[Sequence[Path]], object] | None = None
        if writer is not None:
            checkpoint = partial(self._write, writer) if due else partial(self._note, writer)
        return Measured({}, checkpoint, here=roles_here(self.env))

    def _write(self, writer: CheckpointWriter, after: Sequence[Path]) -> None:
        writer.write(self.env, after=after)

    def _note(self, writer: CheckpointWriter, after: Sequence[Path]) -> None:
        writer.hold(after)
        writer.note(self.env)  # its turns and deliveries, which the next delta replays

    def commit(self, commit: Callable[[], None], *, overlap: bool) -> None:
        """``commit()`` at once: nothing runs meanwhile."""
        commit()

    def close(self) -> None:
        """Nothing is left for later."""


class Sharded:
    """The rounds run on shards, driven from here (``sharding.driver.ShardedRun``)."""

    def __init__(self, run: ShardedRun) -> None:
        """Drive ``run``."""
        self.run = run
        self.env = run.env
        self.failed = False
        """Whether the run ended by an error (roles still on shards are then stranded)."""

    @property
    def is_idle(self) -> bool:
        """True when no role on any shard or here has anything buffered or on its way."""
        return self.run.is_idle

    @property
    def stranded(self) -> bool:
        """Whether a shard failed, or the run failed while roles were on shards."""
        return self.run.broken or (self.failed and any(isinstance(r, RemoteRole) for r in self.env.members))

    async def run_round(self) -> None:
        """One call per shard; the commit of the round before runs while they work."""
        await self.run.run_round()

    async def measure(
        self,
        fns: list[RoleMetric],
        writer: CheckpointWriter | None = None,
        *,
        due: bool = False,
        meanwhile: Meanwhile | None = None,
    ) -> Measured:
        """Each shard computes its parts (one call; the history taken in meanwhile), then writes its checkpoint part.

        The checkpoint's own file, naming the parts, is the driver's, written last by the commit.
        """
        run = self.run
        run.take_later()()  # a commit left for later is done first (the run's end): a reader wants what it wrote
        parts = await run.measure(fns, run.catch_up) if fns else {}  # the history taken in as the shards work
        measured = Measured(parts, take_in=run.catch_up)
        if writer is not None and due:
            recording = partial(self._meanwhile, measured, meanwhile)
            names = await run.checkpoint(writer.folder, recording)  # the round recorded while the shards write
            measured.checkpoint = partial(writer.write_driver, self.env, run.pinned, names)
        elif writer is not None:
            measured.checkpoint = partial(self._note, writer)
        return measured

    def _meanwhile(self, measured: Measured, meanwhile: Meanwhile | None) -> None:
        self.run.catch_up()
        if meanwhile is not None:
            meanwhile(measured)

    def _note(self, writer: CheckpointWriter, after: Sequence[Path]) -> None:
        writer.hold(after)
        writer.note_history(self.env)  # the history's new rows (the shards keep their roles' turns)

    def commit(self, commit: Callable[[], None], *, overlap: bool) -> None:
        """``commit()`` at once, or (``overlap``) while the shards run the next round (or as the run ends)."""
        if overlap:
            self.run.later = commit
        else:
            commit()

    def close(self) -> None:
        """Run the commit left for the next round, now."""
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
    stay: Callable[[], bool] = lambda: False,
) -> AsyncIterator[Runtime]:
    """The runtime ``backend`` says (``None``: this process) for ``env``'s rounds inside the block.

    On shards the roles move when the block starts and come back (or stay: :attr:`Runtime.stay`) when
    it ends; ``casts``, ``keep`` and ``shard_by`` say how (``sharding.session.sharded``). ``log``: what
    the shards send for the event log; ``read_between``: someone reads the history between rounds (a log,
    a checkpoint, a hook), else it is taken in as the run closes; ``stay()``, asked as the block ends without
    an error: leave the roles where they ran (the run's last checkpoint holds them all).
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
            run.stay = stay()
    except BaseException:
        if runtime is not None:
            runtime.failed = True
        raise
