"""A run that waits for the disk once, at its end: the same files, no sync while it runs, exact after a kill."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from metaroles import TestLLM
from metaroles.core import files
from metaroles.core.exceptions import InvalidValueError, RunDirCorrupt
from metaroles.project.scenario import resume_scenario, run_scenario
from metaroles.project.sweep import read_table, run_sweep
from metaroles.record import durability
from metaroles.record.durability import SYNCED, UNSYNCED, boot_id, finish_syncing, restarted_since
from metaroles.team.options import RunOptions
from tests.faults.helpers import command

CLOCKED = {"manifest.json", "timings.jsonl"}
"""The files two runs of one seed may differ in (the time they were made, the latencies measured)."""


def run_files(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name not in CLOCKED
    }


def watch_fsyncs(monkeypatch: Any) -> list[str]:
    """Record the name of every file or folder fsynced from now on, in order."""
    synced: list[str] = []
    fsync = os.fsync

    def recorded(fd: int) -> None:
        synced.append("fsync:" + os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recorded)
    return synced


def renamed(path: Path) -> Path:
    """The file a temp file (``.NAME`` + 8 random characters + ``.tmp``, synced before its rename) became."""
    if path.name.startswith(".") and path.name.endswith(".tmp"):
        return path.with_name(path.name[1:-12])
    return path


def test_writes_inside_syncs_deferred_wait_for_the_disk_once_when_it_ends(tmp_path: Path, monkeypatch: Any) -> None:
    synced = watch_fsyncs(monkeypatch)
    with files.syncs_deferred():
        files.create_durably(tmp_path / "log")
        files.append_durably(tmp_path / "log", "a\n")
        files.write_atomic(tmp_path / "sub" / "state", "s", after=[tmp_path / "log"])
        files.replace_together([(tmp_path / "t", "t"), (tmp_path / "r", "r")])
        files.write_atomic(tmp_path / "gone", "g")
        (tmp_path / "gone").unlink()  # written, then removed before the end: nothing to sync
        assert synced == [], "nothing waited for the disk inside"
        assert (tmp_path / "log").read_text() == "a\n" and (tmp_path / "sub" / "state").read_text() == "s"
    names = {Path(point.removeprefix("fsync:")) for point in synced}
    assert names == {tmp_path / n for n in ("log", "sub/state", "t", "r", "", "sub")}
    assert len(synced) == len(names), "each once"
    files_first = [Path(p.removeprefix("fsync:")).is_file() for p in synced]
    assert files_first == sorted(files_first, reverse=True), "the files, then the folders that name them"


def test_leaving_syncs_deferred_by_an_error_still_syncs_what_was_written(tmp_path: Path, monkeypatch: Any) -> None:
    synced = watch_fsyncs(monkeypatch)
    with pytest.raises(KeyboardInterrupt), files.syncs_deferred():
        files.append_durably(tmp_path / "log", "a\n")
        raise KeyboardInterrupt
    assert f"fsync:{tmp_path / 'log'}" in synced


async def test_a_run_that_waits_at_its_end_writes_the_same_files_and_no_sync_while_it_runs(
    tmp_path: Path, monkeypatch: Any
) -> None:
    await run_scenario("debate", llm=TestLLM(3), options={}, out_dir=tmp_path / "round", run=RunOptions(seed=3))
    synced = watch_fsyncs(monkeypatch)
    marks: list[str] = []

    def at_round(team: Any) -> None:
        synced.append(f"round:{team.env.round}")
        marks.append((tmp_path / "run" / UNSYNCED).read_text().strip())

    out = tmp_path / "run"
    options = RunOptions(seed=3, durability="run")
    await run_scenario("debate", llm=TestLLM(3), options={}, out_dir=out, run=options, on_round=at_round)
    rounds = [i for i, point in enumerate(synced) if point.startswith("round:")]
    assert len(rounds) >= 5 and not any(p.startswith("fsync:") for p in synced[rounds[0] : rounds[-1]]), synced
    assert marks == [boot_id()] * len(rounds), "the folder is marked with this boot while it runs"
    assert not (out / UNSYNCED).exists(), "unmarked once everything is on the disk"
    at_end = {renamed(Path(p.removeprefix("fsync:"))) for p in synced[rounds[-1] :]}
    written = {p for p in out.rglob("*") if p.name not in CLOCKED}  # the manifest was synced before round 0
    assert written <= at_end, sorted(map(str, written - at_end))
    assert run_files(out) == run_files(tmp_path / "round")
    assert json.loads((out / "manifest.json").read_text())["durability"] == "run"


CRASHING_RUN = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import anyio
    from metaroles import TestLLM
    from metaroles.team.options import RunOptions
    from metaroles.project.scenario import run_scenario

    out, kill_round = Path(sys.argv[1]), int(sys.argv[2])

    def at_round(team):
        if team.env.round == kill_round:
            os.kill(os.getpid(), signal.SIGKILL)

    options = RunOptions(seed=3, durability="run")
    anyio.run(lambda: run_scenario("debate", llm=TestLLM(3), options={}, out_dir=out, run=options, on_round=at_round))
    """
)


def killed_run(out: Path, kill_round: int) -> None:
    result = subprocess.run([sys.executable, "-c", CRASHING_RUN, str(out), str(kill_round)], capture_output=True)
    assert result.returncode == -9, result.stderr.decode()[-2000:]


@pytest.mark.parametrize("kill_round", [0, 3])
async def test_a_killed_run_that_waits_at_its_end_resumes_exactly_in_the_same_boot(
    tmp_path: Path, kill_round: int
) -> None:
    await run_scenario("debate", llm=TestLLM(3), options={}, out_dir=tmp_path / "whole", run=RunOptions(seed=3))
    out = tmp_path / "cut"
    killed_run(out, kill_round)
    assert (out / UNSYNCED).read_text().strip() == boot_id() and not restarted_since(out)
    assert not (out / "report.json").exists()
    await resume_scenario(out, llm=TestLLM(3))
    assert not (out / UNSYNCED).exists()
    assert run_files(out) == run_files(tmp_path / "whole")


async def test_after_a_restart_an_unsynced_run_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "cut"
    killed_run(out, 3)
    (out / UNSYNCED).write_text("another-boot\n")  # the machine restarted since: the page cache is gone
    assert restarted_since(out)
    with pytest.raises(RunDirCorrupt, match="restarted since: its files may be torn"):
        await resume_scenario(out, llm=TestLLM(3))
    with pytest.raises(RunDirCorrupt, match="restarted since"):
        finish_syncing(out)
    result = command("none", "resume", str(out))
    assert result.returncode == 2 and "restarted since" in result.stderr and "Traceback" not in result.stderr


def test_a_sweep_runs_a_trial_a_restart_left_unsynced_again_from_its_start(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    rows = run_sweep("debate", {"seed": [0, 1]}, sweep_dir)
    trial = sweep_dir / "seed=1"
    whole = run_files(trial)
    (trial / "report.json").unlink()
    (trial / "events.jsonl").write_bytes(b"\0" * 100)  # what a power cut may leave of a file never synced
    (trial / UNSYNCED).write_text("another-boot\n")
    again = run_sweep("debate", {"seed": [0, 1]}, sweep_dir)
    assert [r["status"] for r in again] == ["done", "done"]
    assert run_files(trial) == whole, "run again from its start: the same files"
    assert [{k: v for k, v in r.items() if k != "wall_s"} for r in again] == [
        {k: v for k, v in r.items() if k != "wall_s"} for r in rows
    ]
    assert read_table(sweep_dir) == json.loads(json.dumps(again))


def test_a_durability_other_than_round_or_run_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(InvalidValueError, match="durability='often'"):
        run_sweep("debate", {"seed": [0]}, tmp_path / "s", durability="often")
    assert not (tmp_path / "s").exists()
    result = command("none", "run", "debate", "--durability", "often", "--out", str(tmp_path / "r"))
    assert result.returncode == 2 and "durability='often'" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "r").exists()


def test_a_sweep_syncs_its_trials_together_and_none_on_its_own(tmp_path: Path, monkeypatch: Any) -> None:
    synced = watch_fsyncs(monkeypatch)
    together: list[Path] = []
    sync_filesystem = durability.sync_filesystem

    def counted(path: Path) -> None:
        together.append(path)
        sync_filesystem(path)

    monkeypatch.setattr(durability, "sync_filesystem", counted)
    marks: list[str] = []
    rows = run_sweep(
        "debate", {"seed": [0, 1, 2]}, tmp_path, on_trial=lambda _: marks.append((tmp_path / UNSYNCED).read_text())
    )
    assert [row["status"] for row in rows] == ["done"] * 3
    inside = [p for p in synced if any(f"/seed={n}" in p for n in range(3))]
    assert inside == [], "a trial waits for nothing itself"
    assert together == [tmp_path], "one wait for all three, at the end"
    assert marks == [boot_id() + "\n"] * 3, "the sweep's folder is marked with this boot while trials end"
    assert not (tmp_path / UNSYNCED).exists() and not (tmp_path / SYNCED).exists()


def test_after_a_restart_a_sweep_runs_again_the_trials_it_had_not_synced(tmp_path: Path) -> None:
    grid = {"seed": [0, 1, 2]}
    rows = run_sweep("debate", grid, tmp_path)
    whole = {n: run_files(tmp_path / f"seed={n}") for n in range(3)}
    kept = (tmp_path / "seed=0" / "report.json").stat().st_mtime_ns
    (tmp_path / UNSYNCED).write_text("another-boot\n")  # a power cut before the sweep's last sync
    (tmp_path / SYNCED).write_text("seed=0\n")
    (tmp_path / "seed=1" / "events.jsonl").write_bytes(b"\0" * 64)  # what it may leave of a file never synced
    assert restarted_since(tmp_path / "seed=1") and restarted_since(tmp_path / "seed=2")
    assert not restarted_since(tmp_path / "seed=0"), "synced before the cut: trusted"
    with pytest.raises(RunDirCorrupt, match="restarted since"):  # resumed on its own, it is refused too
        finish_syncing(tmp_path / "seed=1")
    finish_syncing(tmp_path / "seed=0")
    again = run_sweep("debate", grid, tmp_path)
    assert (tmp_path / "seed=0" / "report.json").stat().st_mtime_ns == kept, "not run again"
    assert {n: run_files(tmp_path / f"seed={n}") for n in range(3)} == whole
    assert [{k: v for k, v in r.items() if k != "wall_s"} for r in again] == [
        {k: v for k, v in r.items() if k != "wall_s"} for r in rows
    ]
    assert not (tmp_path / UNSYNCED).exists()
