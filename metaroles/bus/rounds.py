"""Running the roles of one round concurrently, without paying for a task per role.

The round's own task drains a queue of ready roles. One worker is woken (or started) at once; it
only gets to run when the round's task waits (a role awaiting its model) or has drained the queue.
A worker that runs while roles are still queued wakes more — twice as many each time, so a
thousand waiting roles are all in flight after a few hops — then drains too. Roles that never
wait cost no task at all; roles that wait get up to ``concurrency`` tasks. Workers park between
rounds for the next one (within an Environment's session).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup

from metaroles.bus.role import Role
from metaroles.core.ids import SCOPE

OnError = Callable[[Role, Exception], None]


class TurnObserver(Protocol):
    """Sees each round and turn while it runs (telemetry: ``telemetry.tracing``); ``None`` on the bus costs nothing."""

    def round_begin(self, env: Any) -> None:
        """Round ``env.round`` is about to run its turns."""

    def round_end(self, env: Any, failures: list[tuple[Role, Exception]]) -> None:
        """Round ``env.round``'s turns are over and its messages delivered."""

    def turn(self, role: Role, turn: Coroutine[Any, Any, Any]) -> Coroutine[Any, Any, Any]:
        """Run ``turn`` (the role's turn in this round) within whatever the observer keeps of it."""
        ...

    def agent_event(self, role: Role, kind: str, fields: dict[str, Any]) -> None:
        """An agent on the bus made a ``tool_call`` or got its ``tool_result``."""


class WorkerPool:
    """Worker tasks that outlive rounds: a round wakes parked workers instead of spawning tasks.

    The round's own task drains the queue too; parked workers are woken (and, up to the bound,
    new ones started) with doubling fan-out, and stay for the next round.

    Args:
        tg: The task group the workers live in (the Environment's session).
        concurrency: Roles mid-turn at once, the round's own task included.
    """

    def __init__(self, tg: TaskGroup, concurrency: int) -> None:
        """Create an empty pool; workers start when a round needs them."""
        self.tg = tg
        self.limit = concurrency - 1
        self.started = 0
        self.parked: list[anyio.Event] = []
        self.queue: deque[Role] = deque()
        self.unfinished = 0
        self.done = anyio.Event()
        self.on_error: OnError = _raise
        self.fanout = 1
        self.round = 0
        self.observer: TurnObserver | None = None

    async def run(self, roles: Iterable[Role], round_no: int, *, on_error: OnError) -> None:
        """Run round ``round_no``'s turn of each of ``roles``; return when every turn is over."""
        self.round = round_no
        self.queue.extend(roles)
        self.unfinished = len(self.queue)
        self.on_error = on_error
        self.fanout = 1
        self.done = anyio.Event()
        self._wake(1)
        await self._drain()
        if self.unfinished:
            await self.done.wait()

    def _wake(self, count: int) -> None:
        count = min(count, len(self.queue))
        while count and self.parked:
            self.parked.pop().set()
            count -= 1
        start = min(count, self.limit - self.started)
        self.started += start
        for _ in range(start):
            self.tg.start_soon(self._worker)

    async def _worker(self) -> None:
        while True:
            if self.queue:
                self.fanout *= 2
                self._wake(self.fanout)
                await self._drain()
            else:
                parked = anyio.Event()
                self.parked.append(parked)
                await parked.wait()

    async def _drain(self) -> None:
        queue, observer = self.queue, self.observer
        outer = _enter(None)  # each turn below enters its role's scope; the drain restores the caller's
        try:
            while queue:
                role = queue.popleft()
                enter_turn(role, self.round)
                try:
                    await (role.run() if observer is None else observer.turn(role, role.run()))
                except Exception as exc:
                    self.on_error(role, exc)
                self.unfinished -= 1
                if not self.unfinished:
                    self.done.set()
        finally:
            _leave(outer)


def _raise(role: Role, exc: Exception) -> None:  # pragma: no cover - replaced by each round
    raise exc


_enter, _leave = SCOPE.set, SCOPE.reset  # bound once: a turn pays no extra frame for its ids


def enter_turn(role: Role, round_no: int) -> None:
    """Make the ids the current task creates ``role``'s, in round ``round_no``, until the next turn it enters.

    Its ids then depend only on the round, the role's place and what it does, never on which
    worker ran it or when (see ``core.ids``). The caller restores its own scope when its turns are over.
    """
    ids = role.ids
    if ids is not None and ids.clock is None:
        ids.at(round_no)
    _enter(ids)


async def take_turn(role: Role, round_no: int, observer: TurnObserver | None = None) -> None:
    """One turn of ``role`` in round ``round_no`` (``Role.run``, seen by ``observer``), in its own id scope."""
    outer = _enter(None)
    try:
        enter_turn(role, round_no)
        await (role.run() if observer is None else observer.turn(role, role.run()))
    finally:
        _leave(outer)


async def run_roles(
    roles: Iterable[Role], round_no: int, *, concurrency: int, on_error: OnError, observer: TurnObserver | None = None
) -> None:
    """Run one turn of each of ``roles``, at most ``concurrency`` at once, in a pool of its own.

    A role that raises is reported to ``on_error`` and the others go on; the function returns
    when every turn is over, with no task left behind.
    """
    async with anyio.create_task_group() as tg:
        pool = WorkerPool(tg, concurrency)
        pool.observer = observer
        await pool.run(roles, round_no, on_error=on_error)
        tg.cancel_scope.cancel()
