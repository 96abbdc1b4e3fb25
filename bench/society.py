"""The society at scale: what a recorded run costs, what the bus alone costs, and the floor of its objects.

    python bench/society.py [--agents 10000] [--rounds 100]
    python bench/society.py --quick                        # 2,000 agents, 20 rounds

Prints JSON, one figure a line.

- ``society_recorded_cpu_s``: ``metaroles run society --set agents=N --rounds R`` as a user types it (the
  test model, seed 1, its run directory written: the event log, a checkpoint every 10 rounds, the
  metrics), the command's CPU, user + system (each in the params). Goal (issue 76): ≤ 25 s at
  10,000 × 100, quiet.
- ``society_setup_cpu_s``: the same command for one round, less a round's share: imports, the graph,
  the agents and the run directory's first files.
- ``society_round_ms``: a round's CPU, recorded and not (``--no-save``: no log, checkpoint or metrics).
- ``society_object_floor_ms``: a round of the same society (the same graph and rule) made of the bus's own
  objects and the least any framework must do with them, in parts (``parts``), over as many rounds (an
  agent's memory grows as in the run): ``turn``, each agent's id scope entered and a coroutine awaited
  (what a worker's drain does); ``observe``, its buffer taken and its news remembered
  (``Memory.remember_news``); ``rule``, the opinions the news carry read and the bounded-confidence rule;
  ``answer`` (``Message.trusted``) and ``remember``; ``history_add``; ``deliver``, each answer pushed into
  its neighbours' buffers; ``metrics`` (sorted, mean, variance); ``log``, the event log's line of the round
  (its ``published`` columns, one orjson call); ``checkpoint``, a delta's message rows as columns in one
  orjson call, its ops and deliveries as numbers. No role object, routing, record, hook, error handling or
  file. A design that keeps a message per opinion said and a memory and a buffer per agent costs at least
  this a round. ``society_object_floor_s``: the setup and every round so.
- ``society_columns_floor_ms``: the same round with no object per message or agent (the design that
  would reach the goal): the population's answers rows of one table (an id and a content string each,
  as the log and the message table need), who hears whom index arrays, the rule over arrays (numpy), a
  Python call per agent beside it (``action``: what a user's action costs at least), the same log line
  and the table's rows as columns. ``society_columns_floor_s``: the setup and every round so.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from metaroles.core.ids import SCOPE, IdScope, run_key
from metaroles.core.schema import ChatRole
from metaroles.messages.memory import Memory
from metaroles.messages.message import Message
from metaroles.messages.queue import MessageQueue


def emit(figure: str, value: float, unit: str, **params: object) -> None:
    print(json.dumps({"figure": figure, "value": round(value, 3), "unit": unit, "params": params}), flush=True)


def command_cpu(agents: int, rounds: int, *, save: bool) -> tuple[float, float]:
    """CPU seconds (user, system) of ``metaroles run society`` with these options."""
    folder = Path(tempfile.mkdtemp())
    where = ["--out", str(folder / "run")] if save else ["--no-save"]
    command = [sys.executable, "-m", "metaroles", "run", "society", "--llm", "test", "--seed", "1", "-q"]
    command += ["--set", f"agents={agents}", "--rounds", str(rounds), *where]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime


def object_floor(agents: int, rounds: int) -> dict[str, float]:
    """Milliseconds a round of each part of the floor (see the module), averaged over ``rounds`` rounds."""
    return _timed(_Floor(agents), rounds)


def columns_floor(agents: int, rounds: int) -> dict[str, float]:
    """Milliseconds a round of each part of the population-as-columns probe (see the module)."""
    return _timed(_Columns(agents), rounds)


def _timed(society: Any, rounds: int) -> dict[str, float]:
    """Run ``society``'s parts (its ``PARTS``, in order) for ``rounds`` rounds; each part's mean CPU ms a round."""
    parts = dict.fromkeys(society.PARTS, 0.0)
    clock = time.process_time
    for round_no in range(1, rounds + 1):
        society.round_no = round_no
        for part in society.PARTS:
            begun = clock()
            getattr(society, part)()
            parts[part] += (clock() - begun) * 1000 / rounds
        gc.freeze()  # as a session settles the heap after each round
    gc.unfreeze()
    return parts


class _Floor:
    """The society of the floor: per agent a memory, a buffer and an opinion; a round is its parts, in order."""

    PARTS = ("turn", "observe", "rule", "answer", "remember", "history_add", "deliver", "metrics", "log", "checkpoint")

    def __init__(self, agents: int) -> None:
        import networkx as nx  # the graph extra, as the society's

        graph = nx.connected_watts_strogatz_graph(agents, 6, 0.1, seed=0)
        self.names = [f"a{i}" for i in range(agents)]
        self.near = [sorted(graph.neighbors(i)) for i in range(agents)]
        self.send_to = [frozenset(self.names[j] for j in each) for each in self.near]
        self.sorted_to = [sorted(each) for each in self.send_to]
        rng = random.Random(0)
        self.opinions = [rng.random() for _ in range(agents)]
        self.memories, self.buffers = [Memory() for _ in self.names], [MessageQueue() for _ in self.names]
        self.history = Memory()
        self.scopes = [IdScope(run_key(1), 1 + i) for i in range(agents)]
        self.round_no, self.table = 0, dict[int, int]()
        self.news: list[list[Any]] = []
        self.said: list[str] = []
        self.answers = [self._say(i, f"{o:.6f}") for i, o in enumerate(self.opinions)]
        self.deliver()  # everyone's first opinion, in the neighbours' buffers

    def _say(self, i: int, text: str) -> Any:
        return Message.trusted(text, None, ChatRole.ASSISTANT, "bench.Share", self.names[i], self.send_to[i])

    def turn(self) -> None:
        """The leanest turn: each agent's id scope placed and entered, a coroutine awaited in it."""
        scopes = [scope.at(self.round_no) for scope in self.scopes]

        async def turn() -> int:
            return 0

        async def drain() -> None:
            for scope in scopes:
                token = SCOPE.set(scope)
                await turn()
                SCOPE.reset(token)

        with contextlib.suppress(StopIteration):
            drain().send(None)

    def observe(self) -> None:
        watch = frozenset({"bench.Share"})
        self.news = [
            memory.remember_news(buffer.pop_all(), watch, name)[1]
            for memory, buffer, name in zip(self.memories, self.buffers, self.names, strict=True)
        ]

    def rule(self) -> None:
        heard = ([float(m.content or "") for m in each] for each in self.news)
        self.said = [f"{_rule(own, near):.6f}" for own, near in zip(self.opinions, heard, strict=True)]
        self.opinions = [float(text) for text in self.said]

    def answer(self) -> None:
        self.answers = [self._say(i, text) for i, text in enumerate(self.said)]

    def remember(self) -> None:
        for memory, answer in zip(self.memories, self.answers, strict=True):
            memory.add(answer)

    def history_add(self) -> None:
        self.history.remember_new(self.answers)

    def deliver(self) -> None:
        buffers = self.buffers
        for answer, near in zip(self.answers, self.near, strict=True):
            for j in near:
                buffers[j].push(answer)

    def metrics(self) -> None:
        ordered = sorted(self.opinions)
        statistics.fmean(ordered), statistics.pvariance(ordered)

    def log(self) -> None:
        """The event log's round line as it writes a society's (no turn events), encoded, written nowhere."""
        answers = self.answers
        published = {
            "role": [answer.sent_from for answer in answers],
            "message_id": [answer.id for answer in answers],
            "cause_by": [answer.cause_by for answer in answers],
            "send_to": self.sorted_to,
            "caused_by": [[message.id for message in each] for each in self.news],
            "to": self.sorted_to,
        }
        orjson.dumps({"round": self.round_no, "published": published}, option=orjson.OPT_APPEND_NEWLINE)

    def checkpoint(self) -> None:
        """A delta's rows (as columns: one encoding, its leanest form), ops and deliveries, written nowhere."""
        answers, table = self.answers, self.table
        rows = {"id": [a.id for a in answers], "content": [a.content for a in answers], "send_to": self.sorted_to}
        orjson.dumps(rows | {"sent_from": [a.sent_from for a in answers]})
        ops: list[int] = []
        deliveries: list[int] = []
        for i, (answer, near) in enumerate(zip(answers, self.near, strict=True)):
            row = table[id(answer)] = len(table)
            ops += (0, i, 1, i, row)
            deliveries += (row, len(near), *near)


class _Columns:
    """The same society with no object per message or agent: what it said is a table of rows, who hears whom arrays.

    An agent's memory is the rows it heard and said (the rows of its neighbours' answers and its own, by
    round: nothing to append), its buffer the previous round's rows of its neighbours. Ids and contents
    are made as strings (the log and the table need them), the rule runs over arrays.
    """

    PARTS = ("action", "rule", "answer", "log", "checkpoint", "metrics")

    def __init__(self, agents: int) -> None:
        import networkx as nx  # the graph extra, as the society's
        import numpy as np

        self.np = np
        graph = nx.connected_watts_strogatz_graph(agents, 6, 0.1, seed=0)
        near = [sorted(graph.neighbors(i)) for i in range(agents)]
        self.flat = np.fromiter((j for each in near for j in each), dtype=np.int64)
        self.starts = np.cumsum([0, *map(len, near)])[:-1]
        self.counts = np.fromiter(map(len, near), dtype=np.int64)
        self.names = [f"a{i}" for i in range(agents)]
        self.near = near
        self.sorted_to = [[self.names[j] for j in each] for each in near]
        self.caused_by: list[list[str]] = []
        self.owner = np.repeat(np.arange(agents), self.counts)
        rng = random.Random(0)
        self.said = np.round(np.array([rng.random() for _ in range(agents)]), 6)
        self.ids: list[str] = [f"{0:08x}{i:05x}" for i in range(agents)]
        self.contents: list[str] = []
        self.round_no, self.rows = 0, 0

    def action(self) -> None:
        """A coroutine awaited per agent (a user's action would be one), given its place: what a turn costs at least."""

        async def act(place: int) -> int:
            return place

        async def drain() -> None:
            for place in range(len(self.names)):
                await act(place)

        with contextlib.suppress(StopIteration):
            drain().send(None)

    def rule(self) -> None:
        np, said = self.np, self.said
        heard = said[self.flat]
        close = np.abs(heard - said[self.owner]) <= 0.25
        sums = np.add.reduceat(np.where(close, heard, 0.0), self.starts)
        self.said = np.round((said + sums) / (1 + np.add.reduceat(close, self.starts)), 6)

    def answer(self) -> None:
        """The round's rows: an id and a content string each (as the log and the message table hold them)."""
        ids = self.ids
        self.caused_by = [[ids[j] for j in each] for each in self.near]
        prefix = f"{self.round_no:08x}"
        self.ids = [prefix + f"{i:05x}" for i in range(len(self.names))]
        self.contents = [f"{x:.6f}" for x in self.said.tolist()]

    def log(self) -> None:
        published: dict[str, list[Any]] = {"role": self.names, "message_id": self.ids}
        published |= {"cause_by": ["bench.Share"] * len(self.ids), "send_to": self.sorted_to}
        published |= {"caused_by": self.caused_by, "to": self.sorted_to}
        orjson.dumps({"round": self.round_no, "published": published}, option=orjson.OPT_APPEND_NEWLINE)

    def checkpoint(self) -> None:
        """The round's rows (the table as columns) and the memories' growth: a range of rows, one number a round."""
        orjson.dumps({"id": self.ids, "content": self.contents, "sent_from": self.names, "send_to": self.sorted_to})
        self.rows += len(self.ids)

    def metrics(self) -> None:
        np, said = self.np, self.said
        float(np.mean(said)), float(np.var(said)), int(np.count_nonzero(np.diff(np.sort(said)) > 0.01))


def _rule(own: float, heard: list[float], epsilon: float = 0.25) -> float:
    close = [o for o in heard if abs(o - own) <= epsilon]
    return sum(close, own) / (len(close) + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="2,000 agents, 20 rounds")
    args = parser.parse_args()
    agents, rounds = (2000, 20) if args.quick else (args.agents, args.rounds)
    params = {"agents": agents, "rounds": rounds}
    user, system = command_cpu(agents, rounds, save=True)
    recorded = user + system
    goal = 25 if (agents, rounds) == (10_000, 100) else None
    emit("society_recorded_cpu_s", recorded, "s", user=round(user, 2), system=round(system, 2), goal=goal, **params)
    one = sum(command_cpu(agents, 1, save=True))
    per_round = (recorded - one) / (rounds - 1)
    emit("society_setup_cpu_s", one - per_round, "s", **params)
    bare = (sum(command_cpu(agents, rounds, save=False)) - sum(command_cpu(agents, 1, save=False))) / (rounds - 1)
    emit("society_round_ms", per_round * 1000, "ms", unrecorded=round(bare * 1000, 1), **params)
    parts = object_floor(agents, rounds)
    floor = sum(parts.values())
    emit("society_object_floor_ms", floor, "ms", parts={k: round(v, 1) for k, v in parts.items()}, **params)
    emit("society_object_floor_s", one - per_round + rounds * floor / 1000, "s", **params)
    parts = columns_floor(agents, rounds)
    floor = sum(parts.values())
    emit("society_columns_floor_ms", floor, "ms", parts={k: round(v, 1) for k, v in parts.items()}, **params)
    emit("society_columns_floor_s", one - per_round + rounds * floor / 1000, "s", **params)


if __name__ == "__main__":
    main()
