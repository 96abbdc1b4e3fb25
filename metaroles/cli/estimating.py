"""``metaroles run NAME --estimate``: what the run will cost, printed before anything runs (``project.estimate``)."""

from __future__ import annotations

import json
from typing import Any

import anyio
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from metaroles.cli.common import fail, reported

ESTIMATE_HELP = (
    "print what the run would cost — model calls, prompt and answer tokens, money, time — from dry runs "
    "with the test model; asks no model, writes nothing (-q: one JSON object)"
)

_NOT_WITH = {
    "--record": "it records no call",
    "--replay": "a replay costs nothing",
    "--watch": "nothing runs to watch",
    "--control": "nothing runs to steer",
    "--human": "a person's answers are not the model's",
    "--interventions": "nothing runs to steer",
    "--mcp": "a dry run reaches no server",
    "--a2a": "a dry run reaches no agent",
}


def refuse_with(given: dict[str, object]) -> None:
    """Refuse the options an estimate has no use for (``given``: option → its value), naming the first.

    Raises:
        typer.Exit: One line on stderr, exit 2.
    """
    for option, why in _NOT_WITH.items():
        if given.get(option):
            raise fail(f"--estimate runs nothing, so {option} has no use with it ({why}); drop one of them")


def print_estimate(name: str, kwargs: dict[str, Any], *, quiet: bool) -> None:
    """Estimate a run of scenario ``name`` (``estimate_run``'s ``kwargs``); print a table, or JSON when ``quiet``."""
    from metaroles.project.estimate import estimate_run

    with reported():
        estimate = anyio.run(lambda: estimate_run(name, **kwargs))
    if quiet:
        print(json.dumps(estimate.model_dump(mode="json")))
        return
    out = Console()
    table = Table(title=escape(f"estimate: {name} on {estimate.model}"), show_header=False, box=None)
    spread = "" if estimate.calls_low == estimate.calls_high else f" ({estimate.calls_low}–{estimate.calls_high})"
    rows = {
        "model calls": f"{estimate.calls:,.0f}{spread}",
        "prompt tokens": f"{estimate.prompt_tokens:,.0f}",
        "answer tokens": f"{estimate.completion_tokens:,.0f}",
        "cost": "unknown" if estimate.cost is None else f"${estimate.cost:,.4f}",
        "time": "unknown" if estimate.seconds is None else _duration(estimate.seconds),
        "pace": estimate.pace,
        "tokens counted": estimate.counted,
        "dry runs": f"{len(estimate.seeds)} (seeds {', '.join(map(str, estimate.seeds))}), no model asked",
    }
    for key, value in rows.items():
        table.add_row(key, escape(value))
    out.print(table)
    by_action = Table("action", "calls", "prompt tokens", "answer tokens", box=None)
    for action, figures in estimate.by_action.items():
        by_action.add_row(
            escape(action),
            f"{figures.calls:,.1f}",
            f"{figures.prompt_tokens:,.0f}",
            f"{figures.completion_tokens:,.0f}",
        )
    out.print(by_action)


def _duration(seconds: float) -> str:
    """``seconds`` for a person: 42 s, 3 min 5 s, 2 h 10 min."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:.0f} s"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:.0f} min"
