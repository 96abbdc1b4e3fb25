"""The message-flow graph, derived from a run's event log (never a second source of truth).

- :func:`role_graph`: a ``MultiDiGraph`` of roles, one edge per delivery (sender → recipient)
  with the message id, its ``cause_by`` and round;
- :func:`causal_dag`: messages as nodes, an edge from each message a role had observed to each
  message it then published;
- renderers: Mermaid sequence diagram, GraphML, node-link JSON; plus a few metrics.

This module imports networkx (extra ``graph``); metaroles imports it only when asked.
"""

from __future__ import annotations

import io
import json
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import networkx as nx

from metaroles.core.files import write_atomic
from metaroles.record.eventlog import Event

HUMAN = "Human"
ALL = "<all>"
"""The node a large team's broadcasts are drawn to (see ``flow.plot.aggregate``)."""


def _publishes(events: Iterable[Event]) -> dict[str, Event]:
    return {e["message_id"]: e for e in events if e["kind"] == "publish"}


def _calls(events: Iterable[Event]) -> dict[tuple[int, str, str], dict[str, float]]:
    """Model calls summed per (round, role, action): what produced each message."""
    calls: dict[tuple[int, str, str], dict[str, float]] = {}
    for event in events:
        if event["kind"] == "llm_call":
            key = (event["round"], event.get("role", ""), event.get("action", ""))
            total = calls.setdefault(key, {"tokens": 0, "cost": 0.0, "latency_s": 0.0})
            for field in total:
                total[field] += event.get(field, 0)
    return calls


def role_graph(events: list[Event]) -> nx.MultiDiGraph:
    """Roles as nodes, one edge per delivery, sender → recipient (and per agent tool call and result).

    Each edge carries the message id, its ``cause_by`` and round, and the tokens, cost and
    latency of the model calls that produced the message (its sender's calls for that action in
    that round).
    """
    published = _publishes(events)
    calls = _calls(events)
    graph = nx.MultiDiGraph()
    for event in events:
        if event["kind"] in ("tool_call", "tool_result"):
            _add_tool_edge(graph, event)
            continue
        if event["kind"] != "deliver":
            continue
        source: Event = published.get(event["message_id"]) or {}
        sender = source.get("role") or HUMAN
        cause_by = source.get("cause_by", "")
        made_in = int(source["round"] if "round" in source else event["round"])
        key = (made_in, str(sender), str(cause_by).rpartition(".")[2])
        graph.add_edge(
            sender,
            event["role"],
            message_id=event["message_id"],
            cause_by=cause_by,
            round=event["round"],
            **calls.get(key, {"tokens": 0, "cost": 0.0, "latency_s": 0.0}),
        )
    return graph


def _add_tool_edge(graph: nx.MultiDiGraph, event: Event) -> None:
    """An agent's tool call (role → ``tool:NAME``) or its result (``tool:NAME`` → role)."""
    tool = f"tool:{event.get('tool', '?')}"
    ends = (event["role"], tool) if event["kind"] == "tool_call" else (tool, event["role"])
    graph.add_edge(
        *ends,
        message_id=event.get("call_id", ""),
        cause_by=event["kind"],
        round=event["round"],
        tokens=0,
        cost=0.0,
        latency_s=0.0,
    )


def causal_dag(events: list[Event]) -> nx.DiGraph:
    """Messages as nodes; an edge from each observed message to each message it led to."""
    dag = nx.DiGraph()
    for event in events:
        if event["kind"] != "publish":
            continue
        dag.add_node(event["message_id"], role=event.get("role") or HUMAN, round=event["round"])
        for cause in event.get("caused_by", []):
            dag.add_edge(cause, event["message_id"])
    return dag


def metrics(events: list[Event]) -> dict[str, Any]:
    """Messages and cost per edge, per-role degrees, the critical path (messages and rounds), dead letters."""
    graph = role_graph(events)
    dag = causal_dag(events)
    per_edge = Counter((a, b) for a, b in graph.edges())
    cost: Counter[tuple[str, str]] = Counter()
    for a, b, data in graph.edges(data=True):
        cost[(a, b)] += data["cost"]
    path = nx.dag_longest_path(dag) if dag.number_of_nodes() else []
    rounds = [dag.nodes[n].get("round", 0) for n in path if n in dag.nodes]
    return {
        "messages_per_edge": {f"{a} -> {b}": n for (a, b), n in sorted(per_edge.items())},
        "cost_per_edge": {f"{a} -> {b}": round(c, 10) for (a, b), c in sorted(cost.items())},
        "in_degree": dict(graph.in_degree()),
        "out_degree": dict(graph.out_degree()),
        "critical_path_messages": len(path),
        "critical_path_rounds": max(rounds) - min(rounds) + 1 if rounds else 0,
        "dead_letters": sum(e["kind"] == "dead_letter" for e in events),
    }


_MERMAID_NAME = re.compile(r"[^A-Za-z0-9_]")


def _participant(name: str) -> str:
    return _MERMAID_NAME.sub("_", name) or "anonymous"


def to_mermaid(events: list[Event], *, max_label: int = 40) -> str:
    """A Mermaid sequence diagram: one arrow per delivery, in log order, with rounds as notes."""
    published = _publishes(events)
    lines = ["sequenceDiagram"]
    current = None
    for event in events:
        if event["kind"] != "deliver":
            continue
        if event["round"] != current:
            current = event["round"]
            lines.append(f"    Note over {_participant(HUMAN)}: round {current}")
        source = published.get(event["message_id"], {})
        label = str(source.get("cause_by", "")).rpartition(".")[2][:max_label] or "message"
        lines.append(f"    {_participant(source.get('role') or HUMAN)}->>{_participant(event['role'])}: {label}")
    return "\n".join(lines) + "\n"


def write_graphml(events: list[Event], path: Path) -> Path:
    """Write the role graph as GraphML (atomically: a link at ``path`` is replaced, not followed)."""
    data = io.BytesIO()
    nx.write_graphml(role_graph(events), data)
    return write_atomic(path, data.getvalue(), durable=False)


def to_json(events: list[Event]) -> str:
    """The role graph and the causal DAG as node-link JSON."""
    data = {
        "roles": nx.node_link_data(role_graph(events), edges="edges"),
        "causal": nx.node_link_data(causal_dag(events), edges="edges"),
        "metrics": metrics(events),
    }
    return json.dumps(data, indent=1, default=str)
