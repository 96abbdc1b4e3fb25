"""Tools from MCP servers (the official ``mcp`` SDK), their calls recorded so a run replays without them.

An :class:`MCPServer` names a server and how to reach it: a command run over stdio, or a
streamable-HTTP URL. :class:`MCPClient` starts the servers with the run (an async context),
lists their tools and gives each as an :class:`MCPTool` — a :class:`~metaroles.agents.tool.BaseTool`
named ``server__tool`` whose parameters are the server's input schema — so a ``ToolCallAgent`` or
any role calls them as it calls its own. A result becomes an observation (:func:`observed`): its
text, its structured content as JSON, an image; an error the server reports, a malformed result
and a call that outlives its ``timeout`` are :class:`~metaroles.agents.tool.ToolFailure` results
the agent observes and goes on from. A server that dies mid-run stops the run with one line
(:class:`MCPServerGone`): the run is resumable.

With a :class:`ToolCassette` every listing and call is written down as it happens (``record``) and
answered from it (``replay``): a replayed run starts no server and gets the same answers, so its
run directory is the same. What a server was started with (``env``: tokens, keys) is never
written to the cassette.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import reprlib
import shlex
import shutil
import tempfile
import warnings
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from metaroles.agents.permissions import Asker, Permissions, decided
from metaroles.agents.tool import BaseTool, ToolFailure, ToolResult
from metaroles.core.exceptions import ConfigError, RunError, ToolError
from metaroles.core.files import append_durably
from metaroles.core.guard import kept_answer
from metaroles.core.text import jsonl_lines, redacted, scrubbed

if TYPE_CHECKING:
    from mcp import ClientSession

__all__ = [
    "MCPClient",
    "MCPServer",
    "MCPServerGone",
    "MCPTool",
    "MCPWarning",
    "ToolCassette",
    "observed",
    "renamed_tape",
    "server_from",
    "tool_cassette_beside",
    "tool_name",
]  # fmt: skip

CALL_SECONDS = 30.0
"""How long a tool call may take before it is an observation saying so (``MCPServer(timeout=...)``)."""


START_SECONDS = 60.0
"""How long a server has to start and answer the handshake (a Node server fetched by ``npx`` takes seconds)."""


class MCPWarning(UserWarning):
    """Something of an MCP server the run cannot use (a tool whose input schema no model could fill)."""


def _unusable(schema: Any) -> str | None:
    """Why a model could not be offered a tool with this input schema, or ``None``."""
    import jsonschema

    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        return f"its input schema must be a JSON object schema, not {reprlib.repr(schema)}"
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
        json.dumps(schema)  # what a model's request carries
    except jsonschema.SchemaError as exc:
        return f"its input schema is not a valid JSON schema ({exc.message[:200]})"
    except RecursionError:
        return "its input schema is nested too deeply to check or send"
    return None


READ_RESOURCE = "resources/read"
"""What an agent's ``server__read_resource`` calls (a server has it when it has resources): no tool's own name."""

GET_PROMPT = "prompts/get"
"""What a prompt's fetch is called and recorded as (:meth:`MCPClient.prompt`)."""


async def handshake(session: ClientSession) -> str:
    """Agree on a revision with the server; the one agreed.

    MCP's 2026-07-28 revision has no handshake: ``server/discover`` says what the server speaks, and
    every request carries the revision. A server of an earlier revision does not know that method;
    it is then initialized as before (2025-11-25 and earlier).

    Raises:
        RuntimeError: If the server speaks no revision the client does (the SDK names them).
    """
    from mcp.shared.exceptions import MCPError

    try:
        await session.discover()
    except (MCPError, ValidationError):  # a server before 2026-07-28: the method is unknown to it
        await session.initialize()
    return str(session.protocol_version)


async def _resources(session: ClientSession, taken: set[str]) -> list[dict[str, Any]]:
    """The tool that reads the server's resources (their URIs its one argument's choices), if it has any."""
    listed = (await session.list_resources()).resources
    if not listed or "read_resource" in taken:
        return []
    uris = [str(resource.uri) for resource in listed]
    said = "; ".join(f"{resource.uri}: {resource.description or resource.name}" for resource in listed)
    schema = {"type": "object", "properties": {"uri": {"type": "string", "enum": uris}}, "required": ["uri"]}
    return [{"name": "read_resource", "remote": READ_RESOURCE, "input_schema": schema,
             "description": f"Reads one of the server's resources. {said}"[:1000]}]  # fmt: skip


async def _read(session: ClientSession, what: str, arguments: dict[str, Any]) -> Any:
    """A resource's or a prompt's content as a tool result (text: its texts, a line each)."""
    from mcp import types

    if what == READ_RESOURCE:
        read = await session.read_resource(str(arguments["uri"]))
        texts = [getattr(item, "text", None) or f"[{item.mime_type or 'binary'} content]" for item in read.contents]
    else:
        got = await session.get_prompt(str(arguments["name"]), {k: str(v) for k, v in arguments["arguments"].items()})
        texts = [f"{m.role}: {getattr(m.content, 'text', '')}" for m in got.messages]
    return types.CallToolResult(content=[types.TextContent(type="text", text="\n".join(texts))])


class MCPServerGone(RunError):
    """An MCP server stopped answering during the run (it crashed or was killed): the run stops, resumable."""


class MCPServer(BaseModel):
    """An MCP server a run uses: over stdio (``command``) or streamable HTTP (``url``).

    ``env`` is given to a stdio server's process and never written anywhere (the cassette keeps the
    server's name and tools only); ``pass_env`` names variables of the run's own environment the
    server gets too (the names are written, a run's manifest keeps them; never their values).
    ``timeout``: seconds a call may take; ``start_timeout``: seconds the server has to start and
    answer its handshake.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,40}$")
    command: list[str] = Field(default_factory=list)
    url: str | None = None
    env: dict[str, str] = Field(default_factory=dict, repr=False)
    pass_env: list[str] = Field(default_factory=list)
    cwd: str | None = None
    timeout: float = Field(default=CALL_SECONDS, gt=0)
    start_timeout: float = Field(default=START_SECONDS, gt=0)

    @model_validator(mode="after")
    def _one_way(self) -> MCPServer:
        if bool(self.command) == bool(self.url):
            raise ValueError(
                f"MCP server {self.name!r} needs a command (stdio) or a url (streamable HTTP), not "
                f"{'both' if self.command else 'neither'}"
            )
        return self

    def recorded(self) -> dict[str, Any]:
        """The server as a run's manifest keeps it: everything but ``env``, without credentials in a URL."""
        kept = self.model_dump(mode="json", exclude={"env"})
        kept["url"] = redacted(self.url)
        kept["command"] = [scrubbed(arg) for arg in self.command]
        return kept

    def environment(self) -> dict[str, str] | None:
        """What the server's process gets over the SDK's safe defaults: ``pass_env``'s variables, then ``env``."""
        given = {name: os.environ[name] for name in self.pass_env if name in os.environ}
        return {**given, **self.env} or None


def server_from(text: str) -> MCPServer:
    """``NAME=COMMAND ARGS...`` (stdio) or ``NAME=URL`` (streamable HTTP) as a server (``--mcp``).

    Raises:
        ConfigError: Naming the text and the form it takes.
    """
    name, _, how = text.partition("=")
    try:
        if how.startswith(("http://", "https://")):
            return MCPServer(name=name, url=how)
        return MCPServer(name=name, command=shlex.split(how))
    except ValueError as exc:
        reason = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise ConfigError(
            f"--mcp {text!r}: {reason}; give NAME=COMMAND (e.g. 'files=npx mcp-server-filesystem /data') "
            "or NAME=URL (e.g. notes=http://127.0.0.1:8000/mcp)"
        ) from None


class MCPTool(BaseTool):
    """One tool of an MCP server, called through its :class:`MCPClient` (recorded, or replayed)."""

    server: str
    remote: str
    """The tool's own name on its server (``name`` is ``server__remote``)."""
    role: str | None = None
    """The role that calls it (its permissions are that role's): see :meth:`MCPClient.tools_for`."""
    client: Any = Field(default=None, exclude=True, repr=False)

    async def execute(self, **arguments: Any) -> ToolResult:
        """Call the tool on its server (or answer from the cassette)."""
        client: MCPClient = self.client
        return await client.call(self.server, self.remote, arguments, role=self.role)


def tool_name(server: str, tool: str) -> str:
    """The name a model calls ``tool`` of ``server`` by: ``server__tool`` in the characters a function name takes."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"{server}__{tool}")[:64]


def _key(server: str, tool: str, arguments: dict[str, Any], role: str | None = None) -> str:
    asked = [server, tool, arguments] + ([role] if role is not None else [])
    text = json.dumps(asked, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class ToolCassette:
    """MCP listings and calls (and A2A agents' cards and exchanges), one a line: written, answered on replay.

    A call is answered by the recorded calls with the same server, tool and arguments (and role),
    in the order they were recorded. ``append``: a resumed run's — the calls made before the stop
    are answered as they were then, and the rest are recorded after them (a line a kill tore is
    dropped).

    Raises:
        ConfigError: If a replayed cassette is missing or a line of it is damaged (naming the line).
    """

    def __init__(self, path: str | Path, mode: Literal["record", "replay", "append"]) -> None:
        self.path, self.mode = Path(path), "replay" if mode == "replay" else "record"
        self._tools: dict[str, list[dict[str, Any]]] = {}
        self._servers: dict[str, dict[str, Any]] = {}
        self._cards: dict[str, dict[str, Any]] = {}
        self._calls: dict[str, deque[dict[str, Any]]] = defaultdict(deque)
        if mode == "replay" and not self.path.is_file():
            raise ConfigError(f"tool cassette {str(self.path)!r} does not exist; record the run with its servers first")
        if mode == "record" or not self.path.is_file():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_bytes(b"")
        else:  # replay; or append: a resumed run answers what the cassette holds, then goes on recording
            self._load()
            whole = self.path.read_bytes()
            if mode == "append" and not whole.endswith(b"\n"):
                os.truncate(self.path, whole.rfind(b"\n") + 1)  # what a kill tore goes: the next line starts clean

    def _load(self) -> None:
        try:
            text = self.path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"tool cassette {str(self.path)!r} is not text (byte {exc.start} is not UTF-8): not one metaroles "
                "wrote; record the run again"
            ) from None
        lines = jsonl_lines(text)
        for number, line in enumerate(lines, start=1):
            try:
                entry = json.loads(line)
                if entry["kind"] == "card":
                    self._cards[entry["agent"]] = {"url": entry["url"], **dict(entry["card"])}
                elif entry["kind"] == "tools":
                    self._tools[entry["server"]] = list(entry["tools"])
                    self._servers[entry["server"]] = dict(entry.get("spec") or {"name": entry["server"]})
                else:
                    self._calls[entry["key"]].append(dict(entry["result"]))
            except (ValueError, KeyError, TypeError) as exc:
                if number == len(lines) and not text.endswith("\n"):  # torn by a kill mid-write: never answered
                    break
                raise ConfigError(
                    f"tool cassette {str(self.path)!r} line {number} is not a recorded listing or call ({exc}); "
                    "record the run again"
                ) from None

    def tools(self, server: str) -> list[dict[str, Any]]:
        """The tools ``server`` listed when recorded.

        Raises:
            ConfigError: If the cassette holds no listing of ``server``.
        """
        if server not in self._tools:
            raise ConfigError(f"tool cassette {str(self.path)!r} holds no tools of MCP server {server!r}; record again")
        return self._tools[server]

    def servers(self) -> list[MCPServer]:
        """The servers the cassette was recorded with (as a manifest keeps them): a replay needs them named again."""
        found = []
        for name, spec in self._servers.items():
            found.append(MCPServer.model_validate({"command": ["(replayed)"], **spec, "name": name}))
        return found

    def agents(self) -> dict[str, str]:
        """The A2A agents the cassette was recorded with: name → URL."""
        return {name: card["url"] for name, card in self._cards.items()}

    def card(self, agent: str) -> dict[str, Any]:
        """The card A2A agent ``agent`` had when recorded.

        Raises:
            ConfigError: If the cassette holds no card of ``agent``.
        """
        if agent not in self._cards:
            raise ConfigError(f"tool cassette {str(self.path)!r} holds no card of A2A agent {agent!r}; record again")
        return self._cards[agent]

    def answer(self, server: str, tool: str, arguments: dict[str, Any], role: str | None = None) -> ToolResult:
        """The recorded result of this call (a failure saying so if it was never made)."""
        held = self.held(server, tool, arguments, role)
        if held is None:
            return ToolFailure(
                error=f"MCP tool {server}.{tool} was not called with {arguments!r} when this run was recorded"
            )
        return held

    async def through(
        self, server: str, tool: str, arguments: dict[str, Any], live: Callable[[], Awaitable[ToolResult]],
        role: str | None = None,
    ) -> ToolResult:  # fmt: skip
        """This call's result from the cassette if it holds one, else ``live()``'s, recorded (a replay only answers)."""
        held = self.held(server, tool, arguments, role)
        if held is not None:  # replayed; or a resumed run's call made before the stop, answered as it was then
            return held
        if self.mode == "replay":
            return self.answer(server, tool, arguments, role)  # the failure saying it was never made
        result = await live()
        self.wrote_call(server, tool, arguments, result, role)
        return result

    def held(self, server: str, tool: str, arguments: dict[str, Any], role: str | None = None) -> ToolResult | None:
        """The next recorded result of this call not yet answered, if the cassette holds one."""
        recorded = self._calls.get(_key(server, tool, arguments, role))
        if not recorded:
            return None
        result = recorded.popleft()
        return (ToolFailure if result.get("error") else ToolResult)(**result)

    def write(self, entry: dict[str, Any]) -> None:
        """Append ``entry`` (a listing or a call) durably."""
        append_durably(self.path, json.dumps(entry, sort_keys=True, ensure_ascii=False).encode() + b"\n")

    def wrote_call(
        self, server: str, tool: str, arguments: dict[str, Any], result: ToolResult, role: str | None = None
    ) -> None:
        """Record a call (and who made it) and its result (a denial included)."""
        entry = {"kind": "call", "key": _key(server, tool, arguments, role), "server": server, "tool": tool,
                 "arguments": arguments, "result": result.model_dump(exclude_none=True)}  # fmt: skip
        self.write(entry | ({"role": role} if role is not None else {}))


def renamed_tape(tape: ToolCassette | None, cassette: ToolCassette | None) -> ToolCassette | None:
    """``cassette``, or ``tape`` (its name before the tool tape and the cassette were one word), with a warning."""
    if tape is None:
        return cassette
    warnings.warn("tape= is now cassette= (a ToolCassette)", DeprecationWarning, stacklevel=3)
    return tape


_RENAMED = {"ToolTape": "ToolCassette", "tape_beside": "tool_cassette_beside"}


def __getattr__(name: str) -> Any:
    """The names this module had before the tool tape became the tool cassette, with a ``DeprecationWarning``."""
    if name in _RENAMED:
        warnings.warn(f"{name} is now {_RENAMED[name]}", DeprecationWarning, stacklevel=2)
        return globals()[_RENAMED[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def tool_cassette_beside(cassette: str | Path) -> Path:
    """Where a run's MCP calls are recorded beside its model calls: ``calls.jsonl`` → ``calls.tools.jsonl``."""
    cassette = Path(cassette)
    return cassette.with_name(f"{cassette.stem if cassette.suffix else cassette.name}.tools.jsonl")


class MCPClient:
    """The MCP servers of a run: started with it (``async with``), their tools, every call through here.

    Args:
        servers: The servers to start.
        cassette: Record every listing and call to it, or (``replay``) answer from it and start no server.
            (``tape=``, its name before: still taken, with a ``DeprecationWarning``.)
        permissions: Which role may call which tool (:class:`~metaroles.agents.permissions.Permissions`;
            default: every call allowed). A role's tools come from :meth:`tools_for`.
        ask: Decides the calls the permissions say to ask about: a policy function, or a person
            (:func:`~metaroles.agents.permissions.desk_asker`).

    Raises:
        ConfigError: If the permissions ask and nobody is there to ask; on entering, if a server
            cannot start (its command is missing, it exits, or it does not speak MCP), naming the
            server and what it said.
    """

    def __init__(
        self,
        servers: list[MCPServer],
        *,
        cassette: ToolCassette | None = None,
        permissions: Permissions | None = None,
        ask: Asker | None = None,
        tape: ToolCassette | None = None,
    ) -> None:
        cassette = renamed_tape(tape, cassette)
        names = [server.name for server in servers]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"MCP server name(s) {twice} given twice; give each server a name of its own")
        self.permissions, self.ask = permissions or Permissions(), ask
        replaying = cassette is not None and cassette.mode == "replay"
        if self.permissions.asks and ask is None and not replaying:
            raise ConfigError(
                "the permissions ask about some calls and nobody is there to ask: give ask= (a policy function, "
                "or desk_asker(desk) for a person), or make the rule allow or deny"
            )
        self.servers = {server.name: server for server in servers}
        self.cassette = cassette
        self.tools: list[MCPTool] = []
        self._sessions: dict[str, ClientSession] = {}
        self.revisions: dict[str, str] = {}
        """The MCP revision each started server speaks with the client (none for a replayed one)."""
        self._stack = AsyncExitStack()
        self._logs: dict[str, Path] = {}
        self._log_dir: Path | None = None

    async def __aenter__(self) -> MCPClient:
        try:
            for server in self.servers.values():
                listed = [self._tool(server.name, spec) for spec in await self._listing(server)]
                self.tools += [tool for tool in listed if tool is not None]
        except BaseException:
            await self._stack.aclose()  # the servers started before this one
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stack.aclose()  # the servers stop with the run (in the task that started them)

    def tools_for(self, role: str) -> list[MCPTool]:
        """The servers' tools as ``role`` calls them: under its permissions, recorded as its calls."""
        return [tool.model_copy(update={"role": role}) for tool in self.tools]

    def _tool(self, server: str, spec: dict[str, Any]) -> MCPTool | None:
        """The tool as a model is offered it; ``None`` (and a warning naming it) when no model could fill its schema."""
        schema = spec.get("input_schema") or {"type": "object", "properties": {}}
        why = _unusable(schema)
        if why is not None:
            warnings.warn(
                f"MCP server {server!r}: its tool {spec['name']!r} is left out: {why}", MCPWarning, stacklevel=2
            )
            return None
        remote = spec.get("remote", spec["name"])  # the resource reader's: what it calls, not its name
        return MCPTool(name=tool_name(server, spec["name"]), description=spec.get("description") or spec["name"],
                       parameters=schema, server=server, remote=remote, client=self)  # fmt: skip

    async def _listing(self, server: MCPServer) -> list[dict[str, Any]]:
        if self.cassette is not None and self.cassette.mode == "replay":
            return self.cassette.tools(server.name)
        session = await self._start(server)
        self._sessions[server.name] = session
        try:
            with anyio.fail_after(server.start_timeout):
                listed = await session.list_tools()
        except TimeoutError:
            raise ConfigError(
                f"MCP server {server.name!r} did not list its tools in {server.start_timeout:g} s (start_timeout): "
                "an answer that does not parse (a schema nested too deeply, say) is dropped by the MCP SDK"
            ) from None
        except Exception as exc:
            raise ConfigError(
                f"MCP server {server.name!r} answered tools/list with what cannot be read "
                f"({type(exc).__name__}: {str(exc)[:200]}); fix the server"
            ) from None
        tools: list[dict[str, Any]] = [
            {"name": t.name, "description": t.description or "", "input_schema": t.input_schema} for t in listed.tools
        ]
        capabilities = session.server_capabilities
        if capabilities is not None and capabilities.resources is not None:
            tools += await _resources(session, {str(t["name"]) for t in tools})
        if self.cassette is not None:
            revision = self.revisions.get(server.name)
            self.cassette.write({"kind": "tools", "server": server.name, "spec": server.recorded(), "tools": tools}
                            | ({"revision": revision} if revision else {}))  # fmt: skip
        return tools

    async def _start(self, server: MCPServer) -> ClientSession:
        """Start ``server`` and shake hands; it stops with the client (its contexts join the client's)."""
        from mcp import ClientSession

        stack = AsyncExitStack()
        try:
            streams = await stack.enter_async_context(self._transport(server, stack))
            session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
            with anyio.fail_after(server.start_timeout):
                self.revisions[server.name] = await handshake(session)
        except BaseException as exc:  # a transport that failed cancels the handshake: its own error is why
            raise await self._not_started(server, stack, exc) from None
        self._stack.push_async_exit(stack)
        return session

    async def _not_started(self, server: MCPServer, stack: AsyncExitStack, exc: BaseException) -> BaseException:
        """What to raise for a server that did not start: the run's own cancellation as it is, else why, in a line."""
        problem = exc
        try:
            await stack.aclose()
        except Exception as closing:  # the transport's task group: what really went wrong
            problem = closing
        if isinstance(problem, anyio.get_cancelled_exc_class()):
            return problem
        if isinstance(problem, TimeoutError):
            return ConfigError(
                f"MCP server {server.name!r} did not start: no answer to the handshake in {server.start_timeout:g} s "
                "(start_timeout)"
            )
        return ConfigError(f"MCP server {server.name!r} did not start: {self._why(server, problem)}")

    def _transport(self, server: MCPServer, stack: AsyncExitStack) -> Any:
        if server.url is not None:
            from mcp.client.streamable_http import streamable_http_client

            return streamable_http_client(server.url)
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        if shutil.which(server.command[0]) is None and not Path(server.command[0]).is_file():
            raise OSError(f"command {server.command[0]!r} not found: install it, or give its full path")
        if self._log_dir is None:
            self._log_dir = Path(tempfile.mkdtemp(prefix="metaroles-mcp-"))
            self._stack.callback(shutil.rmtree, self._log_dir, ignore_errors=True)
        self._logs[server.name] = self._log_dir / f"{server.name}.log"
        log = stack.enter_context(self._logs[server.name].open("w", encoding="utf-8"))  # what the server says
        params = StdioServerParameters(command=server.command[0], args=server.command[1:],
                                       env=server.environment(), cwd=server.cwd)  # fmt: skip
        return stdio_client(params, errlog=log)

    def _why(self, server: MCPServer, exc: BaseException) -> str:
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        said = str(exc) or type(exc).__name__
        log = self._logs.get(server.name)
        if log is not None and log.is_file():
            lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
            if lines:
                said += f"; it said: {lines[-1].strip()[:300]}"
        return scrubbed(said, (server.environment() or {}).values())

    async def call(self, server: str, tool: str, arguments: dict[str, Any], *, role: str | None = None) -> ToolResult:
        """Call ``tool`` on ``server`` for ``role`` (or answer from the cassette); the result as an observation.

        A call the role's permissions deny, or that was asked about and not allowed, is a failure
        the agent reads; it is recorded as the call's result.

        Raises:
            MCPServerGone: If the server stopped answering (crashed, killed): the run stops, resumable.
        """

        async def live() -> ToolResult:
            refused = await self._refused(role or "*", tool_name(server, tool), arguments)
            return refused or await self._called(server, tool, arguments)

        return await (live() if self.cassette is None else self.cassette.through(server, tool, arguments, live, role))

    async def _refused(self, role: str, name: str, arguments: dict[str, Any]) -> ToolFailure | None:
        """Why the permissions refuse this call, or ``None`` when it may go ahead."""
        decision = self.permissions.decision(role, name)
        if decision == "allow":
            return None
        if decision == "ask" and self.ask is not None and await decided(self.ask, role, name, arguments):
            return None
        how = "asked, and not allowed" if decision == "ask" else "denied by the run's permissions"
        return ToolFailure(error=f"{role} may not call {name}: {how}")

    async def prompt(self, server: str, name: str, arguments: dict[str, str] | None = None) -> str:
        """The text of ``server``'s prompt ``name`` filled with ``arguments`` (recorded; answered on replay).

        Raises:
            ToolError: If the server refused it (naming the prompt and why).
        """
        result = await self.call(server, GET_PROMPT, {"name": name, "arguments": arguments or {}})
        if result.error is not None:
            raise ToolError(result.error)
        return str(result.output or "")

    async def _called(self, server: str, tool: str, arguments: dict[str, Any]) -> ToolResult:
        from mcp import types
        from mcp.shared.exceptions import MCPError

        spec, session = self.servers[server], self._sessions[server]
        named = arguments.get("name") or arguments.get("uri") if tool in (READ_RESOURCE, GET_PROMPT) else None
        where = f"{server}.{tool}" + (f" {named!r}" if named else "")  # a server's refusal may not name it
        try:  # the SDK makes the request's CLIENT span and puts its trace context in the request's _meta
            with anyio.move_on_after(spec.timeout) as waited:
                if tool in (READ_RESOURCE, GET_PROMPT):
                    answer = await _read(session, tool, arguments)
                else:
                    answer = await session.call_tool(tool, arguments)
            result = (
                ToolFailure(error=f"MCP tool {where} gave no answer in {spec.timeout:g} s (timeout={spec.timeout:g})")
                if waited.cancelled_caught
                else observed(answer, where)
            )
        except ValidationError as exc:  # the server broke the protocol in its answer: the agent reads that
            problem = exc.errors()[0]
            part = ".".join(str(name) for name in problem["loc"]) or "the result"
            result = ToolFailure(error=f"MCP tool {where} answered with malformed content ({part}: {problem['msg']})")
        except MCPError as exc:
            if exc.code != types.CONNECTION_CLOSED:  # the server refused this call: the agent reads why
                result = ToolFailure(error=f"MCP tool {where}: {exc.message}")
            else:
                raise self._gone(spec, exc) from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError) as exc:
            raise self._gone(spec, exc) from None
        return result

    def _gone(self, server: MCPServer, exc: BaseException) -> MCPServerGone:
        return MCPServerGone(
            f"MCP server {server.name!r} stopped answering ({self._why(server, exc)}); "
            "resume the run once it runs again"
        )


def observed(answer: Any, where: str) -> ToolResult:
    """An MCP ``CallToolResult`` as an observation: text, structured content (JSON), an image; or a failure."""
    from mcp import types

    if not isinstance(answer, types.CallToolResult):
        return ToolFailure(error=f"MCP tool {where} answered with {type(answer).__name__}, not a tool result")
    texts, image = [], None
    for item in answer.content:
        if isinstance(item, types.TextContent):
            texts.append(item.text)
        elif isinstance(item, types.ImageContent):
            image = item.data
        else:
            texts.append(f"[{item.type}]")
    text = "\n".join(texts)
    if answer.structured_content is not None and not text:
        text = json.dumps(answer.structured_content, sort_keys=True, ensure_ascii=False)
    text = kept_answer(text, source=f"MCP tool {where}")
    if answer.is_error:
        return ToolFailure(error=f"MCP tool {where}: {text or 'failed, saying nothing'}")
    return ToolResult(output=text, base64_image=image)
