"""The role graph of a run as a picture (PNG or SVG) for papers, drawn with matplotlib.

Edges are aggregated per (sender, recipient): width by message count, colour by the action
that produced most of them (legend), curved so that replies do not hide requests. Node size
grows with messages sent. The layout is a circle up to 16 roles and a seeded spring layout
beyond, so the same run always gives the same picture. Imports matplotlib (extra ``graph``).
"""

from __future__ import annotations

import io
import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display here; renderers only ever write files
import matplotlib.pyplot as plt
import networkx as nx
from matplotlib.lines import Line2D

from metaroles.core.files import write_atomic
from metaroles.flow.graph import ALL, HUMAN, role_graph
from metaroles.record.eventlog import Event

ROLE_FILL, HUMAN_FILL, ALL_FILL = "#e8eef4", "#f4d35e", "#cfe8d5"
"""Node fills (the page's stylesheet uses the same)."""
PALETTE = ["#1b6ca8", "#d1495b", "#2e933c", "#edae49", "#7d4e9e", "#00798c", "#8d6a48", "#e07a5f", "#3d405b", "#81b29a"]
CIRCLE_UP_TO = 16


def aggregate(events: list[Event], multi: nx.MultiDiGraph | None = None) -> nx.DiGraph:
    """One edge per (sender, recipient) with ``count`` and ``actions`` (a Counter of cause_by names).

    Past :data:`CIRCLE_UP_TO` roles a broadcast is one edge to an ``<all>`` node, not one to every
    role: 100 agents that broadcast would otherwise draw 9,900 edges and nothing could be read.
    ``multi`` is the events' :func:`role_graph`, when the caller has it already.
    """
    multi = role_graph(events) if multi is None else multi
    graph = nx.DiGraph()
    graph.add_nodes_from(multi.nodes())
    actions: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for sender, recipient, data in flow_edges(events, multi):
        actions[(sender, recipient)][str(data["cause_by"]).rpartition(".")[2] or "message"] += 1
    for (sender, recipient), counts in actions.items():
        graph.add_edge(sender, recipient, count=sum(counts.values()), actions=counts)
    return graph


def flow_edges(events: list[Event], multi: nx.MultiDiGraph) -> list[tuple[str, str, dict[str, Any]]]:
    """The deliveries to draw: each one, or past :data:`CIRCLE_UP_TO` roles a broadcast once, to ``<all>``."""
    edges = list(multi.edges(data=True))
    if multi.number_of_nodes() <= CIRCLE_UP_TO:
        return edges
    broadcast = {e["message_id"] for e in events if e["kind"] == "publish" and ALL in e.get("send_to", ())}
    drawn: set[str] = set()
    kept = []
    for sender, recipient, data in edges:
        message = data["message_id"]
        if message not in broadcast:
            kept.append((sender, recipient, data))
        elif message not in drawn:
            drawn.add(message)
            kept.append((sender, ALL, data))
    return kept


def action_colours(graph: nx.DiGraph) -> dict[str, str]:
    """Action → colour, the most frequent first: the picture and the page use the very same."""
    totals: Counter[str] = Counter()
    for *_, data in graph.edges(data=True):
        totals.update(data["actions"])
    names = sorted(totals, key=lambda name: (-totals[name], name))
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


def layout(graph: nx.DiGraph) -> dict[Any, Any]:
    """Node positions: a circle for small teams (Human on top), a seeded spring layout for large ones."""
    nodes = sorted(graph.nodes(), key=lambda n: (n != HUMAN, str(n)))
    if len(nodes) <= CIRCLE_UP_TO:
        step = 2 * math.pi / max(len(nodes), 1)
        return {n: (math.cos(math.pi / 2 - i * step), math.sin(math.pi / 2 - i * step)) for i, n in enumerate(nodes)}
    return dict(nx.spring_layout(graph.to_undirected(), seed=7, k=2.5 / len(nodes) ** 0.5, iterations=200))


def render(events: list[Event], path: Path, *, title: str = "") -> Path:
    """Draw the run's role graph into ``path`` (PNG unless its name ends in ``.svg``), atomically."""
    figure = draw(events, title=title)
    data, kind = io.BytesIO(), "svg" if path.suffix == ".svg" else "png"
    figure.savefig(data, format=kind, dpi=200 if kind == "png" else None, bbox_inches="tight")
    plt.close(figure)
    return write_atomic(path, data.getvalue(), durable=False)


def draw(events: list[Event], *, title: str = "") -> Any:
    """The run's role graph as a matplotlib figure (the caller closes it); the legend sits beside the nodes."""
    graph = aggregate(events)
    positions = layout(graph)
    big = graph.number_of_nodes() > CIRCLE_UP_TO
    figure, axes = plt.subplots(figsize=(14, 10) if big else (10, 7))
    actions = action_colours(graph)
    sizes = _node_sizes(graph, big=big)
    _draw_edges(graph, positions, axes, actions, sizes)
    _draw_nodes(graph, positions, axes, sizes, big=big)
    if not big:  # message counts on the edges; at 50 roles they would only be noise
        counts = {(a, b): edge_label(d["actions"]) for a, b, d in graph.edges(data=True) if a != b}
        nx.draw_networkx_edge_labels(
            graph,
            positions,
            edge_labels=counts,
            connectionstyle="arc3,rad=0.12",
            font_size=9,
            ax=axes,
            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85},
        )
    _legend(graph, axes, actions)
    rounds = max((e["round"] for e in events), default=0)
    subtitle = f"{graph.number_of_nodes()} roles · {sum(d['count'] for *_, d in graph.edges(data=True))} deliveries"
    axes.set_title(f"{title}\n{subtitle} · {rounds} rounds" if title else f"{subtitle} · {rounds} rounds", fontsize=12)
    axes.set_axis_off()
    axes.margins(0.12)
    figure.tight_layout()
    return figure


def edge_label(actions: Counter[str]) -> str:
    """An edge's label: its message count, or per action when it carries several (``WriteCode 2 · WriteTest 1``)."""
    if len(actions) == 1:
        return str(sum(actions.values()))
    return " · ".join(
        f"{name} {count}" for name, count in sorted(actions.items(), key=lambda item: (-item[1], item[0]))
    )


def _width(count: int, most: int) -> float:
    return 0.8 + 5.2 * (count / most) ** 0.5 if most else 1.0


def _node_sizes(graph: nx.DiGraph, *, big: bool) -> dict[Any, float]:
    """Area per node: grows with the messages it sent."""
    sent = {node: sum(d["count"] for *_, d in graph.out_edges(node, data=True)) for node in graph.nodes()}
    most = max(sent.values(), default=1) or 1
    return {n: (120 if big else 2000) + (380 if big else 1400) * sent[n] / most for n in graph.nodes()}


def _draw_edges(
    graph: nx.DiGraph, positions: dict[Any, Any], axes: Any, colours: dict[str, str], sizes: dict[Any, float]
) -> None:
    most = max((d["count"] for *_, d in graph.edges(data=True)), default=1)
    for sender, recipient, data in graph.edges(data=True):
        if sender == recipient:
            continue
        action = data["actions"].most_common(1)[0][0]
        nx.draw_networkx_edges(
            graph,
            positions,
            edgelist=[(sender, recipient)],
            width=_width(data["count"], most),
            edge_color=colours[action],
            alpha=0.75,
            arrowsize=14 if sizes[sender] > 500 else 8,
            connectionstyle="arc3,rad=0.12",
            node_size=[sizes[sender], sizes[recipient]],
            nodelist=[sender, recipient],
            ax=axes,
        )


def _draw_nodes(graph: nx.DiGraph, positions: dict[Any, Any], axes: Any, sizes: dict[Any, float], *, big: bool) -> None:
    nodes = list(graph.nodes())
    colours = [HUMAN_FILL if n == HUMAN else (ALL_FILL if n == ALL else ROLE_FILL) for n in nodes]
    area = [sizes[n] for n in nodes]
    nx.draw_networkx_nodes(
        graph, positions, nodelist=nodes, node_size=area, node_color=colours, edgecolors="#33415c", ax=axes
    )
    if big:  # labels beside the nodes, away from the centre, so they do not cover the edges
        shifted = {n: (x * 1.07, y * 1.07) for n, (x, y) in positions.items()}
        nx.draw_networkx_labels(graph, shifted, font_size=6, ax=axes)
    else:
        nx.draw_networkx_labels(graph, positions, font_size=10, ax=axes)


def _legend(graph: nx.DiGraph, axes: Any, colours: dict[str, str]) -> None:
    most = max((d["count"] for *_, d in graph.edges(data=True)), default=1)
    handles = [Line2D([0], [0], color=colour, lw=3, label=name) for name, colour in list(colours.items())[:10]]
    for count in sorted({1, most}):
        handles.append(Line2D([0], [0], color="#555555", lw=_width(count, most), label=f"{count} message(s)"))
    axes.legend(  # beside the drawing, never over a node
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        borderaxespad=0.0,
        fontsize=8,
        frameon=False,
        title="action / edge width",
    )
