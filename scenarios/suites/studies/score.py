"""Scores a studies run as its original paper tested people, and compares the finding with theirs.

A task's ``reference.toml`` states the study: its hypothesis, the test, the conditions compared
(the effect is the first's statistic minus the second's) and the human data — the paper's counts
or values, from which the same test gives the human effect, its 95 % interval and p, or, for a
meta-analytic finding, its published effect. The agents' answers (the experimenter's record, the
last line of ``metrics.jsonl``) go through the same test. Per study:

- ``effect`` with ``effect_low``/``effect_high`` (95 %), ``p_value``, ``replicated`` (1 when the
  effect has the human direction and p < .05);
- ``pas``: HumanStudy-Bench's probability alignment, π_h·π_a + (1 − π_h)(1 − π_a), where π is the
  posterior probability that the effect exists (from the test's z by the BIC approximation of the
  Bayes factor, BF₁₀ ≈ e^{z²/2}/√n, even prior odds; an effect against the human direction counts
  as none; a replicated meta-analytic finding has π_h = 1);
- ``closeness``: 1 − |effect − human effect| / |human effect|, at least 0;
- ``score``: ``pas`` × ``closeness``: the finding as people's *and* its size (1: both; a chance effect
  that is neither significant nor near people's scores near 0);
- ``effect_std`` and ``human_effect_std``: the effect on one scale across studies (Cohen's h for
  proportions, d for means), from which ``across`` gives the effect consistency (ECS: Lin's
  concordance correlation of the agents' with the people's effects over the studies).
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from statistics import fmean
from typing import Any

import numpy as np
from scipy import stats
from statsmodels.stats.contingency_tables import Table2x2
from statsmodels.stats.proportion import (
    confint_proportions_2indep,
    proportion_effectsize,
    test_proportions_2indep,
)

from metaroles.project.scoring import Task

ALPHA = 0.05
LOGIT_TO_D = math.sqrt(3) / math.pi
"""A log odds ratio times this is Cohen's d (Chinn 2000), for a finding published as d."""


def score(run_dir: Path, task: Task) -> dict[str, Any]:
    """The study's test on the agents' answers, the human finding, and how far they agree."""
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    record = json.loads(lines[-1]) if lines else {}
    study = tomllib.loads((task.folder / "reference.toml").read_text(encoding="utf-8"))
    groups = _groups(record, study)
    agents = measure(study, groups)
    human = human_side(study)
    return {**agents, **compare(agents, human), "answered": sum(len(g) for g in groups)}


def _groups(record: dict[str, Any], study: dict[str, Any]) -> list[list[Any]]:
    """Each compared condition's answers (a 1 for the counted option, or the number given)."""
    conditions, answers = record.get("conditions", {}), record.get("answers", {})
    target = study.get("target", {})
    found = []
    for condition in study["compare"]:
        given = [answers[n] for n in sorted(answers, key=_number) if conditions.get(n) == condition]
        if condition in target:
            given = [1 if a == target[condition] else 0 for a in given]
        found.append(given)
    return found


def _number(name: str) -> int:
    return int(name.rsplit(" ", 1)[-1])


def measure(study: dict[str, Any], groups: list[list[Any]]) -> dict[str, Any]:
    """The test of ``study`` on ``groups``: effect, its interval, p, z, n and the effect on one scale."""
    test = study["test"]
    scale = float(study.get("scale", 1))
    if any(len(g) < 2 for g in groups):
        return {"effect": None, "effect_low": None, "effect_high": None, "p_value": None, "n": sum(map(len, groups))}
    if test == "two_proportions":
        return _proportions(groups, as_d=study.get("effect") == "d")
    values = [[float(v) / scale for v in g] for g in groups]
    if test == "one_mean":
        return _one_mean(values[0], float(study.get("null", 0)) / scale)
    if test == "two_means":
        return _two_means(values)
    if test == "two_medians":
        return _two_medians(values)
    raise ValueError(
        f"unknown test {test!r} in reference.toml; use two_proportions, one_mean, two_means or two_medians"
    )


def _proportions(groups: list[list[Any]], *, as_d: bool) -> dict[str, Any]:
    (a, b), (n1, n2) = (sum(g) for g in groups), (len(g) for g in groups)
    tested = test_proportions_2indep(a, n1, b, n2, method="wald", correction=False)
    p = _p(float(tested.pvalue), a / n1 - b / n2)
    if as_d:  # the finding is a d: the effect is the log odds ratio as d
        table = Table2x2(np.array([[a, n1 - a], [b, n2 - b]]), shift_zeros=True)
        low, high = table.log_oddsratio_confint()
        effect, low, high = (x * LOGIT_TO_D for x in (table.log_oddsratio, low, high))
    else:
        effect = a / n1 - b / n2
        low, high = confint_proportions_2indep(a, n1, b, n2, method="newcomb")
    std = effect if as_d else float(proportion_effectsize(a / n1, b / n2))
    return _found(effect, low, high, p, n1 + n2, std)


def _one_mean(values: list[float], null: float) -> dict[str, Any]:
    mean = fmean(values)
    sd = float(np.std(values, ddof=1))
    if sd == 0:
        return _found(mean, mean, mean, 1.0 if mean == null else 0.0, len(values), None)
    tested = stats.ttest_1samp(values, null)
    low, high = tested.confidence_interval()
    return _found(mean, low, high, float(tested.pvalue), len(values), (mean - null) / sd)


def _two_means(groups: list[list[float]]) -> dict[str, Any]:
    x, y = groups
    effect = fmean(x) - fmean(y)
    pooled = math.sqrt((np.var(x, ddof=1) * (len(x) - 1) + np.var(y, ddof=1) * (len(y) - 1)) / (len(x) + len(y) - 2))
    if pooled == 0:
        return _found(effect, effect, effect, 1.0 if effect == 0 else 0.0, len(x) + len(y), None)
    tested = stats.ttest_ind(x, y, equal_var=False)
    low, high = tested.confidence_interval()
    return _found(effect, low, high, float(tested.pvalue), len(x) + len(y), effect / pooled)


def _two_medians(groups: list[list[float]]) -> dict[str, Any]:
    x, y = groups
    effect = float(np.median(x) - np.median(y))
    tested = stats.mannwhitneyu(x, y, alternative="two-sided")
    interval = stats.bootstrap(
        (np.array(x), np.array(y)),
        lambda a, b, axis=-1: np.median(a, axis=axis) - np.median(b, axis=axis),
        n_resamples=2000,
        method="percentile",
        rng=np.random.default_rng(0),
    ).confidence_interval
    return _found(effect, interval.low, interval.high, _p(float(tested.pvalue), effect), len(x) + len(y), None)


def _p(p: float, effect: float) -> float:
    """A test that cannot tell (no variation at all) says: no difference when there is none, certain otherwise."""
    return p if not math.isnan(p) else (1.0 if effect == 0 else 0.0)


def _found(effect: float, low: float, high: float, p: float, n: int, std: float | None) -> dict[str, Any]:
    return {
        "effect": round(float(effect), 6),
        "effect_low": round(float(low), 6),
        "effect_high": round(float(high), 6),
        "p_value": round(float(p), 6),
        "n": n,
        "effect_std": None if std is None or math.isnan(std) else round(float(std), 6),
    }


def human_side(study: dict[str, Any]) -> dict[str, Any]:
    """The human finding: the same test on the paper's counts or values, or the published effect."""
    human = study["human"]
    if "counts" in human:  # [successes, n] per compared condition
        groups = [[1] * k + [0] * (n - k) for k, n in human["counts"]]
        found = measure(study, groups)
    elif "values" in human:
        found = measure(study, [human["values"]])
    else:  # a meta-analytic finding: its effect (and interval if published), replicated
        return {
            "effect": float(human["effect"]),
            "effect_low": human.get("low"),
            "effect_high": human.get("high"),
            "posterior": 1.0,
            "effect_std": human.get("effect_std"),
        }
    return {**found, "posterior": posterior(found["p_value"], found["n"])}


def posterior(p: float | None, n: int) -> float:
    """The probability that the effect exists: BF₁₀ ≈ e^{z²/2}/√n (BIC approximation), even prior odds."""
    if p is None:
        return 0.0
    z = min(float(stats.norm.isf(max(p, 1e-300) / 2)), 37.0)
    bf = math.exp(z * z / 2) / math.sqrt(n)
    return bf / (1 + bf)


def compare(agents: dict[str, Any], human: dict[str, Any]) -> dict[str, Any]:
    """Replication, PAS, closeness and the score of the agents' finding against the human one."""
    base = {
        "human_effect": round(human["effect"], 6),
        "human_effect_low": _rounded(human.get("effect_low")),
        "human_effect_high": _rounded(human.get("effect_high")),
        "human_effect_std": _rounded(human.get("effect_std")),
    }
    if agents["effect"] is None:
        return {**base, "replicated": 0, "pas": None, "closeness": None, "score": 0.0}
    same = agents["effect"] * human["effect"] > 0
    pi_a = posterior(agents["p_value"], agents["n"]) if same else 0.0
    pi_h = human["posterior"]
    pas = pi_h * pi_a + (1 - pi_h) * (1 - pi_a)
    closeness = max(0.0, 1 - abs(agents["effect"] - human["effect"]) / abs(human["effect"]))
    return {
        **base,
        "replicated": int(same and agents["p_value"] < ALPHA),
        "pas": round(pas, 6),
        "closeness": round(closeness, 6),
        "score": round(pas * closeness, 6),
    }


def _rounded(x: Any) -> Any:
    return None if x is None else round(float(x), 6)


def across(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the studies (each its mean over seeds): the score, the share replicated and the ECS."""
    by_task: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_task.setdefault(str(row["task"]), []).append(row)
    scores = [fmean(r["score"] for r in rs) for rs in by_task.values() if all(_number_or_none(r, "score") for r in rs)]
    replicated = [fmean(r["replicated"] for r in rs) for rs in by_task.values() if all("replicated" in r for r in rs)]
    pairs = [
        (rs[0]["human_effect_std"], fmean(r["effect_std"] for r in rs))
        for rs in by_task.values()
        if rs[0].get("human_effect_std") is not None and all(_number_or_none(r, "effect_std") for r in rs)
    ]
    found: dict[str, Any] = {}
    if scores:
        found["study_score"] = round(fmean(scores), 6)
    if replicated:
        found["replication_rate"] = round(fmean(replicated), 6)
    if len(pairs) >= 2:
        found["ecs"] = round(concordance([h for h, _ in pairs], [a for _, a in pairs]), 6)
    return found


def _number_or_none(row: dict[str, Any], key: str) -> bool:
    return isinstance(row.get(key), int | float) and not isinstance(row.get(key), bool)


def concordance(x: list[float], y: list[float]) -> float:
    """Lin's concordance correlation coefficient: agreement of two profiles on the 45° line (1: identical)."""
    mx, my = fmean(x), fmean(y)
    vx, vy = np.var(x), np.var(y)
    cov = fmean((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    denominator = vx + vy + (mx - my) ** 2
    return float(2 * cov / denominator) if denominator else 1.0
