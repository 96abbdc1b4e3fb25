"""What a run saves: the serialisable state of a role and of a whole environment.

``RoleState`` holds everything needed to resume a role, buffered messages included;
``EnvironmentState`` holds the roles, the history, dead letters, events, the cost ledger and the
random source. A state an Environment saves holds each history message once: roles refer to it
by id (:func:`by_reference`), and loading resolves the ids (:func:`resolved`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Annotated, Any, cast

from pydantic import BaseModel, Field, field_serializer, field_validator

from metaroles.bus.context import RoleContext
from metaroles.bus.record import EnvEvent
from metaroles.core.exceptions import ConfigError, InvalidValueError
from metaroles.core.schema import watch_set
from metaroles.llm.ledger import LedgerEntry
from metaroles.longterm.brain import BrainMemory
from metaroles.longterm.memory import LongtermMemory
from metaroles.messages.memory import Memory
from metaroles.messages.message import Message
from metaroles.messages.queue import MessageQueue

MessageRef = Annotated[str | Message, Field(union_mode="left_to_right")]
"""A message, or (in a state an Environment saved) the id of a message in its history."""


STATE_REFERENCE = "checkpoint_reference"
"""The ``kind`` of a ``state.json`` that names a run's last checkpoint instead of holding the state."""


class RoleState(BaseModel):
    """A role's serialisable state: nothing buffered or remembered is left out."""

    name: str
    cls: str
    addresses: list[str]
    watch: list[str]
    state: int = -1
    buffer: list[MessageRef] = Field(default_factory=list)
    """Buffered messages. In a state an Environment saved, a string is the id of a message in its history."""
    memory: list[MessageRef] = Field(default_factory=list)
    """Remembered messages (ids of history messages, as for ``buffer``)."""
    working_memory: list[MessageRef] = Field(default_factory=list)
    """Plan-and-act step outputs (ids of history messages, as for ``buffer``)."""
    news: list[MessageRef] = Field(default_factory=list)
    """The last observation's news (ids, in states saved before news were kept whole)."""
    long_term: str | None = None
    """The id under which the role's long-term memory was persisted, if it has one."""
    brain: BrainMemory | None = None
    """The role's BrainMemory (conversation, knowledge, summary), if it has one."""
    extra: dict[str, Any] | None = None
    """What a subclass keeps beyond the bus's state (:meth:`Role.extra_state`), e.g. an agent's chat."""


class EnvironmentState(BaseModel):
    """A whole Environment, serialisable: roles with buffers and memories, history, ledger."""

    version: int = 1
    round: int = 0
    roles: list[RoleState] = Field(default_factory=list)
    history: list[Message] = Field(default_factory=list)
    dead_letters: list[Message] = Field(default_factory=list)
    events: list[EnvEvent] = Field(default_factory=list)
    ledger: list[LedgerEntry] = Field(default_factory=list)
    rng: list[Any] | None = None
    """The state of :attr:`Environment.rng` (``random.Random.getstate()`` as lists)."""
    id_key: str | None = None
    """The run's id key (:attr:`Environment.id_key`): a resumed or forked run goes on making the same ids."""

    @field_serializer("ledger")
    def _saved_ledger(self, entries: list[LedgerEntry]) -> list[dict[str, Any]]:
        return [entry.saved() for entry in entries]

    @field_validator("history", mode="before")
    @classmethod
    def _history_as_memory(cls, value: Any) -> Any:
        """A history given as a Memory, or as MetaGPT's dump of one (``{"storage": [...], "index": ...}``)."""
        if isinstance(value, Memory):
            return value.storage
        if isinstance(value, Mapping) and "storage" in value:
            return value["storage"]
        return value


_SHARED_FIELDS = ("buffer", "memory", "working_memory", "news")


def by_reference(state: RoleState, history: Mapping[str, Message]) -> RoleState:
    """``state`` with messages that are in the history given by id (a state file holds each message once)."""
    update = {}
    for field in _SHARED_FIELDS:
        items = getattr(state, field)
        update[field] = [m.id if isinstance(m, Message) and _same_as(history.get(m.id), m) else m for m in items]
    return state.model_copy(update=update)


def _same_as(kept: Message | None, message: Message) -> bool:
    """Whether ``message`` is the history's ``kept`` (the same object, or a copy equal in every field).

    A restored role, or one back from a shard, holds copies of history messages; saved by
    reference either way, the state file is the same whether the run was resumed or sharded.
    """
    if kept is message:
        return True
    if kept is None or kept.id != message.id:
        return False
    return kept.same_fields(message)


def resolved(state: RoleState, history: Mapping[str, Message]) -> RoleState:
    """``state`` with history ids replaced by the history's messages.

    Raises:
        ConfigError: If an id is not in the history (a damaged state).
    """
    update = {}
    for field in _SHARED_FIELDS[:3]:
        items = getattr(state, field)
        missing = [m for m in items if isinstance(m, str) and m not in history]
        if missing:
            raise ConfigError(
                f"state of role {state.name!r} names messages {missing[:3]} in {field} that its history lacks"
            )
        update[field] = [history[m] if isinstance(m, str) else m for m in items]
    return state.model_copy(update=update)


def rng_state(rng: random.Random) -> list[Any]:
    """``rng``'s state as JSON-friendly lists."""
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def set_rng_state(rng: random.Random, state: list[Any]) -> None:
    """Restore a state taken by :func:`rng_state`."""
    version, internal, gauss = state
    rng.setstate((version, tuple(internal), gauss))


def whole_messages(state: RoleState, field: str) -> list[Message]:
    """A list of the state's messages, which must be whole (an Environment resolves history ids first).

    Raises:
        InvalidValueError: If it holds a history id.
    """
    items: list[Message | str] = getattr(state, field)
    for item in items:
        if not isinstance(item, Message):
            raise InvalidValueError(
                f"state of role {state.name!r} refers to message {item!r} of an environment's history in {field}; "
                "load it with Environment.load_state, which resolves such ids"
            )
    return cast(list[Message], items)


def restored_news(saved: list[Message | str], memory: dict[str, Message]) -> list[Message]:
    """The news of a saved state, sharing the remembered instances (an old state saved only ids)."""
    news = []
    for item in saved:
        if isinstance(item, Message):
            news.append(memory.get(item.id, item))
        elif item in memory:
            news.append(memory[item])
    return news


def context_state(rc: RoleContext) -> dict[str, Any]:
    """The saved fields of a role's context: watch set, stage, buffer, memories and news."""
    return {
        "watch": sorted(rc.watch),
        "state": rc.state,
        "buffer": rc.msg_buffer.peek_all(),
        "memory": list(rc.memory.storage),
        "working_memory": list(rc.working_so_far.storage),
        "news": list(rc.news),
    }


def restore_context(rc: RoleContext, state: RoleState) -> None:
    """Give ``rc`` the buffer, memories, watch set and news of ``state`` (long-term memory recovered too)."""
    buffer, memory, working = (whole_messages(state, field) for field in ("buffer", "memory", "working_memory"))
    rc.msg_buffer = MessageQueue(buffer)
    if isinstance(rc.memory, LongtermMemory):
        Memory.clear(rc.memory)
        if state.long_term:
            rc.memory.memory_storage.recover_memory(state.long_term)
        Memory.add_batch(rc.memory, memory)
    else:
        rc.memory = Memory(memory, ignore_id=rc.memory.ignore_id)
    rc._working = Memory(working) if working else None  # none made for a role that never planned
    rc.watch = watch_set(state.watch)
    rc.news = restored_news(state.news, {m.id: m for m in memory})


def persist_long_term(memory: Memory, role_name: str) -> str | None:
    """Persist a role's long-term memory, if it has one kept on disk; the id it is kept under."""
    if not isinstance(memory, LongtermMemory) or memory.memory_storage.root is None:
        return None
    storage = memory.memory_storage
    storage.role_id = storage.role_id or role_name
    storage.persist()
    return storage.role_id
