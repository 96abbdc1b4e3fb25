"""What the run's event log and per-round checkpoints cost on the ring (R=1000, K=10).

Prints one JSON line per mode (off; the event log; an incremental checkpoint each round; both),
median of 3 after a warm-up. Run: ``python bench/runlog.py``.
"""

from __future__ import annotations

import gc
import json
import statistics
import tempfile
import time
from pathlib import Path

import anyio
from bus import ring_env

from metaroles.checkpoint import CheckpointWriter
from metaroles.eventlog import EventLog

ROLES, ROUNDS = 1000, 10


async def run(mode: str) -> float:
    env = ring_env(ROLES)
    folder = Path(tempfile.mkdtemp())
    log = EventLog(folder / "events.jsonl", env) if "log" in mode else None
    checkpoints = CheckpointWriter(folder / "checkpoints") if "checkpoint" in mode else None
    start = time.perf_counter()
    for _ in range(ROUNDS):
        await env.run_round()
        if log is not None:
            log.round_done()
        if checkpoints is not None:
            checkpoints.write(env)
    return ROLES * ROUNDS / (time.perf_counter() - start)


async def main() -> None:
    baseline = 0.0
    for mode in ("off", "log", "checkpoint", "log+checkpoint"):
        await run(mode)
        values = []
        for _ in range(3):
            gc.collect()
            values.append(await run(mode))
        value = statistics.median(values)
        baseline = baseline or value
        line = {
            "figure": f"ring_{mode}",
            "value": round(value),
            "unit": "msgs/s",
            "slowdown": round(1 - value / baseline, 3),
        }
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    anyio.run(main)
