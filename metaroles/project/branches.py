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

The report (``ensemble.json``, ``ensemble.md``: :mod:`metaroles.project.ensembles`) reads each
branch's outcomes — the scenario's ``summary(run_dir)`` — and gives for each its distribution across
branches ("pro won 64 of 100, [54, 73] %"), which branches agree and the round where the groups'
stories first part, and how many branches first differ from the parent in each round.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from metaroles.core.exceptions import ConfigError
from metaroles.core.files import write_atomic
from metaroles.core.text import REDACTED
from metaroles.llm.settings import LLMSettings
from metaroles.project.diff import first_divergence, run_messages
from metaroles.project.ensembles import (
    Reading,
    agreement,
    agreement_lines,
    describe,
    effect,
    effect_lines,
    outcome_lines,
    outcomes_of,
    write_ensemble,
)
from metaroles.project.rundir import check_run_dir, read_manifest, refuse_unkept
from metaroles.project.scenario import rebuilt_team
from metaroles.project.sweep import TrialBatch, run_trials
from metaroles.project.trials import Row
from metaroles.team.surgery import check_roles, model_swaps, parse_interventions, recorded

PLAN = "branches.json"
"""What the folder's ensemble is (a second call with another plan is refused, the same one resumes it)."""
MAX_BRANCHES = 10_000
"""The most branches one call makes: a typo must not run for days."""
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

    def saved(self) -> dict[str, Any]:
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

    A branch's seed seeds its model: ``test:N`` becomes ``test``. A base URL the parent recorded
    without its credentials is left out (``OPENAI_BASE_URL`` gives it again, as on a resume).

    Raises:
        ConfigError: If the parent answered from a cassette or a script (nothing new could answer a branch).
    """
    if llm is not None:
        return {k: v for k, v in llm.items() if k != "seed"}
    settings = {k: manifest[k] for k in LLMSettings.model_fields if manifest.get(k) is not None and k != "seed"}
    if REDACTED in str(settings.get("base_url") or ""):  # kept without its credentials: OPENAI_BASE_URL gives it again
        del settings["base_url"]
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
    write_ensemble(out, report, report_markdown)
    return report


def branch_name(params: dict[str, Any]) -> str:
    """A branch's folder: ``b007``, or ``intervened-b007`` in the intervened arm."""
    arm = params.get("arm", "plain")
    return f"b{params['branch']:03d}" if arm == "plain" else f"{arm}-b{params['branch']:03d}"


def _hold(out: Path, plan: Ensemble) -> None:
    """Keep the plan in ``out``; refuse a folder that holds another ensemble's branches."""
    path = out / PLAN
    wanted = plan.saved()
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
    done = [_reading(r) for r in rows if r.get("status") == "done"]
    outcomes = outcomes_of(done)
    arms = {arm: [r for r in done if r["arm"] == arm] for arm in plan.arms}
    report: dict[str, Any] = {
        "title": f"{plan.n} branches from round {plan.from_round}",
        "parent": str(plan.parent.resolve()),
        "from_round": plan.from_round,
        "branches": plan.n,
        "seeds": [plan.first_seed, (plan.first_seed or 0) + plan.n - 1],
        "interventions": recorded(parse_interventions(plan.interventions)),
        "failed": sorted(r["trial"] for r in rows if r.get("status") != "done"),
        "arms": {arm: {name: describe([r.get(name) for r in got]) for name in outcomes} for arm, got in arms.items()},
    }
    if len(plan.arms) > 1:
        report["effects"] = {name: effect(arms["plain"], arms["intervened"], name) for name in outcomes}
    report["agreement"] = agreement(arms["plain"], report["arms"]["plain"], out)
    report["diverged_from_parent"] = _first_parting(plan.parent, [out / r["run"] for r in arms["plain"]])
    report["per_run"] = done
    return report


def _reading(row: Row) -> Reading:
    """A branch's row as an ensemble's reading: its folder, arm, seed and the scenario's summary."""
    summary = {k.removeprefix("summary."): v for k, v in row.items() if k.startswith("summary.")}
    return {"run": row["trial"], "arm": row.get("arm", "plain"), "seed": row.get("seed"), **summary}


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
        lines += ["", f"## {arm}", "", *outcome_lines(outcomes)]
    if "effects" in report:
        lines += ["", "## effect of the intervention (intervened − plain, paired by seed)", ""]
        lines += [f"- {line}" for name, e in report["effects"].items() for line in effect_lines(name, e)]
    lines += ["", "## groups that agree", "", *agreement_lines(report["agreement"], ("branch", "branches"))]
    return "\n".join(lines) + "\n"
