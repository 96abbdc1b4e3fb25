"""The feed at scale, and OASIS's spread and herd-effect experiments offline.

    python bench/feed.py scale [--users 1000000] [--rounds 10] [--activation 0.025] [--shards 2]
    python bench/feed.py scale --users 10000000 --shards 0          # ten million users, one process
    python bench/feed.py idle [--agents 200000]
    python bench/feed.py spread [--agents 10000] [--rounds 30] [--seeds 3]
    python bench/feed.py llm-scale [--users 1000000] [--rounds 10] [--archetypes 8] [--promoted 4]

Prints JSON.

``scale``: ``metaroles run feed`` as a user types it (its run directory written), once in one process
and once on ``--shards`` Ray shards; every activated user asks the test model (``llm_share=1``). Wall
time, CPU (user + system) and the peak resident memory of each process (``VmHWM`` of the command
and of every process under it: the Ray shards are), sampled until it ends. ``--shards 0``: one process only.

``idle``: the memory of a user that has not acted, hired as the feed hires its users (a cast with
``names``: not built until something reaches it): the process's resident memory with ``--agents``
users hired, less without, over their number; and of a user once built (each one reached).

``llm-scale``: every activated user model-guided with the embedded default model (``--llm local``), in
one process, through archetypes (``--archetypes`` k-means archetypes of the personas, one call each a
round; the ``--promoted`` most followed users ask alone): wall time, CPU and peak memory as ``scale``
measures them, the model calls each round (``metrics.jsonl``), and the users that acted. Goal (issue
77): 1,000,000 users × 10 rounds ≤ 15 min wall and ≤ 4 GiB on 2 cores.

``spread``: 10,000 scripted users (no model), OASIS's two setups at once: a post by the most
followed user, whose cascade (size, depth, breadth, users reached) is reported round by round; and
the herd effect, five posts by unremarkable users seeded with 5 likes, five with 5 dislikes, five
with neither (the same text and a neutral stance), whose later net votes are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import anyio

CLOCK = os.sysconf("SC_CLK_TCK")


def _pids() -> set[int]:
    return {int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()}


def _descendants(root: int, before: set[int]) -> list[int]:
    """``root`` and every process under it, and every Ray worker started since (``before``: the pids then)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, parent in parents.items() if parent in frontier]
        found += frontier
    for pid in set(parents) - before - set(found):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::"):
                found.append(pid)
        except OSError:
            continue
    return found


def _sample(pid: int) -> tuple[int, float, str] | None:
    """(peak KiB, CPU seconds, name) of a process, if it is still there."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    peak = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)
    name = next((line.split(None, 1)[1] for line in status.splitlines() if line.startswith("Name:")), "?")
    return peak, (int(stat[11]) + int(stat[12])) / CLOCK, name


def measured(args: list[str]) -> dict[str, Any]:
    """Run ``metaroles ARGS``; its wall time, and the peak memory and CPU of it and every process under it."""
    before, used = _pids(), resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "metaroles", *args], stderr=subprocess.PIPE, text=True)
    seen: dict[int, tuple[int, float, str]] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.25):
            for pid in _descendants(process.pid, before):
                got = _sample(pid)
                if got is not None:
                    seen[pid] = got

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    _, stderr = process.communicate()
    wall = time.perf_counter() - start
    done.set()
    watcher.join()
    if process.returncode != 0:
        raise SystemExit(f"metaroles {' '.join(args)} failed: {stderr[-2000:]}")
    heavy = sorted(((peak, cpu, name) for peak, cpu, name in seen.values() if peak > 200_000), reverse=True)
    own = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "wall_s": round(wall, 1),
        "cpu_s_command": round(own.ru_utime + own.ru_stime - used.ru_utime - used.ru_stime, 1),
        "cpu_s_all_sampled": round(sum(cpu for _, cpu, _ in seen.values()), 1),
        "peak_mib_by_process": [
            {"name": name, "peak_mib": round(peak / 1024), "cpu_s": round(cpu, 1)} for peak, cpu, name in heavy
        ],
    }


def scale(agents: int, rounds: int, activation: float, shards: int) -> dict[str, Any]:
    """One process, then ``shards`` Ray shards, each writing its run directory."""
    sets = ["--set", f"agents={agents}", "--set", f"activation={activation}", "--set", "llm_share=1"]
    report: dict[str, Any] = {"agents": agents, "rounds": rounds, "activation": activation, "load": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as folder:
        runs: list[tuple[str, list[str]]] = [("one_process", [])]
        if shards:
            runs.append((f"ray_{shards}_shards", ["--backend", "ray", "--shards", str(shards)]))
        for label, extra in runs:
            out = Path(folder) / label
            args = [
                "run",
                "feed",
                "--llm",
                "test",
                "--seed",
                "1",
                *sets,
                "--rounds",
                str(rounds),
                "--out",
                str(out),
                "-q",
            ]
            report[label] = measured([*args, *extra])
            rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            report[label]["activated_per_round"] = round(statistics.fmean(r["activated"] for r in rows[1:]))
            report[label]["model_calls"] = sum(r.get("llm", {}).get("calls", 0) for r in rows)
            report[label]["run_dir_mb"] = round(sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 1e6)
            if label != "one_process":
                report["same_metrics"] = (out / "metrics.jsonl").read_bytes() == (
                    Path(folder) / "one_process" / "metrics.jsonl"
                ).read_bytes()
    return report


def llm_scale(agents: int, rounds: int, activation: float, archetypes: int, promoted: int) -> dict[str, Any]:
    """The feed with every activated user guided by the embedded model through archetypes, in one process."""
    sets = {"agents": agents, "activation": activation, "archetypes": archetypes, "promoted": promoted}
    report: dict[str, Any] = {**sets, "rounds": rounds, "load": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "run"
        args = ["run", "feed", "--llm", "local", "--seed", "1", "--rounds", str(rounds), "--out", str(out), "-q"]
        report |= measured([*args, *(a for k, v in sets.items() for a in ("--set", f"{k}={v}"))])
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        report["calls_per_round"] = [r.get("llm", {}).get("calls", 0) for r in rows]
        report["acted_per_round"] = [sum(r.get(kind, 0) for kind in ACTIONS) for r in rows]
        ledger = json.loads((out / "ledger.json").read_text())
        report["model_calls"] = len(ledger)
        report["archetype_calls"] = sum(1 for e in ledger if e["role"].startswith("archetype "))
        report["completion_tokens"] = sum(e["completion_tokens"] for e in ledger)
        report["run_dir_mb"] = round(sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 1e6)
    return report


ACTIONS = ("post", "reply", "repost", "like", "dislike", "follow", "nothing")


def _rss_kib() -> int:
    return next(
        int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmRSS:")
    )


def idle(agents: int) -> dict[str, Any]:
    """Bytes per idle user hired as the feed hires them (a cast with names: built when touched), then per user built."""
    import gc

    from metaroles.scenarios.feed import Agents, Config, Personas

    from metaroles import Cast, Team, TestLLM

    config = Config(agents=agents)
    gc.collect()
    before = _rss_kib()
    team = Team(llm=TestLLM())
    team.hire(Cast(agents, Agents(config, Personas(config)), names="u{}"))
    gc.collect()
    hired = _rss_kib()
    for _ in team.env.members:  # each one reached: built where it is
        pass
    gc.collect()
    built = _rss_kib()
    return {
        "agents": len(team.env.members),
        "idle_agent_bytes": round((hired - before) * 1024 / agents),
        "built_agent_bytes": round((built - before) * 1024 / agents),
    }


SPREAD_POST = "Breaking: the council votes on the car ban tonight. Share if you care."
HERD_TEXT = "What do people here think about the new bus lanes on Main Street?"


async def spread(agents: int, rounds: int, seed: int) -> dict[str, Any]:
    """One run of both setups; the seeded post's cascade by round and the herd posts' net votes."""
    from metaroles import TestLLM
    from metaroles.project.scenario import run_scenario
    from metaroles.team.options import RunOptions

    herd = [(5, 0), (0, 5), (0, 0)]
    posts = [{"text": SPREAD_POST, "author": 0, "stance": 0.6}]
    for group, (likes, dislikes) in enumerate(herd):
        for k in range(5):
            author = agents // 2 + 10 * group + k
            posts.append({"text": HERD_TEXT, "author": author, "stance": 0.0, "likes": likes, "dislikes": dislikes})
    options = {"agents": agents, "rounds": rounds, "activation": 0.1, "seed_posts": posts}
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "run"
        await run_scenario("feed", llm=TestLLM(), options=options, out_dir=out, run=RunOptions(seed=seed))
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    spread_by_round = [{k: row["tracked"]["0"][k] for k in ("size", "depth", "breadth", "reach")} for row in rows[1:]]
    last = rows[-1]["tracked"]
    net = {}
    for group, name in enumerate(("up", "down", "none")):
        roots = [str(1 + 5 * group + k) for k in range(5)]
        likes, dislikes = herd[group]
        net[name] = statistics.fmean(last[r]["likes"] - likes - (last[r]["dislikes"] - dislikes) for r in roots)
    return {
        "spread": spread_by_round,
        "later_net_votes": net,
        "polarization": [rows[1]["polarization"], rows[-1]["polarization"]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["scale", "idle", "spread", "llm-scale"])
    parser.add_argument("--agents", "--users", type=int, dest="agents", help="users (scale: 1,000,000; idle: 200,000)")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--activation", type=float, default=0.025)
    parser.add_argument("--shards", type=int, default=2, help="scale: Ray shards of the second run (0: none)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--archetypes", type=int, default=8, help="llm-scale: archetypes (one call each a round)")
    parser.add_argument("--promoted", type=int, default=4, help="llm-scale: most followed users asking alone")
    args = parser.parse_args()
    if args.what == "llm-scale":
        report = llm_scale(args.agents or 1_000_000, args.rounds or 10, args.activation, args.archetypes, args.promoted)
    elif args.what == "scale":
        report = scale(args.agents or 1_000_000, args.rounds or 10, args.activation, args.shards)
    elif args.what == "idle":
        report = idle(args.agents or 200_000)
    else:
        runs = [anyio.run(spread, args.agents or 10_000, args.rounds or 30, seed) for seed in range(args.seeds)]
        report = {
            "agents": args.agents or 10_000,
            "runs": runs,
            "mean_later_net_votes": {
                group: round(statistics.fmean(run["later_net_votes"][group] for run in runs), 2)
                for group in ("up", "none", "down")
            },
        }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
