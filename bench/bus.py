"""Bus benchmarks: one JSON line per figure, median of 3 runs after a warm-up (the ring: 5 after 3).

Each routing figure has a floor: the same routing done by a minimal dict + deque loop in the
same process, run right after it, so every figure also has a ratio to what plain Python does
here. Run: ``python bench/bus.py`` (``--quick`` shrinks the memory workload).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import statistics
import time
import tracemalloc
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import ClassVar

import anyio
from pydantic import BaseModel, Field

from metaroles import Action, Environment, Memory, Message, Role, UserRequirement
from metaroles.core.ids import new_id

REPEATS = 3


def median_of(run: Callable[[], float], repeats: int = REPEATS) -> float:
    """Median of ``repeats`` runs after one warm-up run (imports, allocator arenas, caches)."""
    run()
    values = []
    for _ in range(repeats):
        gc.collect()
        values.append(run())
    return statistics.median(values)


def paired(
    run: Callable[[], float], floor: Callable[[], float], repeats: int = REPEATS, warmups: int = 1
) -> tuple[float, float, float]:
    """Medians of ``run``, of ``floor`` and of their ratio, each pair run back to back, after ``warmups`` pairs.

    Pairs keep the ratio honest on a machine whose speed drifts between runs.
    """
    for _ in range(warmups):
        run()
        floor()
    pairs = []
    for _ in range(repeats):
        gc.collect()
        ours = run()
        gc.collect()
        pairs.append((ours, floor()))
    return (
        statistics.median(p[0] for p in pairs),
        statistics.median(p[1] for p in pairs),
        statistics.median(p[0] / p[1] for p in pairs),
    )


def emit_paired(figure: str, unit: str, measured: tuple[float, float, float], **params: object) -> None:
    value, floor, ratio = measured
    line = {"figure": figure, "value": round(value, 3), "unit": unit, "params": params}
    line |= {"floor": round(floor, 3), "ratio_to_floor": round(ratio, 3)}
    print(json.dumps(line), flush=True)


def emit(figure: str, value: float, unit: str, **params: object) -> None:
    print(json.dumps({"figure": figure, "value": round(value, 3), "unit": unit, "params": params}), flush=True)


async def timed(fn: Callable[..., Awaitable[object]], *args: object) -> float:
    """Seconds ``fn(*args)`` takes inside a running event loop (loop start-up excluded)."""
    start = time.perf_counter()
    await fn(*args)
    return time.perf_counter() - start


# -- ring_addressed -------------------------------------------------------------------------------


class Relay(Action):
    async def run(self, history: Sequence[Message]) -> str:
        return "relay"


def ring_actions(count: int) -> list[type[Action]]:
    return [type(f"Act{i}", (Relay,), {"__module__": __name__}) for i in range(count)]


def ring_env(roles: int) -> Environment:
    """Role i acts with Act{i}, watches Act{i-1} and sends to role i+1; a seed reaches every role."""
    actions = ring_actions(roles)
    env = Environment()
    names = [f"r{i}" for i in range(roles)]
    for i in range(roles):
        env.add_role(Role(name=names[i], actions=[actions[i]], watch=[actions[i - 1]], send_to=names[(i + 1) % roles]))
    env.publish_message(Message("seed", send_to=set(names)))
    return env


def ring_run(roles: int, rounds: int, build: Callable[[int], Environment] = ring_env) -> float:
    env = build(roles)
    seeded = len(env.history)
    elapsed = anyio.run(timed, env.run, rounds)
    published = len(env.history) - seeded
    assert published == roles * rounds, published
    return published / elapsed


class RelayTo(Action):
    """A relay that addresses each message itself (``send_to`` on the message, not the role)."""

    sender: ClassVar[str] = ""
    target: ClassVar[str] = ""

    async def run(self, history: Sequence[Message]) -> Message:
        return Message("relay", cause_by=self.cause_by, sent_from=self.sender, send_to={self.target})


def ring_env_per_message(roles: int) -> Environment:
    """The ring, but every message names its recipient (the action builds a validated Message)."""
    names = [f"r{i}" for i in range(roles)]
    actions = [
        type(f"To{i}", (RelayTo,), {"__module__": __name__, "sender": names[i], "target": names[(i + 1) % roles]})
        for i in range(roles)
    ]
    env = Environment()
    for i in range(roles):
        env.add_role(Role(name=names[i], actions=[actions[i]], watch=[actions[i - 1]]))
    env.publish_message(Message("seed", send_to=set(names)))
    return env


class FloorMessage:
    __slots__ = ("cause_by", "content", "id", "send_to", "sent_from")

    def __init__(self, content: str, cause_by: str, sent_from: str, send_to: str) -> None:
        self.id = new_id()
        self.content = content
        self.cause_by = cause_by
        self.sent_from = sent_from
        self.send_to = send_to


def ring_floor(roles: int, rounds: int) -> float:
    """The ring's routing with plain structures: address → deque, a seen-dict per role (so that
    what a role already holds is not news, as on the bus), the watch filter, one publish."""
    times = ring_floor_rounds(roles, rounds)
    return roles * rounds / sum(times)


def ring_floor_rounds(roles: int, rounds: int, *, keep: bool = False) -> list[float]:
    """Seconds per round of the ring's floor; ``keep``: also a history (list and dict by id), the heap
    settled after each round as a session settles it (``core.heap``): what storing a run costs plain Python."""
    names = [f"r{i}" for i in range(roles)]
    acts = [f"Act{i}" for i in range(roles)]
    watch = [acts[i - 1] for i in range(roles)]
    queues = {n: deque([FloorMessage("seed", "User", "human", n)]) for n in names}
    seen: dict[str, dict[str, FloorMessage]] = {n: {} for n in names}
    history: list[FloorMessage] = []
    by_id: dict[str, FloorMessage] = {}
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        outbox = []
        for i, name in enumerate(names):
            queue, memory, news = queues[name], seen[name], []
            while queue:
                message = queue.popleft()
                if message.id not in memory:
                    memory[message.id] = message
                    if message.cause_by == watch[i] or message.send_to == name:
                        news.append(message)
            if news:
                reply = FloorMessage("relay", acts[i], name, names[(i + 1) % roles])
                memory[reply.id] = reply
                outbox.append(reply)
        for message in outbox:
            queues[message.send_to].append(message)
        if keep:
            history += outbox
            by_id.update((message.id, message) for message in outbox)
            gc.collect(1)
            gc.freeze()
        times.append(time.perf_counter() - start)
    assert len(history) == (roles * rounds if keep else 0)
    if keep:
        gc.unfreeze()
    return times


# -- broadcast -------------------------------------------------------------------------------------


class Speak(Action):
    async def run(self, history: Sequence[Message]) -> str:
        return "said"


class Speaker(Role):
    def __init__(self, name: str, turns: int) -> None:
        super().__init__(name=name, actions=[Speak], watch=[UserRequirement, Speak])
        self.turns = turns
        self.spoken = 0

    async def _think(self) -> bool:
        if self.spoken >= self.turns:
            return False
        self.spoken += 1
        return await super()._think()


def broadcast_run(roles: int, speakers: int, rounds: int) -> float:
    env = Environment()
    env.add_roles(Speaker(f"s{i}", rounds) for i in range(speakers))
    listeners = [Role(name=f"l{i}", watch=[]) for i in range(roles - speakers)]
    env.add_roles(listeners)
    env.publish_message(Message("topic"))

    async def until_idle() -> None:
        while not env.is_idle:
            await env.run_round()

    elapsed = anyio.run(timed, until_idle)
    messages = len(env.history)
    assert messages == 1 + speakers * rounds, messages
    assert all(listener.rc.memory.count() == messages for listener in listeners), "every delivery is stored"
    return messages * roles / elapsed


def broadcast_floor(roles: int, speakers: int, rounds: int) -> float:
    names = [f"r{i}" for i in range(roles)]
    queues = {n: deque[FloorMessage]() for n in names}
    stored: dict[str, dict[str, FloorMessage]] = {n: {} for n in names}
    deliveries = 0
    pending = [FloorMessage("topic", "User", "human", "<all>")]
    start = time.perf_counter()
    for turn in range(rounds + 1):
        for message in pending:
            for name in names:
                queues[name].append(message)
            deliveries += roles
        pending = []
        for i, name in enumerate(names):
            queue, memory, news = queues[name], stored[name], 0
            while queue:
                message = queue.popleft()
                if message.id not in memory:
                    memory[message.id] = message
                    news += i < speakers
            if news and turn < rounds:
                pending.append(FloorMessage("said", "Speak", name, "<all>"))
    return deliveries / (time.perf_counter() - start)


# -- memory and idle rounds ------------------------------------------------------------------------


def memory_figures(total: int) -> None:
    actions = [f"bench.Act{i}" for i in range(100)]
    rare = Message("rare", cause_by="bench.Rare")
    messages = [Message("m", cause_by=actions[i % 100]) for i in range(total - 10)]
    messages[total // 2 : total // 2] = [rare.model_copy(update={"id": new_id()}) for _ in range(10)]
    memory = Memory()
    chunk = total // 10
    per_add = []
    for start in range(0, total, chunk):
        batch = messages[start : start + chunk]
        begin = time.perf_counter()
        add = memory.add
        for message in batch:
            add(message)
        per_add.append((time.perf_counter() - begin) / len(batch) * 1e6)
    emit("memory_add_first_10pct", per_add[0], "us/add", stored=chunk)
    emit("memory_add_last_10pct", per_add[-1], "us/add", stored=total)
    observed = messages[-50:] + [Message("new") for _ in range(50)]

    def find_news() -> float:
        begin = time.perf_counter()
        for _ in range(1000):
            memory.find_news(observed)
        return (time.perf_counter() - begin) / 1000 * 1e6

    emit("memory_find_news_100_at_1M", median_of(find_news), "us/call", observed=100, stored=total)
    for label, mem in (("small", Memory([*messages[:1000], rare])), ("large", memory)):

        def lookup(mem: Memory = mem) -> float:
            begin = time.perf_counter()
            for _ in range(10_000):
                mem.get_by_action("bench.Rare")
            return (time.perf_counter() - begin) / 10_000 * 1e6

        emit(f"memory_get_by_action_{label}", median_of(lookup), "us/call", stored=mem.count())

    def lookup_rare() -> float:
        begin = time.perf_counter()
        for _ in range(10_000):
            memory.get_by_actions(("bench.Rare", "bench.Rare2"))
        return (time.perf_counter() - begin) / 10_000 * 1e6

    memory.add(Message("rare too", cause_by="bench.Rare2"))
    emit("memory_get_by_actions_rare", median_of(lookup_rare), "us/call", stored=memory.count(), returned=11)


def timed_calls(call: Callable[[], object], between: Callable[[], object] = lambda: None, count: int = 200) -> float:
    """Microseconds per ``call``, ``between`` run (untimed) before each."""
    spent = 0.0
    for _ in range(count):
        between()
        begin = time.perf_counter()
        call()
        spent += time.perf_counter() - begin
    return spent / count * 1e6


def metagpt_get_by_actions(index: dict[str, list[Message]], asked: Sequence[str]) -> None:
    """MetaGPT's ``Memory.get_by_actions`` (its index lists concatenated), the result iterated."""
    found: list[Message] = []
    for action in asked:
        if action in index:
            found += index[action]
    for _ in found:
        pass


def iterate_get_by_actions(memory: Memory, asked: Sequence[str]) -> None:
    """Ours, the result iterated."""
    for _ in memory.get_by_actions(asked):
        pass


def actions_figures(total: int = 50_000, kinds: int = 10) -> None:
    """``get_by_actions`` with three common actions (3 of ``kinds``) at ``total`` stored, the result iterated.

    Against MetaGPT's way (its index lists concatenated, not in storage order): asked again with
    nothing new, with ``kinds`` new messages between asks (a role's ``important_memory`` each turn),
    and the first ask of a memory.
    """
    actions = [f"bench.Act{i}" for i in range(kinds)]
    messages = [Message("m", cause_by=actions[i % kinds]) for i in range(total)]
    asked = (actions[1], actions[4], actions[7])
    index = {a: [m for m in messages if m.cause_by == a] for a in actions}
    memory = Memory(messages)
    arriving = iter([Message("m", cause_by=actions[i % kinds]) for i in range(1000 * kinds)])

    def arrive() -> None:
        for message in itertools.islice(arriving, kinds):
            memory.add(message)
            index[message.cause_by].append(message)  # MetaGPT's index grows too

    def first_ask() -> float:
        fresh = Memory(messages)
        begin = time.perf_counter()
        iterate_get_by_actions(fresh, asked)
        return (time.perf_counter() - begin) * 1e6

    theirs, ours = partial(metagpt_get_by_actions, index, asked), partial(iterate_get_by_actions, memory, asked)
    emit("memory_get_by_actions_metagpt", median_of(lambda: timed_calls(theirs)), "us/call", stored=total)
    emit(
        "memory_get_by_actions_common",
        median_of(lambda: timed_calls(ours)),
        "us/call",
        stored=total,
        returned=3 * total // kinds,
    )
    new = median_of(lambda: timed_calls(ours, arrive))
    emit("memory_get_by_actions_common_with_news", new, "us/call", stored=total, new_between=kinds)
    new = median_of(lambda: timed_calls(theirs, arrive))
    emit("memory_get_by_actions_metagpt_with_news", new, "us/call", stored=total, new_between=kinds)
    emit("memory_get_by_actions_first_ask", statistics.median(first_ask() for _ in range(20)), "us/call", stored=total)


class PydanticMessage(BaseModel):
    """The reference for ``Message.dump``: MetaGPT's message is a pydantic model with these fields."""

    id: str
    content: str
    instruct_content: dict[str, object] | None = None
    role: str = "user"
    cause_by: str = ""
    sent_from: str = ""
    send_to: set[str] = Field(default_factory=set)
    metadata: dict[str, object] = Field(default_factory=dict)


def dump_figures(count: int = 100_000) -> None:
    """``Message.dump()`` against pydantic-core's ``model_dump_json`` of a model with the same fields, in turn."""
    message = Message("relay the opinion onwards", cause_by="Act1", sent_from="r1", send_to={"r2"})
    reference = PydanticMessage(id=message.id, content=message.content, cause_by="Act1", sent_from="r1", send_to={"r2"})

    def per_call(dump: Callable[[], str]) -> Callable[[], float]:
        def run() -> float:
            start = time.perf_counter()
            for _ in range(count):
                dump()
            return (time.perf_counter() - start) / count * 1e6

        return run

    timed_pair = paired(per_call(message.dump), per_call(reference.model_dump_json))
    emit_paired("message_dump", "us/call", timed_pair, floor="pydantic model_dump_json", ratio="time over the floor's")


def idle_role_bytes(roles: int) -> float:
    """Bytes each idle role (no actions, nothing buffered) holds, joined to an Environment."""
    gc.collect()
    tracemalloc.start()
    env = Environment()
    env.add_roles(Role(name=f"r{i}") for i in range(roles))
    gc.collect()
    used = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(env.roles) == roles
    return used / roles


def per_round(env: Environment, rounds: int) -> list[float]:
    """Seconds per round, each round of ``rounds``.

    The rounds run in one session, as ``env.run`` and ``Team.run`` run them (workers kept, the heap
    settled after each round: ``core.heap``).
    """

    async def go() -> list[float]:
        times = []
        async with env.session():
            for _ in range(rounds):
                begin = time.perf_counter()
                await env.run_round()
                times.append(time.perf_counter() - begin)
        return times

    return anyio.run(go)


def ends(times: list[float], edge: int = 20) -> tuple[float, float]:
    """Mean seconds per round over rounds 10 to 29 and over the last ``edge`` rounds (the first ones warm up)."""
    return statistics.fmean(times[9 : 9 + edge]), statistics.fmean(times[-edge:])


def broadcast_env(roles: int, rounds: int) -> Environment:
    env = Environment()
    env.add_roles(Speaker(f"s{i}", rounds) for i in range(roles))
    env.publish_message(Message("topic"))
    return env


def history_figures(rounds: int) -> None:
    """Per-round time early (rounds 10-29) and late in long runs: flat when no act pays for the history it was handed.

    A growing heap costs every round a little more even in plain Python (caches, allocator): the
    ring's floor that keeps its history, run right after in the same process, shows how much.
    """
    for label, build in (
        ("ring_10", lambda: ring_env(10)),
        ("broadcast_10", lambda: broadcast_env(10, rounds)),
        ("ring_1000", lambda: ring_env(1000)),
    ):
        env = build()
        roles = len(env.roles)
        first, last = ends(per_round(env, rounds))
        params = {"roles": roles, "rounds": rounds}
        del env
        growth: dict[str, float] = {"growth": round(last / first, 2)}
        if label.startswith("ring"):
            gc.collect()
            floor_first, floor_last = ends(ring_floor_rounds(roles, rounds, keep=True))
            growth["floor_growth"] = round(floor_last / floor_first, 2)
        emit(f"history_{label}_first_rounds", first * 1e3, "ms/round", **params)
        emit(f"history_{label}_last_rounds", last * 1e3, "ms/round", **growth, **params)


def idle_round(roles: int, rounds: int) -> float:
    env = Environment()
    env.add_roles(Role(name=f"r{i}") for i in range(roles))
    return anyio.run(timed, env.run, rounds) / rounds * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller memory workload")
    args = parser.parse_args()
    # The first figures of a fresh process: a run of the ring reads 10-20 % slower for its first few runs here
    # (the allocator's arenas, caches), so three warm-up pairs, and five measured ones.
    ring = paired(lambda: ring_run(1000, 10), lambda: ring_floor(1000, 10), repeats=5, warmups=3)
    emit_paired("ring_addressed", "msgs/s", ring, roles=1000, rounds=10)
    ring = paired(lambda: ring_run(1000, 10, ring_env_per_message), lambda: ring_floor(1000, 10), repeats=5, warmups=3)
    emit_paired("ring_addressed_per_message", "msgs/s", ring, roles=1000, rounds=10)
    broadcast = paired(lambda: broadcast_run(1000, 10, 10), lambda: broadcast_floor(1000, 10, 10))
    emit_paired("broadcast", "deliveries/s", broadcast, roles=1000, speakers=10, rounds=10)
    dump_figures()
    emit("idle_round_10k_roles", median_of(lambda: idle_round(10_000, 100)), "ms/round", roles=10_000)
    memory_figures(100_000 if args.quick else 1_000_000)
    actions_figures()
    for roles in (10_000, 100_000):
        emit("idle_role", idle_role_bytes(roles), "bytes/role", roles=roles)
    history_figures(100 if args.quick else 1000)


if __name__ == "__main__":
    main()
