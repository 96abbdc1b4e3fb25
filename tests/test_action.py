import pytest
from pydantic import BaseModel

from metaroles import (
    Action,
    ChatRole,
    FunctionLLM,
    LLMOutputInvalid,
    LLMRequest,
    Message,
    Role,
    ScriptedLLM,
    TestLLM,
    UserError,
)


class Score(BaseModel):
    value: int
    why: str


class Rate(Action):
    instruction = "Rate the last message."
    output_model = Score


class Summarise(Action):
    name = "summarise"
    instruction = "Summarise."


async def test_action_name_defaults():
    assert Rate().name == "Rate"
    assert Summarise().name == "summarise"
    assert Summarise(name="other").name == "other"
    assert Rate.action_id() == "tests.test_action.Rate"


async def test_aask_sends_the_prompt_and_tags_role_and_action():
    seen: list[LLMRequest] = []

    def handler(request: LLMRequest) -> str:
        seen.append(request)
        return "short"

    role = Role(name="writer", actions=[Summarise], llm=FunctionLLM(handler))
    result = await role.actions[0].run([Message("a long text", sent_from="user")])
    assert result == "short"
    assert seen[0].role == "writer" and seen[0].action == "summarise"
    prompt = seen[0].messages[-1]["content"]
    assert "Summarise." in prompt and "user: a long text" in prompt


async def test_structured_output_becomes_instruct_content():
    role = Role(name="critic", actions=[Rate], llm=TestLLM(seed=3))
    response = await role.run("rate this please")
    assert response is not None
    assert isinstance(response.instruct_content, Score)
    assert response.role is ChatRole.ASSISTANT
    assert response.cause_by == Rate.action_id()
    assert Score.model_validate_json(response.content) == response.instruct_content
    back = Message.load(response.dump())
    assert back.instruct_content == response.instruct_content


async def test_invalid_structured_output_is_retried_with_the_error_fed_back():
    llm = ScriptedLLM({"*": {"Rate": ["not json", '{"value": "x"}', '```json\n{"value": 7, "why": "fine"}\n```']}})
    role = Role(name="critic", actions=[Rate], llm=llm)
    score = await role.actions[0].aask("rate", output_model=Score)
    assert score == Score(value=7, why="fine")
    assert len(llm.calls) == 3
    last_prompt = llm.calls[2].request.messages[-1]["content"]
    assert "That answer is invalid" in last_prompt


async def test_structured_output_fails_with_a_typed_error_carrying_the_raw_text():
    llm = ScriptedLLM({"*": {"*": ["nope", "still nope", "never"]}})
    action = Rate(llm=llm)
    with pytest.raises(LLMOutputInvalid, match="did not validate as Score after 3 attempts") as info:
        await action.aask("rate", output_model=Score)
    assert info.value.raw == "never"


async def test_action_without_llm_says_where_to_pass_one():
    with pytest.raises(UserError, match=r"action 'summarise' of role 'lonely' has no LLM; pass llm="):
        await Role(name="lonely", actions=[Summarise]).run("hello")


def test_output_model_must_be_a_pydantic_class():
    with pytest.raises(UserError, match=r"output_model=.* is not a pydantic model class"):
        Action(output_model=dict)  # type: ignore[arg-type]


async def test_single_quoted_python_style_answers_are_accepted():
    llm = ScriptedLLM({"*": {"*": ["Sure! {'value': 3, 'why': 'short'} hope that helps"]}})
    assert await Rate(llm=llm).aask("rate", output_model=Score) == Score(value=3, why="short")


async def test_an_answer_that_never_validates_is_published_as_a_failure_and_the_run_goes_on():
    from metaroles import Environment

    broken = ScriptedLLM({"critic": {"Rate": ["nope", "still nope", "{'value': 'x'}"]}, "*": {"*": ["fine"]}})
    env = Environment()
    critic = Role(name="critic", actions=[Rate], llm=broken)
    observer = Role(name="observer", actions=[Summarise], watch=[Rate], llm=broken)
    env.add_roles([critic, observer])
    env.publish_message(Message("rate this"))
    await env.run(2)
    failure = next(m for m in env.history if m.sent_from == "critic")
    assert failure.content.startswith("Rate failed: action 'Rate' of role 'critic'")
    assert failure.metadata["error"]["type"] == "LLMOutputInvalid"
    assert failure.metadata["error"]["raw"] == "{'value': 'x'}"
    assert failure.instruct_content is None
    assert [m.sent_from for m in env.history] == ["", "critic", "observer"], "the observer still acted"
    assert env.events == []


async def test_a_function_model_that_first_breaks_json_then_repairs_it():
    answers = iter(['{"value": 4, "why": "unterminated', '{"value": 4, "why": "fixed"}'])
    seen: list[LLMRequest] = []

    def model(request: LLMRequest) -> str:
        seen.append(request)
        return next(answers)

    role = Role(name="critic", actions=[Rate], llm=FunctionLLM(model))
    response = await role.run("rate this")
    assert response is not None and response.instruct_content == Score(value=4, why="fixed")
    assert len(seen) == 2 and "That answer is invalid" in seen[1].messages[-1]["content"]
    assert seen[0].output_schema == Score.model_json_schema()


def test_an_output_schema_is_made_once_per_class_and_handed_out_as_a_copy() -> None:
    """What a model is asked to fill is the class's own schema; a provider that edits its copy changes no other call."""
    from metaroles.bus.action import output_schema

    class Verdict(BaseModel):
        winner: str
        confidence: float

    first = output_schema(Verdict)
    assert first == Verdict.model_json_schema()
    first["properties"]["winner"]["type"] = "integer"
    first["additionalProperties"] = False
    assert output_schema(Verdict) == Verdict.model_json_schema(), "an edited copy does not reach the next call"
