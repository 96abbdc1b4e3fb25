"""A message's own operations against another checkout of metaroles and against AgentScope, in one sitting.

``Message.load`` (its dump read back), ``model_dump`` and ``==`` (two copies of one message), in
microseconds per call, the best of 7 repeats, for each side in its own process, the sides
alternated ``--rounds`` times (the machine is noisy: compare medians). Sides: this checkout;
``--before PATH``, another checkout (the previous release: ``git worktree add /tmp/before REV``);
``--agentscope PYTHON``, an interpreter with ``agentscope`` installed (its ``Msg``). Prints one JSON
line per side and round, then the medians::

    python bench/messages.py --before /tmp/before --agentscope /tmp/asv/bin/python
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CALLS = 40_000

METAROLES = """
import json, sys, timeit
sys.path.insert(0, sys.argv[1])
from metaroles import Message
m = Message("hello world, a message on the bus", sent_from="Alice", send_to={"Bob"}, cause_by="pkg.WriteCode")
text = m.dump()
m2 = Message.load(text)
ops = {"load": lambda: Message.load(text), "model_dump": m.model_dump, "eq": lambda: m == m2}
print(json.dumps({k: min(timeit.repeat(f, number=int(sys.argv[2]), repeat=7)) / int(sys.argv[2]) * 1e6
                  for k, f in ops.items()}))
"""

AGENTSCOPE = """
import json, sys, timeit
from agentscope.message import Msg, TextBlock
m = Msg(name="Alice", content=[TextBlock(type="text", text="hello world, a message on the bus")], role="assistant")
text = m.model_dump_json()
m2 = Msg.model_validate_json(text)
ops = {"load": lambda: Msg.model_validate_json(text), "model_dump": m.model_dump, "eq": lambda: m == m2}
print(json.dumps({k: min(timeit.repeat(f, number=int(sys.argv[2]), repeat=7)) / int(sys.argv[2]) * 1e6
                  for k, f in ops.items()}))
"""


def measure(python: str, code: str, path: str) -> dict[str, float]:
    done = subprocess.run([python, "-c", code, path, str(CALLS)], capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="another checkout of metaroles (its root folder)")
    parser.add_argument("--agentscope", help="a Python interpreter with agentscope installed")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sides = {"this": (sys.executable, METAROLES, str(Path(__file__).resolve().parents[1]))}
    if args.before:
        sides["before"] = (sys.executable, METAROLES, str(Path(args.before).resolve()))
    if args.agentscope:
        sides["agentscope"] = (args.agentscope, AGENTSCOPE, "")
    found: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for round_ in range(args.rounds):
        for side, (python, code, path) in sides.items():
            found[side].append(measure(python, code, path))
            print(json.dumps({"side": side, "round": round_, "us_per_call": found[side][-1]}))
    for side, rows in found.items():
        medians = {op: round(statistics.median(row[op] for row in rows), 3) for op in rows[0]}
        print(json.dumps({"side": side, "median_us_per_call": medians}))


if __name__ == "__main__":
    main()
