"""Roles travelling between the driver and its shards, pickled without what both sides already hold.

References to the environment a role lives in, its ledger and clock travel as names and mean the
receiving side's own. Messages the driver's history holds travel **by id** on the way back
(:func:`dumps_roles` with ``known``): the driver rebuilds each role's buffer and memory from its
own history, so nothing is copied twice and the messages stay the very objects of the history, as
in one process. A shard learns which messages the driver holds from what it delivered and from
what came with its roles (:func:`loads_roles` collects those into ``known``).

A role its shard built from a seat (``sharding.cast``) while the driver kept the one it built itself
comes back as its state alone (:func:`_state_sent`): what a resume gives a role built again from
its scenario — buffer, memory, working memory, news, stage, watch set, :meth:`Role.extra_state` —
its messages by id, put into the driver's own role (:func:`_role_back`). Unpickling a whole role
cost more than building it.
"""

from __future__ import annotations

import io
import pickle
from array import array
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from operator import attrgetter, is_
from typing import Any, cast

from metaroles.bus.environment import Environment
from metaroles.bus.role import Role
from metaroles.core.heap import paused_gc
from metaroles.core.schema import watch_set
from metaroles.messages.memory import Memory
from metaroles.messages.message import Message
from metaroles.messages.queue import MessageQueue

_HOST: ContextVar[dict[str, Any]] = ContextVar("metaroles_shard_host")
_ID = attrgetter("id")

FILE_SCENARIO = "__metaroles_scenario_file__"
"""Set on a module loaded from a scenario file (its path): no Ray worker can import it, so it travels by value."""


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
    if ids:
        keys = sent if by_id else list(map(_ID, messages))
    else:
        keys = [m.content or "" for m in messages]  # the memory's keys by content (ignore_id)
    return Memory.from_parts(keys, messages, index, edits, ignore_id=not ids)


def _memory_sent(memory: Memory, known: dict[str, Message]) -> tuple[Any, ...]:
    """How a plain memory travels back: messages the driver holds by id, its index as it is (positions)."""
    keys, items, index, edits = memory.parts()
    ids = list(map(_ID, items)) if memory.ignore_id else keys  # the store's keys: ids, in order
    if _all_held(ids, items, known):
        return _memory_back, (not memory.ignore_id, edits, ids, index, True)
    held = map(known.get, ids)
    sent = [i if h is m else m for i, h, m in zip(ids, held, items, strict=True)]
    return _memory_back, (not memory.ignore_id, edits, sent, index)


_MOVED_BY_THE_BUS = frozenset({"addresses"})
"""A role's attributes the bus itself sets during a run (addresses: the driver's stand-in has them)."""


def fingerprint(role: Role) -> int:
    """Which objects ``role``'s own attributes are now, bar those the bus moves, as one number (never 0).

    A shard takes it when it builds a role from its seat and again when the role goes back: an
    attribute the run set anew (``self.count += 1``) changes it, and the role then travels whole.
    """
    attributes = vars(role)
    kept = [id(value) for name, value in attributes.items() if name not in _MOVED_BY_THE_BUS]
    return hash((tuple(attributes), tuple(kept))) or 1


def _all_held(ids: Sequence[str], messages: Sequence[Message], known: dict[str, Message]) -> bool:
    """Whether the driver holds each of ``messages`` (by its id among ``ids``): the very object, not a copy."""
    return all(map(is_, map(known.get, ids), messages))


def _held_ids(messages: Sequence[Message], known: dict[str, Message]) -> list[str] | None:
    """The ids of ``messages`` if the driver holds each one (the very object), else ``None``."""
    ids = list(map(_ID, messages))
    return ids if _all_held(ids, messages, known) else None


def _state_sent(role: Role, known: dict[str, Message], watches: dict[frozenset[str], frozenset[str]]) -> Any:
    """How a seated role travels back as its state (see the module), or ``None`` if it must travel whole.

    A role qualifies when its state is all in its :class:`~metaroles.bus.state.RoleState` but for
    long-term memory and brain (plain memory and buffer, the stage's own action as its todo) and
    none of its attributes was set anew since its shard built it (its :func:`fingerprint`).
    Memories travel as :func:`_memory_sent` makes them; a buffer and news whose every message the
    driver holds, as ids.
    """
    rc = role.rc
    buffer, working = rc.msg_buffer, rc.planned
    actions, stage = role.actions, rc.state
    if (
        type(rc.memory) is not Memory
        or type(buffer) is not MessageQueue
        or role.brain_memory is not None
        or rc.todo is not (actions[stage] if 0 <= stage < len(actions) else None)
        or (working is not None and type(working) is not Memory)
    ):
        return None
    buffered = _held_ids(buffer.peek_all(), known)
    news = _held_ids(rc.news, known)
    watch = frozenset(rc.watch)
    scope = role.ids
    return _role_back, (
        role.place,
        rc.memory,
        buffer if buffered is None else buffered,
        rc.news if news is None else news,
        working,
        stage,
        rc.remembered,
        watches.setdefault(watch, watch),  # one object per watch set: pickled once
        None if scope is None else (scope.round, scope.seq, scope.prefix),
        role.extra_state() if role.keeps_extra_state else None,
    )


def _role_back(
    place: int,
    memory: Memory,
    buffer: MessageQueue | list[str],
    news: list[Message] | list[str],
    working: Memory | None,
    stage: int,
    remembered: int,
    watch: frozenset[str],
    scope: tuple[int, int, str] | None,
    extra: dict[str, Any] | None,
) -> Role:
    """The driver's own role for ``place``, given the state its shard sent (:func:`_state_sent`)."""
    host = _HOST.get()
    role: Role = host["kept"].pop(place)
    held = host["history"].__getitem__
    rc = role.rc
    rc.memory, rc.planned = memory, working
    rc.msg_buffer = buffer if isinstance(buffer, MessageQueue) else MessageQueue(map(held, buffer))
    by_id = bool(news) and type(news[0]) is str
    rc.news = list(map(held, cast("list[str]", news))) if by_id else cast("list[Message]", news)
    role.set_state(stage)
    rc.remembered = remembered
    rc.watch = watch_set(watch)
    role.addresses = host["env"].members[place].addresses  # its stand-in's: the shard reported any change
    if scope is not None and role.ids is not None:
        role.ids.round, role.ids.seq, role.ids.prefix = scope
    if extra is not None:
        role.load_extra_state(extra)
    return role


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


def dumps_roles(
    env: Environment,
    roles: Sequence[Role],
    pickler: type[pickle.Pickler] = pickle.Pickler,
    *,
    history: Mapping[str, Message] | None = None,
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
        history: Mapping[str, Message] | None = None,
        known: dict[str, Message] | None = None,
        piece: int | None = None,
        seated: array[int] | None = None,
    ) -> None:
        """Pieces of ``piece`` roles each (all of them at once if ``None``); see :func:`dumps_roles` for the rest.

        ``seated`` (on a shard, with ``known``): by place, the :func:`fingerprint` a role had when
        the shard built it from its seat (0: it did not), the driver having kept its own: such a role
        goes back as its state when it can (:func:`_state_sent`).
        """
        self.roles, self.at = list(roles), 0
        self.piece = piece or max(1, len(self.roles))
        self.buffer = io.BytesIO()
        self.pickler = _pickler(env, pickler, history, known, seated)(self.buffer, protocol=5)

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
    history: Mapping[str, Message] | None,
    known: dict[str, Message] | None,
    seated: array[int] | None = None,
) -> type[pickle.Pickler]:
    """``pickler`` with the environment's objects, messages the other side holds and memories sent as references."""
    shared = {id(env): "env", id(env.ledger): "ledger", id(env.clock): "clock"}
    fallback = getattr(pickler, "reducer_override", None)
    table = _table(pickler)
    watches: dict[frozenset[str], frozenset[str]] = {}

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
            if seated is not None and known is not None and isinstance(obj, Role):
                state = _state_sent(obj, known, watches) if seated[obj.place] == fingerprint(obj) else None
                if state is not None:
                    return state
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

    def __init__(
        self, env: Environment, *, known: dict[str, Message] | None = None, kept: dict[int, Role] | None = None
    ) -> None:
        """Roles for ``env`` (see :func:`loads_roles`); ``kept``: by place, the roles that come back as their state."""
        self.host = {"env": env, "ledger": env.ledger, "clock": env.clock, "known": known, "kept": kept}
        self.host["history"] = env.history.keyed
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
