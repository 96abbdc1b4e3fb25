"""The role graph of a run as one self-contained interactive HTML page.

No CDN and no external file: the data (positions from the same layout as the picture, every
delivery with its round, action and text) and a small script that draws it as SVG are inlined.
Hover a role or an edge to list its messages; pick a round (or open the page with ``#round=N``)
to see only that round's deliveries. Works offline in any browser.
"""

from __future__ import annotations

import html
import json
from importlib import resources
from pathlib import Path
from typing import Any

from metaroles.flow.graph import HUMAN, role_graph
from metaroles.flow.plot import aggregate, layout
from metaroles.runs.eventlog import Event


def page_data(events: list[Event], texts: dict[str, str] | None = None) -> dict[str, Any]:
    """What the page draws: node positions, every delivery (round, action, text), actions, rounds."""
    texts = texts or {}
    positions = layout(aggregate(events))
    count = max(len(positions), 1)
    deliveries = [
        {
            "from": sender,
            "to": recipient,
            "round": data["round"],
            "action": str(data["cause_by"]).rpartition(".")[2] or "message",
            "id": data["message_id"],
            "text": texts.get(data["message_id"], "")[:500],
        }
        for sender, recipient, data in role_graph(events).edges(data=True)
    ]
    actions = sorted({d["action"] for d in deliveries}, key=lambda a: -sum(d["action"] == a for d in deliveries))
    return {
        "nodes": {
            str(n): {"x": round(float(x) * 450, 1), "y": round(-float(y) * 450, 1)} for n, (x, y) in positions.items()
        },
        "deliveries": deliveries,
        "actions": actions,
        "rounds": sorted({d["round"] for d in deliveries}),
        "human": HUMAN,
        "radius": 50 if count <= 16 else 16,
        "font": 22 if count <= 16 else 9,
        "width": 8 if count <= 16 else 3,
    }


def render_html(
    events: list[Event], path: Path, *, title: str = "message flow", texts: dict[str, str] | None = None
) -> Path:
    """Write the interactive page for ``events`` (``texts``: message id → content, for the hover lists)."""
    data = json.dumps(page_data(events, texts), ensure_ascii=False).replace("</", "<\\/")
    page = resources.files("metaroles.flow").joinpath("page.html").read_text(encoding="utf-8")
    path.write_text(page.replace("__TITLE__", html.escape(title)).replace("__DATA__", data), encoding="utf-8")
    return path
