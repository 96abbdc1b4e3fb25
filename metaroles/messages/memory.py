"""Short-term memory: MetaGPT's action-indexed :class:`Memory` and a windowed :class:`ChatMemory`.

:class:`Memory` keeps messages in insertion order in a list, with a dict keyed by id, so ``add``
is idempotent in O(1) and ``find_news`` is O(len(observed)) — where MetaGPT compares full models
in lists (O(n) per add, O(n·m) per observe). ``index`` maps each ``cause_by`` to the positions of
its messages, from the first time the memory is read by action (or made holding messages): a
memory nobody reads so (a society agent's, the history) never keeps one. Reads hand out read-only
views in O(1) (the history an action runs on, ``get``, ``get_by_action``); ``get_by_actions``
keeps its merge of index entries per set of actions and extends it by what was remembered since.
"""

from __future__ import annotations

import itertools
from array import array
from bisect import bisect_left
from collections.abc import Container, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, Literal, Self

from metaroles.core.exceptions import InvalidValueError
from metaroles.core.schema import ChatRole, action_ids, any_to_str
from metaroles.core.surface import Dumped
from metaroles.messages.message import Message
from metaroles.messages.view import EMPTY, IndexedView, JoinedView, MessageView

_CHAT_ROLES = frozenset(ChatRole)
POSITIONS = "I"
"""The array type of an index entry's positions: 4 bytes each (a memory holds fewer than 2**32 messages:
at ~100 bytes the least a message takes, more would need 400 GB), half what 8-byte positions took."""


def news_of(messages: Iterable[Message], watch: Container[str], address: str) -> list[Message]:
    """The news among ``messages`` for a role watching ``watch`` named ``address``: the bus's one news rule.

    A message is news when the action that caused it is watched, or when it is sent to the role by name.
    """
    news = []
    for message in messages:  # a loop, not a comprehension: this runs in every turn (no inner frame)
        if message.cause_by in watch or address in message.send_to:
            news.append(message)
    return news


class Memory(Dumped):
    """Messages a role remembers, indexed by the Action that caused them.

    Args:
        messages: Messages to add at once, in order.
        ignore_id: Deduplicate by content instead of id (MetaGPT's ``ignore_id`` mode). Messages
            are never mutated: the key changes, not the message's id.

    Reads hand out read-only views (:class:`~metaroles.messages.view.MessageView`) in O(1)
    instead of copies: the history an action runs on, :meth:`get`, :meth:`get_by_action`.
    A view is a snapshot; a later removal copies the lists first when a view may still read them.
    """

    __slots__ = ("_edits", "_index", "_items", "_merged", "_shared", "_store", "ignore_id")

    def __init__(
        self,
        messages: Iterable[Message] = (),
        *,
        ignore_id: bool = False,
        storage: Iterable[Message | dict[str, Any]] = (),
        index: object = None,
    ) -> None:
        """Create a memory, optionally holding ``messages``.

        ``storage`` (messages or their dumps) and ``index`` are what :meth:`model_dump` wrote, as
        MetaGPT's ``Memory(**data)`` takes them; the index is rebuilt from the messages, so it is not read.
        """
        self.ignore_id = ignore_id
        self._edits = 0  # counts removals: a checkpoint tells an append-only memory from an edited one
        self._store: dict[str, Message] = {}  # key (id, or content with ignore_id) -> message
        self._items: list[Message] = []  # storage order; views read it, so it is only ever appended to in place
        self._index: dict[str, array[int]] | None = None
        """``cause_by`` -> positions in ``_items``, ascending; ``None`` until first read (:meth:`_indexed`)."""
        self._shared = False  # whether a view may read _items or an index entry (a removal then copies)
        self._merged: dict[frozenset[str], _Merged] = {}
        """What :meth:`get_by_actions` merged, per set of actions: kept, and extended by what came since."""
        self.add_batch(messages)
        self.add_batch(Message.model_validate(m) for m in storage)
        if self._items:
            self._indexed()  # a memory made holding messages is read by action soon (a restore, a port)

    def model_dump(self, *, mode: str = "python", **_: Any) -> dict[str, Any]:
        """The memory as data (MetaGPT's pydantic dump): its messages in order, its index (ids) and ``ignore_id``."""
        index = {action: [self._items[at].id for at in bucket] for action, bucket in self._indexed().items()}
        how: Literal["python", "json"] = "json" if mode == "json" else "python"
        return {"storage": [m.model_dump(mode=how) for m in self._items], "index": index, "ignore_id": self.ignore_id}

    def _key(self, message: Message) -> str:
        return (message.content or "") if self.ignore_id else message.id

    def add(self, message: Message) -> bool:
        """Remember ``message`` unless already remembered; return whether it was added. O(1).

        Raises:
            InvalidValueError: If ``message`` is not a Message (nothing is added).
        """
        try:
            key = (message.content or "") if self.ignore_id else message.id
        except AttributeError:
            raise InvalidValueError(
                f"Memory.add got {message!r}, which is not a Message; wrap text in Message(...)"
            ) from None
        store = self._store
        if key in store:
            return False
        store[key] = message
        items, index = self._items, self._index
        if index is not None:
            bucket = index.get(message.cause_by)
            if bucket is None:
                index[message.cause_by] = array(POSITIONS, (len(items),))
            else:
                bucket.append(len(items))
        items.append(message)
        return True

    def remember_new(self, messages: Iterable[Message]) -> list[Message]:
        """Add ``messages`` and return those that were new (``find_news`` + ``add_batch`` in one pass).

        The batch form of :meth:`add` (its body, in the loop: this runs once per delivery on the bus's hot path).
        """
        if self.ignore_id:
            add = self.add
            return [m for m in messages if add(m)]
        store, items, index, new = self._store, self._items, self._index, []
        if index is None:  # nobody reads it by action: no index to keep
            for message in messages:
                if message.id not in store:
                    store[message.id] = message
                    items.append(message)
                    new.append(message)
            return new
        for message in messages:
            if message.id in store:
                continue
            store[message.id] = message
            bucket = index.get(message.cause_by)
            if bucket is None:
                index[message.cause_by] = array(POSITIONS, (len(items),))
            else:
                bucket.append(len(items))
            items.append(message)
            new.append(message)
        return new

    def _indexed(self) -> dict[str, array[int]]:
        """The action index, made now if the memory was never read by action (then kept as messages come)."""
        index = self._index
        if index is None:
            index = self._index = {}
            for position, message in enumerate(self._items):
                bucket = index.get(message.cause_by)
                if bucket is None:
                    index[message.cause_by] = array(POSITIONS, (position,))
                else:
                    bucket.append(position)
        return index

    def remember_news(
        self, messages: Iterable[Message], watch: Container[str], address: str
    ) -> tuple[int, list[Message]]:
        """Add ``messages``; return how many were new and, of those, the news (:func:`news_of`).

        A role's observation: :meth:`remember_new` (a subclass's own, e.g. long-term memory's, decides
        what is new), then the one news rule.
        """
        new = self.remember_new(messages)
        return len(new), news_of(new, watch, address) if new else new

    def add_batch(self, messages: Iterable[Message]) -> None:
        """Remember each of ``messages`` in order."""
        add = self.add
        for message in messages:
            add(message)

    def __contains__(self, message: object) -> bool:
        """Return whether ``message`` is remembered. O(1)."""
        return isinstance(message, Message) and self._key(message) in self._store

    def __len__(self) -> int:
        """Return the number of remembered messages."""
        return len(self._items)

    def __iter__(self) -> Iterator[Message]:
        """Iterate over remembered messages, oldest first."""
        return iter(self._items)

    def count(self) -> int:
        """Return the number of remembered messages."""
        return len(self._items)

    @property
    def edits(self) -> int:
        """How many removals the memory has seen (a checkpoint tells an append-only memory from an edited one)."""
        return self._edits

    @property
    def keyed(self) -> Mapping[str, Message]:
        """Key (id, or content with ``ignore_id``) → remembered message, oldest first: a read-only live view."""
        return MappingProxyType(self._store)

    def parts(self) -> tuple[list[str], list[Message], dict[str, array[int]], int]:
        """The memory as it is held: keys and messages in storage order, the action index, the removals.

        The memory's own objects, to be read, not changed (a shard sends a memory back as them);
        :meth:`from_parts` makes a memory of them again.
        """
        self._shared = True
        return list(self._store), self._items, self._indexed(), self._edits

    @classmethod
    def from_parts(
        cls,
        keys: list[str],
        messages: list[Message],
        index: dict[str, array[int]],
        edits: int,
        *,
        ignore_id: bool = False,
    ) -> Self:
        """The memory :meth:`parts` gave (``keys`` and ``messages`` in step), taken over as they are, unchecked."""
        memory = cls(ignore_id=ignore_id)
        memory._take_parts(keys, messages, index, edits)
        return memory

    def _take_parts(self, keys: list[str], messages: list[Message], index: dict[str, array[int]], edits: int) -> None:
        """Hold what :meth:`from_parts` was given, as it is."""
        self._store = dict(zip(keys, messages, strict=True))
        self._items, self._index, self._edits = messages, index, edits

    def by_key(self, key: str) -> Message | None:
        """The remembered message with this id (or content, with ``ignore_id``), if any. O(1)."""
        return self._store.get(key)

    @property
    def storage(self) -> MessageView:
        """All remembered messages, oldest first (a read-only snapshot, O(1))."""
        self._shared = True
        return MessageView(self._items)

    @property
    def index(self) -> Mapping[str, MessageView]:
        """``cause_by`` → messages caused by that action, oldest first; empty for an action with none.

        A read-only mapping that answers like MetaGPT's ``defaultdict(list)`` without growing.
        """
        self._shared = True
        return _Index(self._items, self._indexed())

    def get(self, k: int = 0) -> MessageView:
        """Return the newest ``k`` messages, oldest first; all of them when ``k`` is 0. O(1): a read-only view."""
        self._shared = True
        items = self._items
        size = len(items)
        return MessageView(items, 0 if k <= 0 or k >= size else size - k, size)

    def get_by_role(self, role: ChatRole | str) -> list[Message]:
        """Return messages with chat role ``role``, oldest first. O(n).

        A name that is no chat role is a MetaGPT profile (``Message(role="Engineer")``), which a message
        keeps in ``metadata["profile"]``: those messages are given, as MetaGPT's memory finds them.
        """
        if role in _CHAT_ROLES:
            return [m for m in self._items if m.role == role]
        return [m for m in self._items if m.has_metadata and m.metadata.get("profile") == role]

    def get_by_sender(self, name: str) -> list[Message]:
        """Return messages sent by the role named ``name``, oldest first. O(n)."""
        return [m for m in self._items if m.sent_from == name]

    def get_by_content(self, content: str) -> list[Message]:
        """Return messages whose content contains ``content``, oldest first. O(n)."""
        return [m for m in self._items if content in (m.content or "")]

    def try_remember(self, keyword: str) -> list[Message]:
        """Return messages mentioning ``keyword`` (MetaGPT's name for :meth:`get_by_content`)."""
        return self.get_by_content(keyword)

    def get_by_action(self, action: object) -> MessageView:
        """Return messages caused by ``action`` (class, instance or id), oldest first. O(1): a read-only view."""
        index = self._index if self._index is not None else self._indexed()
        bucket = index.get(action if type(action) is str else any_to_str(action))
        if bucket is None:
            return EMPTY
        self._shared = True
        return IndexedView(self._items, bucket)

    def get_by_actions(self, actions: Iterable[object]) -> MessageView:
        """Return messages caused by any of ``actions``, in the order they were remembered.

        A read-only view. The merge of several actions' index entries is kept per set of actions
        and extended by the messages remembered since: asked again (a role's ``important_memory``
        each turn), it costs O(new), and the view iterates as fast as a list.
        """
        ids = frozenset(action_ids(actions))
        index = self._index if self._index is not None else self._indexed()
        buckets = [b for b in map(index.get, ids) if b]
        if not buckets:
            return EMPTY
        self._shared = True
        if len(buckets) == 1:
            return IndexedView(self._items, buckets[0])
        merged = self._merged.get(ids)
        if merged is None:
            if len(self._merged) >= _MERGES_KEPT:
                self._merged.clear()
            merged = self._merged[ids] = _Merged()
        items = self._items
        if merged.upto < len(items):
            upto = merged.upto
            tails = [b[bisect_left(b, upto) :] if upto else b for b in buckets]
            merged.extend(map(items.__getitem__, sorted(itertools.chain.from_iterable(tails))))
            merged.upto = len(items)
        return JoinedView(merged.body, merged.tail, len(merged.tail))

    def find_news(self, observed: Iterable[Message], k: int = 0) -> list[Message]:
        """Return the messages of ``observed`` not among the newest ``k`` remembered (all if 0).

        O(len(observed)) when ``k`` is 0; O(len(observed) + k) otherwise.
        """
        store = self._store
        if k <= 0 or k >= len(store):
            if self.ignore_id:
                return [m for m in observed if m.content not in store]
            return [m for m in observed if m.id not in store]
        window = set(itertools.islice(reversed(store.keys()), k))
        key = self._key
        return [m for m in observed if key(m) not in window]

    def delete(self, message: Message) -> bool:
        """Forget ``message``; return whether it was remembered. O(n)."""
        stored = self._store.pop(self._key(message), None)
        if stored is None:
            return False
        self._edits += 1
        self._rebuild([m for m in self._items if m is not stored])
        return True

    def delete_newest(self) -> Message | None:
        """Forget and return the newest message, or ``None`` when empty (O(1) unless a view still reads it)."""
        if not self._store:
            return None
        _, message = self._store.popitem()
        self._edits += 1
        self._merged = {}
        if self._shared:
            self._rebuild(self._items[:-1])
            return message
        self._items.pop()
        index = self._index
        if index is not None:
            bucket = index[message.cause_by]
            bucket.pop()
            if not bucket:
                del index[message.cause_by]
        return message

    def _rebuild(self, items: list[Message]) -> None:
        """Hold ``items`` in new lists (views made before keep reading the old ones); the index when next read."""
        self._items, self._index, self._shared, self._merged = items, None, False, {}

    def clear(self) -> None:
        """Forget everything."""
        self._edits += 1
        self._store = {}
        self._items, self._index, self._shared, self._merged = [], None, False, {}

    def dump(self) -> list[dict[str, Any]]:
        """Serialise the remembered messages, oldest first."""
        return [m.model_dump(mode="json") for m in self._items]

    @classmethod
    def load(cls, data: Iterable[dict[str, Any] | Message], *, ignore_id: bool = False) -> Self:
        """Restore a memory serialised by :meth:`dump`."""
        messages = (m if isinstance(m, Message) else Message.model_validate(m) for m in data)
        return cls(messages, ignore_id=ignore_id)


_MERGES_KEPT = 8
"""How many sets of actions a memory keeps merged (a role asks for its watch set, rarely for others)."""


class _Merged:
    """The messages of a set of actions in storage order, as far as the memory's first ``upto`` messages.

    A tuple (``body``) and the messages merged since (``tail``, only ever appended to): a view of
    both iterates at the tuple's speed, and sees its snapshot of the tail. The tail joins the body
    when it reaches a quarter of it, so each message is copied a few times in all.
    """

    __slots__ = ("body", "tail", "upto")

    def __init__(self) -> None:
        self.body: tuple[Message, ...] = ()
        self.tail: list[Message] = []
        self.upto = 0

    def extend(self, messages: Iterable[Message]) -> None:
        tail = self.tail
        tail += messages
        if len(tail) > 64 and len(tail) * 4 > len(self.body):
            self.body, self.tail = self.body + tuple(tail), []


class _Index(Mapping[str, MessageView]):
    """A read-only view of a memory's action index; an unknown action has no messages."""

    __slots__ = ("_index", "_items")

    def __init__(self, items: list[Message], index: dict[str, array[int]]) -> None:
        self._items = items
        self._index = index

    def __getitem__(self, action: str) -> MessageView:
        bucket = self._index.get(action)
        return EMPTY if bucket is None else IndexedView(self._items, bucket)

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, action: object) -> bool:
        return action in self._index


class ChatMemory:
    """A sliding window of the most recent chat messages (the OpenManus agent memory).

    Args:
        messages: Initial messages; only the newest ``max_messages`` are kept.
        max_messages: How many messages the window holds (must be positive).
    """

    __slots__ = ("_messages", "max_messages")

    def __init__(self, messages: Iterable[Message] = (), *, max_messages: int = 100) -> None:
        """Create an empty window holding at most ``max_messages``."""
        if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages <= 0:
            raise InvalidValueError(f"max_messages={max_messages!r} must be a positive integer, e.g. max_messages=100")
        self.max_messages = max_messages
        self._messages: list[Message] = list(messages)[-max_messages:]

    @property
    def messages(self) -> list[Message]:
        """The messages in the window, oldest first: the live list, as OpenManus' (the next add trims it)."""
        return self._messages

    @messages.setter
    def messages(self, value: Iterable[Message]) -> None:
        self._messages = list(value)[-self.max_messages :]

    def add_message(self, message: Message) -> None:
        """Append ``message``, dropping the oldest when the window is full."""
        self.add_messages((message,))

    def add_messages(self, messages: Iterable[Message]) -> None:
        """Append ``messages`` in order; the bound holds (unlike the OpenManus original)."""
        window = self._messages
        window += messages
        if len(window) > self.max_messages:
            del window[: len(window) - self.max_messages]

    def get_recent_messages(self, n: int) -> list[Message]:
        """Return the newest ``n`` messages, oldest first.

        Raises:
            InvalidValueError: If ``n`` is not a non-negative integer (a ``ValueError``, as OpenManus' bound).
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidValueError(f"n={n!r} must be a non-negative integer, e.g. get_recent_messages(5)")
        return self._messages[-n:] if n else []

    def to_dict_list(self) -> list[dict[str, Any]]:
        """Return the window in the chat form a model API expects."""
        return [m.to_dict() for m in self._messages]

    def clear(self) -> None:
        """Forget everything."""
        self._messages.clear()

    def __len__(self) -> int:
        """Return the number of messages in the window."""
        return len(self._messages)
