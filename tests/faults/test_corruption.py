"""Damaged run directories: every reader answers with one line naming the file, or reads what it can.

A killed werewolf run gets one mutation (a file missing, emptied, binary, garbage in the middle, a
wrong type, a torn last line); then ``resume``, ``show``, ``graph``, ``diff`` and ``fork`` run on it
in this process. None may raise: each exits 0, or 1/2 with one line on stderr. A resume that exits 0
must end equal to the uninterrupted run; one that refuses must have changed nothing, so that once
the file is mended the resume ends equal to the uninterrupted run too.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest

from metaroles.cli import main
from tests.faults.helpers import differences, killed, ok, run_args

FILES = [
    "manifest.json",
    "events.jsonl",
    "timings.jsonl",
    "metrics.jsonl",
    "checkpoints/messages.jsonl",
    "checkpoints/round-0003.json",
    "checkpoints/round-0005.json",
]
MUTATIONS = ["missing", "empty", "binary", "garbage_middle", "wrong_type", "torn_last"]


def mutate(path: Path, how: str) -> None:
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    if how == "missing":
        path.unlink()
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "binary":
        path.write_bytes(bytes(range(256)) * 4)
    elif how == "garbage_middle":
        middle = len(lines) // 2
        path.write_bytes(b"".join([*lines[:middle], b"\x00garbage{]\n", *lines[middle + 1 :]]))
    elif how == "wrong_type":
        path.write_bytes(b"".join([b'["a", 1]\n', *lines[1:]]) if len(lines) > 1 else b'["a", 1]\n')
    else:
        path.write_bytes(data[: len(data) - max(1, len(lines[-1]) // 2)] if lines else b'{"ro')


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("runs")
    ok(*run_args("werewolf", root / "straight"))
    killed("call=12", *run_args("werewolf", root / "killed"))
    return root / "straight", root / "killed"


def cli(*args: str) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return main(list(args))


@pytest.mark.parametrize("how", MUTATIONS)
@pytest.mark.parametrize("name", FILES)
def test_a_damaged_run_directory_gets_a_clear_word_never_a_traceback(tmp_path, capsys, runs, name, how):
    straight, killed_run = runs
    run_dir = tmp_path / "run"
    shutil.copytree(killed_run, run_dir)
    mutate(run_dir / name, how)
    capsys.readouterr()
    for args in (
        ["show", str(run_dir)],
        ["graph", str(run_dir), "-f", "json"],
        ["diff", str(straight), str(run_dir)],
        ["fork", str(run_dir), "--from-round", "2", "--out", str(tmp_path / "fork"), "-q"],
        ["resume", str(run_dir), "-q"],
    ):
        code = cli(*args)
        stderr = capsys.readouterr().err
        assert code in (0, 1, 2), (args, code)
        if code:
            said = [line for line in stderr.splitlines() if line.startswith("error:")]
            assert len(said) == 1 and "a metaroles bug" not in said[0], (args, stderr)
    if code == 0:
        assert differences(straight, run_dir) == [], f"resume went on from a damaged {name} ({how})"
        return
    assert code == 2, stderr
    shutil.copyfile(killed_run / name, run_dir / name)  # the fault is gone: the refused resume changed nothing
    assert cli("resume", str(run_dir), "-q") == 0
    assert differences(straight, run_dir) == [], f"after {name} ({how}) was mended"
