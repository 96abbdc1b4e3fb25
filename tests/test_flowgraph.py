"""The event log of a run, and the message-flow graph derived from it."""

import json
import re

import networkx as nx
import pytest

from metaroles import Action, Environment, Message, Role, TestLLM
from metaroles.cli import main
from metaroles.flow.graph import causal_dag, metrics, role_graph, to_json, to_mermaid, write_graphml
from metaroles.project.scenario import run_scenario
from metaroles.record.eventlog import read_events


@pytest.fixture
async def run_dir(tmp_path):
    folder = tmp_path / "run"
    await run_scenario("debate", llm=TestLLM(2), options={"turns": 2}, out_dir=folder)
    return folder


async def test_the_event_log_records_rounds_publishes_deliveries_and_model_calls(run_dir):
    events = read_events(run_dir / "events.jsonl")
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    kinds = {e["kind"] for e in events}
    assert {"round_start", "publish", "deliver", "llm_call", "round_end"} <= kinds
    publishes = [e for e in events if e["kind"] == "publish"]
    assert [e["role"] for e in publishes] == ["Human", "Alice", "Bob", "Alice", "Bob", "Judge"]
    bob = publishes[2]
    assert bob["caused_by"] == [publishes[1]["message_id"]], "Bob answered what Alice said"
    assert sum(e["kind"] == "llm_call" for e in events) == 5
    assert all(e["round"] == 0 for e in events if e["kind"] == "publish" and e["role"] == "Human")


async def test_each_turn_logs_what_the_role_observed_chose_and_produced(run_dir):
    events = read_events(run_dir / "events.jsonl")
    publishes = {e["message_id"]: e for e in events if e["kind"] == "publish"}
    acts = [e for e in events if e["kind"] == "act" and e["message_id"]]
    assert [publishes[e["message_id"]]["role"] for e in acts] == ["Alice", "Bob", "Alice", "Bob", "Judge"]
    for act in acts:
        turn = [
            e for e in events if e["round"] == act["round"] and e.get("role") == act["role"] and e["seq"] < act["seq"]
        ]
        observe, think = turn[-2], turn[-1]
        assert (observe["kind"], think["kind"]) == ("observe", "think")
        assert think["action"] == publishes[act["message_id"]]["cause_by"]
        assert observe["message_ids"] == publishes[act["message_id"]]["caused_by"]


async def test_role_graph_edges_equal_deliveries_and_the_causal_graph_is_acyclic(run_dir):
    events = read_events(run_dir / "events.jsonl")
    graph = role_graph(events)
    assert graph.number_of_edges() == sum(e["kind"] == "deliver" for e in events)
    assert graph.number_of_edges("Alice", "Bob") == 2 and graph.number_of_edges("Alice", "Judge") == 2
    dag = causal_dag(events)
    assert nx.is_directed_acyclic_graph(dag)
    summary = metrics(events)
    assert summary["messages_per_edge"]["Alice -> Bob"] == 2 and summary["dead_letters"] == 0
    assert summary["critical_path_messages"] >= 5
    assert summary["critical_path_rounds"] == 6, "idea in round 0, four speeches in rounds 1-4, the verdict in 5"


async def test_edges_carry_the_cost_of_the_call_that_produced_their_message(tmp_path):
    folder = tmp_path / "priced"
    await run_scenario("debate", llm=TestLLM(2, cost_per_token=0.001), options={"turns": 2}, out_dir=folder)
    events = read_events(folder / "events.jsonl")
    ledger = json.loads((folder / "ledger.json").read_text())
    alice = sum(e["cost"] for e in ledger if e["role"] == "Alice")
    tokens = sum(e["prompt_tokens"] + e["completion_tokens"] for e in ledger if e["role"] == "Alice")
    assert alice > 0
    to_bob = [d for a, b, d in role_graph(events).edges(data=True) if (a, b) == ("Alice", "Bob")]
    assert len(to_bob) == 2 and sum(d["tokens"] for d in to_bob) == tokens
    assert metrics(events)["cost_per_edge"]["Alice -> Bob"] == pytest.approx(alice)


async def test_renderers_produce_valid_files(run_dir, tmp_path):
    events = read_events(run_dir / "events.jsonl")
    mermaid = to_mermaid(events)
    lines = mermaid.splitlines()
    assert lines[0] == "sequenceDiagram"
    grammar = re.compile(r"^    (Note over \w+: round \d+|\w+->>\w+: [\w.]+)$")
    assert all(grammar.match(line) for line in lines[1:]), [line for line in lines[1:] if not grammar.match(line)]
    path = write_graphml(events, tmp_path / "flow.graphml")
    again = nx.read_graphml(path)
    assert again.number_of_edges() == role_graph(events).number_of_edges()
    data = json.loads(to_json(events))
    assert {"roles", "causal", "metrics"} <= set(data)


async def test_a_torn_last_line_is_skipped_with_a_warning(run_dir):
    path = run_dir / "events.jsonl"
    whole = read_events(path)
    with path.open("a") as handle:
        handle.write('{"seq": 999, "kind": "publ')
    with pytest.warns(UserWarning, match="the last line is torn"):
        assert read_events(path) == whole


async def test_cli_graph_prints_mermaid_and_writes_graphml(run_dir, capsys):
    assert main(["graph", str(run_dir)]) == 0
    assert capsys.readouterr().out.startswith("sequenceDiagram\n")
    assert main(["graph", str(run_dir), "--format", "graphml"]) == 0
    assert (run_dir / "flow.graphml").exists()
    assert main(["graph", str(run_dir.parent / "missing")]) == 2
    assert "no run directory at" in capsys.readouterr().err


class Echo(Action):
    async def run(self, history):
        return "echo"


async def test_a_folded_log_reads_as_the_same_events_in_a_fraction_of_the_bytes(tmp_path):
    from metaroles.record.eventlog import EventLog

    env = Environment()
    names = [f"n{i}" for i in range(12)]
    for i, name in enumerate(names):  # each speaks to its two neighbours once it hears anything
        env.add_role(
            Role(
                name=name,
                actions=[Echo],
                watch=[Echo, "metaroles.bus.action.UserRequirement"],
                send_to={names[i - 1], names[(i + 1) % 12]},
            )
        )
    folded = EventLog(tmp_path / "folded.jsonl", env, turns=False)
    lines = EventLog(tmp_path / "lines.jsonl", env, turns=False, folded=False)
    env.publish_message(Message("start"))
    for log in (folded, lines):
        log.round_done()
    for _ in range(3):
        await env.run_round()
        for log in (folded, lines):
            log.round_done()
    events = read_events(tmp_path / "lines.jsonl")
    assert read_events(tmp_path / "folded.jsonl") == events
    assert sum(e["kind"] == "deliver" for e in events) == 12 + 3 * 12 * 2
    a_line_each = sum(len(json.dumps(e, separators=(",", ":"))) + 1 for e in events)  # format 1's bytes
    assert (tmp_path / "folded.jsonl").stat().st_size < 0.6 * a_line_each
    assert '"deliver"' not in (tmp_path / "folded.jsonl").read_text()
