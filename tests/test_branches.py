"""Ensembles: N branches of one run from round K, their shared prefix free, their report the same in any process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from metaroles.cli import main
from metaroles.project.branches import Ensemble, run_branches
from metaroles.project.ensembles import describe
from metaroles.record.eventlog import read_events
from tests.faults.helpers import ok

SOCIETY = {"agents": 20, "rounds": 8, "llm_agents": 4}
RUN_FILES = ("transcript.md", "events.jsonl", "state.json", "metrics.jsonl", "report.json", "ledger.json")
REPORT = ("ensemble.json", "ensemble.md", "ensemble.svg")


@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A society of 20 (four ask the test model), a checkpoint every round."""
    folder = tmp_path_factory.mktemp("branches") / "parent"
    sets = [arg for key, value in SOCIETY.items() for arg in ("--set", f"{key}={value}")]
    ok("run", "society", "--llm", "test", "--seed", "5", *sets, "--checkpoint-every", "1", "--out", str(folder), "-q")
    return folder


def metaroles(*args: str, hash_seed: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed)}
    done = subprocess.run(
        [sys.executable, "-m", "metaroles", *args], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_a_hundred_branches_from_round_5_share_the_prefix_free_and_report_the_same_in_two_processes(
    parent: Path, tmp_path: Path
) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    metaroles("branch", str(parent), "--round", "5", "--n", "100", "--jobs", "2", "--out", str(one), "-q", hash_seed=1)
    metaroles("branch", str(parent), "--round", "5", "--n", "100", "--out", str(two), "-q", hash_seed=2)
    for name in REPORT:
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    branches = sorted(p.name for p in one.iterdir() if p.is_dir())
    assert branches == [f"b{i:03d}" for i in range(100)]
    for name in branches:
        for file in RUN_FILES:
            assert (one / name / file).read_bytes() == (two / name / file).read_bytes(), (name, file)

    n_round = json.loads((parent / "manifest.json").read_text())["n_round"]
    cassettes = [len((one / b / "cassette.jsonl").read_text().splitlines()) for b in branches]
    assert cassettes == [4 * (n_round - 5)] * 100, "each branch asked the model only in its own rounds, 6 on"
    prefix = [e for e in read_events(parent / "events.jsonl") if e["round"] <= 5]
    strip = lambda events: [{k: v for k, v in e.items() if k != "latency_s"} for e in events]  # noqa: E731
    branch_log = read_events(one / "b042" / "events.jsonl")
    assert strip(branch_log[: len(prefix)]) == strip(prefix), "the parent's rounds 1..5, copied, not run again"

    report = json.loads((one / "ensemble.json").read_text())
    assert report["seeds"] == [6, 105] and report["failed"] == []
    assert set(report["diverged_from_parent"]) <= {"6", "7", "8", "9"}, "every branch is its parent up to round 5"
    for name, outcome in report["arms"]["plain"].items():
        assert outcome["n"] == 100 and outcome["missing"] == 0, name
        low, high = outcome["ci95"]
        assert low <= outcome["mean"] <= high and low < high, name
        assert outcome["quantiles"]["min"] <= outcome["quantiles"]["median"] <= outcome["quantiles"]["max"]
    assert "mean: mean" in (one / "ensemble.md").read_text()


def test_an_intervened_arm_is_paired_by_seed_and_its_effect_has_an_interval(parent: Path, tmp_path: Path) -> None:
    """Four stubborn agents of twenty who always say 1.0 pull the society's mean opinion up."""
    stubborn = [f"rule:a{i}=1.0" for i in (0, 5, 10, 15)]
    plan = Ensemble(parent, 5, 12, interventions=stubborn)
    report = run_branches(plan, tmp_path / "e", jobs=2)
    pairs = {(r["arm"], r["seed"]) for r in report["per_run"]}
    assert pairs == {(arm, seed) for arm in ("plain", "intervened") for seed in range(6, 18)}
    effect = report["effects"]["mean"]
    assert effect["pairs"] == 12 and effect["difference"] > 0 and effect["ci95"][0] > 0, effect
    said = [m for m in (tmp_path / "e" / "intervened-b003" / "transcript.md").read_text().splitlines() if "a0" in m]
    assert said, "the stand-in's speeches are in the intervened branch's transcript"
    manifest = json.loads((tmp_path / "e" / "intervened-b003" / "manifest.json").read_text())
    assert manifest["interventions"] == stubborn and manifest["parent"]["seed"] == 9


def test_counted_outcomes_get_wilson_intervals_and_numbers_a_t_interval() -> None:
    winners = ["pro"] * 64 + ["con"] * 36
    counted = describe(winners)["values"]
    assert counted["pro"]["count"] == 64 and counted["pro"]["share"] == 0.64
    low, high = counted["pro"]["ci95"]
    assert 0.53 < low < 0.55 and 0.72 < high < 0.74, "Wilson's 95 % interval of 64 of 100 is [0.542, 0.727]"
    numbers = describe([1.0, 2.0, 3.0, 4.0, 5.0])
    assert numbers["mean"] == 3.0 and numbers["ci95"] == [pytest.approx(1.036757), pytest.approx(4.963243)]
    assert describe([2, 2, 3, None])["values"] == {
        "2": {"count": 2, "share": 0.5, "ci95": [pytest.approx(0.150039), pytest.approx(0.849961)]},
        "3": {"count": 1, "share": 0.25, "ci95": [pytest.approx(0.045587), pytest.approx(0.699358)]},
        "none": {"count": 1, "share": 0.25, "ci95": [pytest.approx(0.045587), pytest.approx(0.699358)]},
    }


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--round", "5", "--n", "0"], "error: --n 0: an ensemble needs 1 to 10000 branches, e.g. --n 100\n"),
        (["--round", "5", "--n", "3", "--intervene", "freeze:zed"], "no role named 'zed' in this run"),
        (["--round", "5", "--n", "3", "--intervene", "hush:a1"], "not an intervention; use one of freeze:NAME"),
        (["--round", "40", "--n", "3"], "--round 40: the parent kept no checkpoint of that round"),
    ],
)
def test_a_bad_branch_request_is_one_line_and_exit_2_before_any_branch_runs(
    parent: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], said: str
) -> None:
    assert main(["branch", str(parent), *args, "--out", str(tmp_path / "e"), "-q"]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err
    assert not (tmp_path / "e").exists()


def test_the_branches_model_is_the_parents_without_its_seed_or_a_base_url_kept_without_credentials() -> None:
    from metaroles.project.branches import branch_model

    parent = {"llm": "openai", "model": "m", "base_url": "http://me:***@127.0.0.1:9/v1", "seed": 4, "temperature": 0.5}
    assert branch_model(parent, None) == {"llm": "openai", "model": "m", "temperature": 0.5}
    assert branch_model({**parent, "base_url": "http://127.0.0.1:9/v1"}, None)["base_url"] == "http://127.0.0.1:9/v1"
    assert branch_model({"llm": "test:7", "seed": 7}, None) == {"llm": "test"}


def test_branches_as_ray_tasks_are_the_branches_made_in_processes(
    parent: Path, ray_address: str, tmp_path: Path
) -> None:
    plan = Ensemble(parent, 5, 4, interventions=["freeze:a2"])
    here = run_branches(plan, tmp_path / "here", jobs=2)
    on_ray = run_branches(plan, tmp_path / "ray", backend="ray", ray_address=ray_address)
    assert on_ray["failed"] == here["failed"] == [] and len(on_ray["per_run"]) == 8
    assert (tmp_path / "ray" / "ensemble.json").read_bytes() == (tmp_path / "here" / "ensemble.json").read_bytes()
    for record in here["per_run"]:
        for file in RUN_FILES:
            assert (tmp_path / "ray" / record["run"] / file).read_bytes() == (
                tmp_path / "here" / record["run"] / file
            ).read_bytes(), (record["run"], file)
