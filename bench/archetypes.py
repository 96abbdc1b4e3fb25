"""How faithful archetypes are: a society and a feed, each model-backed agent asking alone, then through k archetypes.

    python bench/archetypes.py [--scenario society|feed|both] [--agents 120] [--rounds 4] [--seeds 2] [--ks 2,4,8]
                               [--llm local] [--llm-agents N] [--activation 0.5] [--forms chances,examples]

Prints JSON, one line per scenario and k.

Each run is ``metaroles run`` in its own process (seed s, the embedded model by default): first with
every model-backed agent asking alone (``archetypes=0``), then with ``archetypes=k`` for each k, at
the same seeds, in each archetype form (``--forms``: ``chances``, a distribution over the action;
``examples``, eight actions members would take). Compared, per seed, then over the seeds (mean and a
95 % t-interval, scipy):

- society (``--llm-agents`` of them model-backed, every one by default): the opinions' mean and variance after
  the last round (``mean_diff``, ``variance_diff``: archetypes − alone) and, round by round, the mean absolute
  difference of the mean opinion (``mean_path``);
- feed (``--activation`` of the users act a round, each model-guided: ``llm_share=1`` alone, archetypes
  otherwise): the shares of the action kinds over the run, their total variation distance (``actions_tvd``: 0
  the same, 1 disjoint), and the polarization after the last round (``polarization_diff``);
- the model calls of each (``calls_alone``, ``calls``) and how many times fewer (``calls_saved``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

KINDS = ("post", "reply", "repost", "like", "dislike", "follow", "nothing")


def emit(figure: str, value: object, unit: str, **params: object) -> None:
    print(json.dumps({"figure": figure, "value": value, "unit": unit, "params": params}), flush=True)


def run(scenario: str, sets: dict[str, object], rounds: int, seed: int, llm: str, out: Path) -> dict[str, Any]:
    """One run; its metrics rows and its model calls."""
    args = [sys.executable, "-m", "metaroles", "run", scenario, "--llm", llm, "--seed", str(seed)]
    args += [a for k, v in sets.items() for a in ("--set", f"{k}={v}")] + ["--rounds", str(rounds), "-q"]
    subprocess.run([*args, "--out", str(out)], capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"rows": rows, "calls": len(json.loads((out / "ledger.json").read_text()))}


def interval(values: list[float]) -> dict[str, float | None]:
    """Mean and a 95 % t-interval (none for one value)."""
    from scipy import stats

    mean = statistics.fmean(values)
    if len(values) < 2 or statistics.stdev(values) == 0:
        return {"mean": round(mean, 4), "low": None, "high": None}
    low, high = stats.t.interval(0.95, len(values) - 1, loc=mean, scale=stats.sem(values))
    return {"mean": round(mean, 4), "low": round(float(low), 4), "high": round(float(high), 4)}


def society_compared(alone: dict[str, Any], archetypal: dict[str, Any]) -> dict[str, float]:
    a, b = alone["rows"], archetypal["rows"]
    return {
        "mean_diff": b[-1]["mean"] - a[-1]["mean"],
        "variance_diff": b[-1]["variance"] - a[-1]["variance"],
        "mean_path": statistics.fmean(abs(x["mean"] - y["mean"]) for x, y in zip(a, b, strict=False)),
    }


def feed_compared(alone: dict[str, Any], archetypal: dict[str, Any]) -> dict[str, float]:
    def shares(rows: list[dict[str, Any]]) -> list[float]:
        counts = [sum(r.get(kind, 0) for r in rows) for kind in KINDS]
        return [c / max(1, sum(counts)) for c in counts]

    a, b = shares(alone["rows"]), shares(archetypal["rows"])
    return {
        "actions_tvd": sum(abs(x - y) for x, y in zip(a, b, strict=True)) / 2,
        "polarization_diff": archetypal["rows"][-1]["polarization"] - alone["rows"][-1]["polarization"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", choices=["society", "feed", "both"], default="both")
    parser.add_argument("--agents", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--ks", default="2,4,8")
    parser.add_argument("--llm", default="local")
    parser.add_argument("--llm-agents", type=int, default=None, help="society: how many ask the model (default: all)")
    parser.add_argument("--activation", type=float, default=0.5, help="feed: the share of users acting a round")
    parser.add_argument("--forms", default="chances", help="archetype forms, comma-separated: chances, examples")
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    chosen = ["society", "feed"] if args.scenario == "both" else [args.scenario]
    with tempfile.TemporaryDirectory() as tmp:
        for scenario in chosen:
            base: dict[str, object] = (
                {"agents": args.agents, "llm_agents": args.agents if args.llm_agents is None else args.llm_agents}
                if scenario == "society"
                else {"agents": args.agents, "activation": args.activation}
            )
            alone_sets = base if scenario == "society" else {**base, "llm_share": 1}
            seeds = range(1, args.seeds + 1)
            alone = {
                s: run(scenario, alone_sets, args.rounds, s, args.llm, Path(tmp) / f"{scenario}-0-{s}") for s in seeds
            }
            compare = society_compared if scenario == "society" else feed_compared
            for form, k in ((form, k) for form in args.forms.split(",") for k in ks):
                sets = {**base, "archetypes": k, "archetype_form": form}
                runs = {
                    s: run(scenario, sets, args.rounds, s, args.llm, Path(tmp) / f"{scenario}-{form}-{k}-{s}")
                    for s in seeds
                }
                per_seed = [compare(alone[s], runs[s]) for s in seeds]
                figures = {key: interval([p[key] for p in per_seed]) for key in per_seed[0]}
                calls_alone = statistics.fmean(alone[s]["calls"] for s in seeds)
                calls = statistics.fmean(runs[s]["calls"] for s in seeds)
                emit(
                    "archetype_fidelity", figures, "difference", scenario=scenario, form=form, k=k, agents=args.agents,
                    llm_agents=base.get("llm_agents"), activation=base.get("activation"), rounds=args.rounds,
                    seeds=args.seeds, llm=args.llm, calls_alone=calls_alone, calls=calls,
                    calls_saved=round(calls_alone / max(calls, 1), 1),
                )  # fmt: skip


if __name__ == "__main__":
    main()
