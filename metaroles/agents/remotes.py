"""What a run reaches outside its process: MCP servers' tools and A2A agents, started with it, on one cassette."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any

from metaroles.agents.a2a import A2AAgent, A2ARole
from metaroles.agents.mcp import MCPClient, MCPTool
from metaroles.core.exceptions import ConfigError

__all__ = ["Remotes"]


class Remotes:
    """A run's MCP client and its remote A2A agents: entered before the run (``async with``), left after it.

    The scenario's ``build`` gets the MCP client (``tools``); each agent joins the society as an
    :class:`~metaroles.agents.a2a.A2ARole` (:meth:`members`).
    """

    def __init__(self, *, mcp: MCPClient | None = None, agents: Sequence[A2AAgent] = ()) -> None:
        names = [agent.name for agent in agents]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ConfigError(f"A2A agent name(s) {twice} given twice; give each agent a name of its own")
        self.mcp, self.agents = mcp, list(agents)
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> Remotes:
        async with AsyncExitStack() as stack:
            if self.mcp is not None:
                await stack.enter_async_context(self.mcp)
            for agent in self.agents:
                await stack.enter_async_context(agent)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._stack.aclose()

    def tools_for(self, role: str) -> list[MCPTool]:
        """The MCP tools ``role`` calls (none without servers)."""
        return self.mcp.tools_for(role) if self.mcp is not None else []

    def members(self) -> list[A2ARole]:
        """The remote agents as members of the society."""
        return [A2ARole(agent) for agent in self.agents]
