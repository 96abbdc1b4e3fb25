"""Ensembles: N branches of one run from round K, each on its own seed, and what their outcomes say together.

``metaroles branch RUN --round K --n 100`` forks RUN at its checkpoint of round K a hundred times
(``RUN-branchesK/b000`` …), each branch reseeded at the fork point (its random source, its ids, its
model's sampling seed). Every branch shares the parent's record up to K — restored, not run again,
so that prefix costs no model call — and each is a run directory like any other (resume, fork,
diff, export). The branches are trials of one batch (:func:`~metaroles.project.sweep.run_trials`):
processes here or Ray tasks, resumed when run again, byte-identical in any process.

With interventions (``--intervene freeze:a3``, :mod:`metaroles.team.surgery`) each seed runs
twice, a plain branch and an intervened one, and the report gives the effect of the change on
each outcome, paired by seed, with its interval.

The report (``ensemble.json``, ``ensemble.md``) reads each branch's outcomes — the scenario's
``summary(run_dir)`` — and gives for each its distribution across branches: a numeric one's mean
with a t interval and quantiles, a categorical one's counts with Wilson intervals ("pro won 64 of
100, [54, 73] %"); which branches agree (the same categorical outcomes) and the round where the
groups' stories first part (:func:`~metaroles.project.diff.diff_runs` of their first members).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from metaroles.core.exceptions import ConfigError
from metaroles.core.files import write_atomic
from metaroles.llm.settings import LLMSettings
from metaroles.project.diff import first_divergence, run_messages
from metaroles.project.rundir import check_run_dir, read_manifest, refuse_unkept
from metaroles.project.scenario import rebuilt_team
from metaroles.project.sweep import TrialBatch, run_trials
from metaroles.project.trials import Row
from metaroles.team.surgery import check_roles, model_swaps, parse_interventions, recorded

ENSEMBLE = "ensemble.json"
"""The report, as data."""
ENSEMBLE_MD = "ensemble.md"
"""The report, as people read it."""
PLAN = "branches.json"
"""What the folder's ensemble is (a second call with another plan is refused, the same one resumes it)."""
MAX_BRANCHES = 10_000
"""The most branches one call makes: a typo must not run for days."""
FEW = 10
"""An integer outcome with at most this many values across branches is counted by value too."""
ARMS = ("plain", "intervened")


@dataclass(frozen=True)
class Ensemble:
    """The branches to make: of which run, from which round, how many, their seeds, what each arm changes."""

    parent: Path
    from_round: int
    n: int
    first_seed: int | None = None
    """The first branch's seed (the others follow it); default: the parent's seed + 1."""
    interventions: list[str] = field(default_factory=list)

    @property
    def arms(self) -> tuple[str, ...]:
        """``plain``, and ``intervened`` when the ensemble has interventions."""
        return ARMS if self.interventions else ARMS[:1]

    def record(self) -> dict[str, Any]:
        """The plan as the folder keeps it."""
        return {
            "parent": str(self.parent.resolve()),
            "from_round": self.from_round,
            "n": self.n,
            "first_seed": self.first_seed,
            "interventions": self.interventions,
        }


def checked(plan: Ensemble) -> dict[str, Any]:
    """Check the plan against its parent before any branch runs; the parent's manifest.

    Raises:
        ConfigError: For a branch count out of range, a parent that is not a finished-enough run
            directory or kept no checkpoint of the round, or an intervention that does not parse.
        UnknownRoleError: For an intervention naming a role the run does not have.
    """
    if isinstance(plan.n, bool) or not isinstance(plan.n, int) or not 1 <= plan.n <= MAX_BRANCHES:
        raise ConfigError(f"--n {plan.n!r}: an ensemble needs 1 to {MAX_BRANCHES} branches, e.g. --n 100")
    manifest = read_manifest(plan.parent)
    check_run_dir(plan.parent)
    refuse_unkept(plan.parent, plan.from_round)
    surgeries = parse_interventions(plan.interventions)
    if surgeries:
        from metaroles.llm.offline import TestLLM

        team = rebuilt_team({**manifest, "interventions": None}, TestLLM(), plan.parent, {})
        check_roles(surgeries, team.env.roles)
    return manifest


def branch_model(manifest: dict[str, Any], llm: dict[str, Any] | None) -> dict[str, Any]:
    """The settings the branches' model is made from: ``llm`` if given, else the parent's model.

    A branch's seed seeds its model: ``test:N`` becomes ``test``.

    Raises:
        ConfigError: If the parent answered from a tape or a script (nothing new could answer a branch).
    """
    if llm is not None:
        return {k: v for k, v in llm.items() if k != "seed"}
    settings = {k: manifest[k] for k in LLMSettings.model_fields if manifest.get(k) is not None and k != "seed"}
    spec = str(settings.get("llm", "test"))
    if spec.startswith(("replay:", "scripted:")) or manifest.get("replayed_from"):
        raise ConfigError(
            f"the parent's model is {spec!r}, which only repeats what it has; "
            "give the branches a model, e.g. --llm test"
        )
    settings["llm"] = "test" if spec.startswith("test") else spec
    return settings


def run_branches(
    plan: Ensemble,
    out: Path,
    *,
    llm: dict[str, Any] | None = None,
    backend: str = "local",
    jobs: int = 1,
    ray_address: str | None = None,
    on_trial: Callable[[Row], None] | None = None,
) -> dict[str, Any]:
    """Make the ensemble's branches not made yet into ``out``; write and return its report.

    Raises:
        ConfigError: See :func:`checked`; also if ``out`` holds another ensemble.
    """
    manifest = checked(plan)
    if plan.first_seed is None:
        plan = replace(plan, first_seed=(manifest.get("seed") or 0) + 1)
    out.mkdir(parents=True, exist_ok=True)
    _hold(out, plan)
    first = plan.first_seed or 0
    params = [
        {"branch": i, "seed": first + i, **({"arm": arm} if len(plan.arms) > 1 else {})}
        for arm in plan.arms
        for i in range(plan.n)
    ]
    names = [branch_name(p) for p in params]
    fork = {"run_dir": str(plan.parent.resolve()), "from_round": plan.from_round}
    specs = {f"role.{name}.llm": spec for name, spec in (manifest.get("role_llms") or {}).items()}
    swapped = model_swaps(parse_interventions(plan.interventions))
    configs = [{**manifest["config"], **specs, **(swapped if p.get("arm") == "intervened" else {})} for p in params]
    forks = [{**fork, "interventions": plan.interventions if p.get("arm") == "intervened" else []} for p in params]
    batch = TrialBatch(manifest["scenario"], out, names, params, configs, forks=forks)
    settings = {**branch_model(manifest, llm), "cassette": "record"}
    rows = run_trials(batch, llm=settings, backend=backend, jobs=jobs, ray_address=ray_address, on_trial=on_trial)
    report = ensemble_report(plan, rows, out)
    write_atomic(out / ENSEMBLE, json.dumps(report, indent=1) + "\n")
    write_atomic(out / ENSEMBLE_MD, report_markdown(report))
    return report


def branch_name(params: dict[str, Any]) -> str:
    """A branch's folder: ``b007``, or ``intervened-b007`` in the intervened arm."""
    arm = params.get("arm", "plain")
    return f"b{params['branch']:03d}" if arm == "plain" else f"{arm}-b{params['branch']:03d}"


def _hold(out: Path, plan: Ensemble) -> None:
    """Keep the plan in ``out``; refuse a folder that holds another ensemble's branches."""
    path = out / PLAN
    wanted = plan.record()
    if path.is_file():
        held = json.loads(path.read_text(encoding="utf-8"))
        if held != wanted:
            raise ConfigError(
                f"{str(out)!r} holds another ensemble ({held.get('n')} branches of round {held.get('from_round')} "
                f"of {held.get('parent')}); give another --out"
            )
        return
    write_atomic(path, json.dumps(wanted, indent=1) + "\n")


def ensemble_report(plan: Ensemble, rows: Sequence[Row], out: Path) -> dict[str, Any]:
    """What the branches' outcomes say together (see the module); a function of the runs alone."""
    done = [r for r in rows if r.get("status") == "done"]
    outcomes = sorted({k.removeprefix("summary.") for r in done for k in r if k.startswith("summary.")})
    arms = {arm: [r for r in done if r.get("arm", "plain") == arm] for arm in plan.arms}
    report: dict[str, Any] = {
        "parent": str(plan.parent.resolve()),
        "from_round": plan.from_round,
        "branches": plan.n,
        "seeds": [plan.first_seed, (plan.first_seed or 0) + plan.n - 1],
        "interventions": recorded(parse_interventions(plan.interventions)),
        "failed": sorted(r["trial"] for r in rows if r.get("status") != "done"),
        "arms": {
            arm: {name: describe([_value(r, name) for r in got]) for name in outcomes} for arm, got in arms.items()
        },
    }
    if len(plan.arms) > 1:
        report["effects"] = {name: effect(arms["plain"], arms["intervened"], name) for name in outcomes}
    report["agreement"] = agreement(arms["plain"], report["arms"]["plain"], out)
    report["diverged_from_parent"] = _first_parting(plan.parent, [out / r["trial"] for r in arms["plain"]])
    report["per_branch"] = [
        {
            "branch": r["trial"],
            "arm": r.get("arm", "plain"),
            "seed": r.get("seed"),
            **{n: _value(r, n) for n in outcomes},
        }
        for r in done
    ]
    return report


def _value(row: Row, name: str) -> Any:
    return row.get(f"summary.{name}")


def _numeric(values: Sequence[Any]) -> bool:
    return bool(values) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def describe(values: Sequence[Any]) -> dict[str, Any]:
    """One outcome across branches: numeric (mean, t interval, quantiles) and/or counted by value (Wilson)."""
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
    """Each value's count of the branches, its share and the share's 95 % Wilson interval."""
    from statsmodels.stats.proportion import proportion_confint

    counts = Counter(_label(v) for v in values)
    total = len(values)
    shown: dict[str, Any] = {}
    for label, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        low, high = proportion_confint(count, total, alpha=0.05, method="wilson")
        shown[label] = {"count": count, "share": _r(count / total), "ci95": [_r(low), _r(high)]}
    return shown


def _label(value: Any) -> str:
    return "none" if value is None else json.dumps(value) if not isinstance(value, str) else value


def effect(plain: Sequence[Row], intervened: Sequence[Row], name: str) -> dict[str, Any]:
    """The intervention's effect on one outcome: intervened minus plain, paired by seed, with its 95 % interval."""
    by_seed = {r.get("seed"): _value(r, name) for r in plain}
    pairs = [(by_seed[r.get("seed")], _value(r, name)) for r in intervened if r.get("seed") in by_seed]
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
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
    """Per value, its share among intervened minus among plain branches, with a 95 % Newcombe interval."""
    from statsmodels.stats.proportion import confint_proportions_2indep

    a, b = Counter(map(_label, plain)), Counter(map(_label, intervened))
    shown: dict[str, Any] = {}
    for label in sorted(set(a) | set(b)):
        low, high = confint_proportions_2indep(b[label], len(intervened), a[label], len(plain), method="newcomb")
        difference = b[label] / len(intervened) - a[label] / len(plain)
        shown[label] = {"difference": _r(difference), "ci95": [_r(low), _r(high)]}
    return shown


def agreement(rows: Sequence[Row], described: dict[str, Any], out: Path) -> list[dict[str, Any]]:
    """Branches grouped by their counted outcomes (largest group first), and where each group parts from the first."""
    counted = [name for name, d in described.items() if "values" in d]
    groups: dict[tuple[str, ...], list[str]] = {}
    for row in rows:
        groups.setdefault(tuple(_label(_value(row, n)) for n in counted), []).append(row["trial"])
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
    largest = run_messages(out / ordered[0][1][0]) if len(ordered) > 1 else []
    shown = []
    for n, (key, members) in enumerate(ordered):
        parting = first_divergence(largest, run_messages(out / members[0])) if n else None
        shown.append({"outcomes": dict(zip(counted, key, strict=True)), "count": len(members), "branches": members,
                      "parts_from_largest_at_round": parting})  # fmt: skip
    return shown


def _first_parting(parent: Path, branches: Sequence[Path]) -> dict[str, int]:
    """How many branches first differ from the parent in each round (none before the fork round)."""
    told = run_messages(parent)
    rounds = Counter(first_divergence(told, run_messages(branch)) for branch in branches)
    return {
        ("never" if r is None else str(r)): c
        for r, c in sorted(rounds.items(), key=lambda i: (i[0] is None, i[0] or 0))
    }


def report_markdown(report: dict[str, Any]) -> str:
    """The report as people read it: each outcome's distribution, the effects, the groups that agree."""
    lines = [
        f"# {report['branches']} branches of {report['parent']} from round {report['from_round']}",
        "",
        f"Seeds {report['seeds'][0]}..{report['seeds'][1]}"
        + (f"; intervened: {', '.join(report['interventions'])}" if report["interventions"] else "")
        + (f"; failed: {', '.join(report['failed'])}" if report["failed"] else ""),
    ]
    for arm, outcomes in report["arms"].items():
        lines += ["", f"## {arm}", ""]
        for name, d in outcomes.items():
            lines += [f"- {line}" for line in _outcome_lines(name, d)]
    if "effects" in report:
        lines += ["", "## effect of the intervention (intervened − plain, paired by seed)", ""]
        lines += [f"- {line}" for name, e in report["effects"].items() for line in _effect_lines(name, e)]
    lines += ["", "## groups that agree", ""]
    for group in report["agreement"]:
        said = ", ".join(f"{k}={v}" for k, v in group["outcomes"].items()) or "(no counted outcome)"
        parts = group["parts_from_largest_at_round"]
        where = "" if parts is None else f"; its story parts from the largest group's at round {parts}"
        lines.append(f"- {said}: {group['count']} branches{where}")
    return "\n".join(lines) + "\n"


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


def _effect_lines(name: str, e: dict[str, Any]) -> list[str]:
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
