"""How long the ``metaroles`` command takes to answer: ``--help``, and ``show``/``diff``/``graph`` of a small run.

    python bench/cli.py [--repeat 7]

Each command runs in a fresh process (as a user types it); the figure is the median wall time.
The run read is a 9-message debate made first with the offline test model. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(args: list[str], repeat: int) -> float:
    """The median wall time of ``metaroles ARGS`` over ``repeat`` fresh processes (seconds)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "metaroles", *args], capture_output=True, check=True)
        times.append(time.perf_counter() - started)
    return round(statistics.median(times), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    repeat = parser.parse_args().repeat
    with tempfile.TemporaryDirectory() as folder:
        run = Path(folder) / "debate"
        made = ["run", "debate", "--llm", "test", "--set", "turns=1", "--seed", "1", "--out", str(run), "-q"]
        subprocess.run([sys.executable, "-m", "metaroles", *made], capture_output=True, check=True)
        figures = {
            "help_s": timed(["--help"], repeat),
            "show_s": timed(["show", str(run)], repeat),
            "diff_s": timed(["diff", str(run), str(run)], repeat),
            "graph_mermaid_s": timed(["graph", str(run), "--format", "mermaid"], repeat),
        }
    print(json.dumps({**figures, "repeat": repeat, "load_1min": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
