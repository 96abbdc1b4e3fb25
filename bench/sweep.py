"""Sweep throughput: 40 short debate runs, sequential vs the local backend with 2 jobs.

    python bench/sweep.py [--trials 40] [--jobs 2] [--repeats 3] [--durability sweep|run|round]

Prints JSON: wall time of each, and the speed-up. Each trial writes its whole run directory
(event log, checkpoints, transcript, state), as a researcher's sweep does, and waits for the disk
as a sweep does by default: the sweep syncs its ended trials together (``--durability run``: each
trial at its end; ``round``: after each checkpoint). A sweep of 40 short runs lasts a second or
two, and this machine's speed drifts by a third from one minute to the next: the two are timed in
turn ``--repeats`` times, and the speed-up is the median of the pairs'.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from metaroles.project.sweep import run_sweep


def timed(trials: int, jobs: int, out: Path, durability: str) -> float:
    start = time.perf_counter()
    rows = run_sweep("debate", {"seed": list(range(trials))}, out, jobs=jobs, durability=durability)
    assert all(row["status"] == "done" for row in rows)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--durability", choices=["sweep", "run", "round"], default="sweep")
    args = parser.parse_args()
    pairs = []
    with tempfile.TemporaryDirectory() as folder:
        for n in range(args.repeats):
            sequential = timed(args.trials, 1, Path(folder) / f"one-{n}", args.durability)
            parallel = timed(args.trials, args.jobs, Path(folder) / f"many-{n}", args.durability)
            pairs.append((round(sequential, 2), round(parallel, 2), round(sequential / parallel, 2)))
    print(
        json.dumps(
            {
                "trials": args.trials,
                "durability": args.durability,
                "sequential_s": statistics.median(p[0] for p in pairs),
                f"jobs_{args.jobs}_s": statistics.median(p[1] for p in pairs),
                "speedup": statistics.median(p[2] for p in pairs),
                "pairs": pairs,
            }
        )
    )


if __name__ == "__main__":
    main()
