"""Tool-calling agents driven by a ScriptedLLM: tool-choice modes, errors as observations, states."""

import warnings

import pytest
from pydantic import Field

from metaroles import ChatRole, CostLedger, Message, ScriptedLLM
from metaroles.agents.agent import ToolCallAgent
from metaroles.agents.tool import BaseTool, Terminate
from metaroles.core.exceptions import AgentStateError, InvalidValueError, ToolCallMissing
from metaroles.core.schema import AgentState, ToolChoice


class Add(BaseTool):
    name: str = "add"
    description: str = "Adds two integers."
    parameters: dict = Field(
        default_factory=lambda: {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        }
    )

    async def execute(self, **arguments):
        return arguments["a"] + arguments["b"]


class Explodes(BaseTool):
    name: str = "explodes"
    description: str = "Has a bug."

    async def execute(self, **arguments):
        raise RuntimeError("division by zero somewhere")


def call(name, arguments=None, id=None):
    entry = {"name": name, "arguments": {} if arguments is None else arguments}
    if id is not None:
        entry["id"] = id
    return entry


def agent(*answers, **options):
    llm = ScriptedLLM({"coder": {"think": list(answers)}})
    options.setdefault("tools", [Add(), Explodes(), Terminate()])
    return ToolCallAgent(name="coder", llm=llm, **options), llm


DONE = {"content": "done", "tool_calls": [call("terminate", {"status": "success"})]}


async def test_auto_calls_tools_then_terminate_finishes_and_memory_keeps_the_order():
    coder, llm = agent({"content": "adding", "tool_calls": [call("add", {"a": 2, "b": 3})]}, DONE)
    result = await coder.run("What is 2 + 3?")
    assert coder.state is AgentState.FINISHED and coder.stop_reason == "finished"
    assert "Observed output of cmd `add` executed:\n5" in result
    roles = [(m.role, m.name) for m in coder.messages]
    assert roles == [
        (ChatRole.USER, None),
        (ChatRole.USER, None),
        (ChatRole.ASSISTANT, None),
        (ChatRole.TOOL, "add"),
        (ChatRole.USER, None),
        (ChatRole.ASSISTANT, None),
        (ChatRole.TOOL, "terminate"),
    ]
    assistant, tool = coder.messages[2], coder.messages[3]
    assert tool.tool_call_id == assistant.tool_calls[0].id, "each tool message answers its call"
    first = llm.calls[0].request
    assert first.tool_choice == "auto" and [t["function"]["name"] for t in first.tools] == [
        "add",
        "explodes",
        "terminate",
    ]
    assert first.messages[0]["role"] == "system" and "coder" in first.messages[0]["content"]


async def test_auto_without_calls_answers_in_text_and_stops_thinking():
    coder, _ = agent("It is 5.", "", max_steps=2)
    result = await coder.run("2 + 3?")
    assert "Step 1: It is 5." in result and "Step 2: Thinking complete - no action needed" in result
    assert coder.stop_reason == "max_steps" and "terminated: reached max steps (2)" in result


async def test_none_ignores_tool_calls_with_a_warning_and_keeps_the_text():
    coder, llm = agent(
        {"content": "5", "tool_calls": [call("add", {"a": 2, "b": 3})]}, max_steps=1, tool_choice=ToolChoice.NONE
    )
    with pytest.warns(UserWarning, match=r"'coder' called \['add'\] under tool_choice=none; ignored"):
        result = await coder.run("2 + 3?")
    assert "Step 1: 5" in result and not any(m.role is ChatRole.TOOL for m in coder.messages)
    assert llm.calls[0].request.tool_choice == "none"


async def test_required_without_a_call_ends_the_run_in_error():
    coder, _ = agent("I would rather talk.", tool_choice="required")
    with pytest.raises(ToolCallMissing, match="tool_choice=required, but the model called no tool"):
        await coder.run("2 + 3?")
    assert coder.state is AgentState.ERROR, "ERROR stands after run() (OpenManus restores the old state)"
    with pytest.raises(AgentStateError, match="'coder' is ERROR; run\\(\\) starts only from IDLE"):
        await coder.run("again")
    coder.reset()
    assert coder.state is AgentState.IDLE and coder.current_step == 0


async def test_unknown_tools_broken_arguments_and_tool_bugs_are_observations_and_the_run_goes_on():
    coder, _ = agent(
        {"tool_calls": [call("subtract", {"a": 1})]},
        {"tool_calls": [{"name": "add", "arguments": '{"a": 1, "b": '}]},
        {"tool_calls": [call("add", {"a": "one", "b": 2})]},
        {"tool_calls": [call("explodes")]},
        DONE,
    )
    await coder.run("go")
    observations = [m.content for m in coder.messages if m.role is ChatRole.TOOL]
    assert observations[0].startswith("Error: Unknown tool 'subtract'; available: ['add', 'explodes', 'terminate']")
    assert observations[1].startswith("Error: Parsing arguments for 'add': invalid JSON")
    assert observations[2] == "Error: tool 'add': argument 'a'='one' must be of JSON type integer"
    assert observations[3] == "Error: Tool 'explodes' encountered a problem: RuntimeError: division by zero somewhere"
    assert coder.state is AgentState.FINISHED


async def test_max_observe_truncates_each_observation():
    coder, _ = agent({"tool_calls": [call("add", {"a": 20, "b": 22})]}, DONE, max_observe=12)
    await coder.run("go")
    assert next(m.content for m in coder.messages if m.role is ChatRole.TOOL) == "Observed out"


async def test_max_steps_ends_the_run_with_a_clear_result():
    coder, _ = agent(*[{"tool_calls": [call("add", {"a": i, "b": 1})]} for i in range(3)], max_steps=3)
    result = await coder.run("count")
    assert result.endswith("terminated: reached max steps (3)")
    assert coder.state is AgentState.FINISHED and coder.stop_reason == "max_steps" and coder.current_step == 3


async def test_a_stuck_agent_gets_the_change_of_strategy_prompt_once():
    same = {"content": "let me add", "tool_calls": [call("add", {"a": 1, "b": 1})]}
    coder, llm = agent(same, same, same, same, DONE, duplicate_threshold=2)
    await coder.run("go")
    prompts = [r.request.messages[-1]["content"] for r in llm.calls]
    assert "Observed duplicate responses" not in prompts[2]
    assert prompts[3].startswith("Observed duplicate responses"), "after the third identical answer"
    assert coder.next_step_prompt.count("Observed duplicate responses") == 1


async def test_tool_call_ids_are_unique_even_when_the_model_repeats_them():
    coder, _ = agent(
        {"tool_calls": [call("add", {"a": 1, "b": 1}, id="call_0"), call("add", {"a": 2, "b": 2}, id="call_0")]},
        {"tool_calls": [call("terminate", {"status": "success"}, id="call_0")]},
    )
    await coder.run("go")
    ids = [c.id for m in coder.messages for c in m.tool_calls or ()]
    assert len(ids) == len(set(ids)) == 3
    assert [m.tool_call_id for m in coder.messages if m.role is ChatRole.TOOL] == ids


async def test_the_window_never_starts_with_a_tool_message_whose_call_fell_out():
    coder, llm = agent({"tool_calls": [call("add", {"a": 1, "b": 1})]}, DONE, max_messages=3)
    await coder.run("go")
    second = llm.calls[1].request.messages
    assert second[1]["role"] != "tool", second
    assert all(
        m["role"] != "tool" or m["tool_call_id"] in {c["id"] for x in second for c in x.get("tool_calls", [])}
        for m in second
    )


async def test_each_agent_accounts_its_own_calls():
    ledger = CostLedger()
    coder, _ = agent(DONE, ledger=ledger)
    other = ToolCallAgent(name="other", llm=ScriptedLLM({"other": {"think": [DONE]}}), ledger=ledger)
    await coder.run("go")
    await other.run("go")
    assert [e.role for e in ledger.entries] == ["coder", "other"]


def test_update_memory_picks_the_factory_and_bad_states_are_refused():
    coder, _ = agent()
    coder.update_memory("user", "hi")
    coder.update_memory(ChatRole.TOOL, "5", name="add", tool_call_id="c1")
    coder.update_memory("assistant", "ok")
    assert [(m.role, m.tool_call_id) for m in coder.messages] == [
        (ChatRole.USER, None),
        (ChatRole.TOOL, "c1"),
        (ChatRole.ASSISTANT, None),
    ]
    with pytest.raises(InvalidValueError, match=r"needs name=\.\.\. and tool_call_id"):
        coder.update_memory("tool", "5")
    with pytest.raises(InvalidValueError):
        coder.update_memory("narrator", "x")
    with pytest.raises(InvalidValueError, match="tool_choice='sometimes'"):
        agent(tool_choice="sometimes")


async def test_state_context_validates_and_an_error_stands():
    coder, _ = agent()
    with pytest.raises(InvalidValueError, match="is not an AgentState"):
        async with coder.state_context("RUNNING"):
            pass
    with pytest.raises(KeyError):
        async with coder.state_context(AgentState.RUNNING):
            raise KeyError("x")
    assert coder.state is AgentState.ERROR
    assert isinstance(coder.messages, list) and not coder.messages
    coder.messages = [Message.user_message("restored")]
    assert coder.memory.messages[0].content == "restored"


async def test_a_run_in_which_the_model_called_no_tool_says_so_in_a_line():
    from metaroles.agents.agent import NoToolCall

    talker, _ = agent(*[{"content": "terminate"}] * 3, max_steps=3)  # "terminate" written, never called
    with pytest.warns(NoToolCall, match=r"agent 'coder': its model '.*' called no tool in 3 step\(s\)"):
        await talker.run("Sum the numbers.")
    caller, _ = agent(DONE, max_steps=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoToolCall)
        await caller.run("Stop.")
