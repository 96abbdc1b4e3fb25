"""PythonExecute start-up: seconds per call of ``print(1)`` under each isolation, and a bare interpreter.

One JSON line per figure, median of 30 calls after a warm-up, interleaved; the overhead is the
median of each call's difference to the bare interpreter timed next to it. Run: ``python bench/sandbox.py``.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time

import anyio

from metaroles.agents import isolation
from metaroles.agents.sandbox import PythonExecute

CALLS = 30


async def main() -> None:
    """Each round times a bare interpreter and every isolation back to back (the machine drifts)."""

    async def bare() -> None:
        await anyio.run_process([sys.executable, "-I", "-c", "print(1)"])

    runners = {"python_bare": bare}
    for kind in ["bubblewrap", "unsafe-guard"] if isolation.bubblewrap() else ["unsafe-guard"]:
        tool = PythonExecute(workdir=tempfile.mkdtemp(), isolation=kind)

        async def call(tool: PythonExecute = tool) -> None:
            assert (await tool(code="print(1)")).output == "1\n"

        runners[f"python_execute_{kind}"] = call
    times: dict[str, list[float]] = {name: [] for name in runners}
    for round_no in range(CALLS + 1):
        for name, run in runners.items():
            start = time.perf_counter()
            await run()
            if round_no:  # the first round warms up
                times[name].append(time.perf_counter() - start)
    for name, values in times.items():
        line: dict[str, object] = {"figure": name, "value": round(statistics.median(values) * 1000, 2)}
        line |= {"unit": "ms/call", "params": {"calls": CALLS}}
        if name != "python_bare":
            extra = [v - b for v, b in zip(values, times["python_bare"], strict=True)]
            line["overhead_ms"] = round(statistics.median(extra) * 1000, 2)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    anyio.run(main)
