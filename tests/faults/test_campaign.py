"""The holes an outside campaign found: each is its one-line reproduction, and what must come of it.

Planted links in a workspace or a run directory, a resume that fails half-way, two commands on
one run directory, a received run directory's scenario file, a fork that changes the run's
length, a grid too large to count.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from metaroles.core.confined import LinkRefused
from metaroles.project.rundir import locked
from tests.faults.helpers import command, differences, digest, killed, ok, run_args


def one_line_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("model:")]
    assert len(lines) == 1 and "Traceback" not in stderr and "a metaroles bug" not in stderr, stderr
    return lines[0]


@pytest.fixture(scope="module")
def company(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The software company run straight, and killed once its second checkpoint is written."""
    root = tmp_path_factory.mktemp("company")
    ok(*run_args("software_company", root / "straight"))
    killed("point=replace:round-0003.json:1", *run_args("software_company", root / "killed"))
    assert (root / "killed" / "checkpoints" / "round-0002.json").is_file()
    return root / "straight", root / "killed"


@pytest.fixture(scope="module")
def debate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The debate run straight, and killed mid-run."""
    root = tmp_path_factory.mktemp("debate")
    ok(*run_args("debate", root / "straight"))
    killed("call=5", *run_args("debate", root / "killed"))
    return root / "straight", root / "killed"


def test_a_folder_of_the_workspace_swapped_for_a_link_is_not_followed_on_resume(tmp_path, company):
    straight, killed_run = company
    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    shutil.copytree(killed_run, run_dir, symlinks=True)
    elsewhere.mkdir()
    shutil.rmtree(run_dir / "workspace" / "docs")
    os.symlink(elsewhere, run_dir / "workspace" / "docs")
    ok("resume", str(run_dir), "-q")
    assert list(elsewhere.iterdir()) == [], "the resumed run wrote through the planted link"
    assert not (run_dir / "workspace" / "docs").is_symlink()
    assert differences(straight, run_dir) == []


def test_the_actions_write_and_read_no_file_through_a_link(tmp_path):
    from metaroles.actions.software import WritePRD

    workspace, elsewhere = tmp_path / "ws", tmp_path / "elsewhere"
    (workspace / "src").mkdir(parents=True)
    elsewhere.mkdir()
    (elsewhere / "secret.py").write_text("SECRET = 1\n")
    os.symlink(elsewhere, workspace / "docs")
    action = WritePRD(workspace)
    with pytest.raises(LinkRefused, match=r"'docs/prd\.md' goes through a symbolic link"):
        action.write("docs/prd.md", "x")
    assert list(elsewhere.iterdir()) == [elsewhere / "secret.py"]
    os.symlink(elsewhere / "secret.py", workspace / "src" / "linked.py")
    (workspace / "src" / "own.py").write_text("OWN = 1\n")
    assert action.sources("src", "*.py") == [("own", "OWN = 1\n")]
    shutil.rmtree(workspace / "src")
    os.symlink(elsewhere, workspace / "src")
    assert action.sources("src", "*.py") == []
    action.write("notes/a.md", "kept")
    assert (workspace / "notes" / "a.md").read_text() == "kept"
    assert oct((workspace / "notes" / "a.md").stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_resume_that_fails_changes_nothing(tmp_path, debate):
    """``checkpoints`` a file, not a folder: the resume is refused before the event log goes."""
    _, killed_run = debate
    run_dir = tmp_path / "run"
    shutil.copytree(killed_run, run_dir)
    shutil.rmtree(run_dir / "checkpoints")
    (run_dir / "checkpoints").write_text("x\n")
    before = digest(run_dir)
    refused = command("none", "resume", str(run_dir), "-q")
    assert refused.returncode == 2 and "checkpoints is not a folder" in one_line_error(refused.stderr)
    assert digest(run_dir) == before and (run_dir / "events.jsonl").is_file()


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("checkpoint_every", 0, "checkpoint_every=0"),
        ("n_round", -4, "n_round=-4"),
        ("n_round", "8", "n_round='8'"),
        ("events", "../../elsewhere", "events='../../elsewhere'"),
    ],
)
def test_a_damaged_manifest_is_refused_before_anything_changes(tmp_path, debate, field, value, said):
    _, killed_run = debate
    run_dir = tmp_path / "run"
    shutil.copytree(killed_run, run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    (run_dir / "manifest.json").write_text(json.dumps({**manifest, field: value}))
    before = digest(run_dir)
    refused = command("none", "resume", str(run_dir), "-q")
    assert refused.returncode == 2 and said in one_line_error(refused.stderr)
    assert digest(run_dir) == before


def test_a_second_command_on_a_held_run_directory_is_refused_naming_the_holder(tmp_path, debate):
    straight, killed_run = debate
    run_dir = tmp_path / "run"
    shutil.copytree(killed_run, run_dir)
    before = digest(run_dir)
    with locked(run_dir):
        for args in (["resume", str(run_dir), "-q"], run_args("debate", run_dir)):
            refused = command("none", *args)
            assert refused.returncode == 2, refused.stderr
            assert f"in use by process {os.getpid()}" in one_line_error(refused.stderr)
        assert digest(run_dir) == before
    ok("resume", str(run_dir), "-q")  # the holder is gone: the lock went with it
    assert differences(straight, run_dir) == []


def test_a_received_run_directorys_scenario_file_runs_only_when_trusted(tmp_path):
    scenario = tmp_path / "elsewhere" / "tiny.py"
    scenario.parent.mkdir()
    marker = tmp_path / "imported"
    source = Path(__file__).parents[1].joinpath("plugin_pkg", "metaroles_echo", "scenario.py").read_text()
    scenario.write_text(f"open({str(marker)!r}, 'a').write('x')\n" + source)
    project = tmp_path / "project"
    project.mkdir()
    ok("run", str(scenario), "--llm", "test", "--out", str(tmp_path / "run"), "-q", cwd=scenario.parent)
    marker.unlink()
    (tmp_path / "run" / "report.json").unlink()
    refused = command("none", "resume", str(tmp_path / "run"), "-q", cwd=project)
    line = one_line_error(refused.stderr)
    assert refused.returncode == 2 and str(scenario) in line and "--trust" in line
    assert not marker.exists(), "the scenario file was imported before it was trusted"
    ok("resume", str(tmp_path / "run"), "-q", "--trust", cwd=project)
    assert marker.exists()


@pytest.mark.parametrize(
    ("name", "links_to"),
    [("checkpoints/messages.jsonl", "resume"), ("events.jsonl", "resume"), ("flow.graphml", "graph")],
)
def test_a_command_writes_through_no_link_in_a_run_directory(tmp_path, debate, name, links_to):
    _, killed_run = debate
    run_dir, outside = tmp_path / "run", tmp_path / "outside.txt"
    shutil.copytree(killed_run, run_dir)
    outside.write_text("keep me\n")
    (run_dir / name).unlink(missing_ok=True)
    os.symlink(outside, run_dir / name)
    if links_to == "resume":
        refused = command("none", "resume", str(run_dir), "-q")
        assert refused.returncode == 2 and "is a symbolic link" in one_line_error(refused.stderr)
    else:
        ok("graph", str(run_dir), "-f", "graphml")
        assert not (run_dir / name).is_symlink() and "<graphml" in (run_dir / name).read_text()
    assert outside.read_text() == "keep me\n"


@pytest.mark.parametrize(("option", "longer"), [("rounds=10", 4), ("agents=30", 0)])
def test_a_fork_runs_as_long_as_its_changed_config_says(tmp_path, option, longer):
    parent = tmp_path / "parent"
    ok("run", "society", "--llm", "test", "--set", "agents=30", "--set", "rounds=6", "--out", str(parent), "-q")
    child = tmp_path / "child"
    ok("fork", str(parent), "--from-round", "3", "--set", option, "--out", str(child), "-q")
    ran = {}
    for run_dir in (parent, child):
        manifest = json.loads((run_dir / "manifest.json").read_text())
        ran[run_dir] = json.loads((run_dir / "report.json").read_text())["report"]["rounds"]
        assert manifest["n_round"] == ran[run_dir], "the manifest says how long it ran"
    assert ran[child] == ran[parent] + longer


def test_a_run_stopped_by_rounds_can_be_extended(tmp_path):
    straight, short = tmp_path / "straight", tmp_path / "short"
    ok(*run_args("debate", straight))
    ok(*run_args("debate", short, "--rounds", "3"))
    assert json.loads((short / "report.json").read_text())["report"]["rounds"] == 3
    ok("resume", str(short), "-q", "--rounds", str(json.loads((straight / "manifest.json").read_text())["n_round"]))
    assert [d for d in differences(straight, short) if "manifest" not in d and "report" not in d] == []


def test_a_fork_from_a_round_the_parent_never_reached_is_refused(tmp_path, debate):
    straight, _ = debate
    refused = command("none", "fork", str(straight), "--from-round", "999", "--out", str(tmp_path / "c"), "-q")
    assert refused.returncode == 2 and "past the parent's last checkpoint" in one_line_error(refused.stderr)
    assert not (tmp_path / "c").exists()


def test_a_grid_too_large_is_counted_not_expanded():
    refused = command("none", "sweep", "debate", "--grid", "seed=0..999999999999", "--grid", "turns=1,2", "-q")
    line = one_line_error(refused.stderr)
    assert refused.returncode == 2 and "2,000,000,000,000 trials" in line and "--max-trials" in line
