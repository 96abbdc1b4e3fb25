"""Archetypes: a population guided by one model call per archetype a round, each member drawing its own action."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from collections import Counter
from typing import Literal

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, ValidationError

from metaroles import Action, FunctionLLM, LLMRequest, TestLLM
from metaroles.agents.archetypes import Archetypes, clusters, distribution_model, draw, examples_model
from metaroles.core.exceptions import ConfigError, LLMOutputInvalid
from metaroles.project.scenario import run_scenario
from metaroles.sharding.backends import LocalBackend
from metaroles.team.options import RunOptions
from tests.faults.helpers import contents


class Vote(BaseModel):
    choice: Literal["yes", "no", "abstain"]
    loud: bool = False
    strength: float = Field(default=0.5, ge=0, le=1)
    count: int = Field(default=1, ge=1, le=5)
    words: str = Field(default="", max_length=8)


chances = st.floats(0, 1, allow_nan=False)


@settings(max_examples=80, deadline=None)
@given(
    yes=chances, no=chances, abstain=chances, loud=chances, mean=st.floats(-3, 3), spread=st.floats(0, 4),
    samples=st.lists(st.text(max_size=8), min_size=1, max_size=3), seed=st.integers(0, 2**32),
)  # fmt: skip
def test_every_draw_is_a_valid_action_and_never_a_choice_of_no_chance(
    yes, no, abstain, loud, mean, spread, samples, seed
):
    model = distribution_model(Vote)
    strength_mean = min(1.0, max(0.0, mean))
    distribution = model.model_validate({
        "choice": {"yes": yes, "no": no, "abstain": abstain}, "loud": {"True": loud, "False": 1 - loud},
        "strength_mean": strength_mean, "strength_spread": spread, "count_mean": 1 + 4 * strength_mean,
        "count_spread": spread, "words": samples,
    })  # fmt: skip
    drawn = draw(distribution, Vote, random.Random(seed))
    assert isinstance(drawn, Vote) and 0 <= drawn.strength <= 1 and 1 <= drawn.count <= 5
    weights = {"yes": yes, "no": no, "abstain": abstain}
    assert weights[drawn.choice] > 0 or not any(weights.values())
    assert drawn.words in samples


def test_draws_follow_the_distributions_chances():
    distribution = distribution_model(Vote).model_validate({
        "choice": {"yes": 0.7, "no": 0.2, "abstain": 0.1}, "loud": {"True": 0, "False": 1}, "strength_mean": 0.5,
        "strength_spread": 0.1, "count_mean": 3, "count_spread": 0, "words": ["a", "b"],
    })  # fmt: skip
    drawn = [draw(distribution, Vote, random.Random(i)) for i in range(3000)]
    shares = Counter(d.choice for d in drawn)
    assert abs(shares["yes"] / 3000 - 0.7) < 0.04 and abs(shares["abstain"] / 3000 - 0.1) < 0.03
    assert not any(d.loud for d in drawn) and {d.count for d in drawn} == {3}
    assert abs(sum(d.strength for d in drawn) / 3000 - 0.5) < 0.01


def test_a_texts_samples_keep_its_rules_so_every_draw_validates():
    """A model's sample longer than the field allows is refused with the distribution (retried), never drawn."""
    chances = {"choice": {"yes": 1, "no": 0, "abstain": 0}, "loud": {"True": 0, "False": 1}, "strength_mean": 0.5}
    chances |= {"strength_spread": 0, "count_mean": 1, "count_spread": 0}
    with pytest.raises(ValidationError, match="at most 8 characters"):
        distribution_model(Vote).model_validate({**chances, "words": ["fine", "far too long for it"]})
    schema = distribution_model(Vote).model_json_schema()
    assert schema["properties"]["words"]["items"]["maxLength"] == 8  # a grammar holds the model to it


def test_a_field_that_is_no_choice_number_or_text_is_refused_by_name():
    class Plan(BaseModel):
        steps: list[str]

    with pytest.raises(ConfigError, match=r"Plan\.steps"):
        distribution_model(Plan)
    with pytest.raises(ConfigError, match="choose between 1 and 3"):
        clusters([[0.0], [1.0], [2.0]], 4)


def test_clusters_group_the_alike_and_are_a_function_of_the_seed():
    rng = random.Random(0)
    features = [(rng.gauss(c, 0.1), rng.gauss(-c, 0.1)) for c in (0, 5, 10) for _ in range(50)]
    labels = clusters(features, 3, seed=4)
    assert labels == clusters(features, 3, seed=4)
    assert [len(set(labels[i : i + 50])) for i in (0, 50, 100)] == [1, 1, 1] and len(set(labels)) == 3


async def test_one_call_per_archetype_and_round_however_many_members_ask_at_once():
    asked: list[LLMRequest] = []

    def answer(request: LLMRequest) -> str:
        asked.append(request)
        return json.dumps({"choice": {"yes": 1, "no": 0, "abstain": 0}, "loud": {"True": 0.5, "False": 0.5},
                           "strength_mean": 0.3, "strength_spread": 0, "count_mean": 2, "count_spread": 0,
                           "words": ["fine"]})  # fmt: skip

    action = Action()
    action.llm = FunctionLLM(answer)
    archetypes = Archetypes(Vote, describe=lambda key, round: f"group {key}, round {round}")
    drawn: list[Vote] = []

    async def member(i: int, round: int) -> None:
        drawn.append(await archetypes.choose(action, i % 3, round, random.Random(i)))

    for round in (1, 2):
        async with anyio.create_task_group() as group:
            for i in range(30):
                group.start_soon(member, i, round)
    assert len(asked) == 6 and len(drawn) == 60 and all(d.choice == "yes" and d.strength == 0.3 for d in drawn)
    assert sorted(r.role for r in asked) == sorted(f"archetype {k}" for k in (0, 1, 2) for _ in (1, 2))
    assert {r.messages[-1]["content"].split("\n")[0] for r in asked} == {
        f"group {k}, round {r}" for k in (0, 1, 2) for r in (1, 2)
    }


@settings(max_examples=40, deadline=None)
@given(choices=st.lists(st.sampled_from(["yes", "no", "abstain"]), min_size=1, max_size=8), seed=st.integers(0, 2**32))
def test_a_draw_from_examples_is_one_of_them(choices, seed):
    examples = examples_model(Vote).model_validate({"members": [{"choice": c, "count": 1 + n % 5}
                                                               for n, c in enumerate(choices)]})  # fmt: skip
    drawn = draw(examples, Vote, random.Random(seed))
    assert isinstance(drawn, Vote) and drawn in examples.members  # type: ignore[attr-defined]
    with pytest.raises(ValidationError):  # more than asked for is refused
        examples_model(Vote, 2).model_validate({"members": [{"choice": "yes"}] * 3})


async def test_in_the_examples_form_each_member_draws_one_of_its_archetypes_examples():
    asked: list[LLMRequest] = []

    def answer(request: LLMRequest) -> str:
        asked.append(request)
        return json.dumps({"members": [{"choice": "yes", "count": 2}, {"choice": "no", "count": 3}]})

    action = Action()
    action.llm = FunctionLLM(answer)
    archetypes = Archetypes(Vote, describe=lambda key, round: f"group {key}", form="examples", answer_tokens=300)
    drawn = [await archetypes.choose(action, "all", 1, random.Random(i)) for i in range(40)]
    assert len(asked) == 1 and asked[0].max_tokens == 300 and "8 actions" in asked[0].messages[-1]["content"]
    assert {(d.choice, d.count) for d in drawn} == {("yes", 2), ("no", 3)}
    with pytest.raises(ConfigError, match="'chances' or 'examples'"):
        Archetypes(Vote, describe=lambda key, round: "", form="guesses")  # type: ignore[arg-type]


async def test_an_archetype_whose_answer_never_validates_fails_every_member_that_waited():
    action = Action()
    action.llm = FunctionLLM(lambda request: "no JSON here")
    archetypes = Archetypes(Vote, describe=lambda key, round: "group")
    failed: list[BaseException] = []

    async def member(i: int) -> None:
        try:
            await archetypes.choose(action, "all", 1, random.Random(i))
        except LLMOutputInvalid as exc:
            failed.append(exc)

    async with anyio.create_task_group() as group:
        for i in range(5):
            group.start_soon(member, i)
    assert len(failed) == 5


async def test_an_archetypal_feed_asks_once_per_archetype_a_round_and_its_promoted_users_alone(tmp_path):
    options = {"agents": 400, "archetypes": 6, "promoted": 4, "activation": 1.0, "rounds": 3}
    _, team = await run_scenario("feed", llm=TestLLM(), options=options, out_dir=None, run=RunOptions(seed=3))
    calls = Counter(entry.role for entry in team.env.ledger.entries)
    archetypal = {role: n for role, n in calls.items() if role.startswith("archetype ")}
    assert set(archetypal.values()) == {2} and len(archetypal) == 6  # each once in each of the 2 rounds users act
    individual = {role for role in calls if not role.startswith("archetype ")}
    assert individual and individual <= {"u0", "u1", "u2", "u3"}  # the most followed ask alone
    acted = [m for m in team.env.history if m.sent_from.startswith("u") and m.instruct_content is not None]
    assert len(acted) > 10 * len(calls)  # many users' actions for each call
    with pytest.raises(ConfigError, match="archetypes=500 for 400 users"):
        await run_scenario("feed", llm=TestLLM(), options={**options, "archetypes": 500}, out_dir=None)
    with pytest.raises(ConfigError, match="archetypes=6 runs in one process"):  # each shard would ask them all
        await run_scenario(
            "feed", llm=TestLLM(), options=options, out_dir=None, run=RunOptions(backend=LocalBackend(2))
        )


KILLED = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import anyio
    from metaroles import TestLLM
    from metaroles.project.scenario import run_scenario
    from metaroles.team.options import RunOptions

    options = {"agents": 10_000, "archetypes": 8, "promoted": 3, "activation": 0.05}

    def killed(team):  # round 3 logged, its checkpoint not yet the last one kept (every 2 rounds)
        if team.env.round == 3:
            os.kill(os.getpid(), signal.SIGKILL)

    anyio.run(lambda: run_scenario("feed", llm=TestLLM(4), options=options, out_dir=Path(sys.argv[1]),
              run=RunOptions(seed=4, rounds=6, checkpoint_every=2), on_round=killed, manifest={"llm": "test:4"}))
    """
)


def test_an_archetypal_feed_of_10000_users_is_the_same_in_two_processes_and_after_a_sigkill(tmp_path):
    sets = ["--set", "agents=10000", "--set", "archetypes=8", "--set", "promoted=3", "--set", "activation=0.05"]
    run = ["run", "feed", "--llm", "test:4", "--seed", "4", *sets, "--rounds", "6", "--checkpoint-every", "2", "-q"]

    def cli(hash_seed: str, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, check=False)

    for out, hash_seed in (("a", "1"), ("b", "2")):
        done = cli(hash_seed, "-m", "metaroles", *run, "--out", str(tmp_path / out))
        assert done.returncode == 0, done.stderr[-2000:]
    straight = contents(tmp_path / "a")
    assert contents(tmp_path / "b") == straight
    ledger = json.loads((tmp_path / "a" / "ledger.json").read_text())
    assert ledger and all(e["role"].startswith("archetype ") or e["role"] in ("u0", "u1", "u2") for e in ledger)
    killed = cli("3", "-c", KILLED, str(tmp_path / "c"))
    assert killed.returncode == -9, killed.stderr[-2000:]
    resumed = cli("5", "-m", "metaroles", "resume", str(tmp_path / "c"), "-q")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    again = contents(tmp_path / "c")
    assert {k: v for k, v in again.items() if k != "manifest.json"} == {
        k: v for k, v in straight.items() if k != "manifest.json"
    }


async def test_an_archetypal_society_asks_once_per_band_a_round_and_each_agent_moves_by_its_own_draw():
    options = {"agents": 120, "llm_agents": 120, "archetypes": 4}
    _, team = await run_scenario(
        "society", llm=TestLLM(), options=options, out_dir=None, run=RunOptions(seed=1, rounds=5)
    )
    calls = Counter(entry.role for entry in team.env.ledger.entries)
    assert set(calls) <= {f"archetype {band}" for band in range(4)} and max(calls.values()) <= 6  # a band a round
    assert sum(calls.values()) < 120  # the per-agent society: 120 calls a round
    agents = list(team.env.roles.values())
    for agent in agents[:20]:  # each one's opinion is its own moved toward the mean its neighbours said, by its draw
        said = [m for m in agent.rc.memory.get() if m.sent_from == agent.name]
        assert 0 <= agent.opinion <= 1 and said
    opinions = [agent.opinion for agent in agents]
    assert len(set(opinions)) > 20  # drawn one by one, not one answer for all
    shown = await run_scenario("society", llm=TestLLM(), options={**options, "archetype_form": "examples"},
                               out_dir=None, run=RunOptions(seed=1, rounds=5))  # fmt: skip
    assert max(Counter(e.role for e in shown[1].env.ledger.entries).values()) <= 6, "examples: a band a round too"
    plain = await run_scenario("society", llm=TestLLM(), options={**options, "archetypes": 0}, out_dir=None)
    assert all(e.role.startswith("a") and not e.role.startswith("archetype") for e in plain[1].env.ledger.entries)


async def test_a_budget_of_calls_a_round_chooses_how_many_archetypes():
    options = {"agents": 300, "calls_per_round": 6, "promoted": 2, "activation": 1.0, "rounds": 4}
    _, team = await run_scenario("feed", llm=TestLLM(), options=options, out_dir=None, run=RunOptions(seed=2))
    calls = Counter(entry.role for entry in team.env.ledger.entries)
    archetypal = {role for role in calls if role.startswith("archetype ")}
    assert archetypal == {f"archetype {k}" for k in range(4)}, "6 calls, 2 of them the promoted users': 4 archetypes"
    assert set(calls) - archetypal <= {"u0", "u1"}
    _, society = await run_scenario("society", llm=TestLLM(), options={"agents": 60, "llm_agents": 60,
                                    "calls_per_round": 3}, out_dir=None, run=RunOptions(seed=1, rounds=3))  # fmt: skip
    assert set(Counter(e.role for e in society.env.ledger.entries)) <= {f"archetype {b}" for b in range(3)}


@pytest.mark.parametrize(
    ("scenario", "options", "said"),
    [
        ("feed", {"agents": 300, "calls_per_round": 2, "promoted": 2}, "calls_per_round=2"),
        ("feed", {"agents": 300, "calls_per_round": 6, "archetypes": 3}, "not archetypes=3"),
        ("society", {"agents": 30, "llm_agents": 30, "calls_per_round": 3, "archetypes": 2}, "not archetypes=2"),
    ],
)
async def test_a_budget_of_calls_that_cannot_be_is_refused_naming_it(scenario, options, said):
    with pytest.raises(ConfigError, match=said):
        await run_scenario(scenario, llm=TestLLM(), options=options, out_dir=None)
