"""A run's tools on the command line: MCP servers (``--mcp``) and who may call what (``--permit``).

``metaroles run assistant --mcp 'files=npx @modelcontextprotocol/server-filesystem /data'`` starts
the server with the run and gives the scenario its tools; ``--permit 'Assistant:files__write_*=ask'``
asks a person (on the terminal, or on the page with ``--watch``) before such a call. With
``--record CASSETTE`` every listing and call is recorded beside the cassette
(``CASSETTE.tools.jsonl``), and ``--replay CASSETTE`` answers them from it with no server started.
A YAML config says the same with ``mcp:`` (a list of servers) and ``permissions:``. The manifest
keeps the servers (never their ``env``) and the permissions, so ``resume`` starts them again.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from metaroles.core.exceptions import ConfigError

if TYPE_CHECKING:
    from metaroles.agents.mcp import MCPClient, MCPServer
    from metaroles.agents.permissions import Permissions
    from metaroles.llm.human import Desk

MCP_HELP = (
    "an MCP server whose tools the run's roles get: NAME=COMMAND (stdio) or NAME=URL (streamable HTTP); repeat for more"
)
PERMIT_HELP = "who may call which tool: ROLE:TOOL=allow|ask|deny (TOOL is server__tool; * and patterns match)"


def run_tools(
    given: list[str], permits: list[str], settings: dict[str, Any], *, record: Path | None, replay: Path | None,
    desk: Desk | None,
) -> tuple[MCPClient | None, dict[str, Any]]:  # fmt: skip
    """The run's MCP client (``None``: no server given) and what its manifest keeps of it.

    Raises:
        ConfigError: For a server or rule that is not one, ``--permit`` without a server, or a
            ``--replay`` cassette with no tool tape beside it.
    """
    from metaroles.agents.mcp import ToolTape, server_from, tape_beside
    from metaroles.agents.permissions import Permissions, permit_rule

    servers = [*_listed(settings.get("mcp")), *(server_from(text) for text in given)]
    if not servers and replay is not None and tape_beside(replay).is_file():  # replayed: the recorded servers
        servers = ToolTape(tape_beside(replay), "replay").servers()
    if not servers:
        if permits or settings.get("permissions"):
            raise ConfigError("--permit (permissions) needs --mcp: the permissions are for MCP servers' tools")
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
    cassette, mode = (record, "record") if record is not None else (replay, "replay")
    return client(servers, permissions, cassette, mode, desk), {"mcp": recorded}


def resumed_tools(manifest: dict[str, Any], desk: Desk | None) -> MCPClient | None:
    """The MCP client a resumed run goes on with: its manifest's servers, its tape answering what it holds."""
    from metaroles.agents.mcp import MCPServer
    from metaroles.agents.permissions import Permissions

    recorded = manifest.get("mcp")
    if not isinstance(recorded, dict):
        return None
    servers = [MCPServer.model_validate(server) for server in recorded.get("servers") or []]
    permissions = Permissions.model_validate(recorded.get("permissions") or {})
    cassette = manifest.get("cassette") or None
    replaying = str(manifest.get("llm") or "").startswith("replay:")
    return client(servers, permissions, Path(cassette) if cassette else None, "replay" if replaying else "resume", desk)


def client(
    servers: list[MCPServer], permissions: Permissions, cassette: Path | None, mode: str, desk: Desk | None
) -> MCPClient:
    """The client of ``servers``: its tape beside ``cassette`` (``record``, ``replay`` or ``resume`` it)."""
    from metaroles.agents.mcp import MCPClient, ToolTape, tape_beside
    from metaroles.agents.permissions import desk_asker
    from metaroles.llm.human import TerminalDesk

    tape = None
    if cassette is not None:
        tape = ToolTape(tape_beside(cassette), "append" if mode == "resume" else mode)  # type: ignore[arg-type]
    ask = desk_asker(desk or TerminalDesk()) if permissions.asks else None
    return MCPClient(servers, tape=tape, permissions=permissions, ask=ask)


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
