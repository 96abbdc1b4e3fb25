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
    return RolesOut(env, roles, pickler, history=history, known=known).next()


PIECE = 4096
"""Roles per piece a shard gives back (:class:`RolesOut`): the driver reads one while the shard makes the next."""


class RolesOut:
    """Roles pickled as :func:`dumps_roles` does, a piece at a time; :class:`RolesIn` reads the pieces in order.

    One pickler makes every piece, so an object that roles of two pieces share is pickled once and
    read back as one object, as if the roles had travelled together.
    """

    def __init__(
        self,
        env: Environment,
        roles: Sequence[Role],
        pickler: type[pickle.Pickler] = pickle.Pickler,
        *,
        history: dict[str, Message] | None = None,
        known: dict[str, Message] | None = None,
        piece: int | None = None,
    ) -> None:
        """Pieces of ``piece`` roles each (all of them at once if ``None``); see :func:`dumps_roles` for the rest."""
        self.roles, self.at = list(roles), 0
        self.piece = piece or max(1, len(self.roles))
        self.buffer = io.BytesIO()
        self.pickler = _pickler(env, pickler, history, known)(self.buffer, protocol=5)

    @property
    def pieces(self) -> int:
        """How many pieces the roles make (at least one, even for no roles)."""
        return max(1, -(-len(self.roles) // self.piece))

    def next(self) -> bytes:
        """The next piece (an empty list once all roles are out)."""
        part, self.at = self.roles[self.at : self.at + self.piece], self.at + self.piece
        self.pickler.dump(part)
        data = self.buffer.getvalue()
        self.buffer.seek(0)
        self.buffer.truncate()
        return data


def _pickler(
    env: Environment,
    pickler: type[pickle.Pickler],
    history: dict[str, Message] | None,
    known: dict[str, Message] | None,
) -> type[pickle.Pickler]:
    """``pickler`` with the environment's objects, messages the other side holds and memories sent as references."""
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

    return _Pickler


def loads_roles(data: bytes, env: Environment, *, known: dict[str, Message] | None = None) -> list[Role]:
    """The roles :func:`dumps_roles` pickled, now referring to ``env``, its ledger and clock.

    Messages sent by id are taken from ``env``'s history; the ids of messages shipped as ones the
    driver holds are added to ``known``.
    """
    return RolesIn(env, known=known).load(data)


class RolesIn:
    """Reads the pieces one :class:`RolesOut` made, in order, with one unpickler (what they share stays one object)."""

    def __init__(self, env: Environment, *, known: dict[str, Message] | None = None) -> None:
        """Roles for ``env`` (see :func:`loads_roles`)."""
        self.host = {"env": env, "ledger": env.ledger, "clock": env._clock, "known": known}
        self.host["history"] = env.history._store
        self.feed = _Feed()
        self.unpickler = pickle.Unpickler(self.feed)

    def load(self, data: bytes) -> list[Role]:
        """The roles of the next piece."""
        self.feed.data = io.BytesIO(data)
        token = _HOST.set(self.host)
        try:
            with paused_gc():
                roles: list[Role] = self.unpickler.load()
        finally:
            _HOST.reset(token)
        return roles


class _Feed:
    """The file an unpickler reads: the piece it is given next (its methods are looked up once, at the start)."""

    def __init__(self) -> None:
        self.data = io.BytesIO()

    def read(self, size: int = -1) -> bytes:
        return self.data.read(size)

    def readinto(self, buffer: Any) -> int:
        return self.data.readinto(buffer)

    def readline(self) -> bytes:
        return self.data.readline()
