"""A continuous-batching engine for the embedded model: the calls of many roles decoded together.

One llama.cpp context holds a sequence for each call in flight. One thread runs the loop:

1. admit waiting calls while a slot is free: their prompts (the model's chat template) join the batch;
2. every live call adds the token it sampled last;
3. one ``llama_decode`` for the whole batch;
4. each call samples its next token with its own sampler chain (its seed, temperature, repeat
   penalty) and ends at the end-of-generation token or its ``max_tokens``.

**Prefix cache.** A slot keeps its cache when its call ends, and a new call goes to the free slot
whose kept tokens share the longest prefix with its prompt; only the rest of the prompt is
decoded. When another slot — running, or kept — holds more of the prompt, its cells are taken
instead of being decoded again (``llama_memory_seq_cp``), and a call that arrives with another
that begins alike waits one step to take the other's cells. A society's prompts, which begin with
the same system prompt and scenario, then mostly come from the cache.

**The same answer in any batch.** By default each call has a cache stream of its own, so what it
answers does not depend on what is decoded beside it, on the slot it got, nor on how much of its
prompt came from the cache: a run's embedded model answers the same in every process, batch and
shard. Three things make it so:

- a stream's cells stay in the order of their positions (a slot's cache is trimmed at its end
  and refilled from there, a slot taking another's cells copies its whole stream);
- the cache holds Q8_0 keys and values. With f16 ones llama.cpp's CPU attention takes other
  paths (tiles for 64 or more query tokens, a split over threads for one token among 512 cells or
  more) whose sums round differently: 38 of 40 long prompts answered otherwise from the cache
  than decoded alone. Q8_0 attention has one path, token by token.

``unified=True`` (what ``metaroles serve`` runs) puts every call in one cache instead, as
llama.cpp's server does (``kv_unified``): cells taken from another slot are shared, not copied,
and a step is faster (``bench/engine.py``: ``engine_batched``), but an answer may then differ in
the last digits of its logits with the cells it got and what was decoded beside it.

Either way the batch lists its calls by sequence: llama.cpp decodes a run of consecutive sequence
ids in one pass, and listed as they were admitted a step took about 1.5× as long.

A call with a grammar (structured output, a forced tool call) samples as llama.cpp's own
``common_sampler`` does: the chain draws from every token, and only when the grammar refuses the
draw is the grammar applied to the whole vocabulary and the draw made again. Checking one token is
cheap; masking all 49k at every step (the grammar first in the chain) cost about 15 % of the
engine's tokens/s on short JSON answers. Greedy answers are the same either way.

A call is answered on the event loop that made it (``anyio.from_thread``).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import math
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy

from metaroles.core.exceptions import ConfigError, RunError
from metaroles.llm.llama_library import llama_cpp


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a call ended: its text and token counts, or the error it failed with."""

    text: str
    prompt_tokens: int
    cached_tokens: int
    """Prompt tokens taken from the slot's cache rather than decoded."""
    completion_tokens: int
    error: BaseException | None = None


Done = Callable[[Outcome], None]
"""Told of a call's end, from the engine's thread."""


@dataclass
class Counters:
    """What the engine has done since it started (read from any thread)."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class Sampling:
    """How a call's tokens are drawn (the same chain as llama-cpp-python's, per call)."""

    max_tokens: int = 200
    temperature: float = 0.2
    seed: int = 0
    repeat_penalty: float = 1.3
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    grammar: str | None = None
    """A GBNF grammar the answer must follow (structured output, a forced tool call's arguments)."""


@dataclass
class _Call:
    tokens: list[int]
    sampling: Sampling
    done: Done
    chain: Any = None
    grammar: Any = None
    seq: int = -1
    start: int = 0
    """Prompt tokens already in the slot's cache (prefix cache)."""
    position: int = 0
    last: int = -1
    """The batch index of the logits this call samples from next."""
    text: bytearray = field(default_factory=bytearray)
    made: int = 0


class BatchEngine:
    """Decodes up to ``slots`` calls at once on one model (see the module).

    Args:
        path: The GGUF model file.
        slots: How many calls are decoded together.
        n_ctx: Tokens each call may hold (prompt and answer).
        threads: Threads for llama.cpp's decoding.
        unified: One cache for every call, as a server has (faster; an answer may vary with its batch).
    """

    def __init__(
        self,
        path: Path,
        *,
        slots: int = 16,
        n_ctx: int = 2048,
        threads: int = 2,
        unified: bool = False,
    ) -> None:
        """Load the model and make the context (nothing runs until a call is submitted)."""
        if slots < 1 or n_ctx < 64:
            raise ConfigError(f"slots={slots!r} and n_ctx={n_ctx!r} must be at least 1 and 64")
        llama_cpp.llama_log_set(_LOG, ctypes.c_void_p(0))  # llama.cpp's errors to our logger, its chatter nowhere
        llama_cpp.llama_backend_init()
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), llama_cpp.llama_model_default_params())
        if not self.model:
            raise ConfigError(f"could not load the model {str(path)!r}; pass a .gguf model file")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.template = llama_cpp.llama_model_chat_template(self.model, None)
        self.slots, self.n_ctx = slots, n_ctx
        params = llama_cpp.llama_context_default_params()
        self.unified = unified
        params.n_ctx, params.n_seq_max, params.kv_unified = n_ctx * slots, slots, unified
        params.type_k = params.type_v = llama_cpp.GGML_TYPE_Q8_0  # one attention path (see the module)
        params.n_batch = params.n_ubatch = max(512, 64 * slots)
        params.n_threads = params.n_threads_batch = threads
        self.ctx = llama_cpp.llama_init_from_model(self.model, params)
        self.capacity = params.n_batch
        self.batch = llama_cpp.llama_batch_init(self.capacity, 0, 1)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self._data = (llama_cpp.llama_token_data * self.n_vocab)()  # the candidates of a grammar's draw
        self._view = numpy.frombuffer(self._data, dtype=numpy.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")]))
        self._ids = numpy.arange(self.n_vocab, dtype=numpy.int32)
        self.counters = Counters()
        self._waiting: deque[_Call] = deque()
        self._live: dict[int, _Call] = {}
        self._kept: dict[int, list[int]] = {}
        """Per slot, the tokens its cache holds from its last call."""
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closing = False

    # -- the callers' side ------------------------------------------------------------------------

    def submit(self, messages: Sequence[dict[str, Any]], sampling: Sampling, done: Done) -> None:
        """Queue a chat call; ``done`` is called from the engine's thread when it ends.

        Raises:
            ConfigError: If its prompt does not fit a slot's ``n_ctx`` (nothing is queued).
        """
        tokens = self.tokenize(self.chat_prompt(messages))
        if len(tokens) + sampling.max_tokens > self.n_ctx or len(tokens) > self.capacity:
            raise ConfigError(
                f"a prompt of {len(tokens)} tokens and max_tokens={sampling.max_tokens} do not fit n_ctx={self.n_ctx}; "
                "shorten the history the action sends or raise n_ctx"
            )
        with self._wake:
            if self._closing:
                raise RunError("the local model's engine is closed (the process is ending); start a new one")
            self._waiting.append(_Call(tokens, sampling, done))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="metaroles-engine", daemon=True)
                self._thread.start()
                atexit.register(self.close)  # before the model's memory goes: a decode under way ends first
            self._wake.notify()

    def close(self) -> None:
        """Stop the engine's thread after the step under way, fail the calls left, free the model (idempotent).

        Called at interpreter exit once the engine has run: a process ended by Ctrl-C must not free
        llama.cpp's memory (or unload its library) under a decode in the engine's thread.
        """
        with self._wake:
            if self._closing:
                return
            self._closing = True
            self._wake.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        stopped = RunError("the local model's engine was closed before the call ended")
        for call in [*self._waiting, *self._live.values()]:
            _tell(call, stopped)
        self._waiting.clear()
        self._live.clear()
        llama_cpp.llama_batch_free(self.batch)
        llama_cpp.llama_free(self.ctx)
        llama_cpp.llama_model_free(self.model)

    def chat_prompt(self, messages: Sequence[dict[str, Any]]) -> bytes:
        """``messages`` laid out by the model's chat template, ready for the assistant's turn."""
        return chat_prompt(self.template, messages)

    def tokenize(self, text: bytes) -> list[int]:
        """``text``'s tokens (special tokens parsed, the model's BOS added if it wants one)."""
        return tokenize(self.vocab, text)

    @property
    def running(self) -> int:
        """Calls being decoded now."""
        return len(self._live)

    @property
    def waiting(self) -> int:
        """Calls queued for a slot."""
        return len(self._waiting)

    # -- the engine's thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._waiting and not self._live and not self._closing:
                    self._wake.wait()
                if self._closing:
                    return
                admitted = self._admit()
                if not self.unified:
                    self._compact()
            try:
                self._step(admitted)
            except Exception as exc:  # a failed decode fails every call in it, never the engine
                for call in list(self._live.values()):
                    self._finish(call, exc)

    def _admit(self) -> list[_Call]:
        """Give free slots to waiting calls, as far as the batch has room for their prompts."""
        admitted: list[_Call] = []
        room = self.capacity - len(self._live)
        free = [seq for seq in range(self.slots) if seq not in self._live]
        while self._waiting and free and len(self._waiting[0].tokens) <= room:  # (a cached prefix only saves room)
            if self._worth_waiting(self._waiting[0], admitted):
                break
            call = self._waiting.popleft()
            try:
                call.grammar = _grammar(call.sampling, self.vocab)
                call.chain = _chain(call.sampling, self.vocab)
            except Exception as exc:  # its sampling cannot be set up: that call fails, the others go on
                _tell(call, exc)
                continue
            call.seq = self._slot(call, free)
            free.remove(call.seq)
            room -= len(call.tokens) - call.start
            self._live[call.seq] = call
            admitted.append(call)
        return admitted

    def _compact(self) -> None:
        """Move the last live calls down into free slots below them, so the live ones are consecutive.

        llama.cpp decodes a run of consecutive streams in one pass; every gap costs a pass of its own
        (a step with calls in slots 0-3 and 7 took two). A move copies the call's whole stream (at
        the next decode) and leaves the old slot its cache.
        """
        memory = llama_cpp.llama_get_memory(self.ctx)
        while self._live:
            top = max(self._live)
            hole = next((seq for seq in range(top) if seq not in self._live), None)
            if hole is None:
                return
            call = self._live.pop(top)
            llama_cpp.llama_memory_seq_cp(memory, top, hole, -1, -1)
            self._kept[top] = call.tokens[: call.position or call.start]
            self._kept.pop(hole, None)
            call.seq = hole
            self._live[hole] = call

    def _worth_waiting(self, call: _Call, admitted: list[_Call]) -> bool:
        """Whether ``call`` should wait a step for a call admitted now that will hold much more of its prompt.

        Calls that begin alike (a society's shared system prompt) arriving together: the first
        decodes the shared start once, and the next step the others take its cells.
        """
        if not admitted:
            return False
        soon = max(_shared(other.tokens, call.tokens) for other in admitted)
        return soon >= _DONOR_GAIN + self._donor(call.tokens, 0)[1]

    def _slot(self, call: _Call, free: list[int]) -> int:
        """The free slot for ``call``, its cached prefix taken from whichever slot holds the most of its prompt.

        Unified: the free slot that holds the most (the lowest of equals); a stream per call: the
        lowest free one, so the live calls stay consecutive (see :meth:`_compact`).
        """
        memory = llama_cpp.llama_get_memory(self.ctx)
        shared = {seq: _shared(self._kept.get(seq, ()), call.tokens) for seq in free}
        seq = max(free, key=lambda s: (shared[s], -s)) if self.unified else free[0]  # streams: the lowest (one pass)
        donor, lent = self._donor(call.tokens, shared[seq])
        if donor is not None:  # another slot holds more of the prompt: its cells are shared, not decoded again
            if self.unified:
                llama_cpp.llama_memory_seq_rm(memory, seq, -1, -1)
                llama_cpp.llama_memory_seq_cp(memory, donor, seq, 0, lent)
            else:  # a stream of its own: the donor's whole stream is copied (at the next decode), its tail dropped
                llama_cpp.llama_memory_seq_cp(memory, donor, seq, -1, -1)
            shared[seq] = lent
        call.start = min(shared[seq], len(call.tokens) - 1)  # the last prompt token is decoded: its logits are needed
        llama_cpp.llama_memory_seq_rm(memory, seq, call.start, -1)
        self._kept.pop(seq, None)
        return seq

    def _donor(self, tokens: list[int], better_than: int) -> tuple[int | None, int]:
        """The slot whose cache holds the longest start of ``tokens``, if longer than ``better_than``; and its length.

        A slot's cache: a running call's tokens decoded (or found cached when it was admitted), or
        what a free slot kept.
        """
        best, length = None, better_than
        held = [(seq, call.tokens[: call.position or call.start]) for seq, call in self._live.items()]
        for seq, kept in (*held, *self._kept.items()):
            shared = _shared(kept, tokens)
            if shared > length:
                best, length = seq, shared
        return best, length

    def _step(self, admitted: list[_Call]) -> None:
        """One decode of the live calls' last tokens and the admitted calls' prompts; then each samples."""
        batch, fresh = self.batch, {id(call) for call in admitted}
        batch.n_tokens = 0
        for _, call in sorted(self._live.items()):  # by sequence: a stream per call takes runs of consecutive ids
            if id(call) in fresh:
                for position in range(call.start, len(call.tokens)):
                    last = position == len(call.tokens) - 1
                    call.last = _add(batch, call.tokens[position], position, call.seq, logits=last)
                call.position = len(call.tokens)
            else:
                call.last = _add(batch, call.tokens[-1], call.position, call.seq, logits=True)
                call.position += 1
        if llama_cpp.llama_decode(self.ctx, batch) != 0:
            raise RuntimeError("llama_decode failed (the context is full)")
        for call in list(self._live.values()):
            token = self._sample(call)
            if llama_cpp.llama_vocab_is_eog(self.vocab, token):
                self._finish(call, None)
                continue
            call.text += self._piece(token)
            call.tokens.append(token)
            call.made += 1
            if call.made >= call.sampling.max_tokens:
                self._finish(call, None)

    def _sample(self, call: _Call) -> int:
        """``call``'s next token: its chain's draw, drawn again under its grammar if the grammar refuses it."""
        if call.grammar is None:
            return int(llama_cpp.llama_sampler_sample(call.chain, self.ctx, call.last))
        candidates = self._candidates(call.last)
        llama_cpp.llama_sampler_apply(call.chain, ctypes.byref(candidates))
        token = int(candidates.data[candidates.selected].id)
        one = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 1.0, 0.0))
        llama_cpp.llama_sampler_apply(call.grammar, ctypes.byref(llama_cpp.llama_token_data_array(one, 1, -1, False)))
        if one[0].logit == -math.inf:  # refused: the grammar's tokens only, then the chain again
            candidates = self._candidates(call.last, top=GRAMMAR_TOP)
            llama_cpp.llama_sampler_apply(call.grammar, ctypes.byref(candidates))
            if not numpy.isfinite(self._view["logit"][:GRAMMAR_TOP]).any():  # none of the likeliest: all of them
                candidates = self._candidates(call.last)
                llama_cpp.llama_sampler_apply(call.grammar, ctypes.byref(candidates))
            llama_cpp.llama_sampler_apply(call.chain, ctypes.byref(candidates))
            token = int(candidates.data[candidates.selected].id)
        llama_cpp.llama_sampler_accept(call.grammar, token)
        llama_cpp.llama_sampler_accept(call.chain, token)
        return token

    def _candidates(self, index: int, top: int | None = None) -> Any:
        """Every token with its logit at batch ``index`` (or the ``top`` likeliest), as the samplers take them."""
        logits = numpy.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.ctx, index), shape=(self.n_vocab,))
        if top is None or top >= self.n_vocab:
            self._view["id"], self._view["logit"], self._view["p"] = self._ids, logits, 0.0
            return llama_cpp.llama_token_data_array(self._data, self.n_vocab, -1, False)
        likeliest = numpy.sort(numpy.argpartition(-logits, top)[:top])  # in id order: the same list every time
        view = self._view[:top]
        view["id"], view["logit"], view["p"] = likeliest, logits[likeliest], 0.0
        return llama_cpp.llama_token_data_array(self._data, top, -1, False)

    def _piece(self, token: int) -> bytes:
        buffer = ctypes.create_string_buffer(64)
        length = llama_cpp.llama_token_to_piece(self.vocab, token, buffer, 64, 0, False)
        return buffer.raw[: max(length, 0)]

    def _finish(self, call: _Call, error: BaseException | None) -> None:
        del self._live[call.seq]
        if error is None:  # the cache holds every token decoded (not the last one sampled)
            self._kept[call.seq] = call.tokens[: call.position]
        else:
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self.ctx), call.seq, -1, -1)
        llama_cpp.llama_sampler_free(call.chain)
        if call.grammar is not None:
            llama_cpp.llama_sampler_free(call.grammar)
        counters, prompt = self.counters, len(call.tokens) - call.made
        counters.requests += 1
        counters.prompt_tokens += prompt
        counters.cached_tokens += call.start
        counters.completion_tokens += call.made
        _tell(call, error)


GRAMMAR_TOP = 256
"""Tokens a refused draw is drawn again among first: the grammar checks the likeliest, not all 150k of
Qwen's vocabulary; only when none of them fits does it check every token. The
chain's top-k (40) and top-p keep fewer than these, so the draw is the one the whole vocabulary gives
whenever 40 of them fit (always, for a greedy one that fits)."""

_DONOR_GAIN = 16
"""Prompt tokens a call must gain by waiting a step for another's cells (fewer: it decodes them itself)."""


def chat_prompt(template: Any, messages: Sequence[dict[str, Any]]) -> bytes:
    """``messages`` laid out by a model's chat ``template`` (``llama_model_chat_template``), ready for the assistant."""
    chat = (llama_cpp.llama_chat_message * len(messages))()
    keep: list[bytes] = []  # the encoded strings must outlive the call
    for i, message in enumerate(messages):
        role, content = str(message.get("role", "user")).encode(), str(message.get("content") or "").encode()
        keep += (role, content)
        chat[i].role, chat[i].content = role, content
    size = 4096 + sum(len(text) for text in keep) * 2
    buffer = ctypes.create_string_buffer(size)
    length = llama_cpp.llama_chat_apply_template(template, chat, len(messages), True, buffer, size)
    if length < 0:
        raise ConfigError("the model's chat template is not one llama.cpp knows; use LocalLLM without batching")
    return buffer.raw[:length]


def tokenize(vocab: Any, text: bytes) -> list[int]:
    """``text``'s tokens in ``vocab`` (special tokens parsed, the model's BOS added if it wants one)."""
    room = len(text) + 16
    buffer = (llama_cpp.llama_token * room)()
    add_bos = llama_cpp.llama_vocab_get_add_bos(vocab)
    count = llama_cpp.llama_tokenize(vocab, text, len(text), buffer, room, add_bos, True)
    return list(buffer[:count])


class TokenCounter:
    """A model file's tokens, counted as its engine counts them (the same template and vocabulary), nothing decoded.

    Loads the vocabulary only (no weights): what an estimate needs to count a run's tokens for this model.
    """

    def __init__(self, path: Path) -> None:
        """Load ``path``'s vocabulary and chat template."""
        llama_cpp.llama_log_set(_LOG, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise ConfigError(f"could not read the model {str(path)!r}; pass a .gguf model file")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.template = llama_cpp.llama_model_chat_template(self.model, None)

    def chat(self, messages: Sequence[dict[str, Any]]) -> int:
        """The prompt tokens of a call with these ``messages``."""
        return len(tokenize(self.vocab, chat_prompt(self.template, messages)))

    def text(self, text: str) -> int:
        """The tokens of an answer's ``text``."""
        return len(tokenize(self.vocab, text.encode())) - bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))

    def close(self) -> None:
        """Free the vocabulary."""
        if self.model:
            llama_cpp.llama_model_free(self.model)
            self.model = None


def _log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """llama.cpp's log: its errors (level 4) go to the ``metaroles.engine`` logger; the rest is dropped.

    (llama-cpp-python's own callback maps the levels of an older llama.cpp and prints its warnings.)
    """
    if level == 4:
        logging.getLogger("metaroles.engine").error("%s", text.decode("utf-8", errors="replace").rstrip())


_LOG = llama_cpp.llama_log_callback(_log)
"""Kept: llama.cpp holds a pointer to the callback."""


def _shared(kept: Sequence[int], tokens: Sequence[int]) -> int:
    """How many leading tokens ``kept`` and ``tokens`` have in common."""
    for n, (a, b) in enumerate(zip(kept, tokens, strict=False)):
        if a != b:
            return n
    return min(len(kept), len(tokens))


def _tell(call: _Call, error: BaseException | None) -> None:
    """Give ``call``'s caller its answer (or ``error``); a caller whose event loop has ended is not told."""
    text = call.text.decode("utf-8", errors="replace")
    with contextlib.suppress(Exception):
        call.done(Outcome(text, len(call.tokens) - call.made, call.start, call.made, error))


def _grammar(sampling: Sampling, vocab: Any) -> Any:
    """The call's grammar sampler, or ``None`` without a grammar."""
    if sampling.grammar is None:
        return None
    grammar = llama_cpp.llama_sampler_init_grammar(vocab, sampling.grammar.encode(), b"root")
    if not grammar:
        raise ConfigError("the output schema's grammar does not parse; simplify the schema")
    return grammar


def _chain(sampling: Sampling, vocab: Any) -> Any:
    """A sampler chain for one call: penalties, top-k, top-p, min-p, temperature, its seeded draw."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    add = llama_cpp.llama_sampler_chain_add
    if sampling.temperature <= 0:
        add(chain, llama_cpp.llama_sampler_init_greedy())
        return chain
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    add(chain, llama_cpp.llama_sampler_init_penalties(n_vocab, 64, sampling.repeat_penalty, 0.0, 0.0))
    add(chain, llama_cpp.llama_sampler_init_top_k(sampling.top_k))
    add(chain, llama_cpp.llama_sampler_init_top_p(sampling.top_p, 1))
    add(chain, llama_cpp.llama_sampler_init_min_p(sampling.min_p, 1))
    add(chain, llama_cpp.llama_sampler_init_temp(sampling.temperature))
    add(chain, llama_cpp.llama_sampler_init_dist(sampling.seed & 0xFFFFFFFF))
    return chain


def _add(batch: Any, token: int, position: int, seq: int, *, logits: bool) -> int:
    at: int = batch.n_tokens
    batch.token[at], batch.pos[at], batch.n_seq_id[at] = token, position, 1
    batch.seq_id[at][0], batch.logits[at] = seq, logits
    batch.n_tokens = at + 1
    return at
