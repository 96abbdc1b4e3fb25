"""Roles travelling between the driver and its shards, pickled without what both sides already hold.

References to the environment a role lives in, its ledger and clock travel as names and mean the
receiving side's own. Messages the driver's history holds travel **by id** on the way back
(:func:`dumps_roles` with ``known``): the driver rebuilds each role's buffer and memory from its
own history, so nothing is copied twice and the messages stay the very objects of the history, as
in one process. A shard learns which messages the driver holds from what it delivered and from
what came with its roles (:func:`loads_roles` collects those into ``known``).
"""

from __future__ import annotations

import gc
import io
import pickle
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from operator import attrgetter, is_
from typing import Any

from metaroles.bus.environment import Environment
from metaroles.bus.role import Role
from metaroles.messages.memory import Memory
from metaroles.messages.message import Message

_HOST: ContextVar[dict[str, Any]] = ContextVar("metaroles_shard_host")
_ID = attrgetter("id")


def _hosted(key: str) -> Any:
    """What a pickled reference to the environment (or its ledger, or clock) means where it is loaded."""
    return _HOST.get()[key]


def _historic(message_id: str) -> Message:
    """A message of the driver's history, sent back by id."""
    return _HOST.get()["history"][message_id]  # type: ignore[no-any-return]


def _memory_back(ids: bool, edits: int, sent: list[Any], index: dict[str, Any], by_id: bool = False) -> Memory:
    """A memory sent back from a shard: its messages from the driver's history where sent by id.

    ``by_id``: every one of them was (the usual case), so ``sent`` is the ids alone, looked up at C speed.
    """
    history = _HOST.get()["history"]
    if by_id:
        messages = list(map(history.__getitem__, sent))
    else:
        messages = [history[m] if type(m) is str else m for m in sent]
    memory = Memory(ignore_id=not ids)
    memory._edits = edits
    if ids:
        memory._store = dict(zip(sent, messages, strict=True)) if by_id else {m.id: m for m in messages}
    else:
        memory._store = {m.content: m for m in messages}
    memory._items = messages
    memory._index = index
    return memory


def _memory_sent(memory: Memory, known: dict[str, Message]) -> tuple[Any, ...]:
    """How a plain memory travels back: messages the driver holds by id, its index as it is (positions)."""
    items = memory._items
    ids = list(map(_ID, items))
    held = list(map(known.get, ids))
    if all(map(is_, held, items)):  # each one the very message the driver holds
        return _memory_back, (not memory.ignore_id, memory._edits, ids, memory._index, True)
    sent = [i if h is m else m for i, h, m in zip(ids, held, items, strict=True)]
    return _memory_back, (not memory.ignore_id, memory._edits, sent, memory._index)


def _kept(rebuild: Any, values: tuple[Any, ...]) -> Message:
    """A message the driver's history holds, shipped whole: rebuilt, and noted as one the driver has."""
    message: Message = rebuild(*values)
    known = _HOST.get().get("known")
    if known is not None:
        known[message.id] = message
    return message


def _table(pickler: type[pickle.Pickler]) -> dict[Any, Any] | None:
    """``pickler``'s own dispatch table as a plain dict (a chain of maps misses with a raised ``KeyError``)."""
    table = getattr(pickler, "dispatch_table", None)
    return dict(table) if isinstance(table, Mapping) else None


def quick(pickler: type[pickle.Pickler]) -> type[pickle.Pickler]:
    """``pickler`` (e.g. cloudpickle's) with a message pickled as its fields at once, and no slow lookups.

    cloudpickle looks each object's type up in a chain of tables (a raised ``KeyError`` per miss)
    and asks its own hook first; a round moves a hundred thousand messages, so those go first.
    """
    fallback = getattr(pickler, "reducer_override", None)
    table = _table(pickler)

    class _Quick(pickler):  # type: ignore[misc,valid-type]
        if table is not None:
            dispatch_table = table

        def reducer_override(self, obj: Any) -> Any:
            if type(obj) is Message:
                return obj.__reduce__()
            return NotImplemented if fallback is None else fallback(self, obj)

    return _Quick


@contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic garbage collection inside the block (unpickling a round: many objects, no cycles)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def dumps_roles(
    env: Environment,
    roles: Sequence[Role],
    pickler: type[pickle.Pickler] = pickle.Pickler,
    *,
    history: dict[str, Message] | None = None,
    known: dict[str, Message] | None = None,
) -> bytes:
    """Pickle ``roles`` without their environment: references to ``env``, its ledger and clock travel as names.

    ``pickler`` may be a cloudpickle Pickler, which also carries classes defined in a notebook.
    On the driver, ``history`` (id → message) marks the messages it holds, so the shard learns
    them; on a shard, ``known`` holds the messages the driver has (by id), which travel by id.
    """
    shared = {id(env): "env", id(env.ledger): "ledger", id(env._clock): "clock"}
    fallback = getattr(pickler, "reducer_override", None)
    table = _table(pickler)

    class _Pickler(pickler):  # type: ignore[misc,valid-type]
        if table is not None:
            dispatch_table = table

        def reducer_override(self, obj: Any) -> Any:  # not called for str, int, dict, list...: cheap
            if isinstance(obj, Message):
                if known is not None and known.get(obj.id) is obj:
                    return _historic, (obj.id,)
                if history is not None and history.get(obj.id) is obj:
                    return _kept, obj.__reduce__()
                return obj.__reduce__()
            if type(obj) is Memory and known is not None:
                return _memory_sent(obj, known)
            key = shared.get(id(obj))
            if key is not None:
                return _hosted, (key,)
            return NotImplemented if fallback is None else fallback(self, obj)

    buffer = io.BytesIO()
    _Pickler(buffer, protocol=5).dump(list(roles))
    return buffer.getvalue()


def loads_roles(data: bytes, env: Environment, *, known: dict[str, Message] | None = None) -> list[Role]:
    """The roles :func:`dumps_roles` pickled, now referring to ``env``, its ledger and clock.

    Messages sent by id are taken from ``env``'s history; the ids of messages shipped as ones the
    driver holds are added to ``known``.
    """
    token = _HOST.set(
        {"env": env, "ledger": env.ledger, "clock": env._clock, "history": env.history._store, "known": known}
    )
    try:
        with paused_gc():
            roles: list[Role] = pickle.loads(data)
    finally:
        _HOST.reset(token)
    return roles
