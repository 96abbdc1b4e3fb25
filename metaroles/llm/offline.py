"""Offline language models that ship in the package: TestLLM, FunctionLLM and ScriptedLLM.

They are real providers of the :class:`~metaroles.llm.protocol.LLM` protocol, not mocks: scenarios,
tests and notebooks run on them with no key, no server and no network.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel

from metaroles.core.exceptions import ConfigError, ScriptExhausted
from metaroles.core.schema import Function, ToolCall
from metaroles.llm.protocol import LLMRequest, LLMResponse, Usage, estimate_tokens

_WORDS = (
    "evidence suggests clearly that careful reasoning matters more than volume and the strongest "
    "case rests on data history incentives costs risks benefits trade-offs examples precedent "
    "fairness efficiency trust experience practice principle consequence nuance scale"
).split()
_OPENERS = (
    "I would argue",
    "Consider this",
    "The key point is",
    "On balance",
    "Let me add",
    "It follows that",
    "To be precise",
    "In reply",
)
_KEYWORD = re.compile(r"[A-Za-z][A-Za-z'-]{4,}")


def _stable_seed(*parts: object) -> int:
    digest = hashlib.blake2b(json.dumps(parts, sort_keys=True, default=str).encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big")


def _resolve_ref(ref: str, root: Mapping[str, Any]) -> Mapping[str, Any]:
    node: Any = root
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    result: Mapping[str, Any] = node
    return result


def sample_schema(schema: Mapping[str, Any], rng: random.Random, root: Mapping[str, Any] | None = None) -> Any:
    """Return data that validates against the JSON ``schema``, drawn from ``rng``.

    Covers what pydantic emits: objects, arrays, strings, numbers, booleans, null, enums,
    constants, ``$ref`` to ``$defs``, ``anyOf``/``oneOf``/``allOf`` and numeric/length bounds.
    """
    root = schema if root is None else root
    if "$ref" in schema:
        return sample_schema(_resolve_ref(schema["$ref"], root), rng, root)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return rng.choice(list(schema["enum"]))
    for key in ("anyOf", "oneOf"):
        if key in schema:
            options = [o for o in schema[key] if o.get("type") != "null"] or schema[key]
            return sample_schema(options[0], rng, root)
    if "allOf" in schema:
        return sample_schema(schema["allOf"][0], rng, root)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    return _SAMPLERS[kind](schema, rng, root)


def _sample_object(schema: Mapping[str, Any], rng: random.Random, root: Mapping[str, Any]) -> dict[str, Any]:
    properties: Mapping[str, Any] = schema.get("properties", {})
    return {name: sample_schema(sub, rng, root) for name, sub in properties.items()}


def _sample_array(schema: Mapping[str, Any], rng: random.Random, root: Mapping[str, Any]) -> list[Any]:
    low = int(schema.get("minItems", 1))
    high = max(low, min(int(schema.get("maxItems", low + 2)), low + 2))
    items = schema.get("items", {"type": "string"})
    return [sample_schema(items, rng, root) for _ in range(rng.randint(low, high))]


def _sample_string(schema: Mapping[str, Any], rng: random.Random, root: Mapping[str, Any]) -> str:
    low = int(schema.get("minLength", 0))
    high = int(schema.get("maxLength", max(low, 60)))
    text = " ".join(rng.choice(_WORDS) for _ in range(6))
    while len(text) < low:
        text += " " + rng.choice(_WORDS)
    return text[:high]


def _bounds(schema: Mapping[str, Any], default_low: float, default_high: float) -> tuple[float, float]:
    low = schema.get("minimum", schema.get("exclusiveMinimum", default_low - 1) + 1)
    high = schema.get("maximum", schema.get("exclusiveMaximum", default_high + 1) - 1)
    return low, max(low, high)


def _sample_integer(schema: Mapping[str, Any], rng: random.Random, root: Mapping[str, Any]) -> int:
    low, high = _bounds(schema, 0, 100)
    return rng.randint(int(low), int(high))


def _sample_number(schema: Mapping[str, Any], rng: random.Random, root: Mapping[str, Any]) -> float:
    low, high = _bounds(schema, 0.0, 1.0)
    return round(rng.uniform(float(low), float(high)), 3)


_SAMPLERS: dict[str, Callable[[Mapping[str, Any], random.Random, Mapping[str, Any]], Any]] = {
    "object": _sample_object,
    "array": _sample_array,
    "string": _sample_string,
    "integer": _sample_integer,
    "number": _sample_number,
    "boolean": lambda schema, rng, root: rng.random() < 0.5,
    "null": lambda schema, rng, root: None,
}


def _sample_text(request: LLMRequest, rng: random.Random) -> str:
    last = str(request.messages[-1].get("content") or "") if request.messages else ""
    lines = [line for line in last.splitlines() if line.strip()]
    keywords = _KEYWORD.findall(lines[-1] if lines else "")
    picked = [rng.choice(keywords) for _ in range(min(3, len(keywords)))]
    filler = [rng.choice(_WORDS) for _ in range(rng.randint(6, 10))]
    about = f" about {', '.join(dict.fromkeys(picked))}" if picked else ""
    return f"{rng.choice(_OPENERS)}{about}: {' '.join(filler)}."


class TestLLM:
    """A deterministic offline model: the same seed and request always give the same answer.

    Without an output schema it answers a short sentence that echoes keywords of the last
    message; with one it answers JSON data that validates against the schema. The answer depends
    only on the seed and the request (never on call order), so concurrent roles stay reproducible.

    Args:
        seed: Changes every answer.
        model: Name reported in responses and the ledger.
        cost_per_token: Money charged per token (0 by default), to exercise budgets.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, seed: int = 0, *, model: str = "test", cost_per_token: float = 0.0) -> None:
        """Create a TestLLM."""
        self.seed = seed
        self.model = model
        self.cost_per_token = cost_per_token

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Answer ``request`` deterministically."""
        rng = random.Random(_stable_seed(self.seed, request.role, request.action, request.messages))
        if request.output_schema is not None:
            text = json.dumps(sample_schema(request.output_schema, rng))
        else:
            text = _sample_text(request, rng)
        return _response(text, request, self.model, self.cost_per_token)


def _response(text: str, request: LLMRequest, model: str, cost_per_token: float = 0.0) -> LLMResponse:
    usage = Usage(prompt_tokens=estimate_tokens(request.prompt_text()), completion_tokens=estimate_tokens(text))
    return LLMResponse(text=text, usage=usage, model=model, cost=usage.total_tokens * cost_per_token)


class TokenCount(Protocol):
    """How a model counts tokens: a call's prompt (its chat template included) and an answer's text."""

    def chat(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """The prompt tokens of a call with ``messages``."""
        ...

    def text(self, text: str) -> int:
        """The tokens of an answer's ``text``."""
        ...


class RoughCount:
    """Four characters a token, as :class:`TestLLM` counts (for a model whose tokenizer is not here)."""

    def chat(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """The chat's contents joined by newlines, four characters a token."""
        return estimate_tokens("\n".join(str(m.get("content") or "") for m in messages))

    def text(self, text: str) -> int:
        """Four characters a token."""
        return estimate_tokens(text)


class DryRunLLM:
    """The test model standing in for another model, for an estimate of what a run on that one costs.

    It answers as :class:`TestLLM` with the same seed (structured answers from the schema), but a
    free-text answer is made as long as the scenario declares that action's answers are
    (``answer_tokens``), so the prompts that quote it grow as they would; tokens are counted as the
    model it stands in for counts them (``count``), and its answers carry that model's name, so the
    ledger prices them as that model's. A prompt whose first messages an earlier call began with
    reports those messages' tokens as cached (``Usage.cached_tokens``), as a server's prefix cache
    serves them. It asks no model.

    Args:
        seed: The test model's seed.
        model: The name of the model it stands in for.
        count: That model's token count (default: four characters a token, :class:`RoughCount`).
        answer_tokens: Per action name, how many tokens its free-text answers have (``None``: as the
            test model makes them: it stands in for the test model).
        default_tokens: For an action not named there: half its call's ``max_tokens``, else this many.
    """

    def __init__(
        self,
        seed: int,
        *,
        model: str,
        count: TokenCount | None = None,
        answer_tokens: Mapping[str, int] | None = None,
        default_tokens: int = 100,
    ) -> None:
        """Stand in for ``model``; see the class docstring."""
        self.inner = TestLLM(seed, model=model)
        self.model = model
        self.count = count or RoughCount()
        self.answer_tokens = None if answer_tokens is None else dict(answer_tokens)
        self.default_tokens = default_tokens
        self.calls = 0
        """Calls answered (each one the real run would make)."""
        self._begun: set[int] = set()
        """Hashes of the leading messages of the calls so far (one per length)."""

    def declared(self, request: LLMRequest) -> int:
        """How many tokens a free-text answer to ``request`` has."""
        declared = (self.answer_tokens or {}).get(request.action)
        if declared is None:
            declared = request.max_tokens // 2 if request.max_tokens else self.default_tokens
        return max(1, min(declared, request.max_tokens or declared))

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Answer ``request`` as the test model, at the declared length, counted as the other model counts."""
        self.calls += 1
        answer = await self.inner.complete(request)
        text = answer.text
        if request.output_schema is None and self.answer_tokens is not None:
            text = self._at_length(text, self.declared(request))
        usage = Usage(prompt_tokens=self.count.chat(request.messages), completion_tokens=self.count.text(text))
        usage.cached_tokens = self._cached(request.messages)
        return LLMResponse(text=text, usage=usage, model=self.model)

    def _cached(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """The tokens of the longest run of leading ``messages`` an earlier call began with (and note these)."""
        seen, keys = 0, []
        key = 0
        for i, message in enumerate(messages[:-1]):  # the last message is the call's own
            key = hash((key, str(message.get("role")), str(message.get("content"))))
            keys.append(key)
            if key in self._begun:
                seen = i + 1
        self._begun.update(keys)
        return self.count.chat(messages[:seen]) if seen else 0

    def _at_length(self, text: str, tokens: int) -> str:
        """``text``, lengthened by words drawn from the test model's, cut to the most words within ``tokens`` tokens."""
        words, count = text.split(), self.count.text
        rng = random.Random(text)
        while count(" ".join(words)) < tokens:
            words += [rng.choice(_WORDS) for _ in range(len(words) + 1)]
        low, high = 1, len(words)  # the most words whose count is within tokens: counts grow with words
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if count(" ".join(words[:middle])) <= tokens else (low, middle - 1)
        return " ".join(words[:low])


FunctionHandler = Callable[[LLMRequest], "str | LLMResponse | Awaitable[str | LLMResponse]"]


class FunctionLLM:
    """A model whose answers come from a plain function (sync or async) of the request.

    Args:
        fn: Called with each :class:`LLMRequest`; returns text or an :class:`LLMResponse`.
        model: Name reported in responses and the ledger.
    """

    def __init__(self, fn: FunctionHandler, *, model: str = "function") -> None:
        """Create a FunctionLLM around ``fn``."""
        self.fn = fn
        self.model = model

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Answer ``request`` with ``fn``."""
        result = self.fn(request)
        if inspect.isawaitable(result):
            result = await result
        if isinstance(result, LLMResponse):
            return result
        return _response(str(result), request, self.model)


class ScriptedCall(BaseModel):
    """One call a :class:`ScriptedLLM` answered."""

    role: str
    action: str
    number: int
    request: LLMRequest
    response: str


class ScriptedLLM:
    """A model that answers from a script: role name → action name → responses in order.

    ``"*"`` as a role or action matches any. A response may be a string or JSON data (dumped to
    text). ``{"when": "TEXT", "answer": RESPONSE}`` answers only a request whose messages contain
    TEXT (the first such one left): one script can answer many tasks, each by what its prompt says.
    A mapping with ``"tool_calls"`` is a tool-calling answer: ``{"content": "...",
    "tool_calls": [{"name": "python_execute", "arguments": {"code": "..."}, "id": "call_1"}]}``
    (``arguments`` as an object or as the raw JSON string a model would send, even a broken one;
    ``id`` optional). Every call is recorded in :attr:`calls`.

    Args:
        script: The responses.
        source: Where the script came from, for error messages.
        model: Name reported in responses and the ledger.

    Raises:
        ScriptExhausted: On a call for which no response is left (names role, action, call number).
    """

    def __init__(
        self, script: Mapping[str, Mapping[str, Sequence[Any]]], *, source: str = "<script>", model: str = "scripted"
    ) -> None:
        """Create a ScriptedLLM."""
        self.script = _check_script(script, source)
        self.source = source
        self.model = model
        self.calls: list[ScriptedCall] = []
        self._taken: dict[tuple[str, str], set[int]] = {}

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedLLM:
        """Load a JSON script file ``{"role": {"action": ["response", ...]}}``.

        Raises:
            ConfigError: If the file is missing, is not JSON, or has the wrong shape.
        """
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read scripted LLM file {str(path)!r}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"scripted LLM file {str(path)!r} is not UTF-8 text (byte {exc.start}); save it as UTF-8"
            ) from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"scripted LLM file {str(path)!r} does not parse as JSON: {exc.msg} at line {exc.lineno} "
                f'column {exc.colno}; it must hold {{"role": {{"action": ["response", ...]}}}}'
            ) from None
        except RecursionError:
            raise ConfigError(
                f"scripted LLM file {str(path)!r} nests too deep to read; "
                'it must hold {"role": {"action": ["response", ...]}}'
            ) from None
        return cls(data, source=str(path))

    def _key(self, role: str, action: str) -> tuple[str, str]:
        for r in (role, "*"):
            for a in (action, "*"):
                if a in self.script.get(r, {}):
                    return r, a
        return role, action

    def _next(self, key: tuple[str, str], responses: Sequence[Any], request: LLMRequest) -> int | None:
        """The first response not given yet that answers ``request`` (a ``when`` its messages contain)."""
        text: str | None = None
        for index, answer in enumerate(responses):
            if index in self._taken[key]:
                continue
            if not (isinstance(answer, Mapping) and "when" in answer):
                return index
            if text is None:
                text = "\n".join(str(m.get("content") or "") for m in request.messages)
            if str(answer["when"]) in text:
                return index
        return None

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Answer with the next scripted response for the request's role and action."""
        key = self._key(request.role, request.action)
        number = len(self._taken.setdefault(key, set()))
        responses = self.script.get(key[0], {}).get(key[1], ())
        index = self._next(key, responses, request)
        if index is None:
            raise ScriptExhausted(
                f"ScriptedLLM ({self.source}) has no response for role {request.role!r}, action "
                f"{request.action!r}, call #{number + 1} ({len(responses)} scripted); add responses "
                f"under [{request.role!r}][{request.action!r}] or '*'"
            )
        self._taken[key].add(index)
        answer = responses[index]
        if isinstance(answer, Mapping) and "when" in answer:
            answer = answer.get("answer", "")
        text = answer if isinstance(answer, str) else json.dumps(answer)
        self.calls.append(
            ScriptedCall(role=request.role, action=request.action, number=number + 1, request=request, response=text)
        )
        if isinstance(answer, Mapping) and "tool_calls" in answer:
            return _tool_response(answer, request, self.model, len(self.calls))
        return _response(text, request, self.model)


def _tool_response(answer: Mapping[str, Any], request: LLMRequest, model: str, number: int) -> LLMResponse:
    """A scripted tool-calling answer as a model would return it."""
    calls = []
    for i, call in enumerate(answer["tool_calls"]):
        arguments = call.get("arguments", {})
        raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
        calls.append(
            ToolCall(
                id=str(call.get("id") or f"scripted_{number}_{i}"), function=Function(name=call["name"], arguments=raw)
            )
        )
    content = str(answer.get("content") or "")
    response = _response(content + "".join(c.function.arguments for c in calls), request, model)
    return response.model_copy(update={"text": content, "tool_calls": calls or None})


def _check_script(script: object, source: str) -> dict[str, dict[str, list[Any]]]:
    shape = '{"role": {"action": ["response", ...]}}'
    if not isinstance(script, Mapping):
        raise ConfigError(f"scripted LLM {source}: expected {shape}, got {type(script).__name__}")
    checked: dict[str, dict[str, list[Any]]] = {}
    for role, actions in script.items():
        if not isinstance(actions, Mapping):
            raise ConfigError(f"scripted LLM {source}: role {role!r} must map action names to lists; expected {shape}")
        for action, responses in actions.items():
            if not isinstance(responses, list):
                raise ConfigError(
                    f"scripted LLM {source}: [{role!r}][{action!r}] must be a list of responses, got {responses!r}"
                )
        checked[str(role)] = {str(a): list(r) for a, r in actions.items()}
    return checked
