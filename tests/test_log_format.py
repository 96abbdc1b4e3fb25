"""The event log's formats: a line per round (format 2, written now) and a line per event (format 1, read still).

Format 1 logs of every scenario, written by the code before format 2 (``tests/data/format1``: a
line per event, and the folded variant whose publish lines carry a default turn), are the same
runs as the ones made here with the same seed: ``read_events`` must give the very same events,
numbers included, from either. A format 1 run killed mid-way resumes in format 2, and reads back
as the uninterrupted run.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from metaroles import Action, Environment, Message, Role, TestLLM
from metaroles.cli import main
from metaroles.core.exceptions import InvalidValueError, RunDirCorrupt
from metaroles.core.files import read_text
from metaroles.project.scenario import run_scenario
from metaroles.record.eventlog import EventLog, iter_events, publish_rounds, read_events
from metaroles.sharding.backends import LocalBackend
from metaroles.team.options import RunOptions
from metaroles.team.team import Team
from tests.faults.helpers import SCENARIOS, SEED, differences, killed, ok, run_args

FORMAT1 = Path(__file__).parent / "data" / "format1"
SAME = ("transcript.md", "state.json", "report.json", "ledger.json", "metrics.jsonl")


async def scenario_run(name: str, out: Path, log_turns: Any = None, backend: Any = None) -> None:
    run = RunOptions(seed=SEED, log_turns=log_turns, backend=backend)
    await run_scenario(name, llm=TestLLM(SEED), options=SCENARIOS[name], out_dir=out, run=run)  # as `--llm test`


NEWER = {"latency_s", "prompt_tokens", "completion_tokens"}
"""What a format 1 log cannot hold: the clock's latencies, and each turn's tokens (a column of format 2 since)."""


def events(path: Path) -> list[dict[str, Any]]:
    """The events a reader gets, but the clock's latencies and what format 1 logs never held (each turn's tokens)."""
    return [{k: v for k, v in e.items() if k not in NEWER} for e in read_events(path)]


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_a_run_reads_back_as_the_format_1_logs_of_the_same_run(name: str, tmp_path: Path) -> None:
    await scenario_run(name, tmp_path / "default")
    await scenario_run(name, tmp_path / "turns", True)
    default, turns = tmp_path / "default" / "events.jsonl", tmp_path / "turns" / "events.jsonl"
    plain, folded = FORMAT1 / f"{name}.events.jsonl.zst", FORMAT1 / f"{name}-folded.events.jsonl.zst"
    assert events(default) == events(plain), "the scenario's default log: a line per event before"
    assert events(turns) == events(folded), "turns logged: default turns rode on their messages' lines before"
    assert publish_rounds(default) == publish_rounds(plain)
    for path in (default, turns):
        written = lines(path)
        assert all(line["kind"] == "round" for line in written), "a line per round"
        assert len(written) == sum(e["kind"] == "round_end" for e in events(path))
    spelled = events(turns)
    a_line_each = sum(len(json.dumps(e, separators=(",", ":"))) + 1 for e in spelled)
    assert turns.stat().st_size < 0.75 * a_line_each, "smaller than a line per event"


@pytest.mark.parametrize("name", ["society", "werewolf"])
async def test_a_sharded_run_writes_the_log_one_process_writes(name: str, tmp_path: Path) -> None:
    await scenario_run(name, tmp_path / "one", True)
    await scenario_run(name, tmp_path / "sharded", True, LocalBackend(2))
    assert (tmp_path / "sharded" / "events.jsonl").read_bytes() == (tmp_path / "one" / "events.jsonl").read_bytes()


class Relay(Action):
    async def run(self, history: Any) -> str:
        return f"relay {len(history)}"


class Ventriloquist(Action):
    """Speaks in someone else's name: its message's publish does not tell its turn's story."""

    async def run(self, history: Any) -> Message:
        return Message("in another voice", cause_by=self.cause_by, sent_from="puppet", send_to={"a"})


async def test_a_turn_whose_message_tells_another_story_reads_as_it_happened(tmp_path: Path) -> None:
    env = Environment(seed=3)
    env.add_role(Role(name="a", actions=[Relay], watch=[Ventriloquist], send_to="b"))
    env.add_role(Role(name="b", actions=[Ventriloquist], watch=[Relay]))
    log = EventLog(tmp_path / "events.jsonl", env)
    env.publish_message(Message("go", id="go", send_to={"a"}))
    log.round_done()
    for _ in range(4):
        await env.run_round()
        log.round_done()
    read = events(tmp_path / "events.jsonl")
    assert [e["seq"] for e in read] == list(range(1, len(read) + 1))
    acts = {e["message_id"]: e["role"] for e in read if e["kind"] == "act"}
    published = {e["message_id"]: e["role"] for e in read if e["kind"] == "publish"}
    assert acts and set(acts) <= set(published)
    assert {acts[m] for m in acts if published[m] == "puppet"} == {"b"}, "b acted; the message names the puppet"
    observed = [e for e in read if e["kind"] == "observe" and e["role"] == "b"]
    assert len(observed) >= 2 and all(published.get(i) == "a" for e in observed for i in e["message_ids"])


def test_log_turns_is_true_false_or_folded() -> None:
    assert Team(log_turns="folded").log_turns == "folded"
    with pytest.raises(InvalidValueError, match="'folded'"):
        Team(log_turns="fold")  # type: ignore[arg-type]


def test_a_run_killed_mid_way_resumes_to_the_uninterrupted_run(tmp_path: Path) -> None:
    ok(*run_args("debate", tmp_path / "whole"))
    killed("point=append:events.jsonl:5", *run_args("debate", tmp_path / "cut"))
    ok("resume", str(tmp_path / "cut"), "-q")
    assert differences(tmp_path / "whole", tmp_path / "cut") == []


def test_a_format_1_run_killed_mid_way_resumes_in_format_2(tmp_path: Path) -> None:
    ok(*run_args("debate", tmp_path / "whole"))
    shutil.copytree(FORMAT1 / "debate-cut", tmp_path / "old")  # killed at its 5th append, by the code before
    before = lines(tmp_path / "old" / "events.jsonl")
    assert before and all(line["kind"] != "round" for line in before), "a line per event"
    ok("resume", str(tmp_path / "old"), "-q")
    after = lines(tmp_path / "old" / "events.jsonl")
    assert any(line["kind"] == "round" for line in after) and after[0] == before[0], "old lines kept, new appended"
    assert events(tmp_path / "old" / "events.jsonl") == events(tmp_path / "whole" / "events.jsonl")
    assert events(tmp_path / "whole" / "events.jsonl") == events(FORMAT1 / "debate.events.jsonl.zst")
    gone = {"events.jsonl", "manifest.json"}  # the log's bytes mix two formats; the manifest names the versions
    assert [d for d in differences(tmp_path / "whole", tmp_path / "old") if d.split(" ")[0] not in gone] == []


def test_iter_events_reads_a_log_as_read_events_does_a_round_at_a_time(tmp_path: Path) -> None:
    for path in sorted(FORMAT1.glob("*.events.jsonl.zst")):
        assert list(iter_events(path)) == read_events(path), path.name
    log = tmp_path / "run" / "events.jsonl"
    shutil.copytree(FORMAT1 / "debate-cut", tmp_path / "run")
    ok("resume", str(tmp_path / "run"), "-q")  # format 1 lines, then format 2 ones: one stream
    assert list(iter_events(log)) == read_events(log)
    log.write_text(log.read_text() * 2)
    with pytest.raises(RunDirCorrupt, match="does not follow the line before it"):
        list(iter_events(log))


@pytest.mark.parametrize("name", ["werewolf", "society"])
async def test_export_writes_the_events_a_row_each_as_json_lines_and_parquet(name: str, tmp_path: Path) -> None:
    import duckdb
    import pyarrow.parquet as pq

    run_dir = tmp_path / "run"
    await scenario_run(name, run_dir, True)
    events = read_events(run_dir / "events.jsonl")
    assert main(["export", str(run_dir)]) == 0
    assert lines(run_dir / "export" / "events.jsonl") == events
    assert main(["export", str(run_dir), "--format", "parquet", "--out", str(tmp_path / "t.parquet")]) == 0
    table = pq.read_table(tmp_path / "t.parquet").to_pylist()
    assert [{k: v for k, v in row.items() if v is not None} for row in table] == [
        {k: v for k, v in e.items() if v is not None} for e in events
    ]
    kinds = dict(duckdb.sql(f"SELECT kind, count(*) FROM '{tmp_path / 't.parquet'}' GROUP BY kind").fetchall())
    assert kinds == {kind: sum(e["kind"] == kind for e in events) for kind in kinds} and kinds["publish"] > 5


def test_export_of_a_format_1_log_is_the_export_of_the_same_run_in_format_2(tmp_path: Path) -> None:
    ok(*run_args("debate", tmp_path / "new"))
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "events.jsonl").write_text(read_text(FORMAT1 / "debate.events.jsonl.zst"))
    for run in ("new", "old"):
        assert main(["export", str(tmp_path / run), "--out", str(tmp_path / f"{run}.jsonl")]) == 0
    old, new = lines(tmp_path / "old.jsonl"), lines(tmp_path / "new.jsonl")
    assert [{k: v for k, v in e.items() if k not in NEWER} for e in old] == [
        {k: v for k, v in e.items() if k not in NEWER} for e in new
    ]


def test_export_says_what_is_wrong_in_one_line_and_leaves_no_partial_file(tmp_path: Path, capsys, monkeypatch) -> None:
    run_dir = tmp_path / "run"
    ok(*run_args("debate", run_dir))
    capsys.readouterr()
    cases = [
        (["export", str(tmp_path / "nowhere")], "no run directory"),
        (["export", str(run_dir), "--format", "csv"], "csv"),
        (["export", str(run_dir), "--out", str(tmp_path)], "is a folder"),
    ]
    for argv, said in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    text = (run_dir / "events.jsonl").read_text().splitlines(keepends=True)
    (run_dir / "events.jsonl").write_text("".join([text[0], "garbage\n", *text[1:]]))
    assert main(["export", str(run_dir)]) == 2
    assert "line 2 is not a valid entry" in capsys.readouterr().err
    assert not (run_dir / "export").exists() or not list((run_dir / "export").iterdir()), "nothing half-written"
    (run_dir / "events.jsonl").write_text("".join(text))
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if the analysis extra were not installed
    assert main(["export", str(run_dir), "--format", "parquet"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'metaroles[analysis]'" in err and len(err.strip().splitlines()) == 1
    assert not list((run_dir / "export").glob("*")), "nothing half-written"


@pytest.mark.parametrize(
    "damage",
    [
        lambda line: line.update(end=line["end"] + 1),  # numbers that the next line would not follow on
        lambda line: line["steps"]["kind"].__setitem__(0, "tool_call"),  # a tool step whose detail is no JSON object
        lambda line: line.update(parts=[["1", 0]]),
        lambda line: line.update(llm_calls=[{"role": ["a"]}]),
    ],
    ids=["end", "tool_detail", "parts", "llm_call"],
)
async def test_a_damaged_round_line_is_named_by_file_and_line(tmp_path: Path, damage: Any) -> None:
    await scenario_run("debate", tmp_path / "run", True)
    log = tmp_path / "run" / "events.jsonl"
    written = lines(log)
    damage(written[1])
    log.write_text("".join(json.dumps(line) + "\n" for line in written))
    with pytest.raises(RunDirCorrupt, match=r"events\.jsonl: line 2 is not a valid entry"):
        read_events(log)
