import warnings
from collections.abc import Sequence

import pytest

from metaroles import Action, InvalidValueError, Message, Role, StopReason, Team, TestLLM, UserRequirement


class Chat(Action):
    instruction = "Reply to the last message."


class Echo(Action):
    async def run(self, history: Sequence[Message]) -> str:
        return f"echo {history[-1].content}"


def chatter(name: str, partner: str) -> Role:
    return Role(name=name, actions=[Chat], watch=[UserRequirement, Chat], send_to=partner)


async def test_hire_gives_the_team_model_to_roles_without_one():
    own = TestLLM(seed=9)
    team = Team(llm=TestLLM())
    mine, theirs = Role(name="a", actions=[Chat], llm=own), Role(name="b", actions=[Chat])
    team.hire([mine, theirs])
    assert mine.actions[0].llm is own
    assert theirs.actions[0].llm is team.llm
    assert team.env.roles == {"a": mine, "b": theirs}


async def test_run_honours_send_to_and_stops_when_idle():
    team = Team()
    a, b = Role(name="a", actions=[Echo]), Role(name="b", actions=[Echo])
    team.hire([a, b])
    report = await team.run(n_round=10, idea="hello", send_to="b")
    assert report.stop_reason is StopReason.IDLE
    first = team.env.history.storage[0]
    assert first.send_to == {"b"} and first.sent_from == "Human"
    assert [m.sent_from for m in team.env.history] == ["Human", "b"], "only b was addressed"
    assert a.get_memories()[-1].content == "echo hello", "b's broadcast reached a, which does not watch Echo"


async def test_run_stops_at_n_round():
    team = Team(llm=TestLLM())
    team.hire([chatter("a", "b"), chatter("b", "a")])
    report = await team.run(n_round=3, idea="start", send_to="a")
    assert report.rounds == 3 and report.stop_reason is StopReason.MAX_ROUNDS
    assert [m.sent_from for m in team.env.history] == ["Human", "a", "b", "a"]


async def test_budget_exhaustion_is_a_clean_reported_stop():
    team = Team(llm=TestLLM(cost_per_token=0.01))
    team.hire([chatter("a", "b"), chatter("b", "a")])
    team.invest(1.0)
    report = await team.run(n_round=50, idea="argue forever", send_to="a")
    assert report.stop_reason is StopReason.BUDGET
    assert report.rounds < 50
    assert report.total_cost >= 1.0 == report.budget
    assert team.cost_ledger.total_cost == report.total_cost
    assert set(team.cost_ledger.cost_by("role")) == {"a", "b"}
    assert "stopped (budget)" in str(report)
    state = team.env.state_dict()
    assert len(state.ledger) == len(team.cost_ledger.entries)
    assert sum(r.buffer != [] for r in state.roles) == 1, "the pending reply is kept, not lost"


async def test_idle_team_runs_no_round():
    team = Team()
    team.hire([Role(name="a")])
    report = await team.run(n_round=5)
    assert (report.rounds, report.stop_reason) == (0, StopReason.IDLE)


def test_bad_investment_and_rounds():
    with pytest.raises(InvalidValueError, match="investment=0 must be a positive number"):
        Team().invest(0)
    with pytest.raises(InvalidValueError, match="investment='lots'"):
        Team(investment="lots")  # type: ignore[arg-type]


async def test_bad_n_round():
    with pytest.raises(InvalidValueError, match="n_round=-1"):
        await Team().run(n_round=-1)


class Crash(Action):
    async def run(self, history: Sequence[Message]) -> str:
        raise RuntimeError("model server went away")


async def test_a_failed_run_still_saves_its_state(tmp_path):
    from metaroles import EnvironmentState, RoleFailed

    team = Team()
    team.hire([Role(name="a", actions=[Echo], send_to="b"), Role(name="b", actions=[Crash], watch=[Echo])])
    path = tmp_path / "state.json"
    with pytest.raises(RoleFailed, match="model server went away"):
        await team.run(n_round=5, idea="go", send_to="a", save_to=path)
    state = EnvironmentState.model_validate_json(path.read_text())
    assert [m.content for m in state.history] == ["go", "echo go"]
    assert state.events[0].kind == "role_error" and state.events[0].role == "b"


async def test_a_clean_run_saves_its_state_too(tmp_path):
    team = Team()
    team.hire([Role(name="a", actions=[Echo])])
    await team.run(idea="hi", save_to=tmp_path / "s.json")
    assert "echo hi" in (tmp_path / "s.json").read_text()


class WriteDraft(Action):
    async def run(self, history: Sequence[Message]) -> str:
        return "a draft"


class ReviewDraft(Action):
    async def run(self, history: Sequence[Message]) -> str:
        return "reviewed"


async def test_a_watch_that_no_action_produces_but_one_resembles_is_warned_of_naming_it():
    from metaroles import UnheardWatchWarning

    team = Team(llm=TestLLM(1))
    team.hire(
        [Role(name="writer", actions=[WriteDraft]), Role(name="critic", actions=[ReviewDraft], watch=["WriteDraft"])]
    )
    with pytest.warns(UnheardWatchWarning, match=r"watches 'WriteDraft'.*did you mean 'tests\.test_team\.WriteDraft'"):
        await team.run(2, idea="go")
    quiet = Team(llm=TestLLM(1))
    quiet.hire(
        [Role(name="writer", actions=[WriteDraft]), Role(name="critic", actions=[ReviewDraft], watch=[WriteDraft])]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnheardWatchWarning)
        await quiet.run(2, idea="go")
    assert any(m.cause_by.endswith("ReviewDraft") for m in quiet.env.history.storage)
