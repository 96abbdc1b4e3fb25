"""Short-term memory: MetaGPT's action-indexed :class:`Memory` and a windowed :class:`ChatMemory`.

:class:`Memory` keeps messages in insertion order in a dict keyed by id, so ``add`` is
idempotent in O(1) and ``find_news`` is O(len(observed)) — where MetaGPT compares full models
in lists (O(n) per add, O(n·m) per observe). ``index`` maps each ``cause_by`` to its messages.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Container, Iterable, Iterator, Mapping
from typing import Any, ClassVar, Self

from metaroles.core.exceptions import InvalidValueError
from metaroles.core.schema import ChatRole, action_ids, any_to_str
from metaroles.messages.message import Message


class Memory:
    """Messages a role remembers, indexed by the Action that caused them.

    Args:
        messages: Messages to add at once, in order.
        ignore_id: Deduplicate by content instead of id (MetaGPT's ``ignore_id`` mode). Messages
            are never mutated: the key changes, not the message's id.
    """

    __slots__ = ("_edits", "_index", "_store", "ignore_id")

    _fused: ClassVar[bool] = True  # remember_news may inline remember_new: no subclass overrides it

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Note whether the subclass keeps :meth:`remember_new`, which :meth:`remember_news` inlines."""
        super().__init_subclass__(**kwargs)
        cls._fused = cls.remember_new is Memory.remember_new

    def __init__(self, messages: Iterable[Message] = (), *, ignore_id: bool = False) -> None:
        """Create a memory, optionally holding ``messages``."""
        self.ignore_id = ignore_id
        self._edits = 0  # counts removals: a checkpoint tells an append-only memory from an edited one
        self._store: dict[str, Message] = {}
        self._index: dict[str, list[Message]] = {}
        self.add_batch(messages)

    def _key(self, message: Message) -> str:
        return (message.content or "") if self.ignore_id else message.id

    def add(self, message: Message) -> bool:
        """Remember ``message`` unless already remembered; return whether it was added. O(1)."""
        key = (message.content or "") if self.ignore_id else message.id
        store = self._store
        if key in store:
            return False
        store[key] = message
        bucket = self._index.get(message.cause_by)
        if bucket is None:
            self._index[message.cause_by] = [message]
        else:
            bucket.append(message)
        return True

    def remember_new(self, messages: Iterable[Message]) -> list[Message]:
        """Add ``messages`` and return those that were new (``find_news`` + ``add_batch`` in one pass)."""
        if self.ignore_id:
            add = self.add
            return [m for m in messages if add(m)]
        store, index, new = self._store, self._index, []
        for message in messages:  # add() inlined: this runs once per delivery on the bus's hot path
            if message.id in store:
                continue
            store[message.id] = message
            bucket = index.get(message.cause_by)
            if bucket is None:
                index[message.cause_by] = [message]
            else:
                bucket.append(message)
            new.append(message)
        return new

    def remember_news(
        self, messages: Iterable[Message], watch: Container[str], address: str
    ) -> tuple[int, list[Message]]:
        """Add ``messages``; return how many were new and, of those, the ones ``watch`` or ``address`` admits.

        A new message is news when its ``cause_by`` is watched or its ``send_to`` names ``address``
        (a role's observation, in the same single pass as :meth:`remember_new`).
        """
        if self.ignore_id or not self._fused:
            new = self.remember_new(messages)  # a subclass's own remember_new (long-term memory) decides
            return len(new), [m for m in new if m.cause_by in watch or address in m.send_to]
        store, index, news, count = self._store, self._index, [], 0
        for message in messages:  # add() inlined: this runs once per delivery on the bus's hot path
            if message.id in store:
                continue
            store[message.id] = message
            cause = message.cause_by
            bucket = index.get(cause)
            if bucket is None:
                index[cause] = [message]
            else:
                bucket.append(message)
            count += 1
            if cause in watch or address in message.send_to:
                news.append(message)
        return count, news

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
        return len(self._store)

    def __iter__(self) -> Iterator[Message]:
        """Iterate over remembered messages, oldest first."""
        return iter(self._store.values())

    def count(self) -> int:
        """Return the number of remembered messages."""
        return len(self._store)

    @property
    def storage(self) -> list[Message]:
        """All remembered messages, oldest first (a copy)."""
        return list(self._store.values())

    @property
    def index(self) -> Mapping[str, list[Message]]:
        """``cause_by`` → messages caused by that action, oldest first; ``[]`` for an action with none.

        A read-only mapping that answers like MetaGPT's ``defaultdict(list)`` without growing.
        """
        return _Index(self._index)

    def get(self, k: int = 0) -> list[Message]:
        """Return the newest ``k`` messages, oldest first; all of them when ``k`` is 0."""
        if k <= 0 or k >= len(self._store):
            return list(self._store.values())
        newest = list(itertools.islice(reversed(self._store.values()), k))
        newest.reverse()
        return newest

    def get_by_role(self, role: ChatRole | str) -> list[Message]:
        """Return messages with chat role ``role``, oldest first. O(n)."""
        return [m for m in self._store.values() if m.role == role]

    def get_by_sender(self, name: str) -> list[Message]:
        """Return messages sent by the role named ``name``, oldest first. O(n)."""
        return [m for m in self._store.values() if m.sent_from == name]

    def get_by_content(self, content: str) -> list[Message]:
        """Return messages whose content contains ``content``, oldest first. O(n)."""
        return [m for m in self._store.values() if content in (m.content or "")]

    def try_remember(self, keyword: str) -> list[Message]:
        """Return messages mentioning ``keyword`` (MetaGPT's name for :meth:`get_by_content`)."""
        return self.get_by_content(keyword)

    def get_by_action(self, action: object) -> list[Message]:
        """Return messages caused by ``action`` (class, instance or id), oldest first. O(1) lookup."""
        return list(self._index.get(any_to_str(action), ()))

    def get_by_actions(self, actions: Iterable[object]) -> list[Message]:
        """Return messages caused by any of ``actions``, in the order they were remembered.

        O(1) lookup for one action; O(n) for several (to keep memory order).
        """
        ids = action_ids(actions)
        if len(ids) == 1:
            return list(self._index.get(next(iter(ids)), ()))
        return [m for m in self._store.values() if m.cause_by in ids]

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
        """Forget ``message``; return whether it was remembered."""
        key = self._key(message)
        stored = self._store.pop(key, None)
        if stored is None:
            return False
        self._edits += 1
        self._unindex(stored)
        return True

    def delete_newest(self) -> Message | None:
        """Forget and return the newest message, or ``None`` when empty. O(1)."""
        if not self._store:
            return None
        _, message = self._store.popitem()
        self._edits += 1
        self._unindex(message)
        return message

    def _unindex(self, message: Message) -> None:
        bucket = self._index[message.cause_by]
        if bucket[-1] is message:
            bucket.pop()
        else:
            bucket.remove(message)
        if not bucket:
            del self._index[message.cause_by]

    def clear(self) -> None:
        """Forget everything."""
        self._edits += 1
        self._store.clear()
        self._index.clear()

    def dump(self) -> list[dict[str, Any]]:
        """Serialise the remembered messages, oldest first."""
        return [m.model_dump(mode="json") for m in self._store.values()]

    @classmethod
    def load(cls, data: Iterable[dict[str, Any] | Message], *, ignore_id: bool = False) -> Self:
        """Restore a memory serialised by :meth:`dump`."""
        messages = (m if isinstance(m, Message) else Message.model_validate(m) for m in data)
        return cls(messages, ignore_id=ignore_id)


class _Index(Mapping[str, list[Message]]):
    """A read-only view of a memory's action index; an unknown action has no messages (``[]``)."""

    __slots__ = ("_index",)

    def __init__(self, index: dict[str, list[Message]]) -> None:
        self._index = index

    def __getitem__(self, action: str) -> list[Message]:
        return self._index.get(action, [])

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
        self._messages: deque[Message] = deque(messages, maxlen=max_messages)

    @property
    def messages(self) -> list[Message]:
        """The messages in the window, oldest first (a copy)."""
        return list(self._messages)

    def add_message(self, message: Message) -> None:
        """Append ``message``, dropping the oldest when the window is full."""
        self._messages.append(message)

    def add_messages(self, messages: Iterable[Message]) -> None:
        """Append ``messages`` in order; the bound holds (unlike the OpenManus original)."""
        self._messages.extend(messages)

    def get_recent_messages(self, n: int) -> list[Message]:
        """Return the newest ``n`` messages, oldest first."""
        if n <= 0:
            return []
        return list(self._messages)[-n:]

    def to_dict_list(self) -> list[dict[str, Any]]:
        """Return the window in the chat form a model API expects."""
        return [m.to_dict() for m in self._messages]

    def clear(self) -> None:
        """Forget everything."""
        self._messages.clear()

    def __len__(self) -> int:
        """Return the number of messages in the window."""
        return len(self._messages)
