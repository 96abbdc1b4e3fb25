"""SIGKILL at random moments, for every scenario: the resumed run is the uninterrupted one, byte for byte.

A moment is the K-th write point the writer passes (any file, any instant of a round's commit) or
the K-th model call (mid-turn), drawn from a seeded random source so every failure reproduces.
Each killed run is resumed by another process and compared with the straight run: every file of
the run directory but the clock's, and the published messages (none lost, none twice).
``METAROLES_FAULT_KILLS`` sets the kills per scenario (20 here; ``make faults`` runs 100).
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import pytest

from tests.faults.helpers import SCENARIOS, command, differences, killed, messages_lost_and_duplicated, ok, run_args

KILLS = int(os.environ.get("METAROLES_FAULT_KILLS", "20"))
CASES = [(name, i) for name in SCENARIOS for i in range(KILLS)]


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, int, int]]:
    """Each scenario's straight run, with the write points and model calls it made."""
    root = tmp_path_factory.mktemp("straight")
    runs = {}
    for name in SCENARIOS:
        counted = command("count", *run_args(name, root / name))
        assert counted.returncode == 0, counted.stderr[-2000:]
        found = re.search(r"writes=(\d+) calls=(\d+)", counted.stderr)
        assert found is not None, counted.stderr
        runs[name] = (root / name, int(found[1]), int(found[2]))
    return runs


def moment(name: str, case: int, writes: int, calls: int) -> str:
    draw = random.Random(f"kill-loop-{name}-{case}")
    if calls and draw.random() < 0.4:
        return f"call={draw.randint(1, calls)}"
    return f"write={draw.randint(1, writes)}"


@pytest.mark.parametrize(("name", "case"), CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_a_run_killed_at_a_random_moment_resumes_to_the_same_run(tmp_path, straight, name, case):
    whole, writes, calls = straight[name]
    run_dir = tmp_path / name
    killed(moment(name, case, writes, calls), *run_args(name, run_dir))
    if (run_dir / "manifest.json").exists():
        ok("resume", str(run_dir), "-q")
    else:  # killed as its manifest was written: the run never started, and is simply run again
        refused = command("none", "resume", str(run_dir))
        assert refused.returncode == 2 and "is not a run directory" in refused.stderr
        ok(*run_args(name, run_dir))
    assert not list(run_dir.rglob("*.tmp")), "resume leaves no temporary file of a killed write"
    assert messages_lost_and_duplicated(whole, run_dir) == (0, 0)
    assert differences(whole, run_dir) == []
