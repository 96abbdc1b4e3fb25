"""OpenTelemetry: a run is one trace of rounds, turns, model calls and the bus's messages."""

import gzip
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from metaroles import TestLLM
from metaroles.project.scenario import run_scenario
from metaroles.record.eventlog import read_events
from metaroles.team.options import RunOptions
from metaroles.telemetry.spans import SPANS, events_from_spans, read_spans
from metaroles.telemetry.tracing import CAPTURE_CONTENT

EXPORTER = InMemorySpanExporter()
READER = InMemoryMetricReader()


@pytest.fixture
def spans():
    """The global provider (a user's own) with an in-memory exporter: set once per process, emptied per test."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[READER]))
    READER.get_metrics_data()  # what earlier tests recorded is read out (cumulative: compared as differences)
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def otel_run(out, env):
    """``metaroles run debate --llm test --otel`` in a fresh process with ``env``."""
    command = [sys.executable, "-m", "metaroles", "run", "debate", "--llm", "test", "--otel", "-q", "--out", str(out)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)


def by_name(finished, prefix):
    return [s for s in finished if s.name.startswith(prefix)]


async def test_a_debate_is_one_trace_of_rounds_turns_calls_and_messages(spans, tmp_path, monkeypatch):
    monkeypatch.delenv(CAPTURE_CONTENT, raising=False)
    out = tmp_path / "debate-run"
    _, team = await run_scenario("debate", llm=TestLLM(2), options={"turns": 2}, out_dir=out, run=RunOptions(otel=True))
    finished = spans.get_finished_spans()
    ids = {s.context.span_id: s for s in finished}
    assert len({s.context.trace_id for s in finished}) == 1, "one trace per run"
    (root,) = by_name(finished, "invoke_workflow ")
    assert root.name == "invoke_workflow debate" and root.parent is None
    assert root.attributes["gen_ai.conversation.id"] == "debate-run"
    rounds = by_name(finished, "round ")
    assert [s.attributes["metaroles.round"] for s in rounds] == list(range(1, team.env.round + 1))
    assert all(s.parent.span_id == root.context.span_id for s in rounds)

    agents = by_name(finished, "invoke_agent ")
    assert agents and all(ids[s.parent.span_id].name.startswith("round ") for s in agents)
    assert {s.attributes["gen_ai.agent.name"] for s in agents} == {r.name for r in team.env.roles.values()}

    chats = by_name(finished, "chat ")
    entries = team.env.ledger.entries
    assert len(chats) == len(entries) > 0
    for span, entry in zip(sorted(chats, key=lambda s: s.start_time), entries, strict=True):
        parent = ids[span.parent.span_id]
        assert span.kind is SpanKind.CLIENT and parent.name == f"invoke_agent {entry.role}"
        assert span.attributes["gen_ai.operation.name"] == "chat"
        assert span.attributes["gen_ai.provider.name"] == "metaroles"
        assert span.attributes["gen_ai.agent.name"] == entry.role
        assert span.attributes["gen_ai.response.model"] == entry.model
        assert span.attributes["gen_ai.usage.input_tokens"] == entry.prompt_tokens
        assert span.attributes["gen_ai.usage.output_tokens"] == entry.completion_tokens
        assert tuple(span.attributes["gen_ai.response.finish_reasons"]) == ("stop",)
        assert span.attributes["gen_ai.conversation.id"] == "debate-run"
        assert "gen_ai.input.messages" not in span.attributes, "no content unless asked for"
        assert "gen_ai.output.messages" not in span.attributes

    sends = by_name(finished, "send ")
    history = list(team.env.history)
    assert sorted(s.attributes["messaging.message.id"] for s in sends) == sorted(m.id for m in history)
    sent = {s.attributes["messaging.message.id"]: s for s in sends}
    for message in history:
        span = sent[message.id]
        assert span.kind is SpanKind.PRODUCER and span.attributes["messaging.system"] == "metaroles"
        assert span.attributes["metaroles.cause_by"] == message.cause_by
        assert span.attributes["metaroles.sent_from"] == message.sent_from
        assert list(span.attributes["metaroles.send_to"]) == sorted(message.send_to)

    processes = by_name(finished, "process ")
    observed = [
        (e["role"], m) for e in read_events(out / "events.jsonl") if e["kind"] == "observe" for m in e["message_ids"]
    ]
    got = [(s.attributes["metaroles.recipient"], s.attributes["messaging.message.id"]) for s in processes]
    assert sorted(got) == sorted(observed) and observed
    for span in processes:
        (link,) = span.links
        assert span.kind is SpanKind.CONSUMER
        assert link.context.span_id == sent[span.attributes["messaging.message.id"]].context.span_id
    assert not (out / SPANS).exists(), "the user's provider received the spans"


async def test_content_is_captured_only_when_asked(spans, monkeypatch):
    monkeypatch.setenv(CAPTURE_CONTENT, "true")
    run = RunOptions(otel=True)
    _, team = await run_scenario("debate", llm=TestLLM(2), options={"turns": 1}, out_dir=None, run=run)
    chats = by_name(spans.get_finished_spans(), "chat ")
    assert chats
    for span in chats:
        asked = json.loads(span.attributes["gen_ai.input.messages"])
        answered = json.loads(span.attributes["gen_ai.output.messages"])
        assert asked[-1]["role"] == "user" and asked[-1]["content"]
        assert answered[0]["role"] == "assistant" and answered[0]["content"]
    contents = {m.content for m in team.env.history}
    answers = [json.loads(s.attributes["gen_ai.output.messages"])[0]["content"] for s in chats]
    speeches = [a for a in answers if not a.startswith("{")]  # the judge's JSON verdict is re-serialised
    assert speeches and set(speeches) <= contents


async def test_without_telemetry_nothing_is_traced_and_no_hook_is_set(spans):
    _, team = await run_scenario("debate", llm=TestLLM(2), options={"turns": 1}, out_dir=None)
    assert spans.get_finished_spans() == ()
    assert team.env.observer is None and team.env.ledger.observer is None


def test_cli_otel_without_a_provider_or_endpoint_writes_spans_into_the_run_directory(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = tmp_path / "run"
    done = otel_run(out, env)
    assert done.returncode == 0, done.stderr
    lines = read_spans(out / SPANS)
    assert len({s["context"]["trace_id"] for s in lines}) == 1
    names = [s["name"] for s in lines]
    assert "invoke_workflow debate" in names and "round 1" in names
    ledger = json.loads((out / "ledger.json").read_text())
    calls = ledger["entries"] if isinstance(ledger, dict) else ledger
    assert sum(n.startswith("chat ") for n in names) == len(calls) > 0


class Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP trace receiver: decodes each protobuf request and keeps its spans."""

    spans: ClassVar[list] = []
    metrics: ClassVar[list] = []

    def do_POST(self):
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
            ExportMetricsServiceRequest,
            ExportMetricsServiceResponse,
        )
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path not in ("/v1/traces", "/v1/metrics"):
            self.send_error(404)  # not retried: the exporter gives up at once
            return
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path == "/v1/traces":
            request, answer = ExportTraceServiceRequest(), ExportTraceServiceResponse().SerializeToString()
            request.ParseFromString(body)
            Receiver.spans.extend(s for r in request.resource_spans for sc in r.scope_spans for s in sc.spans)
        else:
            request, answer = ExportMetricsServiceRequest(), ExportMetricsServiceResponse().SerializeToString()
            request.ParseFromString(body)
            Receiver.metrics.extend(
                m.name for r in request.resource_metrics for sc in r.scope_metrics for m in sc.metrics
            )
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


def test_a_real_otlp_http_export_reaches_a_receiver_on_loopback(tmp_path):
    Receiver.spans, Receiver.metrics = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{server.server_address[1]}"
        out = tmp_path / "run"
        command = [
            sys.executable,
            "-m",
            "metaroles",
            "run",
            "debate",
            "--llm",
            "test",
            "--otel",
            "-q",
            "--out",
            str(out),
        ]
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
    finally:
        server.shutdown()
        thread.join()
    names = [span.name for span in Receiver.spans]
    events = read_events(out / "events.jsonl")
    assert names.count("invoke_workflow debate") == 1
    assert sum(n.startswith("send ") for n in names) == sum(e["kind"] == "publish" for e in events)
    assert sum(n.startswith("chat ") for n in names) == sum(e["kind"] == "llm_call" for e in events) > 0
    assert sum(n.startswith("round ") for n in names) == max(e["round"] for e in events)
    assert not (out / SPANS).exists(), "exported, not written beside the run"
    assert len({span.trace_id for span in Receiver.spans}) == 1
    assert {"gen_ai.client.token.usage", "gen_ai.client.operation.duration", "metaroles.deliveries"} <= set(
        Receiver.metrics
    )


def edges(graph):
    rows = [
        (u, v, sorted((k, round(x, 9) if isinstance(x, float) else x) for k, x in d.items()))
        for u, v, d in graph.edges(data=True)
    ]
    return sorted(rows, key=repr)


@pytest.mark.parametrize("scenario,options", [("debate", {"turns": 3}), ("software_company", {})])
async def test_the_graph_from_spans_equals_the_graph_from_the_event_log(spans, tmp_path, scenario, options):
    from metaroles.flow.graph import causal_dag, metrics, role_graph

    out = tmp_path / "run"
    llm = TestLLM(2, cost_per_token=0.001)
    await run_scenario(scenario, llm=llm, options=options, out_dir=out, run=RunOptions(otel=True))
    logged = read_events(out / "events.jsonl")
    told = events_from_spans([json.loads(span.to_json()) for span in spans.get_finished_spans()])
    from_log, from_spans = role_graph(logged), role_graph(told)
    assert from_log.number_of_edges() == from_spans.number_of_edges() > 0
    assert edges(from_spans) == edges(from_log), "edges, counts, tokens, cost and latency"
    assert sum(d["cost"] for *_, d in from_spans.edges(data=True)) > 0
    assert sorted(causal_dag(told).edges) == sorted(causal_dag(logged).edges)
    assert metrics(told) == metrics(logged)


def test_cli_graph_from_spans_draws_what_the_event_log_draws(tmp_path, capsys):
    from metaroles.cli import main

    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = tmp_path / "run"
    assert otel_run(out, env).returncode == 0
    assert main(["graph", str(out), "--format", "json"]) == 0
    logged = capsys.readouterr().out
    assert main(["graph", str(out), "--format", "json", "--from-spans"]) == 0
    assert capsys.readouterr().out == logged and logged
    (out / SPANS).write_text('{"name": "x", "attributes": {}}\nnot json\n')
    assert main(["graph", str(out), "--from-spans"]) == 2
    assert "line 2 is not a span" in capsys.readouterr().err


def points(name):
    """name -> the data points of that metric, read now (cumulative since the process set the provider)."""
    data = READER.get_metrics_data()
    if data is None:  # nothing recorded yet in this process (this test ran first on its worker)
        return []
    return [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


def totals():
    tokens = {p.attributes["gen_ai.token.type"]: p.sum for p in points("gen_ai.client.token.usage")}
    calls = sum(p.count for p in points("gen_ai.client.operation.duration"))
    rounds = sum(p.count for p in points("metaroles.round.duration"))
    deliveries = sum(p.value for p in points("metaroles.deliveries"))
    return tokens.get("input", 0), tokens.get("output", 0), calls, rounds, deliveries


def new_totals():
    """The current conventions' token counters and per-call histogram, read now."""
    usage = "gen_ai.client.inference.usage."
    spent = [sum(p.value for p in points(usage + kind)) for kind in ("input_tokens", "output_tokens")]
    return (*spent, sum(p.count for p in points("gen_ai.client.inference.operation.output_tokens")))


async def test_metrics_count_tokens_calls_rounds_and_deliveries(spans, tmp_path):
    before, new_before = totals(), new_totals()
    out = tmp_path / "run"
    _, team = await run_scenario("debate", llm=TestLLM(2), options={"turns": 2}, out_dir=out, run=RunOptions(otel=True))
    after = totals()
    grown = [a - b for a, b in zip(after, before, strict=True)]
    entries, events = team.env.ledger.entries, read_events(out / "events.jsonl")
    assert grown[0] == sum(e.prompt_tokens for e in entries) > 0
    assert grown[1] == sum(e.completion_tokens for e in entries) > 0
    assert grown[2] == len(entries)
    assert grown[3] == team.env.round
    assert grown[4] == sum(e["kind"] == "deliver" for e in events) > 0
    now = new_totals()
    assert [a - b for a, b in zip(now, new_before, strict=True)] == [grown[0], grown[1], len(entries)], "new ones too"


async def test_a_tool_calling_agent_traces_its_tool_calls_under_its_turn(spans, tmp_path, monkeypatch):
    from metaroles import FunctionLLM, Role, Team
    from metaroles.agents.agent_role import AgentRole
    from metaroles.telemetry.tracing import traced
    from tests.test_agent_role import COMPUTE, DONE, Coder, Review, coder

    monkeypatch.delenv(CAPTURE_CONTENT, raising=False)
    agent = coder(tmp_path, COMPUTE, DONE)
    reviewer = Role(name="Reviewer", actions=[Review], watch=[Coder.action_id()], send_to="Human")
    team = Team(llm=FunctionLLM(lambda request: "unused"))
    team.hire([AgentRole(agent, send_to="Reviewer"), reviewer, Role(name="Human", watch=[Review])])
    with traced(team.env, scenario="agents", run_id="agents-1"):
        await team.run(4, idea="What is 6 * 7?", send_to="coder", events=tmp_path / "events.jsonl")
    finished = spans.get_finished_spans()
    ids = {s.context.span_id: s for s in finished}
    tools = by_name(finished, "execute_tool ")
    assert [s.attributes["gen_ai.tool.name"] for s in sorted(tools, key=lambda s: s.start_time)] == [
        "python_execute",
        "terminate",
    ]
    logged = [e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "tool_call"]
    assert sorted(s.attributes["gen_ai.tool.call.id"] for s in tools) == sorted(e["call_id"] for e in logged)
    for span in tools:
        assert ids[span.parent.span_id].name == "invoke_agent coder"
        assert span.attributes["gen_ai.operation.name"] == "execute_tool"
        assert "gen_ai.tool.call.arguments" not in span.attributes and span.status.is_ok
    chats = by_name(finished, "chat ")
    assert {ids[s.parent.span_id].name for s in chats} == {"invoke_agent coder"}
    assert len(chats) == len(team.env.ledger.entries) == 2, "the agent's two calls are the run's"


async def test_long_term_memory_traces_its_embeddings_and_retrievals_under_the_turn(spans, tmp_path):
    from metaroles import Environment, Message
    from metaroles.telemetry.tracing import traced
    from tests.test_long_term import archivist

    env = Environment()
    role = archivist(tmp_path, similarity_threshold=0.95)
    env.add_role(role)
    env.publish_message(Message("the bridge is closed for repairs"))
    with traced(env, scenario="archive", run_id="a-1"):
        await env.run(1)
        env.publish_message(Message("The bridge is closed for repairs!"))  # checked against what is known
        await env.run(1)
    finished = spans.get_finished_spans()
    ids = {s.context.span_id: s for s in finished}
    embedded = by_name(finished, "embeddings ")
    retrieved = by_name(finished, "retrieval")
    assert embedded and retrieved
    for span in embedded + retrieved:
        assert ids[span.parent.span_id].name == "invoke_agent archivist"
        assert span.attributes["gen_ai.agent.name"] == "archivist"
    assert embedded[0].attributes["gen_ai.request.model"] == role.rc.memory.memory_storage.embedding.name
    assert role.rc.memory.memory_storage.observer is None, "unhooked when the trace ends"


def test_cli_otel_without_the_extra_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    from metaroles.cli import main

    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as if the otel extra were not installed
    out = tmp_path / "run"
    assert main(["run", "debate", "--llm", "test", "-q", "--otel", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "pip install 'metaroles[otel]'" in err and len(err.strip().splitlines()) == 1 and "bug" not in err
    assert not out.exists(), "nothing written before the option was checked"


# -- a run's trace after the fact: metaroles export RUN --otlp -------------------------------------

KINDS = {1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
KINDS = {number: f"SpanKind.{name}" for number, name in KINDS.items()}


def any_value(value):
    """An OTLP ``AnyValue`` as Python (arrays as tuples)."""
    which = value.WhichOneof("value")
    if which == "array_value":
        return tuple(any_value(v) for v in value.array_value.values)
    return getattr(value, which)


def tree(spans):
    """Each span as (its names from the root, kind, attributes, the message ids of its links), sorted.

    ``spans``: (span id, parent id, name, kind, attributes, linked span ids) — the same for live
    SDK spans and for decoded OTLP ones; ids only place a span in the tree.
    """
    by_id = {s[0]: s for s in spans}
    rows = []
    for _, parent, name, kind, attributes, links in spans:
        path, up = [name], parent
        while up:
            path.append(by_id[up][2])
            up = by_id[up][1]
        linked = sorted(by_id[link][4]["messaging.message.id"] for link in links)
        rows.append((tuple(reversed(path)), kind, sorted(attributes.items()), linked))
    return sorted(rows, key=repr)


def live_rows(finished):
    return [
        (
            s.context.span_id,
            s.parent.span_id if s.parent else None,
            s.name,
            str(s.kind),
            {k: tuple(v) if isinstance(v, tuple | list) else v for k, v in s.attributes.items()},
            [link.context.span_id for link in s.links],
        )
        for s in finished
    ]


def received_rows(received):
    return [
        (
            s.span_id,
            s.parent_span_id or None,
            s.name,
            KINDS[s.kind],
            {a.key: any_value(a.value) for a in s.attributes},
            [link.span_id for link in s.links],
        )
        for s in received
    ]


@pytest.fixture
def receiver():
    """A real OTLP/HTTP receiver on loopback (protobuf, decoded by opentelemetry-proto); its URL."""
    Receiver.spans, Receiver.metrics = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()
    server.server_close()


@pytest.mark.parametrize(
    "scenario,options,log_turns",
    [("society", {"agents": 12, "llm_agents": 5, "rounds": 3}, False), ("debate", {"turns": 3}, True)],
)
async def test_export_otlp_makes_the_live_span_tree_from_the_record(
    spans, receiver, tmp_path, monkeypatch, capsys, scenario, options, log_turns
):
    from metaroles.cli import main
    from metaroles.record.eventread import read_timings

    monkeypatch.delenv(CAPTURE_CONTENT, raising=False)
    out = tmp_path / "run"
    run = RunOptions(otel=True, log_turns=log_turns)
    await run_scenario(scenario, llm=TestLLM(3, cost_per_token=0.001), options=options, out_dir=out, run=run)
    live = tree(live_rows(spans.get_finished_spans()))
    assert main(["export", str(out), "--otlp", receiver]) == 0
    assert capsys.readouterr().out.strip() == f"exported {len(live)} spans of {out} to {receiver}/v1/traces"
    exported = tree(received_rows(Receiver.spans))
    assert exported == live, "names, parents, kinds, attributes and links: the live tree"
    assert {row[0][-1].split()[0] for row in live} >= {"invoke_workflow", "round", "invoke_agent", "chat", "send"}

    timings = read_timings(out / "events.jsonl")
    rounds = {t["round"]: (t["start_ns"], t["end_ns"]) for t in timings if "start_ns" in t}
    for span in Receiver.spans:
        if span.name.startswith("round "):
            assert (span.start_time_unix_nano, span.end_time_unix_nano) == rounds[int(span.name.split()[1])]
    ends = sorted(t["end_ns"] for t in timings if "latency_s" in t)
    chats = [s for s in Receiver.spans if s.name.startswith("chat ")]
    assert sorted(s.end_time_unix_nano for s in chats) == ends, "each call ends when its answer came"
    for span in chats:
        latency = next(a.value.double_value for a in span.attributes if a.key == "metaroles.latency_s")
        assert span.end_time_unix_nano - span.start_time_unix_nano == int(latency * 1e9)


async def test_export_otlp_of_a_run_recorded_without_tracing_equals_a_traced_twin(spans, receiver, tmp_path, capsys):
    """Same seed, same answers: the untraced run's exported tree is the traced run's, clock readings aside."""
    from metaroles.cli import main

    options = {"agents": 10, "llm_agents": 4, "rounds": 2}
    traced_out, plain_out = tmp_path / "run", tmp_path / "twin" / "run"
    traced = RunOptions(otel=True, seed=4)
    await run_scenario("society", llm=TestLLM(5), options=options, out_dir=traced_out, run=traced)
    live = live_rows(spans.get_finished_spans())
    await run_scenario("society", llm=TestLLM(5), options=options, out_dir=plain_out, run=RunOptions(seed=4))
    assert not (plain_out / SPANS).exists()
    assert main(["export", str(plain_out), "--otlp", receiver]) == 0
    clockless = [(*row[:4], {k: v for k, v in row[4].items() if k != "metaroles.latency_s"}, row[5]) for row in live]
    exported = received_rows(Receiver.spans)
    exported = [(*row[:4], {k: v for k, v in row[4].items() if k != "metaroles.latency_s"}, row[5]) for row in exported]
    assert tree(exported) == tree(clockless)


def test_export_otlp_to_a_collector_that_refuses_is_one_line_and_exit_1(tmp_path, capsys, receiver):
    from metaroles.cli import main

    out = tmp_path / "run"
    assert main(["run", "society", "--llm", "test", "--set", "agents=6", "--rounds", "2", "-q", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["export", str(out), "--otlp", f"{receiver}/v1/nowhere"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{receiver}/v1/nowhere" in err[0] and "0 of" in err[0], err
    assert main(["export", str(tmp_path / "missing"), "--otlp", receiver]) == 2
    assert "missing" in capsys.readouterr().err


def test_export_otlp_names_a_bad_url_and_never_prints_a_password(tmp_path, capsys, receiver):
    from metaroles.cli import main

    out = tmp_path / "run"
    assert main(["run", "society", "--llm", "test", "--set", "agents=6", "--rounds", "2", "-q", "--out", str(out)]) == 0
    capsys.readouterr()
    for endpoint, said in (
        ("http://[::1", "is not a URL"),
        ("ftp://host", "is not an http(s) URL"),
        ("http://h:x", "is not a URL"),
    ):
        assert main(["export", str(out), "--otlp", endpoint]) == 2
        err = capsys.readouterr().err
        assert said in err and "a metaroles bug" not in err and len(err.strip().splitlines()) == 1, err
    with_password = receiver.replace("http://", "http://user:s3cret-PW@") + "/v1/nowhere"
    assert main(["export", str(out), "--otlp", with_password]) == 1
    captured = capsys.readouterr()
    assert "s3cret-PW" not in captured.err + captured.out and "***@" in captured.err


async def test_mcp_and_a2a_calls_are_client_spans_of_the_conventions_and_carry_the_trace(spans, tmp_path):
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as genai
    from opentelemetry.semconv._incubating.attributes import mcp_attributes as mcp

    from metaroles.agents.a2a import A2AAgent, RoleServer
    from metaroles.agents.mcp import MCPClient
    from metaroles.project.scenario import built_team
    from tests.test_mcp import stdio

    tracer = trace.get_tracer("test")
    alice = built_team("debate", {}, TestLLM(3)).env.roles["Alice"]
    async with MCPClient([stdio()]) as client:
        with RoleServer(alice) as server:
            async with A2AAgent("Alice", server.url) as agent:
                with tracer.start_as_current_span("invoke_agent Bob") as turn:
                    said = (await client.call("notes", "traced", {})).output
                    answered = await agent.send("Should cities ban cars?")
    assert answered.output and answered.error is None
    finished = spans.get_finished_spans()
    (called,) = [s for s in finished if s.attributes.get(mcp.MCP_METHOD_NAME) == "tools/call"]  # the MCP SDK's
    (asked,) = [s for s in finished if s.name == "invoke_agent Alice"]  # ours, for the remote agent
    for span in (called, asked):
        assert span.kind is SpanKind.CLIENT and span.parent.span_id == turn.get_span_context().span_id
    context = called.get_span_context()
    assert said.startswith(f"00-{context.trace_id:032x}-{context.span_id:016x}-"), "the server got the call's span"
    assert asked.attributes[genai.GEN_AI_OPERATION_NAME] == genai.GenAiOperationNameValues.INVOKE_AGENT.value
    assert asked.attributes[genai.GEN_AI_AGENT_NAME] == "Alice" and asked.attributes["server.port"] > 0
    (serving,) = [s for s in finished if s.name.endswith("JsonRpcDispatcher.handle_requests")]  # the A2A SDK's
    assert serving.kind is SpanKind.SERVER and serving.parent is not None
    assert serving.context.trace_id == asked.context.trace_id, "the agent's server continued the caller's trace"
    assert serving.parent.span_id != turn.get_span_context().span_id, "under the request, not beside it"
