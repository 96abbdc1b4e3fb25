"""An ensemble's outcomes as a picture: a panel per outcome, the runs' distribution in each arm.

A numeric outcome is a histogram of its values across runs (one colour per arm) with each
arm's mean and 95 % interval marked; an outcome counted by value is a bar per value with its
Wilson interval. Written as SVG with fixed ids and no date, so one report always gives the same
bytes. Imports matplotlib (extra ``graph``).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display here; renderers only ever write files
import matplotlib.pyplot as plt

from metaroles.core.files import write_atomic
from metaroles.flow.plot import PALETTE


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
