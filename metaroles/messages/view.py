"""Read-only views of a memory's messages, handed over in O(1) instead of copied.

A view is a snapshot: it sees the messages that were remembered when it was made, in storage
order, and nothing added later. A :class:`~metaroles.messages.memory.Memory` only ever appends to
the lists a view reads; a removal builds new lists, so no view made before it changes.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterator, Sequence
from typing import Any, overload

from metaroles.messages.message import Message


class MessageView(Sequence[Message]):
    """Messages ``items[start:stop]`` of a memory, oldest first: a sequence that copies nothing.

    Indexing, ``len``, iteration and ``reversed`` cost O(1) per message; a slice returns a list.
    A view equals any sequence holding the same messages in the same order (a list, a tuple,
    another view).
    """

    __slots__ = ("_items", "_start", "_stop")

    def __init__(self, items: list[Message], start: int = 0, stop: int | None = None) -> None:
        """View ``items[start:stop]`` (``stop`` defaults to the list's current length)."""
        self._items = items
        self._start = start
        self._stop = len(items) if stop is None else stop

    def __len__(self) -> int:
        """Return the number of messages in view."""
        return self._stop - self._start

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> list[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | list[Message]:
        """Return the ``index``-th message (negative counts from the newest), or a slice as a list."""
        if isinstance(index, slice):
            return self._items[self._start : self._stop][index] if index.step else self._slice(index)
        size = self._stop - self._start
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError(f"message index {index} out of range for a view of {size} messages")
        return self._items[self._start + index]

    def _slice(self, index: slice) -> list[Message]:
        start, stop, _ = index.indices(self._stop - self._start)
        return self._items[self._start + start : self._start + max(start, stop)]

    def __iter__(self) -> Iterator[Message]:
        """Iterate oldest first, in O(1) per message wherever the view starts (bounded: later adds are not in it).

        ``islice(items, start, stop)`` would step over the first ``start`` messages: a view of a round's
        new messages at the end of a long history (the log's, the checkpoint's) then cost the whole history.
        """
        if not self._start:
            return itertools.islice(self._items, self._stop)
        return map(self._items.__getitem__, range(self._start, self._stop))

    def __reversed__(self) -> Iterator[Message]:
        """Iterate newest first."""
        return map(self._items.__getitem__, range(self._stop - 1, self._start - 1, -1))

    def __eq__(self, other: object) -> bool:
        """Equal to a sequence of the same messages in the same order."""
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=False))

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other: Sequence[Message]) -> list[Message]:
        """Concatenate into a new list (``history + [message]`` keeps working)."""
        return [*self, *other]

    def __radd__(self, other: Sequence[Message]) -> list[Message]:
        """Concatenate into a new list."""
        return [*other, *self]

    def __repr__(self) -> str:
        """Show the messages as a list would."""
        return f"MessageView({list(self)!r})"


class IndexedView(MessageView):
    """Messages of a memory at the given storage positions (an action's index entry), oldest first."""

    __slots__ = ("_positions",)

    def __init__(self, items: list[Message], positions: array[int] | Sequence[int], stop: int | None = None) -> None:
        """View ``items[p]`` for each of the first ``stop`` ``positions``."""
        super().__init__(items, 0, len(positions) if stop is None else stop)
        self._positions = positions

    def __getitem__(self, index: Any) -> Any:
        """Return the ``index``-th message of the entry (negative counts from the newest), or a slice as a list."""
        items, positions = self._items, self._positions
        if isinstance(index, slice):
            return [items[p] for p in positions[: self._stop][index]]
        size = self._stop
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError(f"message index {index} out of range for a view of {size} messages")
        return items[positions[index]]

    def __iter__(self) -> Iterator[Message]:
        """Iterate oldest first."""
        return map(self._items.__getitem__, itertools.islice(self._positions, self._stop))  # later adds: not in it

    def __reversed__(self) -> Iterator[Message]:
        """Iterate newest first."""
        positions = self._positions
        newest, later = reversed(positions), len(positions) - self._stop  # positions added after the snapshot
        return map(self._items.__getitem__, itertools.islice(newest, later, None) if later else newest)

    def __repr__(self) -> str:
        """Show the messages as a list would."""
        return f"IndexedView({list(self)!r})"


class FixedView(MessageView):
    """All of a tuple of messages: nothing is ever added to it, so it iterates as the tuple does."""

    __slots__ = ()

    def __init__(self, items: tuple[Message, ...]) -> None:
        """View all of ``items``."""
        super().__init__(items)  # type: ignore[arg-type]  # read-only use: a tuple serves as the list

    def __iter__(self) -> Iterator[Message]:
        """Iterate oldest first (the tuple's own iterator: no bound to check)."""
        return iter(self._items)


class JoinedView(MessageView):
    """A tuple of messages, then the first ``count`` of a list (appended to later, unseen here), oldest first."""

    __slots__ = ("_body",)

    def __init__(self, body: tuple[Message, ...], tail: list[Message], count: int) -> None:
        """View all of ``body``, then ``tail[:count]``."""
        super().__init__(tail, 0, count)
        self._body = body

    def __len__(self) -> int:
        """Return the number of messages in view."""
        return len(self._body) + self._stop

    def __getitem__(self, index: Any) -> Any:
        """Return the ``index``-th message (negative counts from the newest), or a slice as a list."""
        if isinstance(index, slice):
            return list(self)[index]
        body, size = self._body, len(self)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError(f"message index {index} out of range for a view of {size} messages")
        return body[index] if index < len(body) else self._items[index - len(body)]

    def __iter__(self) -> Iterator[Message]:
        """Iterate oldest first, at the tuple's speed for its part."""
        if not self._stop:
            return iter(self._body)
        return itertools.chain(self._body, itertools.islice(self._items, self._stop))

    def __reversed__(self) -> Iterator[Message]:
        """Iterate newest first."""
        return itertools.chain(reversed(self._items[: self._stop]), reversed(self._body))

    def __repr__(self) -> str:
        """Show the messages as a list would."""
        return f"JoinedView({list(self)!r})"


EMPTY = MessageView([])
"""The view of no messages."""
