"""The society scenario: bounded-confidence opinion dynamics on a social graph, rule-based and LLM-backed."""

import json
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from metaroles.scenarios.society import (
    Agent,
    OpinionUpdate,
    Reconsider,
    Share,
    hegselmann_krause,
    opinion_of,
    round_metrics,
)

from metaroles import Memory, Message, TestLLM
from metaroles.llm.model_files import local_model_available
from metaroles.project.registry import load_scenario
from metaroles.project.scenario import resume_scenario, run_scenario

TINY = {"agents": 4, "graph": "ring", "opinions": [0.0, 0.2, 0.5, 0.9], "epsilon": 0.35, "rounds": 1}


def test_the_rule_averages_only_the_opinions_within_reach():
    assert hegselmann_krause(0.5, [0.2, 0.9], 0.35) == pytest.approx(0.35)
    assert hegselmann_krause(0.9, [0.5, 0.0], 0.35) == 0.9
    assert hegselmann_krause(0.2, [0.0, 0.5], 0.35) == pytest.approx(0.7 / 3)


def _read_whole(agent: Agent) -> float:
    """The agent's opinion read from its whole memory: the last valid answer it said, else its initial one."""
    said = [m for m in agent.rc.memory.get_by_action(agent.actions[0].cause_by) if m.sent_from == agent.name]
    valid = [opinion for m in said if (opinion := opinion_of(m)) is not None]
    return valid[-1] if valid else agent.initial


_STEP = st.one_of(
    st.tuples(st.just("own"), st.floats(0, 1)),  # the agent says an opinion
    st.tuples(st.just("failed"), st.just(0.0)),  # an answer that never validated (kept: the last opinion stands)
    st.tuples(st.just("heard"), st.floats(0, 1)),  # a neighbour's opinion
    st.tuples(st.just("other"), st.floats(0, 1)),  # its own message of another action
    st.tuples(st.just("delete"), st.integers(0, 50)),  # a message removed from its memory
    st.tuples(st.just("replace"), st.integers(0, 50)),  # another memory, holding the first ones
    st.tuples(st.just("read"), st.just(0.0)),
)


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(_STEP, max_size=40), asks=st.booleans())
def test_an_agents_opinion_followed_read_by_read_is_the_one_its_whole_memory_gives(steps, asks):
    agent = Agent(name="a0", neighbours=["a1"], opinion=0.25, epsilon=0.3, llm_backed=asks)
    action = Reconsider if asks else Share
    for kind, value in steps:
        memory = agent.rc.memory
        if kind in ("own", "failed", "heard", "other"):
            sender = "a1" if kind == "heard" else "a0"
            cause = "tests.Other" if kind == "other" else action
            meta = {"error": "never validated"} if kind == "failed" else {}
            memory.add(Message(f"{value:.6f}", cause_by=cause, sent_from=sender, metadata=meta))
        elif kind == "delete" and len(memory):
            memory.delete(memory.get()[value % len(memory)])
        elif kind == "replace":
            agent.rc.memory = Memory(list(memory.get())[: value % (len(memory) + 1)])
        assert agent.opinion == _read_whole(agent)


async def test_one_exchange_on_a_ring_of_four_matches_the_hand_computed_opinions(tmp_path):
    _, team = await run_scenario("society", llm=TestLLM(), options=TINY, out_dir=tmp_path / "run")
    opinions = [team.env.roles[f"a{i}"].opinion for i in range(4)]
    # a0 hears a1 (0.2) and a3 (0.9, too far); a1 hears 0.0 and 0.5; a2 hears 0.2 (0.9 too far); a3 hears nobody near
    expected = [0.1, (0.2 + 0.0 + 0.5) / 3, 0.35, 0.9]
    assert opinions == pytest.approx(expected, abs=1e-6)
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["round"] for line in lines] == [0, 1, 2]
    assert lines[1]["mean"] == pytest.approx(statistics.fmean([0.0, 0.2, 0.5, 0.9]), abs=1e-6)
    last = lines[2]
    assert last["mean"] == pytest.approx(statistics.fmean(expected), abs=1e-6)
    assert last["variance"] == pytest.approx(statistics.pvariance(expected), abs=1e-6)
    assert (last["clusters"], last["min"], last["max"]) == (4, 0.1, 0.9)
    sent = [m for m in team.env.history if m.sent_from == "a0"]
    assert all(m.send_to == {"a1", "a3"} for m in sent), "addressed to its neighbours only"


async def test_opinions_converge_into_clusters_on_a_small_world(tmp_path):
    _, team = await run_scenario(
        "society", llm=TestLLM(), options={"agents": 60, "rounds": 25, "epsilon": 0.2}, out_dir=tmp_path / "r"
    )
    lines = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["variance"] < lines[1]["variance"]
    assert lines[-1]["clusters"] < lines[1]["clusters"]
    assert round_metrics(team) == {k: v for k, v in lines[-1].items() if k != "round"}


async def test_llm_backed_agents_mix_with_rule_based_ones():
    _, team = await run_scenario(
        "society", llm=TestLLM(3), options={"agents": 8, "rounds": 3, "llm_agents": 3}, out_dir=None
    )
    from_llm = [m for m in team.env.history if m.sent_from in {"a0", "a1", "a2"}]
    assert len(from_llm) == 3 * 4 and all(isinstance(m.instruct_content, OpinionUpdate) for m in from_llm)
    assert all(0 <= team.env.roles[f"a{i}"].opinion <= 1 for i in range(8))
    assert len(team.env.ledger.entries) == 3 * 4, "only the LLM-backed agents call the model"


async def test_a_society_resumes_to_the_same_opinions(tmp_path):
    options = {"agents": 30, "rounds": 8}
    _, straight = await run_scenario("society", llm=TestLLM(), options=options, out_dir=tmp_path / "a")
    for later in sorted((tmp_path / "a" / "checkpoints").glob("round-*.json")):
        if int(later.stem[6:]) > 4:
            later.unlink()
    _, resumed = await resume_scenario(tmp_path / "a", llm=TestLLM())
    assert [r.opinion for r in resumed.env.roles.values()] == [r.opinion for r in straight.env.roles.values()]
    rounds = [json.loads(line)["round"] for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert rounds == list(range(10)), "metrics of the resumed rounds are written once"


def test_bad_options_are_refused():
    module = load_scenario("society")
    with pytest.raises(ValueError, match="opinions has 2 values for 4 agents"):
        module.Config(agents=4, opinions=[0.1, 0.2])
    with pytest.raises(ValueError, match="between 0 and 1"):
        module.Config(agents=2, opinions=[0.5, 2])
    with pytest.raises(ValueError, match="degree must be even"):
        module.Config(agents=100, degree=3)
    with pytest.raises(ValueError, match="agents"):
        module.Config(agents=1)


@pytest.mark.skipif(
    not local_model_available(), reason="needs metaroles[local] and the embedded models (make demo installs them)"
)
async def test_a_short_run_with_the_embedded_model():
    from metaroles.llm.local import LocalLLM

    llm = LocalLLM(max_tokens=24, temperature=0.0)
    _, team = await run_scenario("society", llm=llm, options={"agents": 5, "rounds": 1, "llm_agents": 2}, out_dir=None)
    answers = [m.instruct_content for m in team.env.history if m.sent_from in {"a0", "a1"}]
    assert len(answers) == 4 and all(isinstance(a, OpinionUpdate) and 0 <= a.opinion <= 1 for a in answers)


async def test_each_rounds_model_calls_and_tokens_go_into_its_metrics_row_and_a_resume_counts_them_once(tmp_path):
    options = {"agents": 10, "rounds": 6, "llm_agents": 4}
    _, straight = await run_scenario("society", llm=TestLLM(2), options=options, out_dir=tmp_path / "a")
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    used = [row["llm"] for row in rows if "llm" in row]
    assert [row["round"] for row in rows if "llm" in row] == list(range(1, 8)) and "llm" not in rows[0]
    assert all(u["calls"] == 4 and u["prompt_tokens"] > 0 and u["completion_tokens"] > 0 for u in used)
    assert sum(u["prompt_tokens"] for u in used) == sum(e.prompt_tokens for e in straight.env.ledger.entries)
    assert all(u["cached_tokens"] == 0 for u in used), "the test model has no prefix cache"
    for later in sorted((tmp_path / "a" / "checkpoints").glob("round-*.json")):
        if int(later.stem[6:]) > 3:
            later.unlink()
    await resume_scenario(tmp_path / "a", llm=TestLLM(2))
    again = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert again == rows, "the resumed rounds' rows are written again, the same"
