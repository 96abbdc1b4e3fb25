"""One agent does a task with the run's tools: the tools of the MCP servers the run was given (``--mcp``).

OpenManus' Manus on the bus: a tool-calling agent takes the idea as its task, calls the servers'
tools (``server__tool``) under the run's permissions (``--permit``) until it calls ``terminate``,
and publishes its answer. ``metaroles run assistant --mcp 'files=npx @modelcontextprotocol/server-filesystem
/data' --idea 'Summarise /data/notes.txt into /data/summary.txt'``. With ``--record`` its tool calls are
recorded beside the model's, and ``--replay`` runs it again with no server.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from metaroles import LLM, RoleName, ScenarioPlan, Team
from metaroles.agents.agent import ToolCallAgent
from metaroles.agents.agent_role import AgentRole
from metaroles.agents.tool import Terminate

SYSTEM = (
    "You are {name}, an assistant that does the user's task with the tools you are given. Call one tool at a "
    "time, read what it returns, and call terminate once the task is done (or cannot be done)."
)


class Config(BaseModel):
    """Options of the assistant."""

    name: RoleName = "Assistant"
    """The agent's name (the role the permissions name)."""
    max_steps: int = Field(default=20, ge=1, le=500)
    """Tool calls it may make for its task."""


def build(config: Config, llm: LLM, *, tools: Any = None) -> ScenarioPlan:
    """The agent with the run's tools (``tools``: the run's MCP client; none, and it has only ``terminate``)."""
    own = tools.tools_for(config.name) if tools is not None else []
    agent = ToolCallAgent(
        name=config.name,
        llm=llm,
        tools=[*own, Terminate()],
        system_prompt=SYSTEM.format(name=config.name),
        max_steps=config.max_steps,
    )
    team = Team(llm=llm)
    team.hire([AgentRole(agent)])
    return ScenarioPlan(team=team, idea="List the tools you have.", send_to=config.name, n_round=2)
