"""The one narrow interface every language model implements, and the cost ledger.

A provider is any object with a ``model`` name and ``async complete(request) -> LLMResponse``.
Requests carry who is asking (role and action) so that scripted and recorded models can answer
per role and action, and so that the :class:`CostLedger` can account per role and action.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, Field

from metaroles.core.schema import ToolCall

ModelT = TypeVar("ModelT", bound=BaseModel)


class Usage(BaseModel):
    """Tokens spent by one call."""

    prompt_tokens: int = Field(default=0, ge=0)
    """Tokens in the request."""
    completion_tokens: int = Field(default=0, ge=0)
    """Tokens in the answer."""
    cached_tokens: int = Field(default=0, ge=0)
    """Of the prompt tokens, those the engine served from its prefix cache (as its answer reports)."""

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
    cost: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
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
    return model.model_validate(parse_json(text))


def parse_json(text: str) -> Any:
    """The JSON in a model's text, read leniently: fenced or embedded, raw newlines in strings, Python literals.

    Structured answers and tool-call arguments are read alike.

    Raises:
        ValueError: When it is not JSON at all (naming where it broke).
    """
    candidate = extract_json(text)
    try:
        return json.loads(candidate, strict=False)  # small models put raw newlines inside strings
    except json.JSONDecodeError as exc:
        data = _python_literal(candidate)
        if data is None:
            raise ValueError(f"invalid JSON ({exc.msg} at position {exc.pos})") from None
        return data


def _python_literal(text: str) -> Any:
    """Read ``{'a': 'b', 'ok': True}``, which small models write for JSON; ``None`` if it is not that."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, dict | list) else None


__all__ = [
    "LLM",
    "LLMRequest",
    "LLMResponse",
    "Usage",
    "estimate_tokens",
    "extract_json",
    "parse_json",
    "parse_output",
]
