"""Sweep throughput: 40 short debate runs, sequential vs the local backend with 2 jobs.

    python bench/sweep.py [--trials 40] [--jobs 2]

Prints JSON: wall time of each, and the speed-up. Each trial writes its whole run directory
(event log, checkpoints, transcript, state), as a researcher's sweep does.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from metaroles.runs.sweep import run_sweep


def timed(trials: int, jobs: int, out: Path) -> float:
    start = time.perf_counter()
    rows = run_sweep("debate", {"seed": list(range(trials))}, out, jobs=jobs)
    assert all(row["status"] == "done" for row in rows)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        sequential = timed(args.trials, 1, Path(folder) / "one")
        parallel = timed(args.trials, args.jobs, Path(folder) / "many")
    print(
        json.dumps(
            {
                "trials": args.trials,
                "sequential_s": round(sequential, 2),
                f"jobs_{args.jobs}_s": round(parallel, 2),
                "speedup": round(sequential / parallel, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
