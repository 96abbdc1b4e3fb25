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
from pathlib import Path
from typing import Any

import pytest

from metaroles import Action, Environment, Message, Role, TestLLM
from metaroles.core.exceptions import InvalidValueError
from metaroles.project.scenario import run_scenario
from metaroles.record.eventlog import EventLog, publish_rounds, read_events
from metaroles.sharding.backends import LocalBackend
from metaroles.team.options import RunOptions
from metaroles.team.team import Team
from tests.faults.helpers import SCENARIOS, SEED, differences, killed, ok, run_args

FORMAT1 = Path(__file__).parent / "data" / "format1"
SAME = ("transcript.md", "state.json", "report.json", "ledger.json", "metrics.jsonl")


async def scenario_run(name: str, out: Path, log_turns: Any = None, backend: Any = None) -> None:
    run = RunOptions(seed=SEED, log_turns=log_turns, backend=backend)
    await run_scenario(name, llm=TestLLM(SEED), options=SCENARIOS[name], out_dir=out, run=run)  # as `--llm test`


def events(path: Path) -> list[dict[str, Any]]:
    """The events a reader gets, but the clock's latencies."""
    return [{k: v for k, v in e.items() if k != "latency_s"} for e in read_events(path)]


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
