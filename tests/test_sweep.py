"""Sweeps: a grid of trials into run directories and one table, on processes or on Ray, killed and re-run."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaroles import sweep
from metaroles.core import files
from metaroles.core.exceptions import ConfigError
from metaroles.project import trials
from metaroles.project.sweep import TABLE, TIMED, Table, parse_grid, read_table, run_sweep
from tests.faults.helpers import command, killed, ok
from tests.test_sharding import run_files

GRID = {"seed": [0, 1], "turns": [1, 2, 3]}


def untimed(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{k: v for k, v in row.items() if k not in TIMED} for row in rows]


def test_a_grid_on_processes_and_on_ray_gives_the_same_table(ray_address: str, tmp_path: Path) -> None:
    local = run_sweep("debate", GRID, tmp_path / "local", jobs=2)
    on_ray = run_sweep("debate", GRID, tmp_path / "ray", backend="ray", ray_address=ray_address)
    assert [row["trial"] for row in local] == [f"seed={s},turns={t}" for s in (0, 1) for t in (1, 2, 3)]
    assert all(row["status"] == "done" and row["rounds"] > 0 for row in local)
    assert untimed(on_ray) == untimed(local)
    assert untimed(read_table(tmp_path / "ray")) == untimed(read_table(tmp_path / "local"))
    for row in local:  # a trial is a run directory like any other, the same on either backend
        assert run_files(tmp_path / "local" / str(row["trial"])) == run_files(tmp_path / "ray" / str(row["trial"]))
    csv = pd.read_csv(tmp_path / "local" / "sweep.csv")
    assert list(csv["turns"]) == [1, 2, 3, 1, 2, 3]


def test_a_killed_sweep_runs_only_what_is_missing_when_run_again(tmp_path: Path) -> None:
    args = ["sweep", "debate", "--grid", "seed=0,1", "--grid", "turns=1,2,3", "-q"]
    ok(*args, "--out", str(tmp_path / "whole"))
    killed("point=append:events.jsonl:13", *args, "--out", str(tmp_path / "cut"))  # mid-way through a trial
    finished = {p.parent.name: p.stat().st_mtime_ns for p in (tmp_path / "cut").glob("*/report.json")}
    interrupted = [p.parent.name for p in (tmp_path / "cut").glob("*/manifest.json") if p.parent.name not in finished]
    assert finished and len(interrupted) == 1
    ok(*args, "--out", str(tmp_path / "cut"))
    assert {name: (tmp_path / "cut" / name / "report.json").stat().st_mtime_ns for name in finished} == finished
    assert untimed(read_table(tmp_path / "cut")) == untimed(read_table(tmp_path / "whole"))
    for row in read_table(tmp_path / "whole"):
        assert run_files(tmp_path / "cut" / str(row["trial"])) == run_files(tmp_path / "whole" / str(row["trial"]))


def test_the_python_api_returns_a_dataframe_with_the_scenarios_summary(tmp_path: Path) -> None:
    frame = sweep("society", ["seed=0..1", "epsilon=0.1,0.5"], out=tmp_path / "s", options={"agents": 20, "rounds": 3})
    assert isinstance(frame, pd.DataFrame) and len(frame) == 4
    assert {"summary.mean", "summary.variance", "summary.clusters", "total_tokens", "status"} <= set(frame.columns)
    again = sweep("society", ["seed=0..1", "epsilon=0.1,0.5"], out=tmp_path / "s", options={"agents": 20, "rounds": 3})
    assert again.drop(columns=list(TIMED)).equals(frame.drop(columns=list(TIMED)))
    lines = (tmp_path / "s" / TABLE).read_text().splitlines()
    assert [json.loads(line)["trial"] for line in lines] == list(frame["trial"])


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (["seed"], "must be KEY=V1,V2"),
        (["seed=3..1"], "range is empty"),
        (["seed=a..b"], "FIRST..LAST of integers"),
        (["seed=1", "seed=2"], "names 'seed' twice"),
        ([], "at least one --grid"),
    ],
)
def test_a_bad_grid_is_refused_with_its_spec(specs: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_grid(specs)


def test_a_grid_value_the_scenario_refuses_stops_the_sweep_before_any_trial(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="turnz"):
        run_sweep("debate", {"turnz": [1]}, tmp_path / "s")
    with pytest.raises(ConfigError, match="turns"):
        run_sweep("debate", {"seed": [0], "turns": [1, "many"]}, tmp_path / "s")
    assert not list((tmp_path / "s").glob("*/manifest.json"))
    result = command("none", "sweep", "debate", "--grid", "turns=x..y", "--out", str(tmp_path / "t"))
    assert result.returncode == 2 and "FIRST..LAST" in result.stderr and "Traceback" not in result.stderr


def test_the_table_grows_as_trials_end_and_waits_for_the_disk_once(tmp_path: Path, monkeypatch: Any) -> None:
    """Each trial's folder is durable on its own; the table, a view of them, is synced when the sweep ends."""
    synced: list[str] = []
    fsync = os.fsync

    def counted(fd: int) -> None:
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")).name)
        fsync(fd)

    seen: list[int] = []
    monkeypatch.setattr(os, "fsync", counted)
    rows = run_sweep("debate", {"seed": [0, 1, 2]}, tmp_path, on_trial=lambda _: seen.append(len(read_table(tmp_path))))
    assert seen == [1, 2, 3], "the table holds each trial as soon as it ends"
    tables = [name for name in synced if name.startswith(f".{TABLE}") or name.startswith(".sweep.csv")]
    assert len(tables) == 2, tables
    assert read_table(tmp_path) == json.loads(json.dumps(rows))


ROW_VALUES = st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=6), st.floats(allow_nan=False), st.booleans())
ROWS = st.lists(
    st.dictionaries(st.sampled_from(["trial", "seed", "status", "error", "a,b", 'q"x']), ROW_VALUES), max_size=8
)


@settings(max_examples=80, deadline=None)
@given(rows=ROWS, data=st.data())
def test_the_table_of_rows_in_any_order_is_what_csv_and_json_make_of_them_in_grid_order(
    rows: list[dict[str, Any]], data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Rows come in any order, with keys new to the table; each is a JSON line as it comes, the table in grid order."""
    out = tmp_path_factory.mktemp("table")
    order = data.draw(st.permutations(range(len(rows))))
    table = Table(len(rows))
    for index in order:
        assert json.loads(table.put(index, rows[index])) == rows[index]
    table.write(out)
    assert (out / TABLE).read_text() == "".join(json.dumps(row) + "\n" for row in rows)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    expected = io.StringIO()
    writer = csv.DictWriter(expected, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    assert (out / "sweep.csv").read_bytes().decode() == expected.getvalue()
    assert table.rows() == rows


def test_a_worker_killed_mid_trial_fails_its_trial_and_the_sweep_goes_on(tmp_path: Path, monkeypatch: Any) -> None:
    """No traceback and no lost table: the trials it took down say so, and running the sweep again finishes them."""
    parent, died = os.getpid(), tmp_path / "died"

    def die_once(point: str) -> None:  # the first worker to write round 2's checkpoint is killed there
        if os.getpid() != parent and point == "replace:round-0002.json":
            try:
                died.touch(exist_ok=False)
            except FileExistsError:
                return
            os.kill(os.getpid(), signal.SIGKILL)

    monkeypatch.setattr(files, "fault_hook", die_once)
    monkeypatch.setattr(trials, "_context", lambda: get_context("fork"))  # workers inherit the hook (threads or not)
    grid = {"seed": [0, 1, 2, 3]}
    rows = run_sweep("debate", grid, tmp_path / "cut", jobs=2)
    lost = [row for row in rows if row["status"] == "failed"]
    assert died.exists() and len(lost) == 1, rows  # only its own trial: the others went on
    assert all("the process running it died" in row["error"] for row in lost)
    assert read_table(tmp_path / "cut") == json.loads(json.dumps(rows))
    monkeypatch.setattr(files, "fault_hook", None)
    again = run_sweep("debate", grid, tmp_path / "cut", jobs=2)
    whole = run_sweep("debate", grid, tmp_path / "whole")
    assert untimed(again) == untimed(whole) and {row["status"] for row in again} == {"done"}
    for row in lost:
        assert run_files(tmp_path / "cut" / row["trial"]) == run_files(tmp_path / "whole" / row["trial"])


async def test_a_sweep_called_inside_an_event_loop_runs_its_trials_in_workers(tmp_path: Path) -> None:
    """A notebook's cell runs in an event loop, where a trial cannot start its own: even one job runs in a worker."""
    rows = run_sweep("debate", {"seed": [0, 1]}, tmp_path / "one", jobs=1)
    assert [row["status"] for row in rows] == ["done", "done"], rows
    two = run_sweep("debate", {"seed": [0, 1]}, tmp_path / "two", jobs=2)
    assert untimed(two) == untimed(rows)


def test_a_trial_taken_by_a_worker_that_died_before_starting_it_still_gets_a_row(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Nothing is dropped silently: the trial a worker took as it was killed fails, and the sweep says which."""
    parent, take = os.getpid(), trials._take

    def take_then_die(taken: Any, count: int) -> int | None:
        index = take(taken, count)
        if os.getpid() != parent and index is not None:
            os.kill(os.getpid(), signal.SIGKILL)  # before it tells anyone it took this one
        return index

    monkeypatch.setattr(trials, "_take", take_then_die)
    monkeypatch.setattr(trials, "_context", lambda: get_context("fork"))
    grid = {"seed": list(range(6))}
    rows = run_sweep("debate", grid, tmp_path / "s", jobs=2)
    lost = [row for row in rows if row["status"] == "failed"]
    assert len(rows) == 6 and len(lost) == 1 and "the process running it died" in lost[0]["error"], rows
    monkeypatch.setattr(trials, "_take", take)
    assert {row["status"] for row in run_sweep("debate", grid, tmp_path / "s", jobs=2)} == {"done"}


def test_trials_in_threads_sharing_one_engine_write_what_trials_in_processes_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded model's trials run in threads of one process (one engine); their run directories are the same."""
    processes = run_sweep("debate", GRID, tmp_path / "processes", jobs=3)
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr("metaroles.project.sweep.embedded_engine", lambda llm: seen.append(llm) or True)
    threads = run_sweep("debate", GRID, tmp_path / "threads", jobs=3)
    assert seen and untimed(threads) == untimed(processes)
    for row in processes:
        assert run_files(tmp_path / "threads" / str(row["trial"])) == run_files(
            tmp_path / "processes" / str(row["trial"])
        )
    assert trials.embedded_engine({"llm": "local"}) and not trials.embedded_engine({"llm": "test"})
    assert not trials.embedded_engine({"llm": "local", "cassette": "replay:/x"}), "a replay asks no engine"
    assert trials.default_jobs({"llm": "openai", "base_url": "http://x"}) == 1


def test_each_settings_seeds_are_an_ensemble_with_intervals_the_same_in_two_processes(tmp_path: Path) -> None:
    from collections import Counter
    from statistics import fmean

    from statsmodels.stats.proportion import proportion_confint

    from metaroles.flow.ensemble import over_rounds

    grid = ["--grid", "graph_seed=0..7", "--grid", "epsilon=0.1,0.3", "--set", "agents=12", "--set", "rounds=6"]
    ok("sweep", "society", *grid, "--out", str(tmp_path / "a"), "--jobs", "2", "-q")
    ok("sweep", "society", *grid, "--out", str(tmp_path / "b"), "-q")
    for name in ("ensemble.json", "ensemble.md", "ensemble.svg", "rounds.svg"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    report = json.loads((tmp_path / "a" / "ensemble.json").read_text())
    side_by_side = over_rounds(report, tmp_path / "a")  # the settings over the rounds: each arm's mean of its runs
    for epsilon in (0.1, 0.3):
        runs = [tmp_path / "a" / f"graph_seed={seed},epsilon={epsilon}" / "metrics.jsonl" for seed in range(8)]
        lines = [[json.loads(line) for line in run.read_text().splitlines()] for run in runs]
        expected = [fmean(run[k]["variance"] for run in lines) for k in range(len(lines[0]))]
        assert side_by_side["figures"]["variance"][f"epsilon={epsilon}"] == pytest.approx(expected, abs=1e-12)
    parting = side_by_side["parting"]
    arms = side_by_side["figures"]["mean"].values()
    assert parting is not None and len({tuple(a[: side_by_side["rounds"].index(parting)]) for a in arms}) == 1
    assert b"they part at round " + str(parting).encode() in (tmp_path / "a" / "rounds.svg").read_bytes()
    rows = read_table(tmp_path / "a")
    assert list(report["arms"]) == ["epsilon=0.1", "epsilon=0.3"] and report["failed"] == []
    for epsilon in (0.1, 0.3):
        arm = f"epsilon={epsilon}"
        clusters = [r["summary.clusters"] for r in rows if r["epsilon"] == epsilon]
        means = [r["summary.mean"] for r in rows if r["epsilon"] == epsilon]
        counted = report["arms"][arm]["clusters"]
        assert counted["n"] == 8 and {int(v): c["count"] for v, c in counted["values"].items()} == Counter(clusters)
        for value, c in counted["values"].items():  # "k of 12" with its Wilson interval
            assert c["ci95"] == pytest.approx(proportion_confint(c["count"], 8, method="wilson"), abs=1e-6), value
        spread = report["arms"][arm]["mean"]
        assert spread["mean"] == pytest.approx(fmean(means), abs=1e-6)
        assert spread["ci95"][0] <= spread["mean"] <= spread["ci95"][1] and spread["ci95"][0] < spread["ci95"][1]
        groups = report["agreement"][arm]
        assert sum(g["count"] for g in groups) == 8 and [g["count"] for g in groups] == sorted(
            Counter(clusters).values(), reverse=True
        )
        for group in groups:  # a group agrees: its runs ended with the same count of clusters
            ended = {r["summary.clusters"] for r in rows if r["trial"] in group["runs"]}
            assert ended == {int(group["outcomes"]["clusters"])}
        assert all(g["parts_from_largest_at_round"] is not None for g in groups[1:])
    assert "epsilon=0.3" in (tmp_path / "a" / "ensemble.md").read_text()
