"""PythonExecute start-up: seconds per call of ``print(1)`` under each isolation, and a bare interpreter.

One JSON line per figure, median of 20 calls after a warm-up. Run: ``python bench/sandbox.py``.
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

CALLS = 20


async def per_call(run) -> float:  # type: ignore[no-untyped-def]
    await run()
    values = []
    for _ in range(CALLS):
        start = time.perf_counter()
        await run()
        values.append(time.perf_counter() - start)
    return statistics.median(values)


async def main() -> None:
    async def bare() -> None:
        await anyio.run_process([sys.executable, "-I", "-c", "print(1)"])

    figures = {"python_bare": await per_call(bare)}
    kinds = ["bubblewrap", "guard"] if isolation.bubblewrap() else ["guard"]
    for kind in kinds:
        tool = PythonExecute(workdir=tempfile.mkdtemp(), isolation=kind)

        async def call(tool: PythonExecute = tool) -> None:
            assert (await tool(code="print(1)")).output == "1\n"

        figures[f"python_execute_{kind}"] = await per_call(call)
    for name, seconds in figures.items():
        line = {"figure": name, "value": round(seconds * 1000, 2), "unit": "ms/call", "params": {"calls": CALLS}}
        if name != "python_bare":
            line["overhead_ms"] = round((seconds - figures["python_bare"]) * 1000, 2)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    anyio.run(main)
