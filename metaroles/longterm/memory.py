"""LongtermMemory: a role's Memory whose watched messages also go to a MemoryStorage.

Short-term memory works as always; what the role watches is also embedded into its long-term
storage, recovered on the next run with :meth:`LongtermMemory.recover_memory`, and news that is
too similar to what the role already knows can be dropped (a threshold you choose; MetaGPT
hard-codes one). This module imports no vector library: the storage is passed in.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from metaroles.messages.memory import Memory
from metaroles.messages.message import Message

if TYPE_CHECKING:
    from metaroles.longterm.storage import MemoryStorage

log = logging.getLogger("metaroles.longterm.memory")


class LongtermMemory(Memory):
    """A Memory backed by a :class:`~metaroles.longterm.storage.MemoryStorage`.

    Args:
        memory_storage: Where watched messages persist.
        watch: Action ids whose messages go to long-term storage (a Role keeps it in step).
        similarity_threshold: News at least this similar (cosine) to a remembered message is
            dropped, and logged; ``None`` keeps everything.
    """

    __slots__ = ("memory_storage", "msg_from_recovery", "similarity_threshold", "watch")

    def __init__(
        self,
        memory_storage: MemoryStorage,
        *,
        watch: Iterable[str] = (),
        similarity_threshold: float | None = None,
    ) -> None:
        """Create an empty long-term memory over ``memory_storage``."""
        super().__init__()
        self.memory_storage = memory_storage
        self.watch = set(watch)
        self.similarity_threshold = similarity_threshold
        self.msg_from_recovery = False

    def recover_memory(self, role_id: str) -> list[Message]:
        """Load ``role_id``'s long-term memory; its messages also enter short-term memory."""
        messages = self.memory_storage.recover_memory(role_id)
        Memory.add_batch(self, messages)
        self.msg_from_recovery = bool(messages)
        return messages

    def add(self, message: Message) -> bool:
        """Remember ``message``; a watched one also goes to long-term storage."""
        added = super().add(message)
        if added and message.cause_by in self.watch:
            self.memory_storage.add(message)
        return added

    def remember_new(self, messages: Iterable[Message]) -> list[Message]:
        """Remember what is new; drop from the result news too similar to what is known."""
        new = [m for m in messages if self._novel(m)]
        return [m for m in new if self.add(m)]

    def _too_similar(self, message: Message) -> tuple[Message, float] | None:
        """The remembered message at least ``similarity_threshold`` similar to ``message``, if any."""
        if self.similarity_threshold is None:
            return None
        hits = self.memory_storage.search_scored(message, k=1, threshold=self.similarity_threshold)
        return hits[0] if hits else None

    def _novel(self, message: Message) -> bool:
        if message in self or message.cause_by not in self.watch:
            return True
        known = self._too_similar(message)
        if known is None:
            return True
        log.info("dropped news %s: %.3f similar to remembered %s", message.id, known[1], known[0].id)
        super().add(message)
        return False

    def find_news(self, observed: Iterable[Message], k: int = 0) -> list[Message]:
        """Short-term news, minus what is too similar to long-term memory."""
        return [m for m in super().find_news(observed, k) if self._too_similar(m) is None]

    def persist(self) -> None:
        """Write the long-term storage (only new messages are embedded)."""
        self.memory_storage.persist()

    def clear(self) -> None:
        """Forget everything, short- and long-term."""
        super().clear()
        for message_id in list(self.memory_storage.messages):
            self.memory_storage.delete(message_id)
        self.memory_storage.clean()
