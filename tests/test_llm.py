import json
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from metaroles import (
    ConfigError,
    CostLedger,
    FunctionLLM,
    LLMRequest,
    LLMResponse,
    ScriptedLLM,
    ScriptExhausted,
    TestLLM,
    resolve_llm,
)
from metaroles.llm.protocol import extract_json, parse_output


class Inner(BaseModel):
    name: str
    weight: float = Field(ge=0, le=5)


class Report(BaseModel):
    title: str = Field(min_length=3, max_length=20)
    score: int = Field(ge=1, le=10)
    tags: list[str] = Field(min_length=1)
    mood: Literal["calm", "angry"]
    parts: list[Inner]
    note: str | None = None
    flag: bool


def req(text: str = "hello", **kw: object) -> LLMRequest:
    return LLMRequest(messages=[{"role": "user", "content": text}], **kw)  # type: ignore[arg-type]


async def test_test_llm_is_deterministic_per_seed_and_request():
    a = await TestLLM(seed=1).complete(req("What about trams?", role="r", action="a"))
    b = await TestLLM(seed=1).complete(req("What about trams?", role="r", action="a"))
    c = await TestLLM(seed=2).complete(req("What about trams?", role="r", action="a"))
    assert a.text == b.text
    assert a.text != c.text
    assert a.usage.total_tokens > 0 and a.model == "test"


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), prompt=st.text(max_size=50))
def test_test_llm_answers_a_schema_with_valid_data(seed: int, prompt: str) -> None:
    import anyio

    request = req(prompt, output_schema=Report.model_json_schema())
    response = anyio.run(TestLLM(seed).complete, request)
    report = Report.model_validate_json(response.text)
    assert 1 <= report.score <= 10


async def test_test_llm_costs_when_priced():
    response = await TestLLM(cost_per_token=0.5).complete(req("x" * 40))
    assert response.cost == pytest.approx(0.5 * response.usage.total_tokens)


async def test_function_llm_sync_and_async():
    sync = FunctionLLM(lambda r: f"echo {r.messages[-1]['content']}")
    assert (await sync.complete(req("hi"))).text == "echo hi"

    async def handler(r: LLMRequest) -> LLMResponse:
        return LLMResponse(text="custom", model="mine")

    response = await FunctionLLM(handler).complete(req())
    assert (response.text, response.model) == ("custom", "mine")


async def test_scripted_llm_answers_per_role_and_action_and_records_calls():
    llm = ScriptedLLM({"alice": {"Speak": ["one", "two"]}, "*": {"Judge": [{"winner": "pro"}]}})
    assert (await llm.complete(req(role="alice", action="Speak"))).text == "one"
    assert (await llm.complete(req(role="bob", action="Judge"))).text == json.dumps({"winner": "pro"})
    assert (await llm.complete(req(role="alice", action="Speak"))).text == "two"
    assert [(c.role, c.action, c.number, c.response) for c in llm.calls] == [
        ("alice", "Speak", 1, "one"),
        ("bob", "Judge", 1, '{"winner": "pro"}'),
        ("alice", "Speak", 2, "two"),
    ]


async def test_scripted_llm_exhaustion_names_role_action_and_call_number():
    llm = ScriptedLLM({"alice": {"Speak": ["only"]}})
    await llm.complete(req(role="alice", action="Speak"))
    with pytest.raises(ScriptExhausted, match=r"role 'alice', action 'Speak', call #2 \(1 scripted\)"):
        await llm.complete(req(role="alice", action="Speak"))
    with pytest.raises(ScriptExhausted, match=r"role 'bob', action 'Speak', call #1 \(0 scripted\)"):
        await llm.complete(req(role="bob", action="Speak"))


def test_scripted_llm_file_that_does_not_parse_is_a_clear_error(tmp_path):
    bad = tmp_path / "script.json"
    bad.write_text('{"alice": {"Speak": ["one",]}}')
    with pytest.raises(ConfigError, match=r"script.json' does not parse as JSON: .* line 1 column"):
        ScriptedLLM.from_file(bad)
    with pytest.raises(ConfigError, match="must be a list of responses"):
        ScriptedLLM({"alice": {"Speak": "one"}})
    with pytest.raises(ConfigError, match="cannot read scripted LLM file"):
        ScriptedLLM.from_file(tmp_path / "missing.json")


async def test_resolve_llm_by_name(tmp_path):
    assert isinstance(resolve_llm("test"), TestLLM)
    assert resolve_llm("test:7").seed == 7  # type: ignore[attr-defined]
    script = tmp_path / "s.json"
    script.write_text('{"*": {"*": ["scripted answer"]}}')
    llm = resolve_llm(f"scripted:{script}")
    assert (await llm.complete(req())).text == "scripted answer"
    mine = TestLLM()
    assert resolve_llm(mine) is mine
    with pytest.raises(ConfigError, match=r"--llm 'gpt-9' is not a provider; .*--llm openai --model gpt-9"):
        resolve_llm("gpt-9")
    with pytest.raises(ConfigError, match=r"llm='tset' is not a known model; did you mean 'test'"):
        resolve_llm("tset")
    with pytest.raises(ConfigError, match="seed after 'test:' must be an integer"):
        resolve_llm("test:abc")


def test_ledger_accounts_per_role_and_round_trips():
    ledger = CostLedger()
    ledger.record(role="a", action="x", response=LLMResponse(text="", model="m", cost=1.5))
    ledger.record(role="b", action="x", response=LLMResponse(text="", model="m", cost=0.5))
    assert ledger.total_cost == 2.0
    assert ledger.cost_by("role") == {"a": 1.5, "b": 0.5}
    assert CostLedger.load(ledger.dump()).total_cost == 2.0


def test_tolerant_json_extraction():
    assert json.loads(extract_json('Sure!\n```json\n{"a": 1}\n```\nDone.')) == {"a": 1}
    assert json.loads(extract_json('Answer: {"a": {"b": 2}} hope it helps')) == {"a": {"b": 2}}
    with pytest.raises(ValueError, match="invalid JSON"):
        parse_output("no json here", Inner)


async def test_a_scripted_answer_with_when_answers_only_the_prompts_that_hold_its_text() -> None:
    from metaroles.llm.offline import ScriptedLLM, ScriptExhausted
    from metaroles.llm.protocol import LLMRequest

    llm = ScriptedLLM({"*": {"Code": [{"when": "roman(", "answer": "R"}, {"when": "leap(", "answer": "L"}, "plain"]}})

    def asked(text: str) -> LLMRequest:
        return LLMRequest(messages=[{"role": "user", "content": text}], role="Engineer", action="Code")

    assert (await llm.complete(asked("write leap(year)"))).text == "L"
    assert (await llm.complete(asked("write roman(n)"))).text == "R"
    assert (await llm.complete(asked("write roman(n)"))).text == "plain", "each answer once, then the plain one"
    with pytest.raises(ScriptExhausted, match="call #4"):
        await llm.complete(asked("write leap(year)"))
