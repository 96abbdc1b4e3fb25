"""``metaroles run NAME --estimate``: what the run will cost, printed before anything runs (``project.estimate``)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from metaroles.cli.common import fail, reported, resolve

if TYPE_CHECKING:
    from metaroles.llm.protocol import LLM
    from metaroles.project.estimate import Estimate
    from metaroles.project.sweep import TrialBatch
    from metaroles.team.options import RunOptions

ESTIMATE_HELP = (
    "print what it would cost — model calls, prompt and answer tokens, money, time — from dry runs "
    "with the test model; asks no model, writes nothing (-q: one JSON object)"
)

_NOT_WITH = {
    "record": "it records no call",
    "replay": "a replay costs nothing",
    "watch": "nothing runs to watch",
    "control": "nothing runs to steer",
    "human": "a person's answers are not the model's",
    "interventions": "nothing runs to steer",
    "mcp": "a dry run reaches no server",
    "a2a": "a dry run reaches no agent",
}


def refuse_with(**given: object) -> None:
    """Refuse the options an estimate has no use for (``given``: each option's value), naming the first given.

    Raises:
        typer.Exit: One line on stderr, exit 2.
    """
    for option, why in _NOT_WITH.items():
        if given.get(option):
            raise fail(f"--estimate runs nothing, so --{option} has no use with it ({why}); drop one of them")


def print_run_estimate(
    name: str,
    model: LLM,
    options: dict[str, Any],
    run: RunOptions,
    specs: dict[str, str],
    limits: tuple[float | None, float | None],
    *,
    quiet: bool,
) -> None:
    """Estimate a run of scenario ``name`` and print it.

    ``specs``: the roles that have models of their own, and which; ``limits``: the tokens and requests a
    minute given, if any.
    """
    from metaroles.project.estimate import Pace, estimate_run

    role_llms = {role: resolve({"llm": spec}) for role, spec in specs.items()}
    tokens, requests = limits
    pace = Pace(tokens_per_minute=tokens, requests_per_minute=requests) if tokens or requests else None
    estimating = partial(estimate_run, name, model=model, options=options, run=run, role_llms=role_llms, pace=pace)
    print_estimate(name, estimating, quiet=quiet)


def print_trials_estimate(label: str, batch: TrialBatch, spec: dict[str, Any], *, jobs: int, quiet: bool) -> None:
    """Estimate a sweep's or an evaluation's trials (``batch``) on the model ``spec`` names, ``jobs`` at once."""
    from metaroles.project.estimate import estimate_trials

    with reported():
        model = resolve(spec)
    print_estimate(label, partial(estimate_trials, batch, model=model, jobs=jobs), quiet=quiet)


def print_estimate(name: str, estimating: Callable[[], Awaitable[Estimate]], *, quiet: bool) -> None:
    """Make the estimate of ``name`` (a run, a sweep, an evaluation) and print it: a table, or JSON when ``quiet``."""
    with reported():
        estimate = anyio.run(estimating)
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
