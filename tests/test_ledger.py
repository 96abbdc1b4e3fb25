import pytest

from metaroles import (
    Action,
    Budget,
    CostLedger,
    EnvironmentState,
    FunctionLLM,
    LLMRequest,
    LLMResponse,
    Price,
    Role,
    StopReason,
    Team,
    TestLLM,
    Usage,
    UserRequirement,
)
from metaroles.core.exceptions import UnknownRoleError


class Chat(Action):
    instruction = "Reply."


def fixed(tokens: int, model: str = "m") -> FunctionLLM:
    def answer(request: LLMRequest) -> LLMResponse:
        return LLMResponse(text="ok", usage=Usage(prompt_tokens=tokens - 2, completion_tokens=2), model=model)

    return FunctionLLM(answer, model=model)


def chatters(llm: FunctionLLM) -> list[Role]:
    return [
        Role(name="a", actions=[Chat], watch=[UserRequirement, Chat], send_to="b", llm=llm),
        Role(name="b", actions=[Chat], watch=[Chat], send_to="a", llm=llm),
    ]


def test_prices_come_from_the_table_else_from_the_response():
    ledger = CostLedger(prices={"priced": Price(prompt=1.0, completion=2.0)})
    usage = Usage(prompt_tokens=1000, completion_tokens=500)
    priced = ledger.record(role="r", action="a", response=LLMResponse(model="priced", usage=usage), latency_s=0.25)
    assert priced.cost == pytest.approx(1.0 + 1.0)
    assert priced.latency_s == 0.25
    local = ledger.record(role="r", action="a", response=LLMResponse(model="smollm2", usage=usage))
    assert local.cost == 0.0
    reported = ledger.record(role="r", action="a", response=LLMResponse(model="test", usage=usage, cost=0.5))
    assert reported.cost == 0.5
    assert ledger.total_cost == pytest.approx(2.5) and ledger.total_tokens == 4500
    spend = ledger.spend_by("model")
    assert (spend["priced"].calls, spend["priced"].tokens) == (1, 1500)


async def test_every_call_is_recorded_with_role_action_model_tokens_and_latency():
    team = Team()
    team.hire(chatters(fixed(10)))
    await team.run(n_round=2, idea="go", send_to="a")
    entries = team.cost_ledger.entries
    assert [(e.role, e.action, e.model, e.tokens) for e in entries] == [("a", "Chat", "m", 10), ("b", "Chat", "m", 10)]
    assert all(e.latency_s >= 0 for e in entries)


async def test_a_token_budget_stops_at_the_right_round_with_state_saved(tmp_path):
    team = Team(budget=Budget(max_tokens=35))
    team.hire(chatters(fixed(10)))
    path = tmp_path / "state.json"
    report = await team.run(n_round=20, idea="go", send_to="a", save_to=path)
    assert (report.stop_reason, report.rounds) == (StopReason.BUDGET, 4), "40 tokens after round 4 cross 35"
    assert report.detail == "run: 40 tokens reached the budget of 35"
    state = EnvironmentState.model_validate_json(path.read_text())
    assert len(state.ledger) == 4 and state.round == 4
    assert sum(r.buffer != [] for r in state.roles) == 1, "the next turn's news is saved, not lost"


async def test_a_role_budget_stops_the_run_and_names_the_role():
    team = Team(role_budgets={"b": Budget(max_cost=0.5)})
    team.hire(chatters(fixed(10, model="priced")))
    team.cost_ledger.prices["priced"] = Price(prompt=10.0, completion=10.0)  # 0.1 per call
    report = await team.run(n_round=50, idea="go", send_to="a")
    assert report.stop_reason is StopReason.BUDGET
    assert report.detail.startswith("role 'b': cost 0.5 reached the budget of 0.5")
    assert team.cost_ledger.spend_by("role")["b"].calls == 5


async def test_role_budgets_must_name_hired_roles():
    team = Team(role_budgets={"ghost": Budget(max_tokens=1)})
    with pytest.raises(UnknownRoleError, match=r"role_budgets name \['ghost'\]"):
        await team.run(n_round=1)


async def test_ledger_totals_equal_the_sum_of_calls_before_and_after_resume(tmp_path):
    team = Team(llm=TestLLM(cost_per_token=0.001))
    team.hire(
        [
            Role(name="a", actions=[Chat], watch=[UserRequirement, Chat], send_to="b"),
            Role(name="b", actions=[Chat], watch=[Chat], send_to="a"),
        ]
    )
    await team.run(n_round=3, idea="go", send_to="a", save_to=tmp_path / "s.json")
    before = team.cost_ledger
    assert before.total_cost == pytest.approx(sum(e.cost for e in before.entries))

    resumed = Team(llm=TestLLM(cost_per_token=0.001))
    resumed.hire(
        [
            Role(name="a", actions=[Chat], watch=[UserRequirement, Chat], send_to="b"),
            Role(name="b", actions=[Chat], watch=[Chat], send_to="a"),
        ]
    )
    resumed.env.load(tmp_path / "s.json")
    after = resumed.cost_ledger
    assert (after.total_cost, after.total_tokens, len(after.entries)) == (
        before.total_cost,
        before.total_tokens,
        len(before.entries),
    )
    await resumed.run(n_round=2)
    assert len(after.entries) == len(before.entries) + 2
    assert after.total_cost == pytest.approx(sum(e.cost for e in after.entries))
    assert after.total_tokens == sum(e.tokens for e in after.entries)


def test_dated_and_routed_model_names_take_their_family_price():
    ledger = CostLedger()
    mini, big = ledger.price_for("gpt-4o-mini"), ledger.price_for("gpt-4o")
    assert ledger.price_for("gpt-4o-mini-2024-07-18") == mini != big
    assert ledger.price_for("gpt-4o-2024-08-06") == big
    assert ledger.price_for("openai/gpt-4o-mini") == mini
    assert ledger.price_for("gpt-4omni") is None and ledger.price_for("gpt-5-nano") is None
    usage = Usage(prompt_tokens=1000, completion_tokens=1000)
    entry = ledger.record(role="r", action="a", response=LLMResponse(model="gpt-4o-mini-2024-07-18", usage=usage))
    assert entry.cost == pytest.approx(0.00015 + 0.0006)


async def test_a_money_budget_stops_a_dated_model_and_warns_once_for_an_unpriced_one():
    team = Team(budget=Budget(max_cost=0.03))
    team.hire(chatters(fixed(1000, model="gpt-4o-2024-08-06")))  # 0.998 * 0.0025 + 0.002 * 0.01 per call
    report = await team.run(n_round=50, idea="go", send_to="a")
    assert report.stop_reason is StopReason.BUDGET and report.rounds == 12

    unpriced = Team(budget=Budget(max_cost=1.0))
    unpriced.hire(chatters(fixed(10, model="my-own-model")))
    with pytest.warns(UserWarning, match="model 'my-own-model' has no price") as caught:
        await unpriced.run(n_round=4, idea="go", send_to="a")
    assert len([w for w in caught if "has no price" in str(w.message)]) == 1, "once, not once per round"

    given = Team(budget=Budget(max_cost=0.05), prices={"my-own-model": Price(prompt=1.0, completion=1.0)})
    given.hire(chatters(fixed(10, model="my-own-model")))
    assert (await given.run(n_round=50, idea="go", send_to="a")).stop_reason is StopReason.BUDGET
