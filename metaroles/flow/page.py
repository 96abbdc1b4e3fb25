"""The role graph of a run as one self-contained interactive HTML page.

No CDN and no external file: the data (positions from the same layout as the picture, the
deliveries with their round and action, each message's text once, the picture's colours) and a
small script that draws it as SVG are inlined. Past 16 roles a broadcast is one edge to ``<all>``.
Hover a role or an edge to list its messages; pick a round (or open the page with ``#round=N``)
to see only that round's deliveries. Works offline in any browser, and inline in a notebook
(:class:`InlinePage`).
"""

from __future__ import annotations

import html
import json
from importlib import resources
from pathlib import Path
from typing import Any

from metaroles.core.files import write_atomic
from metaroles.flow.graph import ALL, HUMAN, role_graph
from metaroles.flow.plot import action_colours, aggregate, flow_edges, layout
from metaroles.record.eventlog import Event


def page_data(events: list[Event], texts: dict[str, str] | None = None) -> dict[str, Any]:
    """What the page draws: node positions, the deliveries (round, action, message id), each text once.

    The graph is the picture's (``flow.plot``): past 16 roles a broadcast is one edge to ``<all>``,
    and each action has the picture's colour.
    """
    texts = texts or {}
    multi = role_graph(events)
    graph = aggregate(events, multi)
    positions = layout(graph)
    count = max(len(positions), 1)
    deliveries = [
        {
            "from": sender,
            "to": recipient,
            "round": data["round"],
            "action": str(data["cause_by"]).rpartition(".")[2] or "message",
            "id": data["message_id"],
        }
        for sender, recipient, data in flow_edges(events, multi)
    ]
    colours = action_colours(graph)
    return {
        "nodes": {
            str(n): {"x": round(float(x) * 450, 1), "y": round(-float(y) * 450, 1)} for n, (x, y) in positions.items()
        },
        "deliveries": deliveries,
        "texts": {d["id"]: texts[d["id"]][:500] for d in deliveries if d["id"] in texts},
        "actions": list(colours),
        "colours": colours,
        "all": ALL,
        "rounds": sorted({d["round"] for d in deliveries}),
        "human": HUMAN,
        "radius": 50 if count <= 16 else 16,
        "font": 22 if count <= 16 else 9,
        "width": 8 if count <= 16 else 3,
    }


def render_html(
    events: list[Event], path: Path, *, title: str = "message flow", texts: dict[str, str] | None = None
) -> Path:
    """Write the interactive page for ``events`` (``texts``: message id → content, for the hover lists).

    Everything that comes from the run (title, role names, message texts) goes into the page only
    as JSON inside ``<script type="application/json">``, with ``<``, ``>`` and ``&`` escaped, and
    is shown through ``textContent``: no run data can reach markup or the template's placeholder.
    """
    data = {**page_data(events, texts), "title": title}
    before, placeholder, after = _template().partition(_PLACEHOLDER)
    assert placeholder and _PLACEHOLDER not in after, "page.html holds one data placeholder"
    write_atomic(path, before + script_json(data) + after)
    return path


class InlinePage:
    """The interactive page, shown inline in a notebook (Jupyter renders it in a sandboxed frame).

    ``display(InlinePage(events, texts=...))`` or end a cell with it; ``str()`` is the page itself.
    """

    def __init__(
        self,
        events: list[Event],
        *,
        title: str = "message flow",
        texts: dict[str, str] | None = None,
        height: int = 620,
    ) -> None:
        """Build the page for ``events`` (``texts``: message id → text, for the hover lists)."""
        data = {**page_data(events, texts), "title": title}
        before, _, after = _template().partition(_PLACEHOLDER)
        self.html = before + script_json(data) + after
        self.height = height

    def __str__(self) -> str:
        """The whole page."""
        return self.html

    def _repr_html_(self) -> str:
        """An iframe holding the page (its script runs inside; nothing outside the frame is touched)."""
        source = html.escape(self.html, quote=True)
        return (
            f'<iframe srcdoc="{source}" sandbox="allow-scripts" style="width: 100%; height: {self.height}px; '
            'border: 1px solid #ccd;"></iframe>'
        )


_PLACEHOLDER = "__DATA__"


def _template() -> str:
    return resources.files("metaroles.flow").joinpath("page.html").read_text(encoding="utf-8")


def script_json(value: object) -> str:
    """``value`` as JSON that is inert inside an HTML ``<script>`` element (no ``</script>``, no ``<!--``)."""
    text = json.dumps(value, ensure_ascii=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
