"""The embedded local model: a small GGUF model run in-process by llama-cpp-python.

The default is Qwen2.5-Coder-0.5B-Instruct (Q4_K_M), from six chunk packages of the registry;
SmolLM2-135M-Instruct is the other embedded model (``llm.model_files``); any GGUF file with a chat
template runs too. llama-cpp-python comes with the ``local`` extra. This module imports ``llama_cpp``; metaroles
imports it only when the local model is asked for.

One model per process is loaded once and shared by every role; calls to it are serialised (one
model, many roles) and run in a worker thread so the event loop keeps going; it runs with one
thread: on two busy cores two threads make generation collapse. With ``batch=N``, calls are
decoded together instead, up to N at a time, by the continuous-batching engine (``llm.engine``),
with a prefix cache: each keeps its own cache stream and sampler, so its answer does not depend on
the others nor on what came from the cache. Structured output and forced
tool calls are constrained by a grammar built from the JSON schema, so even this small model
answers with valid JSON.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
from anyio.lowlevel import current_token

from metaroles.core.exceptions import ConfigError
from metaroles.core.ids import new_id  # llama.cpp's own call ids are random: ours follow the run
from metaroles.core.schema import Function, ToolCall
from metaroles.llm.engine import BatchEngine, Outcome, Sampling, TokenCounter
from metaroles.llm.grammar import Unsupported, schema_grammar, to_gbnf
from metaroles.llm.llama_library import LlamaGrammar, json_schema_to_gbnf, llama_cpp
from metaroles.llm.model_files import EMBEDDED, MODEL_NAME
from metaroles.llm.model_files import model_path as embedded_path
from metaroles.llm.protocol import LLMRequest, LLMResponse, Usage

_LOCK = threading.Lock()
_MODELS: dict[tuple[str, int, int], llama_cpp.Llama] = {}
_GRAMMARS: dict[str, LlamaGrammar] = {}
_ENGINES: dict[tuple[str, int, int, bool], BatchEngine] = {}
_GBNF: dict[str, str] = {}


def _model(path: Path, n_ctx: int, n_threads: int) -> llama_cpp.Llama:
    key = (str(path), n_ctx, n_threads)
    model = _MODELS.get(key)
    if model is None:
        model = llama_cpp.Llama(
            model_path=str(path), n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads, verbose=False
        )
        _MODELS[key] = model
    return model


def _grammar(schema: dict[str, Any]) -> LlamaGrammar:
    """The parsed grammar of ``schema`` (the one-at-a-time path's), kept per schema."""
    text = grammar_of(schema)
    grammar = _GRAMMARS.get(text)
    if grammar is None:
        grammar = _GRAMMARS[text] = LlamaGrammar.from_string(text, verbose=False)
    return grammar


def grammar_of(schema: dict[str, Any]) -> str:
    """The GBNF grammar of ``schema`` (the batching engine's; :func:`_grammar` parses it), kept per schema.

    Raises:
        ValueError: (or another error of llama-cpp-python's converter) for a schema no grammar follows.
    """
    text = json.dumps(schema)  # keep the schema's property order: the grammar follows it
    grammar = _GBNF.get(text)
    if grammar is None:
        try:  # the whole schema: bounds, enums, lengths, patterns (an answer validates by construction)
            grammar = to_gbnf(*schema_grammar(schema))
        except Unsupported:  # a keyword no grammar carries: the shape only, the answer validated after
            grammar = json_schema_to_gbnf(text)
        _GBNF[text] = grammar
    return grammar


def _forced_tool(request: LLMRequest) -> dict[str, Any] | None:
    """The tool a request forces (by name, or ``required`` with a single tool), if any."""
    tools = request.tools or []
    choice = request.tool_choice
    if not tools or choice in (None, "none", "auto"):
        return None
    if choice == "required":
        return tools[0] if len(tools) == 1 else None
    return next((t for t in tools if t.get("function", {}).get("name") == choice), None)


def _given(request: LLMRequest) -> dict[str, Any]:
    """The sampling settings ``request`` sets (the model's defaults fill the rest)."""
    return {
        field: value
        for field in ("max_tokens", "temperature", "seed")
        if (value := getattr(request, field)) is not None
    }


class LocalLLM:
    """An embedded model, in-process.

    Args:
        model_path: A GGUF file, or the name of an embedded model (``llm.model_files.EMBEDDED``);
            the default is Qwen2.5-Coder-0.5B-Instruct.
        n_ctx: Context length in tokens.
        n_threads: Threads for generation (1 is fastest on a busy 2-core machine).
        max_tokens: Default bound on answer length.
        temperature: Default sampling temperature.
        seed: Sampling seed, for reproducible answers.
        repeat_penalty: Discourages the loops small models fall into (default: the embedded model's own, else 1.1).
        batch: Decode up to this many calls together (0: one at a time, as before); the engine
            uses 2 threads, and constrains structured output and forced tool calls with the same grammar.
        unified: With ``batch``, one cache for every call, as a server has (``metaroles serve``):
            faster, but an answer may vary with what is decoded beside it, so a run's model keeps it off.
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        n_ctx: int = 2048,
        n_threads: int = 1,
        max_tokens: int = 200,
        temperature: float = 0.2,
        seed: int = 0,
        repeat_penalty: float | None = None,
        batch: int = 0,
        unified: bool = False,
    ) -> None:
        """Point at the model file; it is loaded on the first call."""
        named = MODEL_NAME if model_path is None else str(model_path)
        self.path = embedded_path(named) if named in EMBEDDED else Path(named)
        if not self.path.is_file():
            raise ConfigError(f"model_path={named!r} is not a file; pass a .gguf model or one of {sorted(EMBEDDED)}")
        self.model = named if named in EMBEDDED else self.path.stem
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
            raise ConfigError(f"batch={batch!r} must be a whole number of calls decoded together (0: one at a time)")
        self.batch = batch
        self.unified = unified
        self.defaults: dict[str, Any] = {
            "max_tokens": max_tokens,
            "temperature": temperature,
            "seed": seed,
            "repeat_penalty": repeat_penalty or (EMBEDDED[named].repeat_penalty if named in EMBEDDED else 1.1),
        }

    def load(self) -> None:
        """Load the model now (otherwise the first call does)."""
        with _LOCK:
            _model(self.path, self.n_ctx, self.n_threads)

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Answer in a worker thread (calls take turns on the one model), or batched with others (``batch``)."""
        tool = _forced_tool(request)
        schema = (tool["function"].get("parameters") or {"type": "object"}) if tool is not None else None
        schema = schema if schema is not None else request.output_schema
        if self.batch:
            text, usage = await self._batched(request, schema)
        else:
            text, usage = await anyio.to_thread.run_sync(self._complete, request, schema)
        response = LLMResponse(text=text, usage=usage, model=self.model)
        if tool is not None:  # the grammar made the arguments: the answer is the call
            call = ToolCall(id=f"call_{new_id()}", function=Function(name=tool["function"]["name"], arguments=text))
            response = response.model_copy(update={"text": "", "tool_calls": [call]})
        return response

    async def _batched(self, request: LLMRequest, schema: dict[str, Any] | None) -> tuple[str, Usage]:
        """Answer through the batching engine: the call waits on an event the engine's thread sets."""
        with _LOCK:
            engine = self.engine()
            grammar = None if schema is None else grammar_of(schema)
        answered, token, outcomes = anyio.Event(), current_token(), []

        def done(outcome: Outcome) -> None:
            outcomes.append(outcome)
            anyio.from_thread.run_sync(answered.set, token=token)

        engine.submit(request.messages, Sampling(**{**self.defaults, **_given(request)}, grammar=grammar), done)
        await answered.wait()
        outcome = outcomes[0]
        if outcome.error is not None:
            raise outcome.error
        usage = Usage(prompt_tokens=outcome.prompt_tokens, completion_tokens=outcome.completion_tokens)
        if outcome.cached_tokens:
            usage.cached_tokens = outcome.cached_tokens
        return outcome.text, usage

    def engine(self) -> BatchEngine:
        """The batching engine of this model file, batch size, context and cache (one per process)."""
        key = (str(self.path), self.batch, self.n_ctx, self.unified)
        engine = _ENGINES.get(key)
        if engine is None:
            slots = max(self.batch, 1)
            engine = BatchEngine(self.path, slots=slots, n_ctx=self.n_ctx, unified=self.unified)
            _ENGINES[key] = engine
        return engine

    def _complete(self, request: LLMRequest, schema: dict[str, Any] | None) -> tuple[str, Usage]:
        kwargs: dict[str, Any] = {**self.defaults, **_given(request)}
        with _LOCK:
            if schema is not None:
                kwargs["grammar"] = _grammar(schema)
            model = _model(self.path, self.n_ctx, self.n_threads)
            messages: Any = request.messages
            result: Any = model.create_chat_completion(messages=messages, **kwargs)
        usage = result.get("usage") or {}
        counts = Usage(prompt_tokens=usage.get("prompt_tokens", 0), completion_tokens=usage.get("completion_tokens", 0))
        return result["choices"][0]["message"].get("content") or "", counts

    def token_count(self) -> TokenCounter:
        """This model's token count (its vocabulary and chat template, no weights): what an estimate counts with."""
        return TokenCounter(self.path)

    def speed(self) -> dict[str, Any] | None:
        """How fast this model answers here, as measured (an embedded model's figures; ``None``: not measured).

        ``prefill_per_s`` prompt tokens a second; ``decode_step_s`` a decoding step's seconds (fixed, per call
        in it); ``batch`` the calls decoded together at most.
        """
        model = EMBEDDED.get(self.model)
        if model is None or model.prefill_per_s is None or model.decode_step_s is None:
            return None
        return {"prefill_per_s": model.prefill_per_s, "decode_step_s": model.decode_step_s, "batch": max(self.batch, 1)}

    def __repr__(self) -> str:
        """Show the model file."""
        return f"LocalLLM({str(self.path)!r}, n_threads={self.n_threads}, batch={self.batch})"
