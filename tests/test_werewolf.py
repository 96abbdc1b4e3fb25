"""Werewolf: the rules on their own, and whole games on the bus."""

import json

import pytest
from metaroles.environments.werewolf import Game, Phase, RuleError

from metaroles import Message, TestLLM
from metaroles.core.exceptions import InvalidValueError
from metaroles.llm.model_files import local_model_available
from metaroles.project.scenario import run_scenario
from metaroles.team.options import RunOptions


def game() -> Game:
    return Game.deal(
        ["w1", "w2", "seer", "witch", "v1", "v2"], ["werewolf", "werewolf", "seer", "witch", "villager", "villager"]
    )


def test_the_werewolves_kill_their_most_named_living_non_werewolf():
    g = game()
    assert g.wolves_choose({"w1": "v1", "w2": "v1"}) == "v1"
    assert g.wolves_choose({"w1": "w2", "w2": "ghost"}) is None, "no valid target: nobody"
    assert g.wolves_choose({"w1": "v2", "v1": "seer"}) == "v2", "only werewolves choose"


def test_the_witch_potions_work_once_each():
    g = game()
    g.wolves_choose({"w1": "v1"})
    assert g.witch_acts(save=True, poison="w1") == ["w1"], "v1 saved, w1 poisoned"
    g.wolves_choose({"w2": "v2"})
    with pytest.raises(RuleError, match="antidote is used up"):
        g.witch_acts(save=True, poison=None)
    with pytest.raises(RuleError, match="poison is used up"):
        g.witch_acts(save=False, poison="w2")
    assert g.witch_acts(save=False, poison=None) == ["v2"]
    assert g.alive == ["w2", "seer", "witch", "v1"]


def test_a_dead_player_cannot_vote_or_be_voted_for_and_a_tie_eliminates_nobody():
    g = game()
    g.wolves_choose({"w1": "v1"})
    g.witch_acts(save=False, poison=None)
    out = g.vote({"v1": "w1", "seer": "w1", "witch": "w2", "w1": "v1", "w2": "seer", "v2": "v1"})
    assert out is None, "v1 is dead: its ballot and the ballots for it are void; w1 1, w2 1, seer 1: a tie"
    assert g.history[-1]["counted"] == {"seer": "w1", "witch": "w2", "w2": "seer"}
    assert g.vote({"seer": "w1", "witch": "w1", "v2": "w2", "w1": "w1"}) == "w1", "a vote for oneself is void"
    assert "w1" not in g.alive and g.day == 3


def test_the_game_ends_by_the_rules():
    g = game()
    g.wolves_choose({"w1": "seer"})
    g.witch_acts(save=False, poison="w1")
    assert g.winner is None
    assert g.alive == ["w2", "witch", "v1", "v2"]
    g.vote({"witch": "w2", "v1": "w2", "v2": "w2"})
    assert (g.winner, g.phase) == ("villagers", Phase.OVER)
    wolves = game()
    for victim in ("seer", "witch"):
        wolves.wolves_choose({"w1": victim})
        wolves.witch_acts(save=False, poison=None)
    assert (wolves.winner, wolves.alive) == ("werewolves", ["w1", "w2", "v1", "v2"])


def test_seer_checks_and_bad_deals_are_refused():
    g = game()
    assert g.seer_checks("seer", "w2") == "werewolf"
    with pytest.raises(RuleError):
        g.seer_checks("seer", "seer")
    with pytest.raises(InvalidValueError, match="no werewolf"):
        Game.deal(["a", "b"], ["villager", "seer"])


async def test_a_whole_game_with_the_test_model_ends_by_the_rules(tmp_path):
    report, team = await run_scenario("werewolf", llm=TestLLM(1), options={}, out_dir=tmp_path / "run")
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    final = lines[-1]
    assert final["phase"] == "over" and final["winner"] in ("villagers", "werewolves")
    assert report.stop_reason == "idle"
    votes = [line["latest"] for line in lines if line["latest"] and line["latest"]["event"] == "vote"]
    assert votes and all(set(v["counted"]) <= set(v["ballots"]) for v in votes)
    moderator = team.env.roles["Moderator"]
    private = [m for m in team.env.history if m.sent_from == "Moderator" and "whom do you kill" in m.content]
    wolves = {p for p, r in moderator.game.roles.items() if r == "werewolf"}
    assert private and all(m.send_to <= wolves for m in private), "the night's request reaches werewolves only"
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    saved = next(r for r in state["roles"] if r["name"] == "Moderator")["extra"]["game"]
    assert saved["winner"] == final["winner"] and saved["history"] == moderator.game.history


async def test_what_a_dead_player_says_is_dropped_and_recorded(tmp_path):
    _, team = await run_scenario("werewolf", llm=TestLLM(1), options={}, out_dir=None)
    game = team.env.game
    dead = next(p for p in game.roles if p not in game.alive)
    team.env.publish_message(Message("I am not dead yet!", sent_from=dead, send_to="Moderator"))
    assert team.env.history.storage[-1].content != "I am not dead yet!"
    assert team.env.events[-1].kind == "dropped" and "_DeadStaySilent" in team.env.events[-1].detail


@pytest.mark.skipif(
    not local_model_available(), reason="needs metaroles[local] and the embedded models (make demo installs them)"
)
async def test_the_embedded_model_answers_the_first_night():
    from metaroles.llm.local import LocalLLM

    llm = LocalLLM("smollm2-135m-instruct-q4_1", max_tokens=32, temperature=0.0)  # mechanics: the fast model
    _, team = await run_scenario(
        "werewolf", llm=llm, options={"max_days": 1}, out_dir=None, run=RunOptions(rounds=2)
    )  # the first night's rounds
    answers = [m.instruct_content for m in team.env.history if m.sent_from != "Moderator" and m.instruct_content]
    kills = [a for a in answers if a.kind == "kill"]
    assert kills and all(a.target in team.env.game.roles for a in kills), "targets come from the enum of players"


async def test_the_transcript_reads_by_night_and_day_with_answers_as_fields_and_no_ids(tmp_path):
    import re

    await run_scenario("werewolf", llm=TestLLM(2), options={}, out_dir=tmp_path / "run")
    transcript = (tmp_path / "run" / "transcript.md").read_text()
    headings = re.findall(r"^## (.+)$", transcript, flags=re.M)
    assert headings[:2] == ["Night 1", "Day 1"] and headings[-1] == "The end"
    assert not re.search(r"[0-9a-f]{32}", transcript), "no run ids in what people read"
    assert "- **kind**: kill" in transcript and '{"request"' not in transcript
    assert "Roles: Ann (" in transcript and "{'Ann'" not in transcript
