"""Tools: results, schema validation, collections, Terminate."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import Field

from metaroles.agents.tool import BaseTool, Terminate, ToolCollection, ToolFailure, ToolResult
from metaroles.core.exceptions import DuplicateToolError, ToolArgumentsInvalid, ToolError


class Add(BaseTool):
    name: str = "add"
    description: str = "Adds two integers."
    parameters: dict = Field(
        default_factory=lambda: {
            "type": "object",
            "properties": {
                "a": {"type": "integer"},
                "b": {"type": "integer", "default": 1},
                "mode": {"type": "string", "enum": ["plain", "loud"]},
            },
            "required": ["a"],
            "additionalProperties": False,
        }
    )

    async def execute(self, **arguments):
        total = arguments["a"] + arguments["b"]
        return f"{total}!" if arguments.get("mode") == "loud" else total


class Broken(BaseTool):
    name: str = "broken"
    description: str = "Always fails."

    async def execute(self, **arguments):
        raise ToolError("the disk is full")


def test_tool_result_bool_str_add_and_replace():
    assert not ToolResult() and ToolResult(output="x") and ToolResult(system="note")
    assert str(ToolResult(output=3)) == "3" and str(ToolResult(output="ok", error="bad")) == "Error: bad"
    combined = ToolResult(output="a", system="s") + ToolResult(output="b", error="e")
    assert (combined.output, combined.error, combined.system) == ("ab", "e", "s")
    with pytest.raises(ValueError, match="base64_image"):
        ToolResult(base64_image="x") + ToolResult(base64_image="y")
    failure = ToolFailure(error="no").replace(output="partial")
    assert isinstance(failure, ToolFailure) and (failure.output, failure.error) == ("partial", "no")


def test_to_param_is_the_openai_function_format():
    assert Add().to_param() == {
        "type": "function",
        "function": {"name": "add", "description": "Adds two integers.", "parameters": Add().parameters},
    }


async def test_arguments_are_validated_before_execution_with_defaults_filled():
    assert await Add()(a=2) == 3
    assert await Add()(a=2, b=5, mode="loud") == "7!"
    with pytest.raises(ToolArgumentsInvalid, match=r"tool 'add' needs \['a'\]"):
        await Add()(b=1)
    with pytest.raises(ToolArgumentsInvalid, match=r"argument 'a'='2' must be of JSON type integer"):
        await Add()(a="2")
    with pytest.raises(ToolArgumentsInvalid, match=r"argument 'a'=True must be of JSON type integer"):
        await Add()(a=True)
    with pytest.raises(ToolArgumentsInvalid, match=r"must be one of \['plain', 'loud'\]"):
        await Add()(a=1, mode="shout")
    with pytest.raises(ToolArgumentsInvalid, match=r"\['c'\] are not among them"):
        await Add()(a=1, c=2)


@given(st.dictionaries(st.sampled_from(["a", "b", "mode", "c"]), st.one_of(st.integers(), st.text(), st.booleans())))
def test_validation_accepts_exactly_what_the_schema_allows(arguments):
    valid = (
        "a" in arguments
        and set(arguments) <= {"a", "b", "mode"}
        and all(
            isinstance(arguments[k], int) and not isinstance(arguments[k], bool) for k in ("a", "b") if k in arguments
        )
        and arguments.get("mode", "plain") in ("plain", "loud")
    )
    try:
        checked = Add().validate_arguments(arguments)
    except ToolArgumentsInvalid:
        assert not valid
    else:
        assert valid and checked["b"] == arguments.get("b", 1)


async def test_a_collection_refuses_duplicates_and_turns_failures_into_observations():
    tools = ToolCollection(Add(), Terminate())
    assert [t.name for t in tools] == ["add", "terminate"] and len(tools.to_params()) == 2
    with pytest.raises(DuplicateToolError, match=r"\['add'\] already taken"):
        tools.add_tool(Add())
    with pytest.raises(DuplicateToolError):
        ToolCollection().add_tools(Broken(), Broken())
    assert len(tools) == 2, "nothing was added by the refused calls"
    assert (await tools.execute(name="add", tool_input={"a": 1})).output == 2
    unknown = await tools.execute(name="nope")
    assert isinstance(unknown, ToolFailure) and "'nope' is unknown; available: ['add', 'terminate']" in unknown.error
    bad = await tools.execute(name="add", tool_input={})
    assert isinstance(bad, ToolFailure) and "needs ['a']" in bad.error
    tools.add_tool(Broken())
    assert (await tools.execute(name="broken")).error == "the disk is full"


async def test_terminate_reports_its_status():
    result = await ToolCollection(Terminate()).execute(name="terminate", tool_input={"status": "success"})
    assert result.output == "The interaction has been completed with status: success"


STEP = {
    "type": "object",
    "properties": {"title": {"type": "string", "minLength": 1}, "due": {"type": "string", "format": "date"}},
    "required": ["title"],
}
OWNER = {"type": "object", "properties": {"email": {"type": "string", "pattern": "^[^@]+@[^@]+$"}}}


class Plan(BaseTool):
    name: str = "plan"
    description: str = "Make a plan."
    parameters: dict = Field(
        default_factory=lambda: {
            "type": "object",
            "properties": {"steps": {"type": "array", "minItems": 1, "items": STEP}, "owner": OWNER},
            "required": ["steps"],
        }
    )

    async def execute(self, **arguments):
        return len(arguments["steps"])


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        ({"steps": []}, "argument 'steps'=[]: [] should be non-empty"),
        ({"steps": [{"title": ""}]}, "argument 'steps[0].title'=''"),
        ({"steps": [{"title": "a"}, {"due": "2026-01-01"}]}, "argument 'steps[1]'="),
        ({"steps": [{"title": "a", "due": "next week"}]}, "'next week' is not a 'date'"),
        ({"steps": [{"title": 3}]}, "argument 'steps[0].title'=3 must be of JSON type string"),
        ({"steps": [{"title": "a"}], "owner": {"email": "nobody"}}, "argument 'owner.email'='nobody'"),
    ],
)
async def test_nested_objects_arrays_and_formats_are_validated_by_the_whole_schema(arguments, said):
    with pytest.raises(ToolArgumentsInvalid, match=re.escape(said)):
        await Plan()(**arguments)
    assert await Plan()(steps=[{"title": "a", "due": "2026-01-01"}], owner={"email": "a@b"}) == 1


async def test_tool_arguments_are_read_as_leniently_as_structured_answers():
    from metaroles.llm.protocol import parse_json

    assert parse_json('{"code": "print(1)\nprint(2)"}') == {"code": "print(1)\nprint(2)"}, "a raw newline"
    assert parse_json("```json\n{'a': True}\n```") == {"a": True}
