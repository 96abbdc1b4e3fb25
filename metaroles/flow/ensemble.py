"""An ensemble's outcomes as pictures: the runs' distribution of each outcome in each arm; the arms over the rounds.

A numeric outcome is a histogram of its values across runs (one colour per arm) with each
arm's mean and 95 % interval marked; an outcome counted by value is a bar per value with its
Wilson interval (:func:`render_ensemble`). :func:`render_rounds` draws the settings side by side
over the rounds: each arm's mean of a figure of ``metrics.jsonl`` across its runs, round by round,
and the round where the arms first part. Written as SVG with fixed ids and no date, so one report
always gives the same bytes. Imports matplotlib (extra ``graph``).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from statistics import fmean
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display here; renderers only ever write files
import matplotlib.pyplot as plt

from metaroles.core.files import write_atomic
from metaroles.flow.plot import PALETTE

ROUND_FIGURES = 4
"""The figures of ``metrics.jsonl`` drawn over the rounds (the first ones by name, those that move first)."""


def render_ensemble(report: dict[str, Any], path: Path) -> Path:
    """Draw an ensemble's report (its ``ensemble.json``: a branch's, a sweep's, an evaluation's) into ``path`` (SVG).

    Written atomically; an arm each colour (at most the palette's; a sweep of more settings shows its first ones).
    """
    arms = dict(list(report["arms"].items())[: len(PALETTE)])
    outcomes = list(next(iter(arms.values()), {}))
    with plt.rc_context({"svg.hashsalt": "metaroles", "svg.fonttype": "none"}):
        figure, axes = plt.subplots(1, max(1, len(outcomes)), figsize=(4 * max(1, len(outcomes)), 3), squeeze=False)
        for axis, name in zip(axes[0], outcomes, strict=False):
            described = {arm: outcomes_of[name] for arm, outcomes_of in arms.items()}
            if "mean" in next(iter(described.values())) and not _few(described):
                _histogram(axis, name, described, report["per_run"])
            else:
                _bars(axis, name, described)
        cut = f" (the first {len(arms)} of {len(report['arms'])} arms)" if len(arms) < len(report["arms"]) else ""
        figure.suptitle(report["title"] + cut, fontsize=10)
        figure.tight_layout()
        data = io.BytesIO()
        figure.savefig(data, format="svg", metadata={"Date": None, "Creator": "metaroles"})
        plt.close(figure)
    return write_atomic(path, data.getvalue(), durable=False)


def _few(described: dict[str, dict[str, Any]]) -> bool:
    """Whether an integer outcome takes few values (bars read better than a histogram)."""
    return all("values" in d for d in described.values())


def _histogram(axis: Any, name: str, described: dict[str, dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    for n, (arm, d) in enumerate(described.items()):
        colour = PALETTE[n % len(PALETTE)]
        mine = [r[name] for r in rows if r.get(name) is not None and r["arm"] == arm]
        axis.hist(mine, bins=min(20, max(5, len(mine) // 5)), alpha=0.5, color=colour, label=arm)
        if "mean" in d:
            axis.axvline(d["mean"], color=colour, linewidth=1.5)
            axis.axvspan(*d["ci95"], color=colour, alpha=0.15)
    axis.set_title(name, fontsize=9)
    axis.set_ylabel("runs", fontsize=8)
    if len(described) > 1:
        axis.legend(fontsize=7)


def _bars(axis: Any, name: str, described: dict[str, dict[str, Any]]) -> None:
    labels = sorted({value for d in described.values() for value in d.get("values", {})})
    width = 0.8 / max(1, len(described))
    for n, (arm, d) in enumerate(described.items()):
        counts = d.get("values", {})
        shares = [counts.get(v, {}).get("share", 0.0) for v in labels]
        low = [s - counts.get(v, {}).get("ci95", [s, s])[0] for s, v in zip(shares, labels, strict=True)]
        high = [counts.get(v, {}).get("ci95", [s, s])[1] - s for s, v in zip(shares, labels, strict=True)]
        places = [i + n * width for i in range(len(labels))]
        axis.bar(places, shares, width, yerr=[low, high], color=PALETTE[n % len(PALETTE)], label=arm, capsize=2)
    axis.set_xticks([i + width * (len(described) - 1) / 2 for i in range(len(labels))], labels, fontsize=7)
    axis.set_title(name, fontsize=9)
    axis.set_ylabel("share of runs", fontsize=8)
    if len(described) > 1:
        axis.legend(fontsize=7)


def over_rounds(report: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Each arm's mean of each numeric figure across its runs, round by round, and the round the arms first part.

    ``rounds``; ``figures``: per figure, per arm, a value per round (``None`` where none of its runs
    has one); ``parting``: the first round at which two arms' means differ (``None``: they never do,
    or there is one arm). Read from each run's ``metrics.jsonl`` (``report["per_run"]``'s ``run``).
    """
    by_arm: dict[str, dict[int, dict[str, list[float]]]] = {}
    for row in report["per_run"]:
        arm = by_arm.setdefault(str(row["arm"]), {})
        for line in _metric_rows(folder / str(row["run"])):
            values = arm.setdefault(line["round"], {})
            for name, value in line.items():
                if name != "round" and isinstance(value, int | float) and not isinstance(value, bool):
                    values.setdefault(name, []).append(float(value))
    rounds = sorted({r for arm in by_arm.values() for r in arm})
    names = sorted({n for arm in by_arm.values() for values in arm.values() for n in values})
    figures = {
        name: {
            arm: [fmean(v) if (v := got.get(r, {}).get(name)) else None for r in rounds] for arm, got in by_arm.items()
        }
        for name in names
    }
    parting = next(
        (r for i, r in enumerate(rounds) if any(_apart([v[i] for v in arms.values()]) for arms in figures.values())),
        None,
    )
    return {"rounds": rounds, "figures": figures, "parting": parting}


def _metric_rows(run: Path) -> list[dict[str, Any]]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [row for row in rows if isinstance(row, dict) and type(row.get("round")) is int]


def _apart(values: list[float | None]) -> bool:
    """Whether two of the arms' means of a figure at one round differ (beyond the float noise of a mean)."""
    present = [v for v in values if v is not None]
    return bool(present) and max(present) - min(present) > 1e-9 * max(1.0, abs(max(present)))


def render_rounds(report: dict[str, Any], folder: Path, path: Path) -> Path | None:
    """Draw the arms' figures over the rounds (:func:`over_rounds`) into ``path`` (SVG); ``None``: no run has any."""
    seen = over_rounds(report, folder)
    moving = [n for n, arms in seen["figures"].items() if len({v for a in arms.values() for v in a} - {None}) > 1]
    names = [*moving, *(n for n in seen["figures"] if n not in moving)][:ROUND_FIGURES]  # what moves first
    if not names:
        return None
    with plt.rc_context({"svg.hashsalt": "metaroles", "svg.fonttype": "none"}):
        figure, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3), squeeze=False)
        for axis, name in zip(axes[0], names, strict=True):
            for n, (arm, values) in enumerate(list(seen["figures"][name].items())[: len(PALETTE)]):
                axis.plot(seen["rounds"], values, color=PALETTE[n], label=arm, linewidth=1.2)
            if seen["parting"] is not None:
                axis.axvline(seen["parting"], color="#888", linestyle="--", linewidth=1)
            axis.set_title(name, fontsize=9)
            axis.set_xlabel("round", fontsize=8)
        axes[0][0].legend(fontsize=7)
        parting = "" if seen["parting"] is None else f"; they part at round {seen['parting']} (dashed)"
        figure.suptitle(f"{report['title']}: each arm's mean over its runs{parting}", fontsize=10)
        figure.tight_layout()
        data = io.BytesIO()
        figure.savefig(data, format="svg", metadata={"Date": None, "Creator": "metaroles"})
        plt.close(figure)
    return write_atomic(path, data.getvalue(), durable=False)
