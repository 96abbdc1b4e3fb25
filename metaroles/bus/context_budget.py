"""A role's context budget: the past a prompt carries stays within a number of tokens, however long the run.

A :class:`ContextWindow` composes what a role has seen and done (its items, oldest first) into at
most :attr:`ContextBudget.tokens` tokens (four characters a token, as the ledger estimates):

- the **recent** items verbatim, newest first until their share of the budget is spent;
- the **older** ones summarised: when the recent items overflow their share, the oldest are folded
  into a running summary (``BrainMemory.historical_summary``, bounded by its share) in one model
  call, which also gives the folded stretch a one-line gist and an importance from 1 to 10 — the
  gist becomes a memory;
- **memories** retrieved for the question at hand by recency × importance × relevance (generative
  agents' score: recency halves every ``half_life`` rounds, relevance is the cosine of feature-hashed
  embeddings, offline and deterministic), within their share; every ``reflect_every`` foldings the
  model reflects on the most important memories, and the reflection is a memory too.

What was folded, when, and into how many tokens is the window's :attr:`~ContextWindow.compactions`,
saved with the role (its ``extra_state``), and each folding and reflection is a model call of the
role in the ledger and the event log (actions ``Compact`` and ``Reflect``). Without a budget a
window composes every item verbatim: the prompt grows with the run.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field, create_model

from metaroles.bus.action import Action
from metaroles.llm.protocol import estimate_tokens
from metaroles.longterm.brain import BrainMemory
from metaroles.longterm.embedding import HashingEmbedding

__all__ = ["Compaction", "ContextBudget", "ContextItem", "ContextWindow", "Recollection"]


class ContextBudget(BaseModel, frozen=True):
    """How many tokens of its past a role's prompt may carry, and how they are shared."""

    tokens: int = Field(ge=64)
    """The whole context: recent items, the summary and the memories retrieved."""
    recent: float = Field(default=0.5, gt=0, lt=1)
    """The recent items' share (verbatim)."""
    memories: float = Field(default=0.2, ge=0, lt=1)
    """The retrieved memories' share; the summary has what is left."""
    reflect_every: int = Field(default=5, ge=0)
    """Foldings between two reflections (0: never reflect)."""
    half_life: float = Field(default=50.0, gt=0)
    """Rounds after which a memory's recency weighs half."""

    def share(self, part: str) -> int:
        """The tokens of ``part``: ``recent``, ``memories`` or ``summary``."""
        if part == "summary":
            return max(16, int(self.tokens * (1 - self.recent - self.memories)))
        return int(self.tokens * getattr(self, part))


class ContextItem(BaseModel, frozen=True):
    """A thing the role saw or did, as its prompt shows it."""

    id: str
    round: int
    text: str


class Recollection(BaseModel):
    """A memory the window may retrieve: a folded stretch's gist, or a reflection."""

    text: str
    round: int
    importance: int = Field(ge=1, le=10)
    kind: str = "gist"


class Compaction(BaseModel):
    """A folding: which items went into the summary, in which round, and the tokens before and after."""

    round: int
    folded: list[str]
    """The ids of the items folded."""
    tokens_before: int
    """The tokens of the items and the summary folded."""
    summary_tokens: int


class Reflection(BaseModel):
    """A model's reflection on its most important memories."""

    insight: str = Field(min_length=1, max_length=400)
    """What the memories, taken together, say (one or two sentences)."""
    importance: int = Field(ge=1, le=10)
    """How much it matters, from 1 (mundane) to 10 (life-changing)."""


@functools.cache
def _folding_model(summary_chars: int) -> type[BaseModel]:
    """The answer to a folding: the new summary (bounded by its share), the stretch's gist and importance."""
    return create_model(
        "Compacted",
        summary=(str, Field(min_length=1, max_length=summary_chars, description="all of it so far, briefly")),
        gist=(str, Field(min_length=1, max_length=200, description="the newly added stretch in one line")),
        importance=(int, Field(ge=1, le=10, description="how much the stretch matters, 1 to 10")),
    )


class Compact(Action):
    """Fold the oldest of a role's recent past into its summary (the window's model call)."""


class Reflect(Action):
    """Reflect on a role's most important memories (the window's model call)."""


class ContextWindow:
    """What a role's prompt carries of its past: within ``budget`` if given, else everything.

    Args:
        budget: The tokens and their shares; ``None``: every item verbatim.
    """

    def __init__(self, budget: ContextBudget | None) -> None:
        """An empty window."""
        self.budget = budget
        self.brain = BrainMemory()
        self.folded = 0
        """Items before this place are in the summary."""
        self.memories: list[Recollection] = []
        self.compactions: list[Compaction] = []
        self._vectors: list[dict[int, float]] = []
        """The memories' embeddings, in their order."""

    # -- saved with the role -----------------------------------------------------------------------

    def state(self) -> dict[str, Any] | None:
        """The window as JSON data (``None`` while nothing was folded)."""
        if not self.compactions:
            return None
        return {
            "summary": self.brain.historical_summary,
            "folded": self.folded,
            "memories": [m.model_dump() for m in self.memories],
            "compactions": [c.model_dump() for c in self.compactions],
        }

    def load(self, data: dict[str, Any]) -> None:
        """Restore what :meth:`state` gave."""
        self.brain.historical_summary = data["summary"]
        self.folded = data["folded"]
        self.memories = [Recollection.model_validate(m) for m in data["memories"]]
        self._vectors = []
        self.compactions = [Compaction.model_validate(c) for c in data["compactions"]]

    # -- composing ---------------------------------------------------------------------------------

    async def compose(self, items: Sequence[ContextItem], *, query: str, round: int, asker: Action) -> str:
        """The context for a prompt about ``query``: memories, summary and recent items, within the budget.

        ``asker``: the action the prompt is for; the window's own model calls go as its role's.
        """
        budget = self.budget
        if budget is None:
            return "\n".join(item.text for item in items)
        recent = self._recent(items, budget.share("recent"))
        if len(items) - len(recent) > self.folded:  # past its share: fold down to half of it (a fold now and then)
            kept = self._recent(items, budget.share("recent") // 2)
            await self._fold(items[self.folded : len(items) - len(kept)], round, asker)
            recent = self._recent(items, budget.share("recent"))
        parts = []
        if self.brain.historical_summary:
            parts.append(f"Earlier, in short: {self.brain.historical_summary}")
        recalled = self.recall(query, round, budget.share("memories"))
        if recalled:
            parts.append("You remember:\n" + "\n".join(f"- (round {m.round}) {m.text}" for m in recalled))
        parts.append("\n".join(item.text for item in recent))
        return "\n".join(parts)

    def _recent(self, items: Sequence[ContextItem], tokens: int) -> list[ContextItem]:
        """The newest items not folded whose tokens fit in ``tokens`` (the newest always), oldest first."""
        kept: list[ContextItem] = []
        used = 0
        for item in reversed(items[self.folded :]):
            cost = estimate_tokens(item.text)
            if kept and used + cost > tokens:
                break
            kept.append(item)
            used += cost
        return kept[::-1]

    async def _fold(self, stretch: Sequence[ContextItem], round: int, asker: Action) -> None:
        """Fold ``stretch`` into the summary, with its gist kept as a memory."""
        assert self.budget is not None
        text = "\n".join(item.text for item in stretch)
        before = estimate_tokens(text) + estimate_tokens(self.brain.historical_summary)
        chars = 4 * self.budget.share("summary")
        prompt = (
            f"Your summary so far: {self.brain.historical_summary or '(none yet)'}\n\nWhat happened since:\n{text}\n\n"
            f"Rewrite the summary to cover all of it in at most {chars} characters; give the new stretch's gist in "
            "one line and how much it matters (1 to 10)."
        )
        answer = await _asked(asker, Compact, prompt, _folding_model(chars))
        self.brain.historical_summary = str(answer.summary)[:chars]
        self.memories.append(Recollection(text=str(answer.gist), round=round, importance=int(answer.importance)))
        self.folded += len(stretch)
        self.compactions.append(
            Compaction(
                round=round,
                folded=[item.id for item in stretch],
                tokens_before=before,
                summary_tokens=estimate_tokens(self.brain.historical_summary),
            )
        )
        every = self.budget.reflect_every
        if every and len(self.compactions) % every == 0:
            await self._reflect(round, asker)

    async def _reflect(self, round: int, asker: Action) -> None:
        """A reflection on the most important memories, kept as a memory of its own."""
        top = sorted(self.memories, key=lambda m: (-m.importance, -m.round))[:10]
        listed = "\n".join(f"- (round {m.round}) {m.text}" for m in top)
        prompt = f"Your most important memories:\n{listed}\n\nWhat do they tell you, taken together?"
        answer = await _asked(asker, Reflect, prompt, Reflection)
        self.memories.append(
            Recollection(text=str(answer.insight), round=round, importance=int(answer.importance), kind="reflection")
        )

    def recall(self, query: str, round: int, tokens: int) -> list[Recollection]:
        """The memories for ``query`` by recency × importance × relevance, best first, within ``tokens``."""
        if not self.memories or tokens <= 0:
            return []
        assert self.budget is not None
        if len(self._vectors) < len(self.memories):  # each memory embedded once (not saved: made again on load)
            self._vectors += map(_sparse, _EMBEDDING.embed([m.text for m in self.memories[len(self._vectors) :]]))
        asked = _sparse(_EMBEDDING.embed([query])[0])
        scored = []
        for place, (memory, vector) in enumerate(zip(self.memories, self._vectors, strict=True)):
            recency = 0.5 ** ((round - memory.round) / self.budget.half_life)
            relevance = max(0.0, sum(x * asked.get(i, 0.0) for i, x in vector.items()))
            score = recency * memory.importance / 10 * (0.1 + relevance)
            scored.append((-round_to(score), place, memory))
        chosen, used = [], 0
        for _, _, memory in sorted(scored, key=lambda s: (s[0], s[1])):
            cost = estimate_tokens(memory.text) + 4
            if used + cost > tokens:
                break
            chosen.append(memory)
            used += cost
        return chosen


_EMBEDDING = HashingEmbedding(256)
"""Feature hashing has no state: every window shares one."""


def _sparse(vector: Sequence[float]) -> dict[int, float]:
    """A hashed embedding's non-zero places (a few dozen of its 256): a dot product costs what the query has."""
    return {i: x for i, x in enumerate(vector) if x}


def round_to(score: float) -> float:
    """``score`` rounded to 9 places: near-ties fall the same way on any machine."""
    return math.floor(score * 1e9 + 0.5) / 1e9


async def _asked(asker: Action, kind: type[Action], prompt: str, model: type[BaseModel]) -> Any:
    """``prompt`` put to ``asker``'s model as ``kind`` (its role's call, in its ledger)."""
    action = kind()
    action.llm, action.ledger, action.role_name = asker.llm, asker.ledger, asker.role_name
    return await action.aask(prompt, output_model=model)
