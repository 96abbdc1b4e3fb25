"""Scores an economic_games run against the human figures of its task's reference.toml.

Every statistic is computed over the population of the run (the experimenter's record, the last
line of ``metrics.jsonl``), with a bootstrap interval over its agents (``*_low``, ``*_high``: 2000
resamples, seeded: the same every time). ``distance`` is the mean gap between the population's
statistics and the human ones: the distance to a published point, or to the nearest end of a
published range (0 inside it), each as a share of the range of values the statistic can take
(``span`` in reference.toml), so shares and changes of shares are on one scale; a statistic the run
cannot show (no offer below 20%) is left out.
"""

from __future__ import annotations

import json
import random
import statistics
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from metaroles.project.scoring import Task

RESAMPLES = 2000


def score(run_dir: Path, task: Task) -> dict[str, Any]:
    """The population's statistics, their intervals, and the distance to people."""
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    record = json.loads(lines[-1]) if lines else {}
    options = task.options
    found = _ultimatum(record, options["pie"]) if options.get("game") == "ultimatum" else _public_goods(record, options)
    reference = tomllib.loads((task.folder / "reference.toml").read_text(encoding="utf-8"))
    gaps = [_gap(found[name], figure) for name, figure in reference.items() if found.get(name) is not None]
    found["distance"] = round(statistics.fmean(gaps), 6) if gaps else None
    return found


def _ultimatum(record: dict[str, Any], pie: int) -> dict[str, Any]:
    offers = [record["offers"][name] / pie for name in sorted(record.get("offers", {}))]
    pairs = [
        (record["offers"][name] / pie, record["accepted"].get(name.replace("Proposer", "Responder")))
        for name in sorted(record.get("offers", {}))
    ]
    answered = [(share, accepted) for share, accepted in pairs if accepted is not None]
    rejected = [0.0 if accepted else 1.0 for _, accepted in answered]
    low = [0.0 if accepted else 1.0 for share, accepted in answered if share < 0.2]
    found = {
        "pairs": len(answered),
        **_with_interval("offer_share", offers),
        **_with_interval("rejection_rate", rejected),
    }
    found["low_offer_rejection"] = round(statistics.fmean(low), 6) if low else None
    return found


def _public_goods(record: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    endowment = options["endowment"]
    rounds = record.get("rounds") or []
    if not rounds:
        return {"rounds": 0, "first_round_share": None, "decline": None}
    first = [v / endowment for v in rounds[0].values()]
    last = {name: v / endowment for name, v in rounds[-1].items()}
    falls = [share - last[name] for name, share in zip(rounds[0], first, strict=True) if name in last]
    found = {"rounds": len(rounds), **_with_interval("first_round_share", first), **_with_interval("decline", falls)}
    found["by_round"] = json.dumps([round(statistics.fmean(r.values()) / endowment, 4) for r in rounds])
    return found


def _with_interval(name: str, values: Sequence[float]) -> dict[str, Any]:
    """The mean of ``values`` and its bootstrap interval (2.5% and 97.5%) over the agents."""
    if not values:
        return {name: None}
    low, high = _bootstrap(values, statistics.fmean)
    return {name: round(statistics.fmean(values), 6), f"{name}_low": round(low, 6), f"{name}_high": round(high, 6)}


def _bootstrap(values: Sequence[float], statistic: Callable[[Sequence[float]], float]) -> tuple[float, float]:
    draw = random.Random(0)
    means = sorted(statistic(draw.choices(values, k=len(values))) for _ in range(RESAMPLES))
    return means[int(0.025 * RESAMPLES)], means[int(0.975 * RESAMPLES) - 1]


def _gap(value: float, figure: dict[str, Any]) -> float:
    """How far ``value`` is from a published point, range or bound, as a share of the statistic's ``span``.

    ``span``: the width of the values the statistic can take (1 for a share; 2 for a change of a
    share, -1 to 1), so that every statistic's gap is on the same 0-1 scale before they are averaged.
    """
    span = float(figure.get("span", 1.0))
    if "value" in figure:
        return abs(value - float(figure["value"])) / span
    low, high = float(figure.get("low", -1e9)), float(figure.get("high", 1e9))
    return max(low - value, value - high, 0.0) / span
