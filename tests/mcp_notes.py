"""A real MCP server (the official SDK's ``MCPServer``) for the MCP tests: over stdio when run, or its HTTP app.

Tools: ``add``, ``shout``, ``fail`` (an error the server reports), ``slow`` (waits until told,
or for ``seconds``), ``secret`` (says whether its environment holds ``NOTES_TOKEN``), ``die``
(the server's process exits mid-call), ``die_if`` (exits mid-call while a file exists), ``traced`` (the
trace context the call came with). A resource
(``notes://today``) and a prompt (``greet``).
"""

from __future__ import annotations

import os
import sys

import anyio
from mcp.server.mcpserver import Context, MCPServer


def notes() -> MCPServer:
    server = MCPServer("notes")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def shout(text: str) -> str:
        """The text in capitals."""
        return text.upper()

    @server.tool()
    def fail(why: str) -> str:
        """Always fails, saying why."""
        raise ValueError(why)

    @server.tool()
    async def slow(seconds: float) -> str:
        """Answers after ``seconds``."""
        await anyio.sleep(seconds)
        return "late"

    @server.tool()
    def secret() -> str:
        """Whether the server was given its token."""
        return "has a token" if os.environ.get("NOTES_TOKEN") else "no token"

    @server.tool()
    def traced(ctx: Context) -> str:
        """The W3C trace context the call came with (its ``_meta.traceparent``), or ``none``."""
        meta = ctx.request_context.meta or {}
        return str(meta.get("traceparent") or "none")

    @server.tool()
    def die() -> str:
        """The server's process ends mid-call."""
        os._exit(9)

    @server.tool()
    def die_if(path: str) -> str:
        """The server's process ends mid-call if the file ``path`` exists; else it says it lives."""
        if os.path.exists(path):
            os._exit(9)
        return "alive"

    return readable(server)


def readable(server: MCPServer) -> MCPServer:
    """The server with a resource and a prompt."""

    @server.resource("notes://today", description="Today's note")
    def today() -> str:
        return "buy milk"

    @server.prompt()
    def greet(name: str) -> str:
        """A greeting for ``name``."""
        return f"Say hello to {name}."

    return server


class OverHTTP:
    """The notes server's streamable-HTTP app served by uvicorn on 127.0.0.1 in a thread (``url``; ``stop()``)."""

    def __init__(self) -> None:
        import socket
        import threading

        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/mcp"
        config = uvicorn.Config(notes().streamable_http_app(), log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        while not self.server.started and self.thread.is_alive():
            self.thread.join(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


if __name__ == "__main__":
    if "--crash" in sys.argv:
        token = os.environ.get("NOTES_TOKEN")  # a server's error may well show what its environment gave it
        said = f" (token {token}, store http://notes:{token}@127.0.0.1:1/db)" if token else ""
        print(f"notes: cannot read its configuration (crashed on start){said}", file=sys.stderr)
        sys.exit(3)
    notes().run("stdio")
