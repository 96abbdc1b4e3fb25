"""What a checkpoint delta may leave out: roles that replaying the recorded ops rebuilds exactly.

A delta lists the bus's ops (observe, act) and deliveries; a role whose turn is the default one
over plain memory and buffer is rebuilt from them on restore, and gets no entry of its own. The
writer keeps each such role's :func:`signature` and checks with :func:`replays` that the role is
what a replay would give.
"""

from __future__ import annotations

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
        and type(role).extra_state is Role.extra_state
    )


def signature(role: Role) -> list[Any]:
    """What a replayable role looks like now; the writer moves it along with each op it records."""
    rc = role.rc
    memory, buffer, working = rc.memory, rc.msg_buffer, rc.working_so_far
    return [
        len(memory),
        memory.edits,
        len(buffer),
        buffer.last(),
        rc.news,
        len(working),
        working.edits,
        len(rc.watch),
        role.addresses,
    ]


def replays(role: Role, expected: list[Any]) -> bool:
    """Whether ``role`` is exactly what replaying the recorded ops gives (else it gets an entry)."""
    rc = role.rc
    memory, buffer, working = rc.memory, rc.msg_buffer, rc.working_so_far
    return (
        len(memory) == expected[0]
        and memory.edits == expected[1]
        and len(buffer) == expected[2]
        and buffer.last() is expected[3]
        and rc.news is expected[4]
        and rc.state == -1
        and rc.todo is None
        and len(working) == expected[5]
        and working.edits == expected[6]
        and len(rc.watch) == expected[7]
        and role.addresses is expected[8]
        and replayable(role)
    )
