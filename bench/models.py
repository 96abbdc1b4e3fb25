"""The embedded models compared: quality on the eval suites, and speed on the batched engine.

    python bench/models.py [--part speed|software|debate|werewolf|all] [--models NAME,...] [--jobs 16] [--seeds N]

For each embedded model (``llm.model_files.EMBEDDED``):

- ``speed``: completion tokens/s of the batching engine, 1 and 16 calls of a code prompt at once
  (greedy, up to 200 tokens each, prefill included);
- ``software``: ``metaroles eval software --llm local --model NAME --jobs N`` (31 tasks, one seed):
  executability's mean and interval, acceptance tests passed of all, and the wall time;
- ``debate``: ``metaroles eval debate`` (3 motions × 5 seeds): the share of speeches on the motion,
  verdicts that validated;
- ``werewolf``: ``metaroles eval werewolf`` (10 games): structured answers and how many never validated.

Every evaluation's folder is kept under ``--out`` (its report, its trials). Prints JSON, a line per
model and part, with the machine's load.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from metaroles.llm.model_files import EMBEDDED, model_path

PROMPT = "Write a Python function fizzbuzz(n) that returns a list of strings. Answer with the code only."


def speed(name: str) -> dict[str, float]:
    """Completion tokens/s of the engine with 1 and with 16 calls at once."""
    from metaroles.llm.engine import BatchEngine, Sampling

    figures = {}
    for calls in (1, 16):
        engine = BatchEngine(model_path(name), slots=calls, n_ctx=1024)
        started = time.perf_counter()
        outcomes = answered(engine, calls, Sampling(max_tokens=200, temperature=0.0, seed=0))
        seconds = time.perf_counter() - started
        figures[f"tokens_per_s_{calls}"] = round(sum(o.completion_tokens for o in outcomes) / seconds, 1)
        engine.close()
    return figures


def answered(engine: Any, calls: int, sampling: Any) -> list[Any]:
    """``calls`` variants of the prompt asked at once; their outcomes once all have ended."""
    ended, outcomes = threading.Event(), []

    def done(outcome: Any) -> None:
        outcomes.append(outcome)
        if len(outcomes) == calls:
            ended.set()

    for index in range(calls):
        engine.submit([{"role": "user", "content": f"{PROMPT} (variant {index})"}], sampling, done)
    ended.wait()
    return outcomes


def evaluate(
    suite: str, name: str, out: Path, jobs: int, seeds: int | None
) -> tuple[dict[str, dict[str, str]], list[dict], float]:
    """Run ``metaroles eval SUITE`` on the model; its summary by metric, its rows, its wall time."""
    folder = out / f"{suite}-{name}"
    command = [sys.executable, "-m", "metaroles", "eval", suite, "--llm", "local", "--model", name]
    command += ["--seeds", str(seeds)] if seeds else []
    started = time.perf_counter()
    subprocess.run([*command, "--jobs", str(jobs), "--out", str(folder), "-q"], check=False, capture_output=True)
    seconds = time.perf_counter() - started
    with (folder / "summary.csv").open(encoding="utf-8") as table:
        summary = {line["metric"]: line for line in csv.DictReader(table) if line["setting"] == "default"}
    rows = [json.loads(line) for line in (folder / "eval.jsonl").read_text(encoding="utf-8").splitlines()]
    return summary, rows, round(seconds, 1)


def figure(summary: dict[str, dict[str, str]], metric: str) -> list[float | None]:
    """A metric's mean and interval, as numbers."""
    line = summary.get(metric, {})
    return [float(line[k]) if line.get(k) else None for k in ("mean", "low", "high")]


def part(which: str, name: str, out: Path, jobs: int, seeds: int | None) -> dict[str, object]:
    """One part's figures for one model."""
    if which == "speed":
        return speed(name)
    summary, rows, seconds = evaluate(which, name, out, jobs, seeds)
    found: dict[str, object] = {"wall_s": seconds, "trials": len(rows)}
    if which == "software":
        found["executability"] = figure(summary, "executability")
        found["tests_passed"] = sum(int(r.get("tests_passed") or 0) for r in rows)
        found["tests_total"] = sum(int(r.get("tests_total") or 0) for r in rows)
    elif which == "debate":
        found["on_motion"] = figure(summary, "on_motion")
        found["verdicts_valid"] = sum(int(r.get("verdict_valid") or 0) for r in rows)
    else:
        found["answers"] = sum(int(r.get("answers") or 0) for r in rows)
        found["failed_answers"] = sum(int(r.get("failed_answers") or 0) for r in rows)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", default="all", choices=["speed", "software", "debate", "werewolf", "all"])
    parser.add_argument("--models", default=",".join(EMBEDDED))
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("evals/models"))
    parser.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 instead of each suite's")
    args = parser.parse_args()
    parts = ["speed", "software", "debate", "werewolf"] if args.part == "all" else [args.part]
    for name in args.models.split(","):
        for which in parts:
            found = part(which, name, args.out, args.jobs, args.seeds)
            print(json.dumps({"model": name, "part": which, **found, "load_1min": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
