"""What a checkpoint delta may leave out: roles that replaying the recorded ops rebuilds exactly.

A delta lists the bus's ops (observe, act) and deliveries; a role whose turn is the default one
over plain memory and buffer is rebuilt from them on restore, and gets no entry of its own. The
writer keeps each such role's :func:`signature` and checks with :func:`replays` that the role is
what a replay would give.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from metaroles.bus.role import Role
from metaroles.messages.memory import Memory
from metaroles.messages.message import Message
from metaroles.messages.queue import MessageQueue


def plain(message: Message) -> bool:
    """Whether ``message`` has only the routing fields (the table writes it in its short form)."""
    return (
        message.instruct_content is None
        and not message.has_metadata
        and message.tool_calls is None
        and message.name is None
        and message.tool_call_id is None
        and message.base64_image is None
    )


def replayable(role: Role) -> bool:
    """Whether a replay of the bus's ops rebuilds this role: a default turn over plain memory and buffer."""
    rc = role.rc
    return (
        role.default_turn
        and type(rc.memory) is Memory
        and not rc.memory.ignore_id
        and type(rc.msg_buffer) is MessageQueue
        and role.brain_memory is None
        and not role.keeps_extra_state
    )


@dataclass(slots=True)
class Expected:
    """What a replayable role should look like once the recorded ops are replayed.

    The checkpoint writer takes it from the role (:meth:`take`) and moves it along with each op it
    records: an observation, an act, a delivery.
    """

    remembered: int = 0
    """How many messages its memory holds."""
    edits: int = 0
    """Its memory's removals."""
    buffered: int = 0
    """How many messages its buffer holds."""
    last: Message | None = None
    """The newest of them."""
    news: Any = None
    """Its news list (the very object)."""
    working: int = 0
    """How many messages its working memory holds."""
    working_edits: int = 0
    """The working memory's removals."""
    watching: int = 0
    """How many actions it watches."""
    addresses: frozenset[str] = frozenset()
    """Its addresses (the very object)."""

    def take(self, role: Role) -> Expected:
        """Look as ``role`` looks now; return self."""
        rc = role.rc
        memory, buffer, working = rc.memory, rc.msg_buffer, rc.working_so_far
        self.remembered, self.edits, self.buffered, self.last = len(memory), memory.edits, len(buffer), buffer.last()
        self.news, self.working, self.working_edits = rc.news, len(working), working.edits
        self.watching, self.addresses = len(rc.watch), role.addresses
        return self


def replays(role: Role, expected: Expected) -> bool:
    """Whether ``role`` is exactly what replaying the recorded ops gives (else it gets an entry).

    Runs for every replayable role at every delta: the identity tests first, :func:`replayable` last.
    """
    rc = role.rc
    memory, buffer, working = rc.memory, rc.msg_buffer, rc.working_so_far
    return (
        rc.news is expected.news
        and role.addresses is expected.addresses
        and rc.state == -1
        and rc.todo is None
        and len(memory) == expected.remembered
        and memory.edits == expected.edits
        and len(buffer) == expected.buffered
        and buffer.last() is expected.last
        and len(working) == expected.working
        and working.edits == expected.working_edits
        and len(rc.watch) == expected.watching
        and replayable(role)
    )
