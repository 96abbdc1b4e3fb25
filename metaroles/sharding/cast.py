"""Many roles from one recipe, built again where they run: a :class:`Cast`.

``Team.hire(Cast(count, build))`` hires ``build(0)``, …, ``build(count - 1)``. In one process that is
all there is to it. On shards, a role the cast built and nothing has changed yet (the run has not
started, its memory is empty) does not travel pickled: its shard calls ``build(i)`` itself and gives
the new role what it received so far (a :class:`Seat` carries the index, the model and the buffered
messages). A shard then holds roles as compact as freshly built ones, and the driver ships a recipe
instead of a hundred thousand objects.

With ``names``, the cast's roles are built in one process only when something first reaches them
(``Bus.add_cast``): a role no message reached costs the bus nothing.

``build`` must make the same role wherever it runs: a function of ``i`` and of what it was made
with (a module-level function, a ``functools.partial`` or a picklable object), not of a clock or of
the process. A shard checks that the role it built has the name and addresses of the one it stands
for and stops the run with what went wrong if not.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from metaroles.bus.role import Role
from metaroles.core.exceptions import InvalidValueError, RunError
from metaroles.messages.memory import Memory
from metaroles.messages.message import Message
from metaroles.messages.queue import MessageQueue

__all__ = ["Cast", "Seat", "seats"]


@dataclass(frozen=True)
class Cast:
    """``count`` roles: the ``i``-th is ``build(i)`` (the same role in any process)."""

    count: int
    build: Callable[[int], Role]
    names: str | None = None
    """The roles' names as a pattern, ``"u{}"``: the ``i``-th is named ``names.format(i)`` and receives on its
    name and its class. Given, a role is built when first touched, not when hired (``bus.population``):
    a million users cost nothing until they act. ``None``: each is built as it is hired."""

    def __post_init__(self) -> None:
        """Check the arguments, naming what is wrong."""
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 0:
            raise InvalidValueError(f"Cast count={self.count!r} must be a non-negative integer")
        if not callable(self.build):
            raise InvalidValueError(f"Cast build={self.build!r} must be callable as build(i) -> Role")

    def roles(self) -> Iterator[Role]:
        """Build every role, in order."""
        for i in range(self.count):
            role = self.build(i)
            if not isinstance(role, Role):
                raise InvalidValueError(f"Cast build({i}) returned {role!r}; it must return a Role")
            yield role


class Seat:
    """A role to be built on its shard: which of its cast, and what it has that ``build`` does not give it."""

    __slots__ = ("addresses", "buffer", "cast", "ids", "index", "llm", "name", "place")

    def __init__(
        self, cast: Cast, index: int, name: str, addresses: Any, place: int, ids: Any, llm: Any, buffer: list[Message]
    ) -> None:
        """Stand for the ``index``-th role of ``cast`` (``name`` on ``addresses``, at ``place``), holding ``buffer``."""
        self.cast, self.index, self.name, self.addresses, self.place = cast, index, name, addresses, place
        self.ids, self.llm, self.buffer = ids, llm, buffer

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as the fields (the cast is shared by every seat of a part: pickled once)."""
        return Seat, (self.cast, self.index, self.name, self.addresses, self.place, self.ids, self.llm, self.buffer)

    def build(self, host: Any) -> Role:
        """The role, built here, attached to ``host`` at its place, holding what it had received.

        Raises:
            RunError: If ``build`` made a role other than the one hired (another name or addresses).
        """
        role = self.cast.build(self.index)
        if not isinstance(role, Role) or role.name != self.name or role.addresses != self.addresses:
            got = f"{role.name!r} on {sorted(role.addresses)}" if isinstance(role, Role) else repr(role)
            raise RunError(
                f"Cast build({self.index}) made {got} on a shard, but the team hired {self.name!r} on "
                f"{sorted(self.addresses)}; build(i) must make the same role in every process (change a "
                "cast's roles in build, or hire them as roles)"
            )
        if self.llm is not None:
            role.set_llm(self.llm)
        role.attach(host, self.place, ids=self.ids)
        for message in self.buffer:
            role.rc.msg_buffer.push(message)
        return role


def seats(casts: Sequence[tuple[int, Cast]], kept: dict[int, Role] | None = None) -> Callable[[Role], Seat | None]:
    """Given the casts a team hired (``(first place, cast)``), a role's seat if its shard may build it, else None.

    Only a role as its cast made it qualifies: nothing in its memory, a plain buffer (what it holds
    travels with the seat). ``kept`` collects, by place, each role given a seat (it comes back into
    that very role, as its state: ``sharding.transfer``).
    """
    starts = [start for start, _ in casts]

    def seat(role: Role) -> Seat | None:
        n = bisect.bisect_right(starts, role.place) - 1
        if n < 0:
            return None
        start, cast = casts[n]
        index = role.place - start
        if index >= cast.count or type(role.rc.msg_buffer) is not MessageQueue:
            return None
        if type(role.rc.memory) is not Memory or len(role.rc.memory):
            return None
        buffer = role.rc.msg_buffer.peek_all()
        if kept is not None:
            kept[role.place] = role
        return Seat(cast, index, role.name, role.addresses, role.place, role.ids, role.llm, buffer)

    return seat
