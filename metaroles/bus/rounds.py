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

from metaroles.bus.action import failure_message, result_message
from metaroles.bus.role import Role
from metaroles.core.exceptions import LLMOutputInvalid
from metaroles.core.ids import SCOPE
from metaroles.core.schema import ChatRole
from metaroles.messages.message import Message

OnError = Callable[[Role, Exception], None]


class TurnObserver(Protocol):
    """Sees each round and turn while it runs (telemetry: ``runs.telemetry``); ``None`` on the bus costs nothing."""

    def round_begin(self, env: Any) -> None:
        """Round ``env.round`` is about to run its turns."""

    def round_end(self, env: Any, failures: list[tuple[Role, Exception]]) -> None:
        """Round ``env.round``'s turns are over and its messages delivered."""

    def turn(self, role: Role, turn: Coroutine[Any, Any, Any]) -> Coroutine[Any, Any, Any]:
        """Run ``turn`` (the role's turn in this round) within whatever the observer keeps of it."""
        ...

    def agent_event(self, role: Role, kind: str, fields: dict[str, Any]) -> None:
        """An agent on the bus made a ``tool_call`` or got its ``tool_result``."""


def _turn(role: Role) -> Coroutine[Any, Any, Any]:
    return plain_turn(role) if role.takes_plain_turn else role.run()


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
        queue = self.queue
        outer = _enter(None)  # each turn below sets its role's scope; the drain restores the caller's
        try:
            while queue:
                role = queue.popleft()
                ids = role.ids  # take_turn, inlined: one frame and one reset less per turn
                if ids is not None and ids.clock is None:
                    ids.at(self.round)
                _enter(ids)
                try:
                    if self.observer is None:
                        await (plain_turn(role) if role.takes_plain_turn else role.run())
                    else:
                        await self.observer.turn(role, _turn(role))
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


async def take_turn(role: Role, round_no: int, observer: TurnObserver | None = None) -> None:
    """One turn of ``role`` in round ``round_no``, the ids it makes drawn from its own scope.

    Its ids then depend only on the round, the role's place and what it does, never on which
    worker ran it or when (see ``core.ids``).
    """
    ids = role.ids
    if ids is not None and ids.clock is None:
        ids.at(round_no)
    token = _enter(ids)
    try:
        await (_turn(role) if observer is None else observer.turn(role, _turn(role)))
    finally:
        _leave(token)


async def plain_turn(role: Role) -> Message | None:
    """The default turn of a role with at most one action whose class overrides no turn hook.

    Behaves exactly as ``_observe`` → ``react`` → ``publish_message`` do for such a role,
    with their bodies inlined: fewer awaits and calls on the hot path of large societies.
    """
    rc = role.rc
    env = rc.env
    trace = env.trace if env is not None else None
    memory = rc.memory
    rc.remembered, news = memory.remember_news(rc.msg_buffer.pop_all(), rc.watch, role.name)
    rc.news = news
    if trace is not None:
        trace.append(("observe", role.name, news, rc.remembered))
    if not news or not role.actions:
        return None
    todo = rc.todo = role.actions[0]
    rc.state = 0
    if trace is not None:
        trace.append(("think", role.name, todo, 0))
    name, send_to = role.name, role._send_to
    try:  # run_action, inlined
        result = await todo.run(memory.get())
    except LLMOutputInvalid as exc:
        result = failure_message(todo, exc, name, send_to)
    if type(result) is str:
        message: Message | None = Message._trusted(result, None, ChatRole.ASSISTANT, todo._action_id, name, send_to)
    elif type(result) is Message and result.sent_from:  # the action addressed it itself
        message = result
    else:
        message = result_message(result, todo, name, send_to)
    if message is not None:
        memory.add(message)
    if trace is not None:
        trace.append(("act", role.name, message, 0))
    rc.state, rc.todo = -1, None
    if message is not None and env is not None:
        env.publish_message(message)
    return message


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
