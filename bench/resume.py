"""Resume time against agent count: the restore of a society's checkpoint, one-process and sharded.

    python bench/resume.py [--agents 1000,10000,100000] [--rounds 4] [--shards 2] [--skip-sharded]

For each count, the society runs ``--rounds`` rounds into a run directory (in one process, and on
``--shards`` Ray shards, whose checkpoints keep each shard's roles in its part), then a fresh
process rebuilds the plan and restores the last checkpoint in one process, as ``metaroles resume
DIR --backend process`` does. Prints a JSON line per run: ``restore_s`` (wall) and
``restore_cpu_s`` of the restore alone, ``build_s`` of the plan it restores into, and the ratio
of the restore to the agents (µs per agent): flat when the restore is O(state).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from metaroles import TestLLM
from metaroles.project.registry import load_scenario
from metaroles.project.scenario import run_scenario
from metaroles.record.restore import restore_checkpoint
from metaroles.team.options import RunOptions


def _run(agents: int, rounds: int, out: Path, shards: int) -> None:
    backend = None
    if shards:
        from metaroles.sharding.ray import RayBackend

        backend = RayBackend(shards)
    options = {"agents": agents, "rounds": rounds}
    run = RunOptions(seed=1, backend=backend, transcript=False, log_turns=False)
    anyio.run(lambda: run_scenario("society", llm=TestLLM(1), options=options, out_dir=out, run=run))


def _restore(out: Path, agents: int, rounds: int) -> dict[str, Any]:
    """In a fresh process: build the plan as a resume does, then restore the last checkpoint into it."""
    module = load_scenario("society")
    start = time.perf_counter()
    plan = module.build(module.Config(agents=agents, rounds=rounds), TestLLM(1))
    built = time.perf_counter()
    cpu = time.process_time()
    restored = restore_checkpoint(out / "checkpoints", plan.team.env)
    return {
        "build_s": round(built - start, 3),
        "restore_s": round(time.perf_counter() - built, 3),
        "restore_cpu_s": round(time.process_time() - cpu, 3),
        "round": restored.round,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", default="1000,10000,100000")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--skip-sharded", action="store_true")
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    for agents in [int(a) for a in args.agents.split(",")]:
        for shards in [0] if args.skip_sharded else [0, args.shards]:
            with tempfile.TemporaryDirectory() as folder:
                out = Path(folder) / "run"
                with context.Pool(1) as pool:  # each run in a process of its own (Ray's session goes with it)
                    pool.apply(_run, (agents, args.rounds, out, shards))
                with context.Pool(1) as pool:
                    figures = pool.apply(_restore, (out, agents, args.rounds))
            per_agent = figures["restore_cpu_s"] / agents * 1e6
            line = {"figure": "resume_restore", "agents": agents, "checkpoint_of": "sharded" if shards else "process"}
            print(json.dumps({**line, **figures, "restore_us_per_agent": round(per_agent, 1)}), flush=True)


if __name__ == "__main__":
    main()
