"""Running the roles of one round concurrently, without paying for a task per role.

The round's own task drains a queue of ready roles. One helper task is started; it only gets
to run when the round's task waits (a role awaiting its model) or has drained the queue. A
helper that runs while roles are still queued starts more helpers — twice as many each time, so
a thousand waiting roles are all in flight after a few hops — then drains too. Roles that never
wait cost no task at all; roles that wait get up to ``concurrency`` tasks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

import anyio
from anyio.abc import TaskGroup

from metaroles.role import Role

OnError = Callable[[Role, Exception], None]


class _Drain:
    """A queue of roles and the tasks draining it."""

    __slots__ = ("fanout", "on_error", "queue", "spare", "tg")

    def __init__(self, roles: Iterable[Role], tg: TaskGroup, spare: int, on_error: OnError) -> None:
        self.queue = deque(roles)
        self.tg = tg
        self.spare = spare
        self.on_error = on_error
        self.fanout = 1

    def add_helpers(self, count: int) -> None:
        count = min(count, self.spare, len(self.queue))
        self.spare -= count
        for _ in range(count):
            self.tg.start_soon(self.helper)

    async def helper(self) -> None:
        self.fanout *= 2
        self.add_helpers(self.fanout)
        await self.drain()

    async def drain(self) -> None:
        queue = self.queue
        while queue:
            role = queue.popleft()
            try:
                await role.run()
            except Exception as exc:
                self.on_error(role, exc)


async def run_roles(roles: Iterable[Role], *, concurrency: int, on_error: OnError) -> None:
    """Run one turn of each of ``roles``, at most ``concurrency`` at once.

    A role that raises is reported to ``on_error`` and the others go on; the function returns
    when every turn is over, with no task left behind.
    """
    async with anyio.create_task_group() as tg:
        drain = _Drain(roles, tg, concurrency - 1, on_error)
        drain.add_helpers(1)
        await drain.drain()
