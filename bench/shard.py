"""Sharded society vs one process: wall time, peak memory per process, bytes crossing shards per round.

    python bench/shard.py [--agents 100000] [--rounds 10] [--shards 2] [--idle 10000] [--with-run-dir-only]
                          [--floor-only]

Prints JSON. The society is rule-based (no model calls) and writes no run directory: this times
the bus, the start (the society hires its agents as a ``Cast``: each shard builds its own) and the
driver's merge, not the disk (``with_run_dir`` times the same run as ``metaroles run`` makes it,
run directory and all). ``idle_round_ms`` is the driver's cost of a round in which 10,000 agents on
2 shards have nothing to do but one does. ``parts_at_once`` is the floor of any split on this
machine: the society cut into K separate societies run at once in K processes (nothing crosses, no
driver), against which the sharded run's rounds, start and return can be weighed; ``parts_shipping``
the floor of this design: the same parts, each sending its rounds' messages to a driver that keeps
the history, lock-step (still nothing crosses between them, no start, no return).

``rounds_cpu_s`` is the CPU each process of the sharded run used in its rounds (the shards' and the
driver's, from ``/proc``), and ``rounds_cpu_ratio`` their sum against the one-process run's CPU: a
run K× faster on C cores may use at most C / K times one process's CPU (2 / 1.6 = 1.25 for the
issue's goal on two cores), and only with every core busy throughout.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import pickle
import resource
import tempfile
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from metaroles import Environment, LocalBackend, RayBackend, TestLLM
from metaroles.core.heap import paused_gc
from metaroles.project.registry import load_scenario
from metaroles.project.scenario import run_scenario
from metaroles.sharding.backends import LocalShards
from metaroles.sharding.crossing import OutboxReader, OutboxWriter
from metaroles.sharding.driver import ShardedRun
from metaroles.sharding.merging import take_in
from metaroles.sharding.ray import RayShards, ensure_ray
from metaroles.sharding.shardset import RoundResult, RunRound
from metaroles.team.options import RunOptions


def plan(agents: int, rounds: int) -> Any:
    module = load_scenario("society")
    built = module.build(module.Config(agents=agents, rounds=rounds - 1), TestLLM())
    built.team.metric_parts = list(module.METRIC_PARTS)
    built.team.shard_by = module.shard_by  # neighbours on one shard, as `metaroles run` places them
    return built


def cpu_s(pid: int) -> float:
    """CPU-seconds (user + system) process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main_thread_cpu_s() -> float:
    """CPU-seconds this process's main thread (metaroles' own code) has used; the rest is Ray's threads."""
    return time.thread_time()


def peak_kib(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


async def one_process(agents: int, rounds: int) -> dict[str, Any]:
    built = plan(agents, rounds)
    start, cpu = time.perf_counter(), time.process_time()
    await built.team.run(n_round=rounds, idea=built.idea)
    return {
        "wall_s": round(time.perf_counter() - start, 2),
        "cpu_s": round(time.process_time() - cpu, 2),
        "messages": len(built.team.env.history),
    }


def _part(agents: int, rounds: int, start: Any, walls: Any, ship: Any = None) -> None:
    """One of :func:`parts_at_once`'s processes: a society of ``agents`` built, then run once all are built.

    With ``ship`` (a pipe's end), each round's new messages go down it as a shard's outbox goes to the driver.
    """
    built = plan(agents, rounds)
    if ship is not None:
        writer, seen = OutboxWriter(), [len(built.team.env.history)]

        def shipped(team: Any) -> None:
            history = team.env.history.storage
            outbox, seen[0] = history[seen[0] :], len(history)
            ship.send_bytes(pickle.dumps(writer.columns([(n, m, 0) for n, m in enumerate(outbox)]), 5))

        built.team.on_round = shipped
    start.wait()
    began = time.perf_counter()
    anyio.run(partial(built.team.run, n_round=rounds, idea=built.idea))
    walls.put(time.perf_counter() - began)
    if ship is not None:
        ship.send_bytes(b"")


def parts_at_once(agents: int, rounds: int, shards: int, *, ship: bool = False) -> float:
    """The floor of any ``shards``-way split on this machine: ``shards`` separate societies of ``agents / shards``.

    Each runs in its own fresh process, all at once (built first, outside the time, as
    :func:`one_process`), so nothing crosses between them and no driver merges anything: the
    time of the slowest is the least a sharded run's rounds can take here, before it starts its
    shards, carries the messages that cross, keeps the history and brings the roles back.

    ``ship``: the floor of this design, where the driver keeps the history: each part also sends
    each round's messages as a shard sends its outbox (columns), and this process, the driver,
    takes them into a history as a sharded run does — still with nothing crossing between the
    parts, no start and no return. A part's round waits for the driver to read the last one (a
    pipe holds less than a round): the rounds are lock-step, as a sharded run's are. The time is
    until the slowest part ends and all is taken in.
    """
    context = multiprocessing.get_context("spawn")
    start, walls = context.Barrier(shards + 1), context.Queue()
    pipes = [context.Pipe(duplex=False) if ship else (None, None) for _ in range(shards)]
    workers = [
        context.Process(target=_part, args=(agents // shards, rounds, start, walls, pipes[n][1])) for n in range(shards)
    ]
    for worker in workers:
        worker.start()
    start.wait()
    began = time.perf_counter()
    if ship:
        _take_in([receive for receive, _ in pipes])
    taken = time.perf_counter() - began
    slowest = max(walls.get() for _ in workers)
    for worker in workers:
        worker.join()
    return round(max(slowest, taken), 2)


def _take_in(pipes: list[Any]) -> None:
    """The driver's side of ``parts_at_once(ship=True)``: each part's rounds into one history, in turn."""
    driver, readers = Environment(), [OutboxReader() for _ in pipes]
    live = list(range(len(pipes)))
    try:
        while live:
            for n in list(live):
                data = pipes[n].recv_bytes()
                if not data:
                    live.remove(n)
                    continue
                with paused_gc():
                    outbox = readers[n].outbox(pickle.loads(data))
                take_in(driver, outbox)  # as ShardedRun.catch_up takes a round in
                gc.freeze()
    finally:  # the runs timed after this one in this process settle their heaps only if nobody froze it
        del driver
        gc.unfreeze()
        gc.collect()


async def sharded(agents: int, rounds: int, shards: int) -> dict[str, Any]:
    built = plan(agents, rounds)
    backend = RayBackend(shards)
    phases: dict[str, float] = {}
    peaks: list[int] = []
    cpu_at_start: dict[int, float] = {}  # pid → CPU-seconds when the rounds began: this process's, then each shard's
    rounds_cpu: list[float] = []  # CPU-seconds in the rounds, in the same order
    main_thread: list[float] = []  # the driver's main thread: at the start of the rounds, then in them
    opened, stepped, closed = ShardedRun.open, ShardedRun.run_round, ShardedRun.close

    async def open_(self: ShardedRun) -> None:
        t = time.perf_counter()
        await opened(self)
        phases["open_s"] = time.perf_counter() - t
        assert isinstance(self.shards, RayShards)
        cpu_at_start.update({pid: cpu_s(pid) for pid in (os.getpid(), *await self.shards.pids())})
        main_thread.append(main_thread_cpu_s())

    async def round_(self: ShardedRun) -> None:
        t = time.perf_counter()
        await stepped(self)
        phases["rounds_s"] = phases.get("rounds_s", 0.0) + time.perf_counter() - t

    async def close_(self: ShardedRun) -> None:
        assert isinstance(self.shards, RayShards)
        rounds_cpu.extend(cpu_s(pid) - began for pid, began in cpu_at_start.items())
        main_thread.append(main_thread_cpu_s() - main_thread[0])
        peaks.extend(peak_kib(pid) for pid in await self.shards.pids())
        t = time.perf_counter()
        await closed(self)
        phases["return_s"] = time.perf_counter() - t

    ShardedRun.open, ShardedRun.run_round, ShardedRun.close = open_, round_, close_  # type: ignore[method-assign]
    try:
        built.team.backend = backend
        start = time.perf_counter()
        await built.team.run(n_round=rounds, idea=built.idea)
        wall = time.perf_counter() - start
    finally:
        ShardedRun.open, ShardedRun.run_round, ShardedRun.close = opened, stepped, closed  # type: ignore[method-assign]
    return {
        "wall_s": round(wall, 2),
        **{k: round(v, 2) for k, v in phases.items()},
        "shard_peak_mib": [round(p / 1024) for p in peaks],
        "rounds_cpu_s": {
            "driver": round(rounds_cpu[0], 2),
            "driver_main_thread": round(main_thread[1], 2),
            "shards": [round(c, 2) for c in rounds_cpu[1:]],
        },
        "messages": len(built.team.env.history),
    }


async def with_run_dir(agents: int, rounds: int, shards: int) -> dict[str, Any]:
    """``metaroles run society`` as a user types it: one process vs K Ray shards, each writing its run directory.

    Building the society is timed in both (on shards each shard then builds its own agents again); at
    this size ``state.json`` names the last checkpoint, so the roles stay on their shards when the run ends.
    Each round settles the heap (``core.heap``: a run's session does it), in both runs.
    """
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        for label, backend in (("one_process_s", None), ("sharded_s", RayBackend(shards))):
            run_dir = Path(folder) / label
            start = time.perf_counter()
            await run_scenario(
                "society",
                llm=TestLLM(),
                options={"agents": agents, "rounds": rounds - 1},
                out_dir=run_dir,
                run=RunOptions(seed=0, backend=backend),
            )
            out[label] = round(time.perf_counter() - start, 2)
            gc.collect()
            out[label.replace("_s", "_mb")] = round(
                sum(f.stat().st_size for f in run_dir.rglob("*") if f.is_file()) / 1e6
            )
    out["speedup"] = round(out["one_process_s"] / out["sharded_s"], 2)
    return out


async def crossing_bytes(agents: int, rounds: int, shards: int) -> dict[str, Any]:
    """Bytes each round moves (pickled as Ray would), measured in-process: driver → shards, shards → driver, and
    between shards (the parts of one shard's outbox for another's roles, which never pass through the driver)."""
    built = plan(agents, rounds)
    down: list[int] = []
    up: list[int] = []
    taken: list[int] = []  # bytes of the outboxes the driver took in (each round, or as the run closed)
    across: list[int] = []
    original = LocalShards.send
    outboxes = [OutboxWriter() for _ in range(shards)]  # as a Ray shard sends its outbox: columns, recipients once

    def opened(shard: int, sealed: Any) -> Any:  # the outbox and news, when the driver takes them in
        outbox, news = sealed()
        taken.append(len(pickle.dumps((outboxes[shard].columns(outbox), news), 5)))
        return outbox, news

    def sent(shard: int, result: RoundResult) -> int:  # the result as it travels; its outbox only once taken in
        if result.sealed is not None:
            result.sealed = partial(opened, shard, result.sealed)
        return len(pickle.dumps(replace(result, outbox=[], news={}, sealed=None), 5))

    def send(self: LocalShards, requests: Any, broadcasts: Any) -> Any:
        rounds = [r for r in requests if isinstance(r, RunRound)]
        in_flight = original(self, requests, broadcasts)
        if any(requests) and not rounds:  # a checkpoint, a measure, the roles' return: not a round
            return in_flight
        down.append(
            sum(len(pickle.dumps(replace(r, delivery=replace(r.delivery, crossed=[])), 5)) for r in rounds)
            + len(pickle.dumps(broadcasts, 5))
        )

        class Measured:
            async def replies(_: Any) -> Any:
                results = await in_flight.replies()
                up.append(sum(sent(n, r.result) for n, r in enumerate(results) if r is not None))
                across.append(sum(len(h) for r in results if r is not None for h in r.outgoing if h is not None))
                return results

        return Measured()

    LocalShards.send = send  # type: ignore[method-assign]
    try:
        built.team.backend = LocalBackend(shards)
        await built.team.run(n_round=rounds, idea=built.idea)
    finally:
        LocalShards.send = original  # type: ignore[method-assign]
    messages = max(1, len(built.team.env.history))
    return {
        "driver_to_shards_per_round": round(sum(down) / len(down)),
        "shards_to_driver_per_round": round(sum(up) / len(up)),
        "through_driver_per_round": round((sum(down) + sum(up)) / len(up)),
        "outboxes_taken_in": sum(taken),
        "between_shards_per_round": round(sum(across) / len(across)),
        "bytes_per_message": round((sum(down) + sum(up) + sum(taken) + sum(across)) / messages),
    }


async def idle_round(agents: int, shards: int, repeats: int = 20) -> float:
    """The driver's round cost when the agents are idle (one message keeps the run going)."""
    from metaroles import Environment, Message, Role, Team

    team = Team(env=Environment(seed=0), backend=RayBackend(shards))
    team.hire(Role(name=f"a{i}") for i in range(agents))
    times: list[float] = []
    original = ShardedRun.run_round

    async def timed(self: ShardedRun) -> None:
        t = time.perf_counter()
        await original(self)
        times.append(time.perf_counter() - t)
        with self.env.id_scope():
            message = Message("ping", sent_from="Human", send_to={"a0"})
        self.env.publish_message(message)  # a0 answers nothing; it is ready again next round

    ShardedRun.run_round = timed  # type: ignore[method-assign]
    try:
        team.run_project("start", send_to="a0")
        await team.run(n_round=repeats)
    finally:
        ShardedRun.run_round = original  # type: ignore[method-assign]
    times.sort()
    return round(times[len(times) // 2] * 1000, 2)


async def driver_share(agents: int, rounds: int, counts: list[int]) -> dict[str, Any]:
    """The driver's CPU in the rounds over one process's CPU for the same rounds, at each shard count.

    Also ``rounds_cpu_ratio`` (the driver's and the shards' CPU in the rounds over one process's) and the
    bytes through the driver per round (``crossing_bytes``: sent to the shards and taken from them).
    """
    one = await one_process(agents, rounds)
    out: dict[str, Any] = {"one_process": one}
    for count in counts:
        run = await sharded(agents, rounds, count)
        used = run["rounds_cpu_s"]
        out[f"shards_{count}"] = {
            "driver_share": round(used["driver"] / one["cpu_s"], 3),
            "rounds_cpu_ratio": round((used["driver"] + sum(used["shards"])) / one["cpu_s"], 2),
            **run,
        }
    return out


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--idle", type=int, default=10_000)
    parser.add_argument("--with-run-dir-only", action="store_true", help="time with_run_dir alone, in this process")
    parser.add_argument("--floor-only", action="store_true", help="one process and parts_at_once (both ways) alone")
    parser.add_argument("--driver-share", default="", help="shard counts, e.g. 2,4: driver_share alone")
    parser.add_argument("--bytes-only", default="", help="agent counts, e.g. 10000,100000: bytes through the driver")
    args = parser.parse_args()
    if args.driver_share:
        counts = [int(k) for k in args.driver_share.split(",")]
        ensure_ray(num_cpus=max(2, *counts))
        report = await driver_share(args.agents, args.rounds, counts)
        print(json.dumps({"agents": args.agents, "rounds": args.rounds, **report}, indent=1))
        return
    if args.bytes_only:
        counts = args.bytes_only.split(",")
        print(json.dumps({n: await crossing_bytes(int(n), args.rounds, args.shards) for n in counts}))
        return
    if args.floor_only:
        wall = (await one_process(args.agents, args.rounds))["wall_s"]
        floor = parts_at_once(args.agents, args.rounds, args.shards)
        shipping = parts_at_once(args.agents, args.rounds, args.shards, ship=True)
        print(
            json.dumps(
                {
                    "one_process_s": wall,
                    "parts_at_once_s": floor,
                    "speedup": round(wall / floor, 2),
                    "parts_shipping_s": shipping,
                    "shipping_speedup": round(wall / shipping, 2),
                }
            )
        )
        return
    ensure_ray(num_cpus=max(2, args.shards))
    report: dict[str, Any] = {"agents": args.agents, "rounds": args.rounds, "shards": args.shards}
    if args.with_run_dir_only:  # a fresh process: no earlier run's heap in the way
        report["with_run_dir"] = await with_run_dir(args.agents, args.rounds, args.shards)
        print(json.dumps(report, indent=1))
        return
    report["one_process"] = await one_process(args.agents, args.rounds)
    report["one_process"]["peak_mib"] = round(peak_kib() / 1024)
    report["sharded"] = await sharded(args.agents, args.rounds, args.shards)
    report["speedup"] = round(report["one_process"]["wall_s"] / report["sharded"]["wall_s"], 2)
    used = report["sharded"]["rounds_cpu_s"]
    report["rounds_cpu_ratio"] = round((used["driver"] + sum(used["shards"])) / report["one_process"]["cpu_s"], 2)
    # the driver's peak before parts_shipping, whose history this process holds
    report["driver_peak_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    for name, ship in (("parts_at_once", False), ("parts_shipping", True)):
        floor = parts_at_once(args.agents, args.rounds, args.shards, ship=ship)
        report[name] = {"wall_s": floor, "speedup": round(report["one_process"]["wall_s"] / floor, 2)}
    report["with_run_dir"] = await with_run_dir(args.agents, args.rounds, args.shards)
    report["crossing"] = await crossing_bytes(min(args.agents, 20_000), args.rounds, args.shards)
    report["idle_round_ms"] = await idle_round(args.idle, 2)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    anyio.run(main)
