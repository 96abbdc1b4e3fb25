"""Message buffers: a FIFO queue and a priority queue, both with O(1) duplicate checks.

Each Role buffers what reaches it in a :class:`MessageQueue`. Pushing a message whose id is
already buffered does nothing. ``await queue.get()`` waits for a message without polling.
Both queues serialise with their contents, so nothing buffered is lost on save.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Generator, Iterable
from typing import Any, Self

import anyio

from metaroles.core.exceptions import InvalidValueError
from metaroles.messages.message import Message


class DumpedText(str):
    """A dumped queue's JSON text, which may also be awaited: MetaGPT's ``await queue.dump()`` gives the same text.

    MetaGPT's ``MessageQueue.dump`` is a coroutine; ours does no I/O, so it returns the text at once,
    and ported code that awaits it gets the text too.
    """

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, str]:
        """Give the text itself, without suspending."""
        return str(self)
        yield  # pragma: no cover - makes this a generator, as ``__await__`` must be


class _Waitable:
    """Wake-up plumbing shared by both queues: one anyio Event, created only when awaited."""

    _event: anyio.Event | None

    def _wake(self) -> None:
        event = self._event
        if event is not None:
            self._event = None
            event.set()

    def empty(self) -> bool:  # pragma: no cover - overridden
        """Return whether the queue holds no message."""
        raise NotImplementedError

    async def wait_nonempty(self) -> None:
        """Wait until the queue holds at least one message."""
        while self.empty():
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()


class MessageQueue(_Waitable):
    """A FIFO buffer of messages without duplicate ids.

    ``push``, ``pop``, ``empty``, ``count`` and ``pop_all`` are O(1) (``pop`` amortised; ``pop_all``
    hands over the buffer itself). An empty queue holds a few hundred bytes: a society keeps one per agent.
    """

    __slots__ = ("_event", "_head", "_ids", "_queue")

    def __init__(self, messages: Iterable[Message] = ()) -> None:
        """Create a queue, optionally holding ``messages`` in order."""
        self._queue: list[Message] = []  # _queue[_head:] is buffered; _head is 0 whenever the queue is empty
        self._head = 0
        self._ids: dict[str, None] = {}  # smaller than a set when empty
        self._event = None
        queue = list(messages)
        ids = dict.fromkeys([message.id for message in queue])
        if len(ids) == len(queue):  # distinct (a buffer restored or shipped back): its lists at once
            self._queue, self._ids = queue, ids
            return
        for message in queue:
            self.push(message)

    def push(self, message: Message) -> bool:
        """Append ``message`` unless a message with its id is buffered; return whether it was added."""
        ids = self._ids
        if message.id in ids:
            return False
        ids[message.id] = None
        self._queue.append(message)
        if self._event is not None:
            self._wake()
        return True

    def last(self) -> Message | None:
        """The newest buffered message, or ``None`` when empty."""
        return self._queue[-1] if self._queue else None

    def pop(self) -> Message | None:
        """Remove and return the oldest message, or ``None`` when empty."""
        if not self._queue:
            return None
        return self._popleft()

    def _popleft(self) -> Message:
        queue, head = self._queue, self._head
        message = queue[head]
        head += 1
        if head == len(queue):
            queue.clear()
            head = 0
        elif head > 32 and head * 2 > len(queue):  # drop what was popped once it is most of the list
            del queue[:head]
            head = 0
        self._head = head
        del self._ids[message.id]
        return message

    def pop_all(self) -> list[Message]:
        """Remove and return every buffered message, oldest first."""
        messages = self._queue
        if self._head:
            messages = messages[self._head :]
            self._head = 0
        self._queue = []
        self._ids = {}
        return messages

    async def get(self) -> Message:
        """Wait for a message, then remove and return the oldest one."""
        await self.wait_nonempty()
        return self._popleft()

    def empty(self) -> bool:
        """Return whether the queue holds no message."""
        return not self._queue

    def count(self) -> int:
        """Return the number of buffered messages."""
        return len(self._queue) - self._head

    def __len__(self) -> int:
        """Return the number of buffered messages."""
        return len(self._queue) - self._head

    def peek_all(self) -> list[Message]:
        """Return the buffered messages, oldest first, without removing them."""
        return self._queue[self._head :]

    def dump(self) -> DumpedText:
        """Serialise the buffered messages, oldest first, as JSON text (MetaGPT's ``MessageQueue.dump``; awaitable)."""
        return DumpedText(json.dumps([m.model_dump(mode="json") for m in self.peek_all()], ensure_ascii=False))

    @classmethod
    def load(cls, data: str | bytes | Iterable[dict[str, Any] | str | Message]) -> Self:
        """Restore a queue from :meth:`dump`'s text (or a list of message dicts or messages).

        Raises:
            InvalidValueError: If the text is not a JSON list of messages (nothing is restored).
        """
        return cls(_message(m) for m in _entries(data))


class PriorityMessageQueue(_Waitable):
    """A buffer that pops the lowest priority number first, FIFO among equals.

    A message's priority is the ``priority`` argument of :meth:`push`, else its
    ``metadata["priority"]``, else 0. ``push`` and ``pop`` are O(log n).
    """

    __slots__ = ("_event", "_heap", "_ids", "_seq")

    def __init__(self, messages: Iterable[Message] = ()) -> None:
        """Create a queue, optionally holding ``messages``."""
        self._heap: list[tuple[int, int, Message]] = []
        self._ids: set[str] = set()
        self._seq = 0
        self._event = None
        for message in messages:
            self.push(message)

    def push(self, message: Message, priority: int | None = None) -> bool:
        """Add ``message`` unless its id is buffered; return whether it was added."""
        if message.id in self._ids:
            return False
        given = message.metadata.get("priority", 0) if priority is None else priority
        try:
            priority = int(given)
        except (TypeError, ValueError):
            raise InvalidValueError(
                f"priority={given!r} of message {message.id!r} is not a number; pass priority=1 "
                "(or metadata={'priority': 1}); lower pops first"
            ) from None
        self._ids.add(message.id)
        self._seq += 1
        heapq.heappush(self._heap, (priority, self._seq, message))
        self._wake()
        return True

    def pop(self) -> Message | None:
        """Remove and return the most urgent message, or ``None`` when empty."""
        if not self._heap:
            return None
        message = heapq.heappop(self._heap)[2]
        self._ids.discard(message.id)
        return message

    def pop_all(self) -> list[Message]:
        """Remove and return every buffered message, most urgent first."""
        ordered = [entry[2] for entry in sorted(self._heap)]
        self._heap.clear()
        self._ids.clear()
        return ordered

    async def get(self) -> Message:
        """Wait for a message, then remove and return the most urgent one."""
        await self.wait_nonempty()
        message = heapq.heappop(self._heap)[2]
        self._ids.discard(message.id)
        return message

    def empty(self) -> bool:
        """Return whether the queue holds no message."""
        return not self._heap

    def count(self) -> int:
        """Return the number of buffered messages."""
        return len(self._heap)

    def __len__(self) -> int:
        """Return the number of buffered messages."""
        return len(self._heap)

    def dump(self) -> DumpedText:
        """Serialise as JSON text: ``{"priority": p, "message": {...}}`` entries in pop order (awaitable, as above)."""
        entries = [{"priority": p, "message": m.model_dump(mode="json")} for p, _, m in sorted(self._heap)]
        return DumpedText(json.dumps(entries, ensure_ascii=False))

    @classmethod
    def load(cls, data: str | bytes | Iterable[dict[str, Any]]) -> Self:
        """Restore a queue from :meth:`dump`'s text (or its list of entries), keeping pop order."""
        queue = cls()
        for entry in _entries(data):
            queue.push(Message.model_validate(entry["message"]), priority=int(entry["priority"]))
        return queue


def _message(entry: dict[str, Any] | str | Message) -> Message:
    """A message of a dumped queue: a message, its dict, or its JSON text (MetaGPT's dump lists texts)."""
    if isinstance(entry, Message):
        return entry
    if isinstance(entry, str):
        return Message.model_validate_json(entry)
    return Message.model_validate(entry)


def _entries(data: str | bytes | Iterable[Any]) -> Iterable[Any]:
    """The entries of a dumped queue: parsed when given as JSON text."""
    if not isinstance(data, str | bytes):
        return data
    try:
        entries = json.loads(data)
    except ValueError as exc:
        raise InvalidValueError(
            f"not a dumped message queue ({exc}); pass the text MessageQueue.dump() returned"
        ) from None
    if not isinstance(entries, list):
        raise InvalidValueError(f"a dumped message queue is a JSON list, got {type(entries).__name__}")
    return entries
