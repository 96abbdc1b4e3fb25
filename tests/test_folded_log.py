"""A folded log (``log_turns="folded"``): a default turn rides on its message's publish line, and reads back whole.

Every reader goes through ``read_events``, which spells each folded turn out as the observe, think
and act events a log with a line per event holds — the very events, numbers included. Tested on
every scenario, on shards, across a kill and a resume, and with a turn whose message tells another
story (it stays spelled out).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from metaroles import Action, Environment, Message, Role, TestLLM
from metaroles.core.exceptions import InvalidValueError
from metaroles.project.scenario import run_scenario
from metaroles.record.eventlog import EventLog, read_events
from metaroles.sharding.backends import LocalBackend
from metaroles.team.options import RunOptions
from metaroles.team.team import Team
from tests.faults.helpers import SCENARIOS, SEED, differences, killed, ok, run_args

SAME = ("transcript.md", "state.json", "report.json", "ledger.json", "metrics.jsonl")


async def scenario_run(name: str, out: Path, log_turns: Any, backend: Any = None) -> None:
    run = RunOptions(seed=SEED, log_turns=log_turns, backend=backend)
    await run_scenario(name, llm=TestLLM(), options=SCENARIOS[name], out_dir=out, run=run)


def events(path: Path) -> list[dict[str, Any]]:
    """The events a reader gets, but the clock's latencies."""
    return [{k: v for k, v in e.items() if k != "latency_s"} for e in read_events(path)]


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_a_folded_log_reads_back_as_the_log_with_a_line_per_event(name: str, tmp_path: Path) -> None:
    await scenario_run(name, tmp_path / "plain", True)
    await scenario_run(name, tmp_path / "folded", "folded")
    plain, folded = tmp_path / "plain" / "events.jsonl", tmp_path / "folded" / "events.jsonl"
    assert events(folded) == events(plain)
    turned = [e for e in lines(folded) if "turn" in e]
    assert turned, "default turns went on their messages' lines"
    assert len(lines(folded)) == len(lines(plain)) - 3 * len(turned)
    assert folded.stat().st_size < plain.stat().st_size
    for file in SAME:
        if (tmp_path / "plain" / file).exists():
            assert (tmp_path / "folded" / file).read_bytes() == (tmp_path / "plain" / file).read_bytes(), file
    assert json.loads((tmp_path / "folded" / "manifest.json").read_text())["log_turns"] == "folded"


@pytest.mark.parametrize("name", ["society", "werewolf"])
async def test_a_sharded_run_folds_its_log_as_one_process_does(name: str, tmp_path: Path) -> None:
    await scenario_run(name, tmp_path / "one", "folded")
    await scenario_run(name, tmp_path / "sharded", "folded", LocalBackend(2))
    assert (tmp_path / "sharded" / "events.jsonl").read_bytes() == (tmp_path / "one" / "events.jsonl").read_bytes()


class Relay(Action):
    async def run(self, history: Any) -> str:
        return f"relay {len(history)}"


class Ventriloquist(Action):
    """Speaks in someone else's name: its message's line does not tell its turn's story."""

    async def run(self, history: Any) -> Message:
        return Message("in another voice", cause_by=self.cause_by, sent_from="puppet", send_to={"a"})


def relays(turns: Any) -> tuple[Environment, EventLog, Path]:
    env = Environment(seed=3)
    env.add_role(Role(name="a", actions=[Relay], watch=[Ventriloquist], send_to="b"))
    env.add_role(Role(name="b", actions=[Ventriloquist], watch=[Relay]))
    return env, EventLog(Path(turns[1]), env, turns=turns[0]), Path(turns[1])


async def test_a_turn_whose_message_tells_another_story_stays_spelled_out(tmp_path: Path) -> None:
    written = {}
    for turns in (True, "folded"):
        env, log, path = relays((turns, tmp_path / f"{turns}.jsonl"))
        env.publish_message(Message("go", id="go", send_to={"a"}))
        log.round_done()
        for _ in range(4):
            await env.run_round()
            log.round_done()
        written[turns] = path
    raw = lines(written["folded"])
    assert any("turn" in e and e["role"] == "a" for e in raw), "a's turns ride on its messages"
    assert [e["kind"] for e in raw if e.get("role") == "b" and e["kind"] != "deliver"].count("observe") >= 2
    assert not any("turn" in e and e["role"] == "puppet" for e in raw)
    assert events(written["folded"]) == events(written[True])


def test_log_turns_is_true_false_or_folded() -> None:
    assert Team(log_turns="folded").log_turns == "folded"
    with pytest.raises(InvalidValueError, match="'folded'"):
        Team(log_turns="fold")  # type: ignore[arg-type]


def test_a_folded_run_killed_mid_way_resumes_to_the_uninterrupted_run(tmp_path: Path) -> None:
    ok(*run_args("debate", tmp_path / "whole", "--fold-turns"))
    killed("point=append:events.jsonl:5", *run_args("debate", tmp_path / "cut", "--fold-turns"))
    ok("resume", str(tmp_path / "cut"), "-q")
    assert differences(tmp_path / "whole", tmp_path / "cut") == []
    assert any("turn" in e for e in lines(tmp_path / "cut" / "events.jsonl"))
