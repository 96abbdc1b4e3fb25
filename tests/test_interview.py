"""Interviews and surveys on a fork at a round: the same answers in any process, the run untouched."""

import hashlib
import subprocess
import sys
from pathlib import Path

import anyio
import pyarrow.parquet as pq
import pytest

from metaroles import TestLLM
from metaroles.cli import main
from metaroles.project.interview import COLUMNS, interview_run
from metaroles.project.scenario import run_scenario
from metaroles.team.options import RunOptions


def society(out: Path, every: int) -> Path:
    options = {"agents": 12, "rounds": 6, "llm_agents": 12}
    anyio.run(
        lambda: run_scenario(
            "society", llm=TestLLM(4), options=options, out_dir=out, run=RunOptions(seed=4, checkpoint_every=every)
        )
    )
    return out


def digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return society(tmp_path_factory.mktemp("runs") / "society", every=1)


def test_an_interview_gives_the_same_answers_in_two_processes_and_leaves_the_run_as_it_was(run, tmp_path):
    before = digests(run)
    for name in ("one", "two"):
        command = [sys.executable, "-m", "metaroles", "interview", str(run), "What do you believe now?"]
        command += ["--round", "3", "--role", "a1*", "--out", str(tmp_path / name)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("a1: ")
    assert (tmp_path / "one" / "answers.parquet").read_bytes() == (tmp_path / "two" / "answers.parquet").read_bytes()
    assert digests(run) == before  # the run directory, file by file
    table = pq.read_table(tmp_path / "one" / "answers.parquet")
    assert table.column_names == list(COLUMNS)
    assert sorted(table.column("role").to_pylist()) == ["a1", "a10", "a11"]
    assert all(table.column("completion_tokens").to_pylist())


def test_a_survey_asks_every_chosen_role_every_question_as_its_memory_stood(run, tmp_path, capsys):
    (tmp_path / "q.txt").write_text("Where do you stand?\n\nWho convinced you?\n")
    for at in (1, 5):
        argv = ["survey", str(run), "--round", str(at), "--roles", "a2,a3", "--questions", str(tmp_path / "q.txt")]
        assert main([*argv, "--out", str(tmp_path / f"r{at}")]) == 0
        assert "4 answers from 2 roles" in capsys.readouterr().out
    early, late = (pq.read_table(tmp_path / f"r{at}" / "answers.parquet").to_pylist() for at in (1, 5))
    assert [(r["role"], r["question"]) for r in early] == [
        ("a2", "Where do you stand?"), ("a2", "Who convinced you?"), ("a3", "Where do you stand?"),
        ("a3", "Who convinced you?"),
    ]  # fmt: skip
    assert all(b["prompt_tokens"] > a["prompt_tokens"] for a, b in zip(early, late, strict=True))  # more memory
    assert early[0]["attributes"]["class"] == "Agent" and "state" in early[0]["attributes"]  # a column per field


def test_a_round_between_checkpoints_is_run_again_in_memory_to_the_same_answers(run, tmp_path):
    sparse = society(tmp_path / "sparse", every=4)
    before, asked = digests(sparse), {}
    for name, folder in (("every", run), ("sparse", sparse)):
        anyio.run(
            lambda folder=folder, name=name: interview_run(
                folder, at_round=3, roles="a4", questions=["Why?"], out_dir=tmp_path / f"asked-{name}", llm=TestLLM(4)
            )
        )
        asked[name] = (tmp_path / f"asked-{name}" / "answers.parquet").read_bytes()
    assert asked["every"] == asked["sparse"]
    assert digests(sparse) == before  # the rounds run again were run in memory


def test_bad_input_to_an_interview_is_one_line_and_exit_2(run, tmp_path, capsys):
    cases = [
        (["interview", str(run), "Hi?", "--round", "2", "--role", "nobody"], "no role of the run matches"),
        (["interview", str(run), "Hi?", "--round", "99", "--role", "a1"], "past the run's last logged round"),
        (["interview", str(tmp_path), "Hi?", "--round", "1", "--role", "a1"], "is not a run directory"),
        (["survey", str(run), "--round", "1", "--questions", str(tmp_path / "none.txt")], "is not a file"),
        (["interview", str(run), "Hi?", "--round", "1", "--role", "a1", "--out", str(run)], "folder of their own"),
        (
            ["interview", str(run), "Hi?", "--round", "1", "--role", "a1", "--out", str(run / "in")],
            "folder of their own",
        ),
    ]
    for argv, said in cases:
        assert main([*argv, "--out", str(tmp_path / "x")] if "--out" not in argv else argv) == 2, argv
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err


def test_an_unreadable_checkpoint_at_the_round_asked_is_one_line_not_an_earlier_rounds_answer(tmp_path, capsys):
    from metaroles.cli import main

    run_dir = tmp_path / "run"
    assert main(["run", "debate", "--llm", "test", "--set", "turns=1", "--out", str(run_dir), "-q"]) == 0
    (run_dir / "checkpoints" / "round-0002.json").write_bytes(b"\x00garbage")
    capsys.readouterr()
    code = main(["interview", str(run_dir), "--round", "2", "--role", "Alice", "--llm", "test", "What now?"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert code == 2 and len(lines) == 1 and "the checkpoint of round 2" in lines[0] and "ask at round 1" in lines[0]
    assert main(["interview", str(run_dir), "--round", "1", "--role", "Alice", "--llm", "test", "What now?"]) == 0


def test_a_live_run_paused_past_its_last_checkpoint_is_asked_as_it_stands_and_as_it_ended(tmp_path):
    import threading

    from metaroles.project.scenario import run_scenario
    from metaroles.record.eventread import logged_through
    from metaroles.team.control import Injection, RunControl
    from metaroles.team.options import RunOptions

    run = tmp_path / "run"
    from metaroles.bus.action import UserRequirement

    said = "The bridge is closed."
    heard = Injection(name="notice", content=said, after_round=2, cause_by=UserRequirement.action_id())
    control = RunControl(schedule=[heard])  # in every agent's memory: asked after it, they answer with it
    paused, asked = threading.Event(), {}
    control.listeners.append(lambda c: c.barrier_round == 3 and c.waiting_at is None and c.pause())
    control.listeners.append(lambda c: c.waiting_at is not None and paused.set())
    questions = ["Where do you stand?"]

    def ask_while_paused() -> None:
        try:
            assert paused.wait(120)
            at = logged_through(run / "events.jsonl")
            assert at == 4 and sorted(p.name for p in (run / "checkpoints").glob("round-*")) == ["round-0000.json"]
            asked["paused"] = anyio.run(
                lambda: interview_run(run, at_round=at, roles="a1,a3", questions=questions, out_dir=tmp_path / "p",
                                      llm=TestLLM(3))
            )  # fmt: skip
        finally:
            control.resume()  # asked or not, the run goes on

    helper = threading.Thread(target=ask_while_paused)
    helper.start()
    anyio.run(lambda: run_scenario("society", llm=TestLLM(3), options={"agents": 12, "rounds": 6}, out_dir=run,
                                   run=RunOptions(seed=3, checkpoint_every=10), control=control))  # fmt: skip
    helper.join()
    ended = anyio.run(
        lambda: interview_run(run, at_round=4, roles="a1,a3", questions=questions, out_dir=tmp_path / "e",
                              llm=TestLLM(3))
    )  # fmt: skip
    assert asked["paused"] == ended, "asked while paused after round 4, and after the end at round 4: the same"
    truth = tmp_path / "every-round"  # the same run with a checkpoint of round 4 itself: nothing run again
    anyio.run(
        lambda: run_scenario(
            "society",
            llm=TestLLM(3),
            options={"agents": 12, "rounds": 6},
            out_dir=truth,
            run=RunOptions(seed=3, checkpoint_every=1),
            control=RunControl(schedule=[heard]),
        )
    )
    kept = anyio.run(
        lambda: interview_run(truth, at_round=4, roles="a1,a3", questions=questions, out_dir=tmp_path / "t",
                              llm=TestLLM(3))
    )  # fmt: skip
    assert ended == kept, "the rounds run again in memory (the injection in them) are the run's own"
    assert len(ended) == 2 and all(a.answer for a in ended)
