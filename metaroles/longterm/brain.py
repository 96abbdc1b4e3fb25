"""BrainMemory: a conversation's history, knowledge and a running summary, kept in a store.

MetaGPT's API (seed 004) with its faults fixed: ``add_talk``/``add_answer`` do not mutate the
caller's message (they keep a copy with the chat role set); the model is passed to
``compress_history`` rather than held in a field; compression is bounded by a message count and a
token estimate, and becomes hierarchical when the summary itself grows too long; the store is
passed in (a file store by default, Redis with a file fallback), never built from a global config.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, Field

from metaroles.core.exceptions import ConfigError
from metaroles.core.prompts import load_prompt, render_prompt
from metaroles.core.schema import ChatRole
from metaroles.llm.protocol import LLM, LLMRequest, estimate_tokens
from metaroles.longterm.stores import KeyValueStore
from metaroles.messages.message import Message


class BrainMemory(BaseModel):
    """History, knowledge and summary of one conversation."""

    history: list[Message] = Field(default_factory=list)
    """The talk not yet summarised, oldest first."""
    knowledge: list[Message] = Field(default_factory=list)
    """Facts the assistant may use."""
    historical_summary: str = ""
    """Summary of the talk that left ``history``."""
    last_history_id: str = ""
    is_dirty: bool = False
    """Changed since the last dump."""
    last_talk: str | None = None
    cacheable: bool = True

    @staticmethod
    def to_redis_key(prefix: str, user_id: str, chat_id: str) -> str:
        """``{prefix}:{user}:{chat}``."""
        return f"{prefix}:{user_id}:{chat_id}"

    def add_history(self, message: Message) -> None:
        """Append ``message`` to the history (once per id)."""
        if any(m.id == message.id for m in self.history[-8:]):
            return
        self.history.append(message)
        self.last_history_id = message.id
        self.is_dirty = True

    def add_talk(self, message: Message) -> None:
        """Record what the user said (a copy with role ``user``)."""
        self.add_history(message.model_copy(update={"role": ChatRole.USER}))
        self.last_talk = message.content

    def add_answer(self, message: Message) -> None:
        """Record what the assistant answered (a copy with role ``assistant``)."""
        self.add_history(message.model_copy(update={"role": ChatRole.ASSISTANT}))

    def add_knowledge(self, message: Message) -> None:
        """Add a fact."""
        self.knowledge.append(message)
        self.is_dirty = True

    def get_knowledge(self) -> str:
        """The knowledge, one fact per line."""
        return "\n".join(m.content or "" for m in self.knowledge)

    @property
    def history_text(self) -> str:
        """The summary (if any) and the history as ``role: content`` lines (a property, as in MetaGPT)."""
        lines = [f"{m.role.value}: {m.content or ''}" for m in self.history]
        return "\n".join(([f"summary: {self.historical_summary}"] if self.historical_summary else []) + lines)

    @property
    def is_history_available(self) -> bool:
        """Whether there is any talk to go on: history or a summary of it."""
        return bool(self.history or self.historical_summary)

    def exists(self, text: str) -> bool:
        """Whether the history holds a message with exactly ``text``."""
        return any(m.content == text for m in reversed(self.history))

    def pop_last_talk(self) -> str | None:
        """What the user said last (:meth:`add_talk`), once: the next call gives ``None``."""
        talk, self.last_talk = self.last_talk, None
        return talk

    @staticmethod
    def to_int(value: object, default_value: int) -> int:
        """``int(value)``, or ``default_value`` when it is not a number."""
        try:
            number: int = int(value)  # type: ignore[call-overload]
            return number
        except (TypeError, ValueError):
            return default_value

    @staticmethod
    def extract_info(input_string: str, pattern: str = r"\[([A-Z]+)\]:\s*(.+)") -> tuple[str | None, str]:
        """``"[TAG]: text"`` → ``("TAG", "text")``; anything else → ``(None, input_string)``."""
        match = re.match(pattern, input_string)
        return (match.group(1), match.group(2)) if match else (None, input_string)

    async def summarize(self, llm: LLM, max_words: int = 200, keep_language: bool = False, limit: int = -1) -> str:
        """A summary of the summary and the history in at most ``max_words`` words (the model is passed in).

        ``limit`` > 0 sends at most that many characters of the text; ``keep_language`` asks for the text's language.
        """
        text = self.history_text if limit <= 0 else self.history_text[:limit]
        language = "Write it in the language of the text." if keep_language else ""
        prompt = load_prompt("metaroles.longterm.prompts", "summarize_words.txt")
        return await self._ask(
            llm, "summarize", render_prompt(prompt, max_words=str(max_words), language=language, text=text)
        )

    async def get_title(self, llm: LLM, max_words: int = 5) -> str:
        """A title of at most ``max_words`` words for the conversation (summarised first)."""
        summary = await self.summarize(llm, max_words=500)
        prompt = load_prompt("metaroles.longterm.prompts", "title.txt")
        return await self._ask(llm, "get_title", render_prompt(prompt, summary=summary, max_words=str(max_words)))

    async def is_related(self, text1: str, text2: str, llm: LLM) -> bool:
        """Whether the model judges ``text1`` semantically related to ``text2``."""
        system = load_prompt("metaroles.longterm.prompts", "is_related.txt").strip()
        context = f"## Paragraph 1\n{text2}\n---\n## Paragraph 2\n{text1}\n"
        return "TRUE" in await self._ask(llm, "is_related", context, system=system)

    async def rewrite(self, sentence: str, context: str, llm: LLM) -> str:
        """``sentence`` augmented with what ``context`` says of it, by the model."""
        system = load_prompt("metaroles.longterm.prompts", "rewrite.txt").strip()
        return await self._ask(llm, "rewrite", f"## Context\n{context}\n---\n## Sentence\n{sentence}\n", system=system)

    async def _ask(self, llm: LLM, action: str, prompt: str, *, system: str = "") -> str:
        messages = [{"role": "system", "content": system}] if system else []
        request = LLMRequest(
            messages=[*messages, {"role": "user", "content": prompt}], role="BrainMemory", action=action
        )
        return (await llm.complete(request)).text.strip()

    def needs_compression(self, *, max_messages: int = 10, max_tokens: int = 4000) -> bool:
        """Whether the history passed the message-count or the token bound."""
        return len(self.history) > max_messages or estimate_tokens(self.history_text) > max_tokens

    async def compress_history(
        self, llm: LLM, *, max_messages: int = 10, max_tokens: int = 4000, max_summary_tokens: int = 500
    ) -> bool:
        """Summarise the history into ``historical_summary`` past a bound; return whether it did.

        When the summary itself grows past ``max_summary_tokens`` it is summarised again
        (hierarchical compression), so the summary stays bounded however long the talk.
        """
        if not self.needs_compression(max_messages=max_messages, max_tokens=max_tokens):
            return False
        summary = await self._summarise(llm, self.history_text)
        if estimate_tokens(summary) > max_summary_tokens:
            summary = await self._summarise(llm, f"summary: {summary}")
        self.historical_summary = summary
        self.history = []
        self.is_dirty = True
        return True

    async def set_history_summary(
        self, history_summary: str, store: KeyValueStore | None = None, key: str = ""
    ) -> None:
        """Replace the history by ``history_summary`` (MetaGPT's name); save to ``store`` under ``key`` if given.

        The same summary again only saves pending changes.
        """
        if history_summary != self.historical_summary:
            self.historical_summary = history_summary
            self.history = []
            self.is_dirty = True
        if store is not None:
            await self.dumps(store, key)

    async def _summarise(self, llm: LLM, text: str) -> str:
        prompt = render_prompt(load_prompt("metaroles.longterm.prompts", "summarise.txt"), conversation=text)
        return await self._ask(llm, "summarise", prompt)

    async def dumps(self, store: KeyValueStore, key: str, *, ttl: float | None = 1800) -> bool:
        """Save to ``store`` under ``key`` if anything changed; return whether it wrote."""
        if not self.is_dirty or not self.cacheable:
            return False
        self.is_dirty = False
        await store.set(key, self.model_dump_json(), ttl=ttl)
        return True

    @classmethod
    async def loads(cls, store: KeyValueStore, key: str) -> BrainMemory:
        """Load from ``store`` (an empty memory if nothing is saved)."""
        text = await store.get(key)
        if text is None:
            return cls()
        try:
            memory = cls.model_validate_json(text)
        except ValueError as exc:
            first = str(exc).splitlines()[0]
            raise ConfigError(
                f"the BrainMemory saved under key {key!r} is damaged ({first}); nothing was loaded and nothing "
                "overwritten: repair or delete that entry"
            ) from None
        memory.is_dirty = False
        return memory
