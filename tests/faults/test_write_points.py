"""A kill at every named write point loses nothing: the run resumes to the uninterrupted run's bytes.

Each test kills (or fails) a real ``metaroles`` process at an exact instant through the writer's
fault hook (``tests/faults/driver.py``), not by luck, then resumes it in another process.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.faults.helpers import command, contents, differences, digest, killed, ok, run_args


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("straight")
    runs = {}
    for name in ("debate", "werewolf", "software_company"):
        ok(*run_args(name, root / name))
        runs[name] = root / name
    return runs


def one_line_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("model:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.mark.parametrize("name", ["debate", "werewolf"])
def test_a_kill_while_resume_rewrites_the_event_log_loses_nothing(tmp_path, straight, name):
    run_dir = tmp_path / name
    killed("call=5", *run_args(name, run_dir))
    killed("point=replace:events.jsonl:1", "resume", str(run_dir), "-q")
    ok("resume", str(run_dir), "-q")
    assert differences(straight[name], run_dir) == []


@pytest.mark.parametrize("point", ["append:metrics.jsonl:4", "replace:round-0004.json:1", "append:events.jsonl:3"])
def test_a_kill_between_a_rounds_files_loses_nothing(tmp_path, straight, point):
    """Events, then metrics, then the checkpoint: a kill between any two is reconciled on resume."""
    run_dir = tmp_path / "werewolf"
    killed(f"point={point}", *run_args("werewolf", run_dir))
    ok("resume", str(run_dir), "-q")
    assert differences(straight["werewolf"], run_dir) == []


def test_a_torn_metrics_line_is_skipped_and_written_again(tmp_path, straight):
    run_dir = tmp_path / "werewolf"
    killed("point=replace:round-0005.json:1", *run_args("werewolf", run_dir))
    with (run_dir / "metrics.jsonl").open("a") as handle:
        handle.write('{"round": 6, "ali')
    resumed = ok("resume", str(run_dir), "-q")
    assert "metrics.jsonl: the last line is torn" in resumed.stderr
    assert differences(straight["werewolf"], run_dir) == []


@pytest.mark.parametrize("when", ["interrupt=12", "interrupt=30"])
def test_ctrl_c_stops_a_run_with_one_line_and_resume_finishes_it(tmp_path, straight, when):
    """Ctrl-C between two writes: exit 130, one line saying how to go on, and the run goes on to the same files."""
    run_dir = tmp_path / "debate"
    result = command(when, *run_args("debate", run_dir))
    assert result.returncode == 130, result.stderr[-2000:]
    assert one_line_error(result.stderr) == f"error: interrupted; to go on: metaroles resume {run_dir}"
    ok("resume", str(run_dir), "-q")
    assert differences(straight["debate"], run_dir) == []


def test_a_run_killed_before_its_first_checkpoint_starts_over(tmp_path, straight):
    run_dir = tmp_path / "debate"
    killed("point=replace:round-0000.json:1", *run_args("debate", run_dir))
    ok("resume", str(run_dir), "-q")
    assert differences(straight["debate"], run_dir) == []


def test_a_failed_model_turn_is_logged_then_retried_on_resume(tmp_path, straight):
    run_dir = tmp_path / "debate"
    failed = command("fail=4", *run_args("debate", run_dir))
    assert failed.returncode == 1
    assert "503" in one_line_error(failed.stderr) and "metaroles resume" in failed.stderr
    assert '"kind":"role_error"' in (run_dir / "events.jsonl").read_text()
    ok("resume", str(run_dir), "-q")
    assert differences(straight["debate"], run_dir) == []


def test_a_kill_mid_manifest_leaves_no_half_run_directory(tmp_path):
    run_dir = tmp_path / "debate"
    killed("point=replace:manifest.json:1", *run_args("debate", run_dir))
    assert not (run_dir / "manifest.json").exists()
    refused = command("none", "resume", str(run_dir))
    assert refused.returncode == 2 and "is not a run directory" in one_line_error(refused.stderr)


def test_a_resume_that_cannot_read_the_log_changes_nothing(tmp_path):
    run_dir = tmp_path / "debate"
    killed("call=6", *run_args("debate", run_dir))
    lines = (run_dir / "events.jsonl").read_text().splitlines(keepends=True)
    lines[3] = "garbage\n"
    (run_dir / "events.jsonl").write_text("".join(lines))
    before = digest(run_dir)
    refused = command("none", "resume", str(run_dir))
    assert refused.returncode == 2 and "events.jsonl: line 4 is not a valid entry" in one_line_error(refused.stderr)
    assert digest(run_dir) == before


@pytest.mark.parametrize("point", ["append:events.jsonl:2", "replace:round-0004.json:1", "call=3"])
def test_a_killed_fork_resumes_to_the_unkilled_fork_and_never_touches_its_parent(tmp_path, straight, point):
    parent = tmp_path / "parent"
    shutil.copytree(straight["software_company"], parent)
    before = digest(parent)
    fork = ["fork", str(parent), "--from-round", "3", "--set", "role.Engineer.llm=test:99", "-q"]
    ok(*fork, "--out", str(tmp_path / "whole"))
    when = point if point.startswith("call") else f"point={point}"
    killed(when, *fork, "--out", str(tmp_path / "killed"))
    ok("resume", str(tmp_path / "killed"), "-q")
    assert differences(tmp_path / "whole", tmp_path / "killed") == []
    assert digest(parent) == before, "the fork wrote into its parent"
    assert (tmp_path / "killed" / "workspace").is_dir()


def test_a_fork_starts_from_its_parents_workspace_at_the_fork_round(tmp_path, straight):
    parent = tmp_path / "parent"
    shutil.copytree(straight["software_company"], parent)
    before = digest(parent)
    kept = sorted(p.name for p in (parent / "checkpoints").glob("workspace-*.json"))
    assert kept, "the workspace is kept with the checkpoints"
    ok("fork", str(parent), "--from-round", "4", "--out", str(tmp_path / "child"), "-q")
    assert contents(tmp_path / "child" / "workspace") == contents(parent / "workspace"), "a fork without a change"
    assert digest(parent) == before, "the fork wrote into its parent"
    first = json.loads(sorted((tmp_path / "child" / "checkpoints").glob("workspace-*.json"))[0].read_text())
    at_fork = json.loads(sorted((parent / "checkpoints").glob("workspace-000[0-4].json"))[-1].read_text())
    assert set(at_fork) <= set(first), "the child began with the parent's files of round 4"


@pytest.mark.parametrize("appends", [5, 13])
def test_message_rows_written_ahead_of_the_checkpoint_are_cut_on_resume(tmp_path, appends):
    """The message table grows every round; a kill between checkpoints leaves rows no checkpoint names."""
    straight_dir, run_dir = tmp_path / "straight", tmp_path / "cut"
    ok(*run_args("society", straight_dir))
    killed(f"point=append:messages.jsonl:{appends}", *run_args("society", run_dir))
    folder = run_dir / "checkpoints"
    last = max(folder.glob("round-*.json"))
    named = json.loads(last.read_text())["rows"]
    assert (folder / "messages.jsonl").read_bytes().count(b"\n") > named  # ahead of its last checkpoint
    ok("resume", str(run_dir), "-q")
    assert differences(straight_dir, run_dir) == []


SOCIETY = ["--set", "agents=3000", "--rounds", "8"]
"""A run whose rounds never await a model: Ctrl-C must still stop it at the next round barrier."""


@pytest.mark.parametrize("when", ["interrupt=9", "interrupt2=9"])
def test_ctrl_c_stops_a_cpu_bound_run_at_the_next_barrier_and_twice_at_once(tmp_path, when):
    straight, run_dir = tmp_path / "straight", tmp_path / "society"
    ok("run", "society", "--llm", "test", "--seed", "5", *SOCIETY, "--out", str(straight), "-q")
    result = command(when, "run", "society", "--llm", "test", "--seed", "5", *SOCIETY, "--out", str(run_dir), "-q")
    assert result.returncode == 130, result.stderr[-2000:]
    assert one_line_error(result.stderr) == f"error: interrupted; to go on: metaroles resume {run_dir}"
    if when.startswith("interrupt="):  # once: the round under way ends, and the run writes what a stopped run writes
        report = json.loads((run_dir / "report.json").read_text())["report"]
        assert report["stop_reason"] == "interrupted" and 0 < report["rounds"] < 8
        assert (run_dir / "ledger.json").is_file()
    else:  # twice: at once, its last checkpoint whole
        assert not (run_dir / "report.json").exists()
    ok("resume", str(run_dir), "-q")
    assert differences(straight, run_dir) == []
