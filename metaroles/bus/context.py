"""A role's runtime context: what it buffers, remembers and is about to do, and what it needs from its bus."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, Protocol

from metaroles.bus.action import Action
from metaroles.bus.record import Steps
from metaroles.core.exceptions import InvalidValueError
from metaroles.llm.ledger import CostLedger
from metaroles.messages.memory import Memory
from metaroles.messages.message import Message
from metaroles.messages.queue import MessageQueue


class RoleReactMode(StrEnum):
    """How a role chooses its actions within one turn."""

    REACT = "react"
    """The model picks the next action, up to ``max_react_loop`` times."""
    BY_ORDER = "by_order"
    """Every action once, in declaration order."""
    PLAN_AND_ACT = "plan_and_act"
    """The model plans a sequence of actions first, then they run in order."""


_REACT_MODES = frozenset(m.value for m in RoleReactMode)


def check_react_mode(react_mode: object, max_react_loop: object) -> RoleReactMode:
    """The react mode named ``react_mode``, after checking it and ``max_react_loop``.

    Raises:
        InvalidValueError: On an unknown mode or a loop bound that is not a positive integer.
    """
    if not isinstance(react_mode, str) or react_mode not in _REACT_MODES:
        allowed = ", ".join(repr(m.value) for m in RoleReactMode)
        raise InvalidValueError(f"react_mode={react_mode!r} is not a react mode; use one of {allowed}")
    mode = RoleReactMode(react_mode)
    if isinstance(max_react_loop, bool) or not isinstance(max_react_loop, int) or max_react_loop < 1:
        raise InvalidValueError(f"max_react_loop={max_react_loop!r} must be a positive integer")
    return mode


class RoleHost(Protocol):
    """What a role needs from the Environment it lives in.

    It speaks of roles as ``Any``: this module sits below ``role`` (a Role holds a RoleContext),
    and the Environment is the one host there is.
    """

    ledger: CostLedger
    steps: Steps | None
    """The round record's turn steps, where a turn appends its own (``None``: not kept)."""

    @property
    def roles(self) -> Mapping[str, Any]:
        """The roles on the bus, by name."""
        ...

    def publish_message(self, message: Message) -> object:
        """Route ``message`` to its recipients."""
        ...

    def mark_ready(self, role: Any) -> None:
        """Note that ``role`` has buffered messages to observe."""
        ...


_NO_WORK = Memory()


class RoleContext:
    """A role's runtime state: buffer, memories, watch set, news and the current todo."""

    __slots__ = (
        "_working",
        "env",
        "max_react_loop",
        "memory",
        "msg_buffer",
        "news",
        "react_mode",
        "remembered",
        "state",
        "todo",
        "watch",
    )

    def __init__(self, *, react_mode: RoleReactMode, max_react_loop: int) -> None:
        """Create an empty context."""
        self.env: RoleHost | None = None
        self.msg_buffer = MessageQueue()
        self.memory = Memory()
        self._working: Memory | None = None  # made when first used: most roles never plan
        self.state = -1
        self.todo: Action | None = None
        self.watch: frozenset[str] = frozenset()
        """The actions whose messages are news (one set shared by the roles that watch the same: ``watch_set``)."""
        self.news: list[Message] = []
        self.remembered = 0  # how many messages the last observation added to memory (news or not)
        self.react_mode = react_mode
        self.max_react_loop = max_react_loop

    @property
    def working_memory(self) -> Memory:
        """What a plan_and_act turn's steps produced (MetaGPT's ``rc.working_memory``)."""
        if self._working is None:
            self._working = Memory()
        return self._working

    @working_memory.setter
    def working_memory(self, memory: Memory) -> None:
        self._working = memory

    @property
    def planned(self) -> Memory | None:
        """The working memory if a plan_and_act turn made one, else ``None`` (reading makes none)."""
        return self._working

    @planned.setter
    def planned(self, memory: Memory | None) -> None:
        self._working = memory

    @property
    def working_so_far(self) -> Memory:
        """The working memory without making one: an empty memory (not to be changed) when none was used."""
        return _NO_WORK if self._working is None else self._working

    @property
    def important_memory(self) -> Sequence[Message]:
        """Remembered messages caused by a watched action."""
        return self.memory.get_by_actions(self.watch)

    @property
    def history(self) -> Sequence[Message]:
        """Everything remembered, oldest first."""
        return self.memory.get()
