"""A disk that fills up or turns read-only mid-run: one clear line, exit 1, and a run that resumes.

The run writes into a small tmpfs (8 KB to 7 MB) or a read-only bind of its directory, made by
bubblewrap in a mount namespace of its own; the run directory is then copied out and resumed,
fault gone, by another process, and must end as the uninterrupted run did.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from metaroles.agents.isolation import bubblewrap
from tests.faults.helpers import DRIVER, differences, killed, ok, run_args

pytestmark = pytest.mark.skipif(bubblewrap() is None, reason="no working bwrap: a small tmpfs cannot be mounted here")


def in_namespace(mounts: list[str], script: str) -> subprocess.CompletedProcess[str]:
    """``script`` (sh) with ``mounts`` (bwrap arguments) over a view of the whole machine."""
    command = [str(bubblewrap()), "--dev-bind", "/", "/", *mounts, "--", "sh", "-c", script]
    return subprocess.run(command, capture_output=True, text=True, check=False)


def one_error(stderr: str) -> str:
    said = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(said) == 1 and "Traceback" not in stderr and "a metaroles bug" not in said[0], stderr
    return said[0]


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("straight") / "werewolf"
    ok(*run_args("werewolf", out))
    return out


@pytest.mark.parametrize("size", [8_192, 24_576, 65_536, 200_000, 1_000_000, 7_000_000])
def test_a_full_disk_stops_the_run_with_one_line_and_it_resumes(tmp_path, straight, size):
    small, kept = tmp_path / "small", tmp_path / "kept"
    small.mkdir()
    run = " ".join(shlex.quote(a) for a in [sys.executable, str(DRIVER), "none", *run_args("werewolf", small / "run")])
    script = f"{run}; echo rc=$? >&2; cp -a {small}/run {kept} 2>/dev/null; true"
    done = in_namespace(["--size", str(size), "--tmpfs", str(small)], script)
    code = int(done.stderr.rsplit("rc=", 1)[1].split()[0])
    if code == 0:
        assert size >= 1_000_000, "the whole run fit in the small disk"
    else:
        assert code == 1
        line = one_error(done.stderr)
        assert "No space left on device" in line and "free space" in line
    if not (kept / "manifest.json").exists():
        assert "manifest.json" in done.stderr, "a run that could not write its manifest says so"
        return
    ok("resume", str(kept), "-q")
    assert differences(straight, kept) == []


def test_a_run_directory_turned_read_only_stops_with_one_line_and_resumes(tmp_path, straight):
    run_dir = tmp_path / "werewolf"
    killed("call=10", *run_args("werewolf", run_dir))
    resume = " ".join(shlex.quote(a) for a in [sys.executable, str(DRIVER), "none", "resume", str(run_dir), "-q"])
    done = in_namespace(["--ro-bind", str(run_dir), str(run_dir)], f"{resume}; echo rc=$? >&2")
    assert "rc=1" in done.stderr
    line = one_error(done.stderr)
    assert "Read-only file system" in line and f"metaroles resume {run_dir}" in line
    ok("resume", str(run_dir), "-q")
    assert differences(straight, run_dir) == []
