"""Damaged run directories: every reader answers with one line naming the file, or reads what it can.

A killed werewolf run gets one mutation (a file missing, emptied, binary, garbage in the middle, a
wrong type, a torn last line); then ``resume``, ``show``, ``graph``, ``diff`` and ``fork`` run on it
in this process. None may raise: each exits 0, or 1/2 with one line on stderr. A resume that exits 0
must end equal to the uninterrupted run; one that refuses must have changed nothing, so that once
the file is mended the resume ends equal to the uninterrupted run too.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from metaroles.cli import main
from tests.faults.helpers import differences, digest, killed, ok, run_args

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


def every_reader(straight: Path, run_dir: Path, fork: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run show, graph, diff, fork and resume on ``run_dir``: each exits 0, 1 or 2 with at most one line.

    Returns the resume's exit code and what it said on stderr.
    """
    capsys.readouterr()
    for args in (
        ["show", str(run_dir)],
        ["graph", str(run_dir), "-f", "json"],
        ["diff", str(straight), str(run_dir)],
        ["fork", str(run_dir), "--from-round", "2", "--out", str(fork), "-q"],
        ["resume", str(run_dir), "-q"],
    ):
        code = cli(*args)
        stderr = capsys.readouterr().err
        assert code in (0, 1, 2), (args, code)
        if code and not (args[0] == "diff" and code == 1):  # diff: 1 is "they differ", as diff(1) says
            said = [line for line in stderr.splitlines() if line.startswith("error:")]
            assert len(said) == 1 and "a metaroles bug" not in said[0], (args, stderr)
    return code, stderr


@pytest.mark.parametrize("how", MUTATIONS)
@pytest.mark.parametrize("name", FILES)
def test_a_damaged_run_directory_gets_a_clear_word_never_a_traceback(tmp_path, capsys, runs, name, how):
    straight, killed_run = runs
    run_dir = tmp_path / "run"
    shutil.copytree(killed_run, run_dir)
    mutate(run_dir / name, how)
    code, stderr = every_reader(straight, run_dir, tmp_path / "fork", capsys)
    if code == 0:
        assert differences(straight, run_dir) == [], f"resume went on from a damaged {name} ({how})"
        return
    assert code == 2, stderr
    shutil.copyfile(killed_run / name, run_dir / name)  # the fault is gone: the refused resume changed nothing
    assert cli("resume", str(run_dir), "-q") == 0
    assert differences(straight, run_dir) == [], f"after {name} ({how}) was mended"


def _edit_json(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))


def _edit_lines(path: Path, pick: str, change: Callable[[dict[str, Any]], None]) -> None:
    lines = path.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if pick in line)
    record = json.loads(lines[at])
    change(record)
    lines[at] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")


ROUND = "checkpoints/round-0005.json"
DAMAGES: dict[str, Callable[[Path], None]] = {
    "checkpoint_every_zero": lambda r: _edit_json(r / "manifest.json", lambda m: m.update(checkpoint_every=0)),
    "n_round_negative": lambda r: _edit_json(r / "manifest.json", lambda m: m.update(n_round=-4)),
    "round_file_misnamed": lambda r: shutil.copyfile(r / ROUND, r / "checkpoints/round-abcd.json"),
    "deliveries_past_the_roles": lambda r: _edit_json(r / ROUND, lambda c: c["deliveries"].__setitem__(2, 999)),
    "deliveries_past_the_rows": lambda r: _edit_json(r / ROUND, lambda c: c["deliveries"].__setitem__(0, 10**6)),
    "ops_past_the_roles": lambda r: _edit_json(r / ROUND, lambda c: c.update(ops=[0, 999])),
    "a_negative_row": lambda r: _edit_json(r / ROUND, lambda c: c.update(dead_letters_add=[-1])),
    "round_without_roles": lambda r: _edit_json(r / ROUND, lambda c: c.pop("roles")),
    "garbage_rng": lambda r: _edit_json(r / ROUND, lambda c: c.update(rng=[3, [1, 2], None])),
    "rng_not_a_list": lambda r: _edit_json(r / ROUND, lambda c: c.update(rng="x")),
    "event_without_message_id": lambda r: _edit_lines(
        r / "events.jsonl", '"published"', lambda e: e["published"]["message_id"].pop()
    ),
    "event_role_a_list": lambda r: _edit_lines(
        r / "events.jsonl", '"published"', lambda e: e["published"]["role"].__setitem__(0, ["a"])
    ),
    "log_duplicated": lambda r: (r / "events.jsonl").write_text((r / "events.jsonl").read_text() * 2),
    "row_without_content": lambda r: _edit_lines(
        r / "checkpoints/messages.jsonl", "Night 1", lambda m: m.pop("content")
    ),
}
"""Damage that parses: fields of the wrong type or out of range, names that are not the run's, a log told twice."""


@pytest.mark.parametrize("damage", DAMAGES)
def test_damage_that_parses_gets_a_clear_word_and_a_refused_resume_changes_nothing(tmp_path, capsys, runs, damage):
    straight, killed_run = runs
    run_dir = tmp_path / "run"
    shutil.copytree(killed_run, run_dir)
    DAMAGES[damage](run_dir)
    before = digest(run_dir)
    code, stderr = every_reader(straight, run_dir, tmp_path / "fork", capsys)
    if code == 0:  # it read what it could (a damaged round file: the one before it) and went on
        assert differences(straight, run_dir) == [], f"resume kept the damage ({damage})"
        return
    assert code == 2, stderr
    assert digest(run_dir) == before, "the refused resume changed the run directory"
