"""What many runs of one setting say together: each outcome's distribution with intervals, and which runs agree.

An ensemble is runs that differ only by their seed: the branches of one run (``metaroles branch``),
a sweep's trials of one setting across its seeds (``metaroles sweep``), an evaluation's trials of
one task and setting (``metaroles eval``). Each run is a reading — its folder (``run``), its ``arm``
(the setting it belongs to), its ``seed`` and its outcomes (the scenario's ``summary``, or a
suite's scores) — and for each arm the report gives:

- each outcome's distribution across its runs: a number's mean with a t interval (scipy) and its
  quantiles; a category's (or a few-valued integer's) counts with Wilson intervals (scipy):
  "pro won 64 of 100, [54, 73] %";
- the groups of runs that agree (the same counted outcomes), largest first, and the round where
  each group's story first parts from the largest's (:func:`~metaroles.project.diff.first_divergence`
  of their first members);
- between two arms paired by seed (a plain and an intervened branch), the effect on each outcome.

``ensemble.json`` holds it as data, ``ensemble.md`` for people; ``metaroles.flow.ensemble`` draws
``ensemble.svg``. Nothing in it comes from the clock: the same runs give the same bytes.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from metaroles.core.files import write_atomic
from metaroles.project.diff import first_divergence, run_messages
from metaroles.project.trials import Row

__all__ = [
    "ENSEMBLE",
    "ENSEMBLE_MD",
    "agreement",
    "agreement_lines",
    "describe",
    "effect",
    "effect_lines",
    "grouped_markdown",
    "grouped_report",
    "outcome_lines",
    "write_ensemble",
]

ENSEMBLE = "ensemble.json"
"""The report, as data."""
ENSEMBLE_MD = "ensemble.md"
"""The report, as people read it."""
FEW = 10
"""An integer outcome with at most this many values across runs is counted by value too."""
Reading = dict[str, Any]
"""One run of an ensemble: ``run`` (its folder), ``arm``, ``seed``, and an entry per outcome."""
_LABELS = ("run", "arm", "seed")


def outcomes_of(readings: Sequence[Reading]) -> list[str]:
    """The outcomes the readings hold, sorted."""
    return sorted({key for reading in readings for key in reading} - set(_LABELS))


def arms_of(readings: Sequence[Reading]) -> dict[str, list[Reading]]:
    """The readings by arm, in the order the arms first appear."""
    arms: dict[str, list[Reading]] = {}
    for reading in readings:
        arms.setdefault(str(reading["arm"]), []).append(reading)
    return arms


def grouped_report(rows: Sequence[Row], out: Path, *, title: str, reading: Callable[[Row], Reading]) -> dict[str, Any]:
    """The ensembles of a table of trials (a sweep's, an evaluation's): each arm's outcomes and its agreeing groups.

    ``reading`` makes a trial's row a :data:`Reading` (its arm: the trial's setting but the seed).
    """
    done = [reading(r) for r in rows if r.get("status") == "done"]
    names = outcomes_of(done)
    arms = arms_of(done)
    described = {arm: {name: describe([r.get(name) for r in mine]) for name in names} for arm, mine in arms.items()}
    return {
        "title": title,
        "runs": len(rows),
        "failed": sorted(str(reading(r)["run"]) for r in rows if r.get("status") != "done"),
        "arms": described,
        "agreement": {arm: agreement(mine, described[arm], out) for arm, mine in arms.items()},
        "per_run": done,
    }


def write_ensemble(out: Path, report: dict[str, Any], markdown: Callable[[dict[str, Any]], str]) -> None:
    """``ensemble.json`` and ``ensemble.md`` (``markdown`` of the report) in ``out``, atomically."""
    write_atomic(out / ENSEMBLE, json.dumps(report, indent=1) + "\n")
    write_atomic(out / ENSEMBLE_MD, markdown(report))


def grouped_markdown(report: dict[str, Any]) -> str:
    """A :func:`grouped_report` as people read it: per arm, its outcomes and the groups that agree."""
    lines = [f"# {report['title']}", ""]
    lines.append(f"{report['runs']} runs" + (f"; failed: {', '.join(report['failed'])}" if report["failed"] else ""))
    for arm, outcomes in report["arms"].items():
        lines += ["", f"## {arm}", "", *outcome_lines(outcomes), "", "groups that agree:", ""]
        lines += agreement_lines(report["agreement"][arm])
    return "\n".join(lines) + "\n"


def outcome_lines(outcomes: dict[str, dict[str, Any]]) -> list[str]:
    """A line per outcome as :func:`describe` gives it (and per counted value)."""
    return [f"- {line}" for name, d in outcomes.items() for line in _outcome_lines(name, d)]


def agreement_lines(groups: list[dict[str, Any]], noun: tuple[str, str] = ("run", "runs")) -> list[str]:
    """A line per group of runs that agree, with the round its story parts from the largest group's."""
    lines = []
    for group in groups:
        said = ", ".join(f"{k}={v}" for k, v in group["outcomes"].items()) or "(no counted outcome)"
        parts = group["parts_from_largest_at_round"]
        where = "" if parts is None else f"; its story parts from the largest group's at round {parts}"
        lines.append(f"- {said}: {group['count']} {noun[group['count'] != 1]}{where}")
    return lines


def _numeric(values: Sequence[Any]) -> bool:
    return bool(values) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def describe(values: Sequence[Any]) -> dict[str, Any]:
    """One outcome across runs: numeric (mean, t interval, quantiles) and/or counted by value (Wilson)."""
    present = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    described: dict[str, Any] = {"n": len(values), "missing": len(values) - len(present)}
    if _numeric(present):
        described |= _spread([float(v) for v in present])
    if not _numeric(present) or (all(isinstance(v, int) for v in present) and len(set(present)) <= FEW):
        described["values"] = _counted(values)
    return described


def _spread(values: list[float]) -> dict[str, Any]:
    """Mean with its 95 % t interval, standard deviation, and quantiles."""
    import numpy as np
    from scipy import stats

    array = np.asarray(values)
    mean = float(array.mean())
    sd = float(array.std(ddof=1)) if len(array) > 1 else 0.0
    low, high = (mean, mean) if sd == 0 else stats.t.interval(0.95, len(array) - 1, loc=mean, scale=stats.sem(array))
    quantiles = np.quantile(array, [0, 0.05, 0.5, 0.95, 1])
    return {
        "mean": _r(mean),
        "sd": _r(sd),
        "ci95": [_r(low), _r(high)],
        "quantiles": dict(zip(("min", "q05", "median", "q95", "max"), map(_r, quantiles), strict=True)),
    }


def _counted(values: Sequence[Any]) -> dict[str, Any]:
    """Each value's count of the runs, its share and the share's 95 % Wilson interval (scipy's binomial test)."""
    from scipy.stats import binomtest

    counts = Counter(_label(v) for v in values)
    total = len(values)
    shown: dict[str, Any] = {}
    for label, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        low, high = binomtest(count, total).proportion_ci(confidence_level=0.95, method="wilson")
        shown[label] = {"count": count, "share": _r(count / total), "ci95": [_r(low), _r(high)]}
    return shown


def _label(value: Any) -> str:
    return "none" if value is None else json.dumps(value) if not isinstance(value, str) else value


def effect(plain: Sequence[Reading], intervened: Sequence[Reading], name: str) -> dict[str, Any]:
    """A change's effect on one outcome: the second arm minus the first, paired by seed, with its 95 % interval."""
    by_seed: dict[Any, Any] = {r.get("seed"): r.get(name) for r in plain}
    both = [(by_seed[r.get("seed")], r.get(name)) for r in intervened if r.get("seed") in by_seed]
    pairs: list[tuple[Any, Any]] = [(a, b) for a, b in both if a is not None and b is not None]
    if not pairs:
        return {"pairs": 0}
    if _numeric([v for pair in pairs for v in pair]):
        return {"pairs": len(pairs), **_paired([float(b) - float(a) for a, b in pairs])}
    return {"pairs": len(pairs), "shares": _shares([a for a, _ in pairs], [b for _, b in pairs])}


def _paired(differences: list[float]) -> dict[str, Any]:
    """The mean paired difference with its t interval and p value (none when every difference is the same)."""
    import numpy as np
    from scipy import stats

    array = np.asarray(differences)
    mean = float(array.mean())
    if len(array) < 2 or float(array.std(ddof=1)) == 0:
        return {"difference": _r(mean), "ci95": [_r(mean), _r(mean)], "p": None}
    test = stats.ttest_1samp(array, 0.0)
    low, high = test.confidence_interval(0.95)
    return {"difference": _r(mean), "ci95": [_r(low), _r(high)], "p": _r(float(test.pvalue))}


def _shares(plain: list[Any], intervened: list[Any]) -> dict[str, Any]:
    """Per value, its share in the second arm minus in the first, with a 95 % Newcombe interval."""
    from statsmodels.stats.proportion import confint_proportions_2indep

    a, b = Counter(map(_label, plain)), Counter(map(_label, intervened))
    shown: dict[str, Any] = {}
    for label in sorted(set(a) | set(b)):
        low, high = confint_proportions_2indep(b[label], len(intervened), a[label], len(plain), method="newcomb")
        difference = b[label] / len(intervened) - a[label] / len(plain)
        shown[label] = {"difference": _r(difference), "ci95": [_r(low), _r(high)]}
    return shown


def agreement(readings: Sequence[Reading], described: dict[str, Any], out: Path) -> list[dict[str, Any]]:
    """Runs grouped by their counted outcomes (largest group first), and where each group parts from the first."""
    counted = [name for name, d in described.items() if "values" in d]
    groups: dict[tuple[str, ...], list[str]] = {}
    for reading in readings:
        groups.setdefault(tuple(_label(reading.get(n)) for n in counted), []).append(str(reading["run"]))
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
    largest = run_messages(out / ordered[0][1][0]) if len(ordered) > 1 else []
    shown = []
    for n, (key, members) in enumerate(ordered):
        parting = first_divergence(largest, run_messages(out / members[0])) if n else None
        shown.append({"outcomes": dict(zip(counted, key, strict=True)), "count": len(members), "runs": members,
                      "parts_from_largest_at_round": parting})  # fmt: skip
    return shown


def _outcome_lines(name: str, d: dict[str, Any]) -> list[str]:
    lines = []
    if "mean" in d:
        low, high = d["ci95"]
        lines.append(f"{name}: mean {d['mean']:.4g} [{low:.4g}, {high:.4g}], sd {d['sd']:.3g}, "
                     f"median {d['quantiles']['median']:.4g}")  # fmt: skip
    for value, c in d.get("values", {}).items():
        low, high = c["ci95"]
        lines.append(f"{name} = {value}: {c['count']} of {d['n']}, [{100 * low:.0f}, {100 * high:.0f}] %")
    return lines


def effect_lines(name: str, e: dict[str, Any]) -> list[str]:
    """An effect's lines as :func:`effect` gives it."""
    if "difference" in e:
        low, high = e["ci95"]
        p = "" if e["p"] is None else f", p = {e['p']:.3g}"
        return [f"{name}: {e['difference']:+.4g} [{low:+.4g}, {high:+.4g}] over {e['pairs']} pairs{p}"]
    return [
        f"{name} = {value}: {100 * s['difference']:+.0f} points [{100 * s['ci95'][0]:+.0f}, {100 * s['ci95'][1]:+.0f}]"
        for value, s in e.get("shares", {}).items()
    ]


def _r(value: float) -> float:
    """Six decimals: what a report shows (and the same in every process)."""
    return round(float(value), 6)
