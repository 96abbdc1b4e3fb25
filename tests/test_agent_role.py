"""Agents on the bus: an AgentRole among ordinary roles, its tool calls in the log and the graph."""

import json

import pytest
from pydantic import Field

from metaroles import Action, Environment, FunctionLLM, Message, Role, ScriptedLLM, Team
from metaroles.agents.agent import ToolCallAgent
from metaroles.agents.agent_role import AgentRole, PublishMessage
from metaroles.agents.sandbox import PythonExecute
from metaroles.agents.tool import BaseTool, Terminate
from metaroles.core.schema import AgentState, ChatRole
from metaroles.flow.graph import role_graph
from metaroles.llm.model_files import local_model_available
from metaroles.record.eventlog import read_events


class Coder(ToolCallAgent):
    """A tool agent class: its action id is the cause_by of what it publishes."""


class Review(Action):
    async def run(self, history):
        return f"reviewed: {history[-1].content}"


def coder(tmp_path, *answers, tools=None):
    llm = ScriptedLLM({"coder": {"think": list(answers)}})
    return Coder(name="coder", llm=llm, tools=tools or [PythonExecute(workdir=tmp_path / "work"), Terminate()])


COMPUTE = {"content": "computing", "tool_calls": [{"name": "python_execute", "arguments": {"code": "print(6 * 7)"}}]}
DONE = {"content": "The answer is 42.", "tool_calls": [{"name": "terminate", "arguments": {"status": "success"}}]}


async def test_an_agent_answers_on_the_bus_next_to_ordinary_roles(tmp_path):
    agent = coder(tmp_path, COMPUTE, DONE)
    role = AgentRole(agent, send_to="Reviewer")
    reviewer = Role(name="Reviewer", actions=[Review], watch=[Coder.action_id()], send_to="Human")
    human = Role(name="Human", watch=[Review])
    team = Team(llm=FunctionLLM(lambda request: "unused"))
    team.hire([role, reviewer, human])
    report = await team.run(4, idea="What is 6 * 7?", send_to="coder", events=tmp_path / "events.jsonl")
    history = team.env.history.storage
    answer = next(m for m in history if m.sent_from == "coder")
    assert answer.content == "The answer is 42." and answer.cause_by == Coder.action_id()
    assert answer.send_to == {"Reviewer"}
    assert history[-1].content == "reviewed: The answer is 42." and history[-1].sent_from == "Reviewer"
    assert agent.state is AgentState.FINISHED and report.stop_reason == "idle"
    tool_messages = [m for m in agent.messages if m.role is ChatRole.TOOL]
    assert tool_messages[0].content == "Observed output of cmd `python_execute` executed:\n42\n"
    events = read_events(tmp_path / "events.jsonl")
    calls = [e for e in events if e["kind"] == "tool_call"]
    results = [e for e in events if e["kind"] == "tool_result"]
    assert [(e["role"], e["tool"]) for e in calls] == [("coder", "python_execute"), ("coder", "terminate")]
    assert json.loads(calls[0]["arguments"]) == {"code": "print(6 * 7)"}
    assert [r["call_id"] for r in results] == [c["call_id"] for c in calls] and all(r["ok"] for r in results)
    graph = role_graph(events)
    assert graph.has_edge("coder", "tool:python_execute") and graph.has_edge("tool:python_execute", "coder")
    assert graph.number_of_edges("coder", "Reviewer") == 1


async def test_a_second_request_runs_the_agent_again_from_idle_with_its_chat(tmp_path):
    agent = coder(tmp_path, DONE, DONE)
    env = Environment()
    env.add_role(AgentRole(agent, send_to="nobody-yet"))
    env.add_role(Role(name="nobody-yet", watch=[Coder.action_id()]))
    for question in ("first?", "second?"):
        env.publish_message(Message(question, send_to="coder"))
        await env.run(1)
    assert agent.state is AgentState.FINISHED
    assert [m.content for m in agent.messages if m.role is ChatRole.USER and m.content.startswith("user:")] == [
        "user: first?",
        "user: second?",
    ]


async def test_the_bus_tool_publishes_to_named_roles_and_refuses_unknown_ones(tmp_path):
    tell = {"tool_calls": [{"name": "publish_message", "arguments": {"content": "heads up", "send_to": ["Reviewer"]}}]}
    wrong = {"tool_calls": [{"name": "publish_message", "arguments": {"content": "x", "send_to": ["Nobody"]}}]}
    publish = PublishMessage()
    agent = coder(tmp_path, tell, wrong, DONE, tools=[publish, Terminate()])
    role = AgentRole(agent, send_to="Reviewer")
    publish.attach(role)
    reviewer = Role(name="Reviewer", actions=[Review], watch=[Coder.action_id()])
    env = Environment()
    env.add_roles([role, reviewer])
    env.publish_message(Message("go", send_to="coder"))
    await env.run(1)
    sent = [m for m in env.history if m.sent_from == "coder"]
    assert [m.content for m in sent] == ["heads up", "The answer is 42."]
    assert all(m.cause_by == Coder.action_id() and m.send_to == {"Reviewer"} for m in sent)
    errors = [m.content for m in agent.messages if m.role is ChatRole.TOOL and m.content.startswith("Error")]
    assert errors == ["Error: no role named ['Nobody']; roles on the bus: ['Reviewer', 'coder']"]
    assert not env.dead_letters


class Multiply(BaseTool):
    name: str = "multiply"
    description: str = "Multiplies two small integers."
    parameters: dict = Field(
        default_factory=lambda: {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        }
    )

    async def execute(self, **arguments):
        return arguments["a"] * arguments["b"]


@pytest.mark.skipif(
    not local_model_available(), reason="needs metaroles[local] and the embedded models (make demo installs them)"
)
async def test_the_embedded_model_makes_a_real_tool_call_with_a_tight_schema():
    from metaroles.llm.local import LocalLLM

    llm = LocalLLM(max_tokens=48, temperature=0.0)
    agent = ToolCallAgent(name="calc", llm=llm, tools=[Multiply()], tool_choice="required", max_steps=1)
    await agent.run("Multiply 6 by 7 with the multiply tool.")
    (assistant,) = [m for m in agent.messages if m.tool_calls]
    (call,) = assistant.tool_calls
    arguments = json.loads(call.function.arguments)
    assert call.function.name == "multiply" and set(arguments) == {"a", "b"}
    assert all(isinstance(v, int) for v in arguments.values())
    (observation,) = [m for m in agent.messages if m.role is ChatRole.TOOL]
    assert observation.tool_call_id == call.id
    assert observation.content == f"Observed output of cmd `multiply` executed:\n{arguments['a'] * arguments['b']}"


async def test_the_agent_chat_is_checkpointed_and_comes_back_on_resume(tmp_path):
    def team_with(agent):
        team = Team()
        team.hire([AgentRole(agent, send_to="Reviewer"), Role(name="Reviewer", watch=[Coder.action_id()])])
        return team

    first = coder(tmp_path, COMPUTE, DONE)
    await team_with(first).run(1, idea="What is 6 * 7?", send_to="coder", checkpoints=tmp_path / "ck")
    again = coder(tmp_path, DONE)
    await team_with(again).resume(tmp_path / "ck", 1)
    assert [m.model_dump() for m in again.messages] == [m.model_dump() for m in first.messages]
    assert (again.state, again.current_step, again.call_ids) == (first.state, first.current_step, first.call_ids)
    record = json.loads((tmp_path / "ck" / "round-0001.json").read_text())
    assert "state_dict" in record["roles"]["coder"], "an agent's role is saved whole, not replayed"
