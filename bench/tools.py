"""What the framework adds to an MCP tool call: metaroles' MCPClient against a bare SDK client, same server, same calls.

Both call the same tools of one real MCP server over stdio (``tests/mcp_notes.py``: the official
SDK's server), ``--calls`` times each way, the ways interleaved in ``--rounds`` blocks: the bare
``mcp.ClientSession.call_tool`` and the framework's call as an agent makes it
(``ToolCollection.execute``: the arguments checked against the tool's schema, the timeout, the
result made an observation). ``ratio`` is the framework's median time per call over the bare
client's; ``recorded_ratio`` is the same with every call written to a ``ToolCassette`` (appended to the
disk and flushed, as a recording run does). Each way has its own server process.

Run: ``python bench/tools.py`` (needs the ``tools`` extra: ``make test`` installs it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from metaroles.agents.mcp import MCPClient, MCPServer, ToolCassette
from metaroles.agents.tool import ToolCollection

SERVER = [sys.executable, str(Path(__file__).resolve().parents[1] / "tests" / "mcp_notes.py")]
CALLS = [("add", {"a": 2, "b": 3}), ("shout", {"text": "a storm is coming"})]


async def bare(calls: int, quiet: TextIO) -> list[float]:
    """Seconds per call of the SDK's own client (the server's log to ``quiet``)."""
    params = StdioServerParameters(command=SERVER[0], args=SERVER[1:])
    times = []
    async with stdio_client(params, errlog=quiet) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await session.list_tools()
        for n in range(calls):
            tool, arguments = CALLS[n % len(CALLS)]
            started = time.perf_counter()
            await session.call_tool(tool, arguments)
            times.append(time.perf_counter() - started)
    return times


async def framework(calls: int, cassette: Path | None) -> list[float]:
    """Seconds per call as an agent makes it through metaroles (optionally recorded)."""
    times = []
    recording = ToolCassette(cassette, "record") if cassette is not None else None
    async with MCPClient([MCPServer(name="notes", command=SERVER)], cassette=recording) as client:
        tools = ToolCollection(*client.tools)
        for n in range(calls):
            tool, arguments = CALLS[n % len(CALLS)]
            started = time.perf_counter()
            result = await tools.execute(name=f"notes__{tool}", tool_input=arguments)
            times.append(time.perf_counter() - started)
            assert not result.error, result
    return times


async def measure(calls: int, rounds: int, quiet: TextIO) -> dict:
    ways: dict[str, list[float]] = {"bare": [], "framework": [], "recorded": []}
    with tempfile.TemporaryDirectory(prefix="metaroles-tools-bench-") as folder:
        for n in range(rounds):
            ways["bare"] += await bare(calls, quiet)
            ways["framework"] += await framework(calls, None)
            ways["recorded"] += await framework(calls, Path(folder) / f"tools-{n}.jsonl")
    median = {name: statistics.median(times) for name, times in ways.items()}
    return {
        "calls_per_way": calls * rounds,
        **{f"{name}_us_per_call": round(1e6 * seconds, 1) for name, seconds in median.items()},
        "ratio": round(median["framework"] / median["bare"], 3),
        "recorded_ratio": round(median["recorded"] / median["bare"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    figures = {"load_before": round(os.getloadavg()[0], 2)}
    with open(os.devnull, "w") as quiet:
        figures |= anyio.run(measure, args.calls, args.rounds, quiet)
    figures["load_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
