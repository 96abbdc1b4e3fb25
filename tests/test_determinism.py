"""The determinism contract: one seed and the same model answers give the same run directory, byte for byte.

Every run here happens in a process of its own, each with another ``PYTHONHASHSEED``: two straight
runs; a fork that changes nothing; a run of the embedded model on cassette, replayed. Runs SIGKILLed at
random moments and resumed by another process are in ``tests/faults/test_kill_loop.py``. Only
``manifest.json`` (timestamps, versions, the folder's name) and ``timings.jsonl`` (latencies) may differ.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from metaroles.llm.model_files import local_model_available

SEED = 5
SCENARIOS = {
    "debate": {},
    "society": {"agents": 40, "rounds": 12, "llm_agents": 4},
    "software_company": {},
    "werewolf": {},
}
MEASURED = {"manifest.json", "timings.jsonl"}
"""The files a run directory may hold that the clock wrote into."""


def metaroles(
    *args: str, hash_seed: int, cwd: Path | None = None, code: int = 0, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed)}
    result = subprocess.run(
        [sys.executable, "-m", "metaroles", *args], capture_output=True, text=True, env=env, cwd=cwd, check=False,
        input=stdin,
    )  # fmt: skip
    assert result.returncode == code, result.stderr[-3000:]
    return result


def set_options(options: dict[str, object]) -> list[str]:
    return [arg for key, value in options.items() for arg in ("--set", f"{key}={value}")]


def run(name: str, out: Path, *, hash_seed: int) -> Path:
    args = ["run", name, "--llm", "test", "--seed", str(SEED), *set_options(SCENARIOS[name]), "--out", str(out), "-q"]
    metaroles(*args, hash_seed=hash_seed)
    return out


def contents(run_dir: Path, *, only: set[str] | None = None) -> dict[str, bytes]:
    """Every file of a run directory by relative path, but those the clock wrote (or only ``only``'s)."""
    files = {}
    for path in sorted(run_dir.rglob("*")):
        relative = path.relative_to(run_dir).as_posix()
        if path.is_file() and path.name not in MEASURED and "__pycache__" not in relative:
            if only is None or relative in only:
                files[relative] = path.read_bytes()
    return files


def assert_same_bytes(a: dict[str, bytes], b: dict[str, bytes]) -> None:
    assert sorted(a) == sorted(b), "the run directories hold different files"
    for name in a:
        if a[name] != b[name]:
            left, right = a[name].splitlines(), b[name].splitlines()
            first = next(
                (i for i, (x, y) in enumerate(zip(left, right, strict=False)) if x != y), min(len(left), len(right))
            )
            shown = (left[first : first + 1], right[first : first + 1])
            raise AssertionError(f"{name} differs at line {first + 1}: {shown[0]!r} vs {shown[1]!r}")


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("straight")
    return {name: run(name, root / name, hash_seed=1) for name in SCENARIOS}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_two_processes_write_the_same_run_directory(tmp_path, straight, name):
    again = run(name, tmp_path / name, hash_seed=2)
    files = contents(again)
    assert {"transcript.md", "events.jsonl", "state.json", "checkpoints/messages.jsonl"} <= set(files)
    if "round_metrics" in Path(f"scenarios/{name}.py").read_text():
        assert "metrics.jsonl" in files
    assert_same_bytes(contents(straight[name]), files)


RUN_FILES = {"transcript.md", "events.jsonl", "state.json", "metrics.jsonl", "report.json", "ledger.json"}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_fork_without_a_change_is_its_parent(tmp_path, straight, name):
    parent = straight[name]
    rounds = json.loads((parent / "state.json").read_text())["round"]
    child = tmp_path / "child"
    metaroles("fork", str(parent), "--from-round", str(rounds // 2), "--out", str(child), "-q", hash_seed=6)
    assert_same_bytes(contents(parent, only=RUN_FILES), contents(child, only=RUN_FILES))
    same = metaroles("diff", str(parent), str(child), hash_seed=7)
    assert same.stdout.startswith("identical:") and "event(s)" in same.stdout


def test_diff_names_the_first_event_that_differs(tmp_path, straight):
    other = tmp_path / "other"
    metaroles("run", "debate", "--llm", "test", "--seed", str(SEED + 1), "--out", str(other), "-q", hash_seed=8)
    result = metaroles("diff", str(straight["debate"]), str(other), hash_seed=8, code=1)
    assert "first differing event:" in result.stdout
    minus = next(line for line in result.stdout.splitlines() if line.startswith("- {"))
    assert json.loads(minus[2:])["seq"] >= 1


@pytest.mark.skipif(not local_model_available(), reason="the embedded model is not installed (make demo installs it)")
def test_the_embedded_model_on_a_cassette_replays_to_the_same_bytes(tmp_path):
    cassette = tmp_path / "debate.jsonl"
    common = ["--seed", str(SEED), "--set", "turns=1", "-q"]
    metaroles(
        "run",
        "debate",
        "--llm",
        "local",
        "--model",
        "smollm2-135m-instruct-q4_1",  # an embedded model: the fast one
        "--record",
        str(cassette),
        *common,
        "--out",
        str(tmp_path / "live"),
        hash_seed=1,
    )
    for hash_seed in (2, 3):
        metaroles(
            "run",
            "debate",
            "--replay",
            str(cassette),
            *common,
            "--out",
            str(tmp_path / f"r{hash_seed}"),
            hash_seed=hash_seed,
        )
    live = contents(tmp_path / "live")
    assert_same_bytes(live, contents(tmp_path / "r2"))
    assert_same_bytes(live, contents(tmp_path / "r3"))


SHARDED_RUN = """
import sys
from pathlib import Path

import anyio

from metaroles import LocalBackend, TestLLM
from metaroles.team.options import RunOptions
from metaroles.project.scenario import run_scenario

options = {"agents": 40, "rounds": 6, "llm_agents": 4}
run = RunOptions(seed=5, backend=LocalBackend(2), checkpoint_every=2)
anyio.run(lambda: run_scenario("society", llm=TestLLM(), options=options, out_dir=Path(sys.argv[1]), run=run))
"""


def test_two_processes_write_the_same_sharded_run_directory_the_shards_parts_too(tmp_path):
    for hash_seed in (1, 2):
        env = {**os.environ, "PYTHONHASHSEED": str(hash_seed)}
        out = tmp_path / str(hash_seed)
        result = subprocess.run([sys.executable, "-c", SHARDED_RUN, str(out)], capture_output=True, text=True, env=env)
        assert result.returncode == 0, result.stderr[-3000:]
    first, second = contents(tmp_path / "1"), contents(tmp_path / "2")
    assert any(name.startswith("checkpoints/parts/") for name in first)
    assert_same_bytes(first, second)
