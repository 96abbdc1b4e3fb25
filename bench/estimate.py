"""How close ``metaroles run … --estimate`` comes to the runs it estimates, and the embedded models' pace.

    python bench/estimate.py accuracy [--seeds 5] [--first 11] [--models test,local] [--only debate,feed]
    python bench/estimate.py pace [--models qwen2.5-coder-0.5b-instruct-q4_k_m,smollm2-135m-instruct-q4_1]

Prints JSON, one figure a line.

- ``accuracy``: for each scenario (the four and the feed, sized so that the embedded model runs them in
  minutes) and model, the estimate (``--estimate -q`` at seed ``first``: its dry runs are seeds
  ``first`` onwards) against the mean of the real runs at seeds ``first`` … ``first + seeds - 1``
  (werewolf, whose games last 4 to 30 calls: 20 seeds), each in its own
  process (its run directory's ``ledger.json`` read, its wall time measured): ``calls``,
  ``prompt_tokens``, ``completion_tokens``, ``cost`` (at ``--price`` 0.5 and 1.5 USD per 1,000 prompt
  and answer tokens, so money is counted for free models too) and ``seconds``, each with its error in
  percent; the estimate's model calls (none). Goal (issue 77): calls, tokens and cost within ±20 %.
  The seeds are not those the scenarios' ``ANSWER_TOKENS`` were read from (seed 3).
- ``pace``: an embedded model's engine as ``--llm local`` runs it (32 slots): prompt tokens read a
  second (1, 4 and 16 prompts at once) and a decoding step's seconds with 1, 4 and 16 calls in it,
  fitted to ``fixed + per_call × calls``: the figures ``EmbeddedModel`` keeps for an estimate's time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WIDER = {"werewolf": 20}
"""Scenarios whose course varies by seed, run at more seeds than ``--seeds`` (a game lasts 4 to 30 calls: 20 games
put the mean within about ±7 % at one standard error)."""

SCENARIOS: dict[str, list[str]] = {
    "debate": [],
    "werewolf": [],
    "software_company": [],
    "society": ["--set", "agents=60", "--set", "llm_agents=12", "--rounds", "3"],
    "feed": ["--set", "agents=500", "--set", "llm_share=0.2", "--rounds", "4"],
}
"""The scenarios and their sizes."""

PRICE = "0.5,1.5"


def emit(figure: str, value: object, unit: str, **params: object) -> None:
    print(json.dumps({"figure": figure, "value": value, "unit": unit, "params": params}), flush=True)


def metaroles(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metaroles", *args], capture_output=True, text=True, check=True)


def model_name(llm: str) -> str:
    return "test" if llm == "test" else "qwen2.5-coder-0.5b-instruct-q4_k_m"


def real_runs(name: str, extra: list[str], llm: str, seeds: range, folder: Path) -> dict[str, float]:
    """The mean figures of real runs at ``seeds``."""
    runs: list[dict[str, float]] = []
    for seed in seeds:
        out = folder / f"{name}-{llm}-{seed}"
        begun = time.perf_counter()
        metaroles("run", name, *extra, "--llm", llm, "--seed", str(seed), "-q", "--out", str(out),
                  "--price", f"{model_name(llm)}={PRICE}")  # fmt: skip
        seconds = time.perf_counter() - begun
        entries = json.loads((out / "ledger.json").read_text(encoding="utf-8"))
        runs.append({
            "calls": len(entries),
            "prompt_tokens": sum(e["prompt_tokens"] for e in entries),
            "completion_tokens": sum(e["completion_tokens"] for e in entries),
            "cost": sum(e["cost"] for e in entries),
            "seconds": seconds,
        })  # fmt: skip
    return {key: statistics.fmean(run[key] for run in runs) for key in runs[0]}


def accuracy(seeds: int, first: int, models: list[str], only: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in SCENARIOS.items():
            if only and name not in only:
                continue
            for llm in models:
                said = metaroles("run", name, *extra, "--llm", llm, "--seed", str(first), "--estimate", "-q",
                                 "--price", f"{model_name(llm)}={PRICE}")  # fmt: skip
                estimate = json.loads(said.stdout)
                measured = real_runs(name, extra, llm, range(first, first + WIDER.get(name, seeds)), Path(tmp))
                errors = {
                    key: None if estimate[key] is None or not measured[key]
                    else round(100 * (estimate[key] - measured[key]) / measured[key], 1)
                    for key in measured
                }  # fmt: skip
                emit(
                    "estimate_error", errors, "%", scenario=name, llm=llm, options=extra, first=first,
                    seeds=WIDER.get(name, seeds), dry_runs=len(estimate["seeds"]),
                    estimate={key: estimate[key] for key in measured}, measured=measured,
                    model_calls=estimate["model_calls"],
                )  # fmt: skip


def pace(models: list[str]) -> None:
    import anyio

    from metaroles.llm.local import LocalLLM
    from metaroles.llm.protocol import LLMRequest

    async def together(llm: Any, prompts: list[str], max_tokens: int) -> tuple[float, list[Any]]:
        usages: list[Any] = []

        async def one(content: str) -> None:
            request = LLMRequest(messages=[{"role": "user", "content": content}], max_tokens=max_tokens)
            usages.append((await llm.complete(request)).usage)

        begun = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for content in prompts:
                tg.start_soon(one, content)
        return time.perf_counter() - begun, usages

    async def measure(model: str) -> None:
        llm = LocalLLM(model, batch=32)
        await llm.complete(LLMRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=2))
        read = []
        for n in (1, 4, 16):
            prompts = [" ".join(f"Point {k}: trams carry {i * k + n} people." for k in range(30)) for i in range(n)]
            seconds, usages = await together(llm, prompts, 1)
            read.append(sum(u.prompt_tokens - u.cached_tokens for u in usages) / seconds)
        steps = []
        for n in (1, 4, 16):
            story = [f"Write a long story ({i}, {n}) about a tram driver, at least 400 words." for i in range(n)]
            seconds, usages = await together(llm, story, 100)
            steps.append((n, seconds / max(u.completion_tokens for u in usages)))
        slope = (steps[-1][1] - steps[0][1]) / (steps[-1][0] - steps[0][0])
        emit("prefill_per_s", round(statistics.fmean(read), 1), "tokens/s", model=model, at=[1, 4, 16])
        emit("decode_step_s", [round(steps[0][1] - slope, 4), round(slope, 4)], "s", model=model,
             steps={n: round(s, 4) for n, s in steps})  # fmt: skip

    for model in models:
        anyio.run(measure, model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["accuracy", "pace"])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first", type=int, default=11)
    parser.add_argument("--models", default="")
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    models = [m for m in args.models.split(",") if m]
    if args.what == "accuracy":
        accuracy(args.seeds, args.first, models or ["test", "local"], [s for s in args.only.split(",") if s])
    else:
        pace(models or ["qwen2.5-coder-0.5b-instruct-q4_k_m", "smollm2-135m-instruct-q4_1"])


if __name__ == "__main__":
    main()
