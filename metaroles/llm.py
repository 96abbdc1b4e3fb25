"""The one narrow interface every language model implements, and the cost ledger.

A provider is any object with a ``model`` name and ``async complete(request) -> LLMResponse``.
Requests carry who is asking (role and action) so that scripted and recorded models can answer
per role and action, and so that the :class:`CostLedger` can account per role and action.
"""

from __future__ import annotations

import ast
import json
import re
from collections import defaultdict
from typing import Any, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, Field

from metaroles.schema import ToolCall

ModelT = TypeVar("ModelT", bound=BaseModel)


class Usage(BaseModel):
    """Tokens spent by one call."""

    prompt_tokens: int = 0
    """Tokens in the request."""
    completion_tokens: int = 0
    """Tokens in the answer."""

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens


class LLMRequest(BaseModel):
    """What an Action asks a model."""

    messages: list[dict[str, Any]]
    """The chat, in the ``Message.to_dict()`` form."""
    output_schema: dict[str, Any] | None = None
    """JSON schema the answer must match, when the action declared an output model."""
    tools: list[dict[str, Any]] | None = None
    """Tool descriptions the model may call."""
    tool_choice: str | None = None
    """none / auto / required, or a tool's name."""
    temperature: float | None = None
    """Sampling temperature; ``None`` leaves the provider's default."""
    max_tokens: int | None = None
    """Bound on the answer's length."""
    seed: int | None = None
    """Sampling seed, where the provider supports one."""
    role: str = ""
    """Name of the asking role."""
    action: str = ""
    """Name of the asking action."""

    def prompt_text(self) -> str:
        """The chat's contents joined by newlines (for offline models and token estimates)."""
        return "\n".join(str(m.get("content") or "") for m in self.messages)


class LLMResponse(BaseModel):
    """What a model answered."""

    text: str = ""
    """The answer's text (JSON text when an output schema was requested)."""
    tool_calls: list[ToolCall] | None = None
    """Tool calls the model requested."""
    usage: Usage = Field(default_factory=Usage)
    """Tokens spent."""
    model: str = ""
    """Model that answered."""
    cost: float = 0.0
    """Money spent on this call, in the ledger's currency."""


@runtime_checkable
class LLM(Protocol):
    """A language model: a name and one async call."""

    model: str

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Answer ``request``."""
        ...


def estimate_tokens(text: str) -> int:
    """A crude, deterministic token estimate: one token per four characters, at least one."""
    return max(1, len(text) // 4)


class LedgerEntry(BaseModel):
    """One accounted call."""

    role: str
    action: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    cost: float


class CostLedger:
    """Tokens and money spent, per role, action and model.

    Args:
        entries: Entries to start from (a resumed run's ledger).
    """

    def __init__(self, entries: list[LedgerEntry] | None = None) -> None:
        """Create a ledger, optionally continuing ``entries``."""
        self.entries: list[LedgerEntry] = []
        self.total_cost = 0.0
        self.total_tokens = 0
        self.reset(entries or [])

    def reset(self, entries: list[LedgerEntry]) -> None:
        """Replace the entries (when a saved run is restored); totals follow."""
        self.entries = list(entries)
        self.total_cost = sum(e.cost for e in self.entries)
        self.total_tokens = sum(e.prompt_tokens + e.completion_tokens for e in self.entries)

    def record(self, *, role: str, action: str, response: LLMResponse) -> None:
        """Account for one call's usage and cost."""
        entry = LedgerEntry(
            role=role,
            action=action,
            model=response.model,
            prompt_tokens=response.usage.prompt_tokens,
            completion_tokens=response.usage.completion_tokens,
            cost=response.cost,
        )
        self.entries.append(entry)
        self.total_cost += entry.cost
        self.total_tokens += entry.prompt_tokens + entry.completion_tokens

    def cost_by(self, key: str) -> dict[str, float]:
        """Money spent grouped by ``"role"``, ``"action"`` or ``"model"``."""
        totals: defaultdict[str, float] = defaultdict(float)
        for entry in self.entries:
            totals[getattr(entry, key)] += entry.cost
        return dict(totals)

    def dump(self) -> list[dict[str, Any]]:
        """Serialise the entries."""
        return [e.model_dump() for e in self.entries]

    @classmethod
    def load(cls, data: list[dict[str, Any]]) -> CostLedger:
        """Restore a ledger serialised by :meth:`dump`."""
        return cls([LedgerEntry.model_validate(e) for e in data])


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def extract_json(text: str) -> str:
    """Return the JSON part of a model's answer: inside a code fence, else from the first brace."""
    fenced = _FENCE.search(text)
    if fenced:
        text = fenced.group(1)
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    if not starts:
        return text.strip()
    start = min(starts)
    closing = "}" if text[start] == "{" else "]"
    end = text.rfind(closing)
    return text[start : end + 1] if end > start else text[start:]


def parse_output(text: str, model: type[ModelT]) -> ModelT:
    """Parse and validate a model's answer as ``model``.

    Raises:
        pydantic.ValidationError: When the answer does not validate.
        ValueError: When it is not JSON at all.
    """
    candidate = extract_json(text)
    try:
        data = json.loads(candidate)
    except json.JSONDecodeError as exc:
        data = _python_literal(candidate)
        if data is None:
            raise ValueError(f"the answer is not JSON ({exc.msg} at position {exc.pos})") from None
    return model.model_validate(data)


def _python_literal(text: str) -> Any:
    """Read ``{'a': 'b', 'ok': True}``, which small models write for JSON; ``None`` if it is not that."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, dict | list) else None


__all__ = [
    "LLM",
    "CostLedger",
    "LLMRequest",
    "LLMResponse",
    "LedgerEntry",
    "Usage",
    "estimate_tokens",
    "extract_json",
    "parse_output",
]
