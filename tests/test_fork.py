"""Forking a run from round K: the parent's prefix exactly, then a divergence when something changed."""

import pytest

from metaroles import TestLLM
from metaroles.core.exceptions import ConfigError
from metaroles.project.diff import diff_runs, run_messages
from metaroles.project.rundir import read_manifest
from metaroles.project.scenario import fork_scenario, run_scenario
from metaroles.record.eventlog import read_events

OPTIONS = {"turns": 3}


@pytest.fixture
async def parent(tmp_path):
    await run_scenario(
        "debate", llm=TestLLM(5), options=OPTIONS, out_dir=tmp_path / "parent", manifest={"llm": "test:5"}
    )
    return tmp_path / "parent"


async def test_a_fork_without_a_change_replays_the_parent_exactly(parent, tmp_path):
    await fork_scenario(parent, from_round=3, out_dir=tmp_path / "child", llm=TestLLM(5))
    assert diff_runs(parent, tmp_path / "child").first_divergence_round is None
    assert read_manifest(tmp_path / "child")["parent"] == {
        "run_dir": str(parent),
        "from_round": 3,
        "idea": "",
        "changes": {},
    }


async def test_a_fork_with_another_model_keeps_the_prefix_then_diverges(parent, tmp_path):
    child = tmp_path / "child"
    await fork_scenario(parent, from_round=3, out_dir=child, llm=TestLLM(5), role_llms={"Bob": TestLLM(99)})
    before = [m for m in run_messages(parent) if m.round <= 3]
    assert [(m.sender, m.content, m.id) for m in run_messages(child)[: len(before)]] == [
        (m.sender, m.content, m.id) for m in before
    ], "the prefix is the parent's, ids included"
    diff = diff_runs(parent, child)
    assert diff.common >= len(before)
    assert diff.first_divergence_round is not None and diff.first_divergence_round > 3
    left, right = diff.differing[0]
    assert left.sender == right.sender == "Bob" and left.content != right.content
    events = [{k: v for k, v in e.items() if k != "latency_s"} for e in read_events(child / "events.jsonl")]
    parent_events = [{k: v for k, v in e.items() if k != "latency_s"} for e in read_events(parent / "events.jsonl")]
    prefix = [e for e in parent_events if e["round"] <= 3]
    assert events[: len(prefix)] == prefix, "the child's log starts with the parent's first three rounds"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))


async def test_an_idea_at_the_fork_point_reaches_every_role(parent, tmp_path):
    child = tmp_path / "child"
    await fork_scenario(parent, from_round=2, out_dir=child, llm=TestLLM(5), idea="Consider the winter.")
    forked = run_messages(child)
    injected = [m for m in forked if m.content == "Consider the winter."]
    assert len(injected) == 1 and injected[0].round == 2 and injected[0].recipients == ("<all>",)
    assert diff_runs(parent, child).first_divergence_round == 2


async def test_a_config_change_at_the_fork_is_recorded(parent, tmp_path):
    child = tmp_path / "child"
    await fork_scenario(parent, from_round=1, out_dir=child, llm=TestLLM(5), changes={"turns": 4})
    manifest = read_manifest(child)
    assert manifest["config"]["turns"] == 4 and manifest["parent"]["changes"] == {"turns": 4}
    speeches = [m for m in run_messages(child) if m.action == "SpeakAloud"]
    assert len(speeches) > 6, "the debaters went on for a fourth turn each"


async def test_forking_an_unknown_role_or_round_is_a_clear_error(parent, tmp_path):
    with pytest.raises(ConfigError, match="no role named 'Carol'"):
        await fork_scenario(
            parent, from_round=1, out_dir=tmp_path / "c1", llm=TestLLM(5), role_llms={"Carol": TestLLM()}
        )
    with pytest.raises(ConfigError, match="is not a run directory"):
        await fork_scenario(tmp_path / "nothing", from_round=1, out_dir=tmp_path / "c2", llm=TestLLM())
