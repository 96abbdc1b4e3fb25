"""Agents on the bus: any tool-calling agent as a Role, and a tool to publish messages.

``AgentRole(agent, watch=[...])``: the role's news become the agent's request; the agent runs
(from IDLE each turn, keeping its chat); its final answer is published with ``cause_by`` set to
the agent's action id. Each tool call and tool result goes into the round's record (its steps), so the run's
event log has ``tool_call``/``tool_result`` events and the flow graph shows the tools.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import Field

from metaroles.agents.agent import ToolCallAgent
from metaroles.agents.tool import BaseTool, ToolResult
from metaroles.bus.action import Action, ActionResult
from metaroles.bus.role import Role
from metaroles.core.exceptions import ToolError
from metaroles.core.schema import MESSAGE_ROUTE_TO_ALL, AgentState
from metaroles.messages.message import Message

_RUN_ACTIONS: dict[str, type[RunAgent]] = {}


class RunAgent(Action):
    """Runs a role's agent on its news; the agent's final answer is the result."""

    def __init__(self, agent: ToolCallAgent) -> None:
        """Wrap ``agent``."""
        super().__init__(name=type(agent).__name__, llm=agent.llm)
        self.agent = agent
        self.owner: Role | None = None

    async def run(self, history: Sequence[Message]) -> ActionResult:
        """Give the owner's news (else the newest message) to the agent as its request; return its answer."""
        news = list(self.owner.rc.news) if self.owner is not None else []
        news = news or list(history[-1:])
        request = "\n".join(f"{m.sent_from or 'user'}: {m.content}" for m in news) or None
        agent = self.agent
        if agent.state is not AgentState.IDLE:
            agent.reset()
        await agent.run(request)
        return agent.final_answer() or "(no answer)"


def _run_action_class(agent: ToolCallAgent) -> type[RunAgent]:
    """A RunAgent subclass whose action id is the agent's, so ``cause_by`` names the agent."""
    agent_id = type(agent).action_id()
    found = _RUN_ACTIONS.get(agent_id)
    if found is None:
        found = type(f"Run{type(agent).__name__}", (RunAgent,), {"__module__": __name__})
        found.cause_by = agent_id
        _RUN_ACTIONS[agent_id] = found
    return found


class AgentRole(Role):
    """A tool-calling agent sitting on the bus as a role.

    Args:
        agent: The agent (its name is the role's name unless ``name`` is given).
        watch: Actions whose messages are the agent's requests (default: the user's requirement).
        send_to: Where its answers go (default: everyone).
        name: The role's name.
    """

    def __init__(
        self,
        agent: ToolCallAgent,
        *,
        watch: Iterable[Any] | None = None,
        send_to: Any = None,
        name: str | None = None,
    ) -> None:
        """Wrap ``agent``; its tool calls are reported into the round's record (its steps)."""
        action = _run_action_class(agent)(agent)
        super().__init__(
            name=name or agent.name,
            actions=[action],
            watch=watch,
            send_to=send_to if send_to is not None else MESSAGE_ROUTE_TO_ALL,
        )
        self.agent = agent
        action.owner = self
        agent.on_event = self._on_agent_event
        self._own_ledger = agent.ledger is not None  # else the agent's calls go to the run's ledger once it joins

    def attach(self, env: Any, index: int, *, ids: Any = None) -> None:
        """Join ``env`` (see :meth:`Role.attach`); the agent's model calls are accounted in its ledger."""
        super().attach(env, index, ids=ids)
        if not self._own_ledger:
            self.agent.ledger = self.ledger

    @property
    def action_id(self) -> str:
        """The ``cause_by`` of this role's answers (watch it to hear the agent)."""
        return type(self.agent).action_id()

    def extra_state(self) -> dict[str, Any] | None:
        """The agent's state, step, chat and used call ids: saved with the role, restored on resume."""
        agent = self.agent
        return {
            "state": agent.state.value,
            "current_step": agent.current_step,
            "stop_reason": agent.stop_reason,
            "next_step_prompt": agent.next_step_prompt,
            "messages": [m.model_dump(mode="json") for m in agent.messages],
            "call_ids": sorted(agent.call_ids),
        }

    def load_extra_state(self, data: dict[str, Any]) -> None:
        """Restore the agent saved by :meth:`extra_state`."""
        agent = self.agent
        agent.state = AgentState(data["state"])
        agent.current_step = data["current_step"]
        agent.stop_reason = data["stop_reason"]
        agent.next_step_prompt = data["next_step_prompt"]
        agent.messages = [Message.model_validate(m) for m in data["messages"]]
        agent.call_ids = set(data["call_ids"])

    def _on_agent_event(self, kind: str, fields: dict[str, Any]) -> None:
        env = self.rc.env
        if env is not None and env.steps is not None:
            env.steps.add(kind, self.name, fields)
        observer = getattr(env, "observer", None)
        if observer is not None:  # telemetry: an execute_tool span per call
            observer.agent_event(self, kind, fields)


class PublishMessage(BaseTool):
    """Lets an agent publish a message to named roles on the bus (a tool for an AgentRole's agent).

    Args:
        role: The AgentRole whose agent uses it (set with :meth:`attach`, or at construction).
    """

    name: str = "publish_message"
    description: str = "Sends a message to other roles on the bus, by name."
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {
            "type": "object",
            "properties": {
                "content": {"type": "string", "description": "The message."},
                "send_to": {"type": "array", "items": {"type": "string"}, "description": "Names of the recipients."},
            },
            "required": ["content", "send_to"],
        }
    )
    role: Any = None

    def attach(self, role: AgentRole) -> PublishMessage:
        """Publish as ``role``."""
        self.role = role
        return self

    async def execute(self, **arguments: Any) -> ToolResult:
        """Publish; unknown recipients are refused (the message would reach no one).

        Raises:
            ToolError: If the tool is not attached to a role on a bus, or a recipient is unknown.
        """
        role = self.role
        env = role.rc.env if isinstance(role, Role) else None
        if env is None:
            raise ToolError("publish_message is not attached to a role on a bus; call attach(role) first")
        recipients = [str(r) for r in arguments["send_to"]]
        unknown = sorted(set(recipients) - set(env.roles) - {MESSAGE_ROUTE_TO_ALL})
        if unknown or not recipients:
            raise ToolError(f"no role named {unknown or recipients}; roles on the bus: {sorted(env.roles)}")
        message = Message(
            arguments["content"], sent_from=role.name, send_to=set(recipients), cause_by=role.agent.action_id()
        )
        role.publish_message(message)
        return ToolResult(output=f"sent to {', '.join(sorted(recipients))}")
