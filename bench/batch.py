"""A round as one batch: a society's round of model calls through ``metaroles serve``'s Batch API.

    python bench/batch.py [--agents 1000] [--model smollm2-135m-instruct-q4_1] [--slots 32]

Prints JSON, a line per figure. ``metaroles serve`` runs the embedded model (``--model``: its name or a
GGUF file); a society of ``--agents`` agents, every one model-backed, runs one round against it twice,
each its own ``metaroles run`` process: with ``--batch`` (the round's calls as one batch: a file
uploaded, the batch created, asked after until it ends) and call by call (as many in flight as the
client learns the server takes). Figures: each run's wall time, the calls, the batches the server
made and their lines, and how many answers the two runs heard differently (calls and event-log lines;
``--again``: call by call a second time, the engine against itself).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def emit(figure: str, value: object, unit: str, **params: object) -> None:
    print(json.dumps({"figure": figure, "value": value, "unit": unit, "params": params}), flush=True)


def differing_calls(a: Path, b: Path) -> int:
    """How many calls two runs heard answered differently (their tokens; the prompt tokens a server took
    from its cache left out: they depend on what it served before), and the event logs' differing lines."""

    def calls(run: Path) -> list[dict[str, object]]:
        ledger = json.loads((run / "ledger.json").read_text())
        return [{k: v for k, v in entry.items() if k != "cached_tokens"} for entry in ledger]

    events = [(run / "events.jsonl").read_text().splitlines() for run in (a, b)]
    lines = sum(x != y for x, y in zip(*events, strict=False)) + abs(len(events[0]) - len(events[1]))
    return sum(x != y for x, y in zip(calls(a), calls(b), strict=False)) + lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--model", default="smollm2-135m-instruct-q4_1", help="an embedded model, or a GGUF file")
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--again", action="store_true", help="ask call by call twice: the engine against itself")
    args = parser.parse_args()
    serve = [sys.executable, "-m", "metaroles", "serve", "--port", "0", "--slots", str(args.slots),
             "--model-path", args.model, "--max-tokens", "32"]  # fmt: skip
    server = subprocess.Popen(serve, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if not line.startswith("serving "):
            raise SystemExit(f"metaroles serve did not start: {server.stderr.read() if server.stderr else line}")
        url = line.split(" at ")[1].split()[0]
        with tempfile.TemporaryDirectory() as tmp:
            runs = {kind: Path(tmp) / kind for kind in ("batched", "asked", "again")}
            sets = ["--set", f"agents={args.agents}", "--set", f"llm_agents={args.agents}", "--rounds", "1"]
            common = ["run", "society", *sets, "--llm", "openai", "--base-url", url, "--model", args.model,
                      "--seed", "1", "-q", "--timeout", "3600"]  # fmt: skip
            params = {"agents": args.agents, "model": args.model, "slots": args.slots}
            for kind, extra in (("batched", ["--batch"]), ("asked", []), *((("again", []),) if args.again else ())):
                started = time.perf_counter()
                subprocess.run([sys.executable, "-m", "metaroles", *common, *extra, "--out", str(runs[kind])],
                               check=True, capture_output=True)  # fmt: skip
                emit(f"{kind}_round_s", round(time.perf_counter() - started, 1), "s", **params)
            calls = len(json.loads((runs["batched"] / "ledger.json").read_text()))
            batches = json.loads(urllib.request.urlopen(url + "/batches").read())["data"]
            emit("batch_calls", calls, "calls", **params)
            emit("batches", len(batches), "batches", lines=[b["request_counts"] for b in batches], **params)
            emit("batched_vs_asked_differing", differing_calls(runs["batched"], runs["asked"]), "calls+lines", **params)
            if args.again:
                emit("asked_vs_asked_differing", differing_calls(runs["asked"], runs["again"]), "calls+lines", **params)
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
