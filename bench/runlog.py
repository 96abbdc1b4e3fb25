"""What the run's event log and checkpoints cost on the ring (R=1000 roles, K=10 rounds).

Modes: off; the full event log (publish, deliver, observe, think, act...); an incremental
checkpoint each round; both (what a scenario run does by default); the log without turn events
and a checkpoint each round; and the light setting for large societies (no turn events, a
checkpoint every 10 rounds). Each run's rounds are one session of the environment, as ``Team.run`` runs
them (workers kept, the heap settled after each round). The modes run interleaved, five
times each after a warm-up, and each slowdown is the median of the ratios to the "off" run of the
same repetition, so the machine's drift does not leak into the figures.

``otel_sdk_floor`` is what the OpenTelemetry SDK alone costs for the spans a traced ring makes (per
message a turn, the ``process`` span of what it observed and the ``send`` span of what it published,
with their attributes; per round a round span), made with no bus at all: the slowdown OTel would
cause if metaroles itself cost nothing. No tracing of those spans can be cheaper than this floor;
``otel_over_sdk_floor`` is what tracing the ring costs over it (repetition by repetition: the traced
ring's time less the untraced one's, over the floor).
``record_floor_*`` is what recording the ring's rounds costs with no bus at all: each round's messages
taken from the history into columns (round, id, sender, cause_by, send_to, content: what a publish
and its folded turn and deliveries need), encoded in one batch per round — as folded JSON columns with
orjson (``record_floor_json``) and as an Arrow IPC record batch (``record_floor_arrow``) — and appended
to one file; ``record_floor_turns`` adds each message's turn as the log's steps (observe with the news'
ids, think, act: three rows of kind, role and detail), still orjson with no bus: the floor of a log with
turn events; ``record_floor_fsync`` is one fsync per round on top (the durability a checkpoint needs).
No log of those rounds can cost less on the round's path. ``ring_record_batch`` probes the design
between: the bus's round record (turn steps kept) written as one orjson line of columns a round, fsynced
(:class:`RoundBatches`). ``full_snapshot``: what the ring's full snapshot (every role's entry whole: a
run's first checkpoint and every 25th) costs a role. Needs the ``bench`` extra (pyarrow, orjson).
Run: ``python bench/runlog.py``.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import anyio
from bus import ring_env

from metaroles import Environment, Message
from metaroles.bus.record import names_of
from metaroles.record.checkpoint import CheckpointWriter
from metaroles.record.eventlog import EventLog

ROLES, ROUNDS, REPEATS = 1000, 10, 5
MODES: dict[str, tuple[bool | str | None, int | None]] = {  # name: (turn events in the log?, checkpoint every N)
    "off": (None, None),
    "log": (True, None),
    "checkpoint": (None, 1),
    "log+checkpoint": (True, 1),
    "folded+checkpoint": ("folded", 1),  # metaroles run --fold-turns: a default turn on its message's line
    "messages+checkpoint": (False, 1),
    "light": (False, 10),
    "otel": (None, None),  # OpenTelemetry on (the SDK's in-memory exporter, content off), no log or checkpoint
    "record_batch": (None, None),  # the design probe below: each round's record, one orjson batch, fsynced
}


async def run(mode: str) -> float:
    turns, every = MODES[mode]
    env = ring_env(ROLES)
    folder = Path(tempfile.mkdtemp())
    log = EventLog(folder / "events.jsonl", env, turns=turns) if turns is not None else None
    checkpoints = CheckpointWriter(folder / "checkpoints") if every is not None else None
    telemetry = traced_in_memory(env) if mode == "otel" else nullcontext()
    batches = RoundBatches(folder / "record.jsonl", env) if mode == "record_batch" else None
    with telemetry:
        start = time.perf_counter()
        await rounds(env, log, checkpoints, every, batches)
        return ROLES * ROUNDS / (time.perf_counter() - start)


class RoundBatches:
    """A design probe, not a log metaroles writes: each round's record (``bus.record``) as one line of columns.

    The columns are what the event log and a checkpoint delta would need from the round — its turns
    (kind, role, the news' ids, the action, the message made), its messages whole (id, sender, action,
    addresses, content) and their recipients — encoded by orjson in one batch, appended and fsynced
    (the durability a checkpoint each round needs). What recording would cost if the record were the
    file: ``ring_record_batch``.
    """

    def __init__(self, path: Path, env: Environment) -> None:
        import orjson

        self.dumps, self.env = orjson.dumps, env
        self.file = path.open("ab")
        self.records = env.record_reader()

    def write(self) -> None:
        """Append the records closed since the last call, a line each, then wait for the disk."""
        name_at = self.env.name_at
        for record in self.records.take():
            steps, said = record.steps, record.published
            assert steps is not None
            details = [_detail(kind, detail) for kind, detail in zip(steps.kind, steps.detail, strict=True)]
            line = {
                "round": record.round,
                "steps": {"kind": steps.kind, "role": steps.role, "detail": details, "remembered": steps.remembered},
                "id": [m.id for m in said],
                "sent_from": [m.sent_from for m in said],
                "cause_by": [m.cause_by for m in said],
                "send_to": [sorted(m.send_to) for m in said],
                "content": [m.content for m in said],
                "to": [names_of(rs, name_at) for rs in record.recipients],
            }
            self.file.write(self.dumps(line) + b"\n")
        self.file.flush()
        os.fsync(self.file.fileno())


def _detail(kind: str, detail: object) -> object:
    if kind == "observe":
        return [m.id for m in detail]  # type: ignore[attr-defined]
    if detail is None or kind not in ("think", "act"):
        return detail
    return detail.cause_by if kind == "think" else detail.id  # type: ignore[attr-defined]


def traced_in_memory(env: Environment) -> AbstractContextManager[object]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from metaroles.telemetry.tracing import traced

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    return traced(env, scenario="ring", run_id="bench", tracer=provider.get_tracer("bench"), content=False)


def otel_sdk_floor() -> float:
    """Seconds the SDK takes for the spans of the traced ring's ``ROUNDS`` rounds (see the module), no bus."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    tracer = provider.get_tracer("floor")
    start = time.perf_counter()
    root = tracer.start_span("invoke_workflow ring")
    sent: list[trace.SpanContext] = [root.get_span_context()] * ROLES
    for round_no in range(ROUNDS):
        round_span = tracer.start_span(f"round {round_no}", context=trace.set_span_in_context(root))
        in_round = trace.set_span_in_context(round_span)
        for i in range(ROLES):
            name, after = f"r{i}", f"r{(i + 1) % ROLES}"
            agent = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name}
            agent |= {"gen_ai.conversation.id": "bench", "metaroles.round": round_no}
            turn = tracer.start_span(f"invoke_agent {name}", context=in_round, attributes=agent)
            in_turn = trace.set_span_in_context(turn)
            message = {"messaging.system": "metaroles", "messaging.message.id": f"{round_no:06x}{i:05x}"}
            message |= {"messaging.destination.name": after, "metaroles.round": round_no}
            process = {**message, "messaging.operation.name": "process", "messaging.operation.type": "process"}
            process["metaroles.recipient"] = name
            links = [trace.Link(sent[i - 1])]
            kind = trace.SpanKind.CONSUMER
            tracer.start_span(f"process {name}", context=in_turn, kind=kind, links=links, attributes=process).end()
            send = {**message, "messaging.operation.name": "send", "messaging.operation.type": "send"}
            send |= {"metaroles.cause_by": f"Act{i}", "metaroles.sent_from": name, "metaroles.send_to": [after]}
            send["metaroles.delivered_to"] = [after]
            span = tracer.start_span(f"send {after}", context=in_turn, kind=trace.SpanKind.PRODUCER, attributes=send)
            span.end()
            sent[i] = span.get_span_context()
            turn.end()
        round_span.end()
    root.end()
    return time.perf_counter() - start


def record_floor(history: Sequence[Message], how: str) -> float:
    """Seconds to record the ring's rounds from ``history`` (R messages a round) as ``how``, no bus (see the module)."""
    import orjson
    import pyarrow as pa
    import pyarrow.ipc as ipc

    path = Path(tempfile.mkdtemp()) / "record"
    start = time.perf_counter()
    with path.open("wb") as file:
        writer = None
        for round_no in range(ROUNDS):
            said = history[round_no * ROLES : (round_no + 1) * ROLES]
            news = history[(round_no - 1) * ROLES : round_no * ROLES] if round_no else [history[0]] * ROLES
            columns = {
                "round": [round_no + 1] * len(said),
                "message_id": [m.id for m in said],
                "role": [m.sent_from for m in said],
                "cause_by": [m.cause_by for m in said],
                "send_to": [sorted(m.send_to) for m in said],
                "content": [m.content for m in said],
            }
            if how == "turns":  # and each message's turn as the log's steps: observe (the news), think, act
                columns["kind"] = ["observe", "think", "act"] * len(said)
                columns["step_role"] = [m.sent_from for m in said for _ in range(3)]
                columns["detail"] = [d for m, n in zip(said, news, strict=True) for d in ([n.id], [m.cause_by], [m.id])]
            if how == "arrow":
                batch = pa.record_batch(columns)
                writer = writer or ipc.new_stream(file, batch.schema)
                writer.write_batch(batch)
            else:
                file.write(orjson.dumps(columns) + b"\n")
            file.flush()
            if how == "fsync":
                os.fsync(file.fileno())
    return time.perf_counter() - start


async def rounds(
    env: Environment,
    log: EventLog | None,
    checkpoints: CheckpointWriter | None,
    every: int | None,
    batches: RoundBatches | None = None,
) -> None:
    async with env.session():  # as Team.run runs its rounds: workers kept, the heap settled after each round
        for _ in range(ROUNDS):
            await one_round(env, log, checkpoints, every)
            if batches is not None:
                batches.write()


async def one_round(
    env: Environment, log: EventLog | None, checkpoints: CheckpointWriter | None, every: int | None
) -> None:
    """A round, then its recording as a Team does it: events, then the checkpoint (when due), last."""
    await env.run_round()
    due = checkpoints is not None and env.round % (every or 1) == 0
    if log is not None:
        log.round_done(sync=not due)  # as a Team logs: a checkpoint due syncs the log with its own file
    if checkpoints is not None:
        checkpoints.note(env)  # every round: the turns and deliveries the next delta replays
        if due:
            checkpoints.write(env, after=log.unsynced() if log is not None else ())


async def main() -> None:
    values: dict[str, list[float]] = {mode: [] for mode in MODES}
    floors: list[float] = []
    for mode in MODES:
        await run(mode)
    otel_sdk_floor()
    said = await ring_history()
    records: dict[str, list[float]] = {how: [] for how in ("json", "turns", "arrow", "fsync")}
    snapshots: list[float] = []
    for _ in range(REPEATS):
        for mode in MODES:
            gc.collect()
            values[mode].append(await run(mode))
        gc.collect()
        floors.append(otel_sdk_floor())
        for how, seconds in records.items():
            seconds.append(record_floor(said, how))
        snapshots.append(await full_snapshot())
    for mode, runs in values.items():
        slowdown = statistics.median(1 - v / off for v, off in zip(runs, values["off"], strict=True))
        line = {
            "figure": f"ring_{mode}",
            "value": round(statistics.median(runs)),
            "unit": "msgs/s",
            "slowdown": round(slowdown, 3),
            "params": {"roles": ROLES, "rounds": ROUNDS},
        }
        print(json.dumps(line), flush=True)
    off_s = [ROLES * ROUNDS / v for v in values["off"]]  # the untraced ring's seconds, repetition by repetition
    floor = statistics.median(sdk / (sdk + off) for sdk, off in zip(floors, off_s, strict=True))
    line = {"figure": "otel_sdk_floor", "value": round(statistics.median(floors) / (ROLES * ROUNDS) * 1e6, 2)}
    line |= {"unit": "us/msg", "slowdown": round(floor, 3), "params": {"roles": ROLES, "rounds": ROUNDS}}
    print(json.dumps(line), flush=True)
    otel_s = [ROLES * ROUNDS / v for v in values["otel"]]
    over = statistics.median((on - off) / sdk for on, off, sdk in zip(otel_s, off_s, floors, strict=True))
    line = {"figure": "otel_over_sdk_floor", "value": round(over, 3), "unit": "x", "goal": 1.2}
    line["params"] = {"roles": ROLES, "rounds": ROUNDS}  # what tracing the ring costs, over the SDK's own floor
    print(json.dumps(line), flush=True)
    for how, seconds in records.items():  # each against the untraced ring's time, repetition by repetition
        floor = statistics.median(rec / (rec + off) for rec, off in zip(seconds, off_s, strict=True))
        line = {"figure": f"record_floor_{how}", "value": round(statistics.median(seconds) / (ROLES * ROUNDS) * 1e6, 2)}
        line |= {"unit": "us/msg", "slowdown": round(floor, 3), "params": {"roles": ROLES, "rounds": ROUNDS}}
        print(json.dumps(line), flush=True)
    line = {"figure": "full_snapshot", "value": round(statistics.median(snapshots) / ROLES * 1e6, 2), "unit": "us/role"}
    print(json.dumps(line | {"params": {"roles": ROLES}}), flush=True)  # what a full snapshot (every 25th) costs a role


async def full_snapshot() -> float:
    """Seconds the ring's third checkpoint takes as a full snapshot (``every=1``): every role's entry, whole."""
    env = ring_env(ROLES)
    writer = CheckpointWriter(Path(tempfile.mkdtemp()), every=1)
    took = 0.0
    async with env.session():
        for _ in range(3):
            await env.run_round()
            writer.note(env)  # the round's turns and rows taken in, as every round: the snapshot is what is timed
            start = time.perf_counter()
            writer.write(env)
            took = time.perf_counter() - start
    return took


async def ring_history() -> list[Message]:
    """The messages the ring publishes in its ``ROUNDS`` rounds (the seed left out)."""
    env = ring_env(ROLES)
    await env.run(ROUNDS)
    return list(env.history)[1:]


if __name__ == "__main__":
    anyio.run(main)
