"""A run's tools and remote agents on the command line: MCP servers, permissions, A2A agents.

``metaroles run assistant --mcp 'files=npx @modelcontextprotocol/server-filesystem /data'`` starts
the server with the run and gives the scenario its tools; ``--permit 'Assistant:files__write_*=ask'``
asks a person (on the terminal, or on the page with ``--watch``) before such a call. With
``--record CASSETTE`` every listing and call is recorded beside the cassette
(``CASSETTE.tools.jsonl``), and ``--replay CASSETTE`` answers them from it with no server started.
``--a2a 'Critic=http://127.0.0.1:9000'`` seats a remote A2A agent as the member ``Critic`` (it
hears the run's idea and answers everyone); its exchanges go on the same cassette. A YAML config says
the same with ``mcp:`` (a list of servers), ``permissions:`` and ``a2a:``. The manifest keeps the
servers (never their ``env``), the permissions and the agents, so ``resume`` reaches them again.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from metaroles.core.exceptions import ConfigError
from metaroles.core.text import redacted

if TYPE_CHECKING:
    from metaroles.agents.mcp import MCPServer
    from metaroles.agents.permissions import Permissions
    from metaroles.agents.remotes import Remotes
    from metaroles.llm.human import Desk

MCP_HELP = (
    "an MCP server whose tools the run's roles get: NAME=COMMAND (stdio) or NAME=URL (streamable HTTP); repeat for more"
)
PERMIT_HELP = "who may call which tool: ROLE:TOOL=allow|ask|deny (TOOL is server__tool; * and patterns match)"
A2A_HELP = "a remote A2A agent that joins the society: NAME=URL (it hears the idea, answers everyone); repeat"


def run_tools(
    given: list[str], permits: list[str], agents: list[str], settings: dict[str, Any], *, record: Path | None,
    replay: Path | None, desk: Desk | None,
) -> tuple[Remotes | None, dict[str, Any]]:  # fmt: skip
    """The run's MCP servers and A2A agents (``None``: none given) and what its manifest keeps of them.

    A replay given none takes those its cassette was recorded with.

    Raises:
        ConfigError: For a server, rule or agent that is not one, or ``--permit`` without a server.
    """
    from metaroles.agents.mcp import ToolCassette, server_from, tool_cassette_beside
    from metaroles.agents.permissions import Permissions, permit_rule

    servers = [*_listed(settings.get("mcp")), *(server_from(text) for text in given)]
    remote = dict(_agent(text) for text in [*_strings(settings.get("a2a"), "a2a"), *agents])
    if not (servers or remote) and replay is not None and tool_cassette_beside(replay).is_file():  # what was recorded
        tools = ToolCassette(tool_cassette_beside(replay), "replay")
        servers, remote = tools.servers(), tools.agents()
    if not servers and (permits or settings.get("permissions")):
        raise ConfigError("--permit (permissions) needs --mcp: the permissions are for MCP servers' tools")
    if not (servers or remote):
        return None, {}
    try:
        permissions = Permissions.model_validate(settings.get("permissions") or {})
    except ValidationError as exc:
        where = ".".join(str(part) for part in exc.errors()[0]["loc"])
        raise ConfigError(
            f"permissions: {where}: {exc.errors()[0]['msg']}; e.g. rules: {{Assistant: {{files__write_file: ask}}}}"
        ) from None
    for text in permits:
        permissions = permissions.with_rule(*permit_rule(text))
    recorded = {"servers": [server.recorded() for server in servers], "permissions": permissions.model_dump()}
    named = {name: redacted(url) for name, url in remote.items()}  # credentials never reach the manifest
    kept = ({"mcp": recorded} if servers else {}) | ({"a2a": named} if remote else {})
    cassette, mode = (record, "record") if record is not None else (replay, "replay")
    return remotes(servers, permissions, remote, cassette, mode, desk), kept


def resumed_tools(manifest: dict[str, Any], desk: Desk | None, *, trust: bool) -> Remotes | None:
    """What a resumed run reaches again: its manifest's servers and agents, its cassette answering what it holds.

    A run directory may come from someone else: the commands its manifest names run only with ``trust``.

    Raises:
        ConfigError: For server commands to start without ``trust``, naming them.
    """
    from metaroles.agents.mcp import MCPServer
    from metaroles.agents.permissions import Permissions

    recorded: dict[str, Any] = manifest["mcp"] if isinstance(manifest.get("mcp"), dict) else {}
    agents: dict[str, str] = manifest["a2a"] if isinstance(manifest.get("a2a"), dict) else {}
    if not (recorded or agents):
        return None
    servers = [MCPServer.model_validate(server) for server in recorded.get("servers") or []]
    permissions = Permissions.model_validate(recorded.get("permissions") or {})
    cassette = manifest.get("cassette") or None
    mode = "replay" if str(manifest.get("llm") or "").startswith("replay:") else "resume"
    commands = [" ".join(server.command) for server in servers if server.command]
    if commands and mode != "replay" and not trust:
        raise ConfigError(
            f"this run starts the MCP servers its manifest names ({'; '.join(commands)[:300]}): commands run code; "
            "pass --trust to start them"
        )
    return remotes(servers, permissions, agents, Path(cassette) if cassette else None, mode, desk)


def remotes(
    servers: list[MCPServer], permissions: Permissions, agents: dict[str, str], cassette: Path | None, mode: str,
    desk: Desk | None,
) -> Remotes:  # fmt: skip
    """The servers' client and the agents, on one tool cassette beside ``cassette`` (to record, replay or resume)."""
    from metaroles.agents.a2a import A2AAgent
    from metaroles.agents.mcp import MCPClient, ToolCassette, tool_cassette_beside
    from metaroles.agents.permissions import desk_asker
    from metaroles.agents.remotes import Remotes
    from metaroles.llm.human import TerminalDesk

    tools = None
    if cassette is not None:
        tools = ToolCassette(tool_cassette_beside(cassette), "append" if mode == "resume" else mode)  # type: ignore[arg-type]
    ask = desk_asker(desk or TerminalDesk()) if permissions.asks else None
    client = MCPClient(servers, cassette=tools, permissions=permissions, ask=ask) if servers else None
    return Remotes(mcp=client, agents=[A2AAgent(name, url, cassette=tools) for name, url in agents.items()])


def _agent(text: str) -> tuple[str, str]:
    """``NAME=URL`` (``--a2a``) as its two parts.

    Raises:
        ConfigError: Naming the text and the form it takes.
    """
    name, _, url = text.partition("=")
    if not (name.isidentifier() and url.startswith(("http://", "https://"))):
        raise ConfigError(f"--a2a {text!r} is not NAME=URL; e.g. --a2a 'Critic=http://127.0.0.1:9000'")
    return name, url


def _strings(given: Any, key: str) -> list[str]:
    if given is None:
        return []
    if not isinstance(given, list) or not all(isinstance(item, str) for item in given):
        raise ConfigError(f"{key}: {given!r} must be a list of NAME=URL, e.g. [Critic=http://127.0.0.1:9000]")
    return given


def _listed(given: Any) -> list[MCPServer]:
    """A YAML config's ``mcp:``: a list of servers, each ``NAME=COMMAND``/``NAME=URL`` or a mapping of its fields."""
    from metaroles.agents.mcp import MCPServer, server_from

    if given is None:
        return []
    if not isinstance(given, list):
        raise ConfigError(f"mcp: {given!r} must be a list of servers, e.g. [files=npx mcp-server-filesystem /data]")
    servers = []
    for item in given:
        if isinstance(item, str):
            servers.append(server_from(item))
            continue
        try:
            servers.append(MCPServer.model_validate(item))
        except ValidationError as exc:
            why = exc.errors()[0]["msg"]
            raise ConfigError(f"mcp: {item!r} is not a server ({why}); give its name and command, or its url") from None
    return servers
