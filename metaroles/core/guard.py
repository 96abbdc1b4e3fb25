"""One limit policy for every server metaroles runs and every remote answer it keeps.

Servers (the watch page, ``metaroles serve``, ``metaroles a2a``) listen on 127.0.0.1 by default,
and a page on any site can still make a browser send them requests: a name the attacker controls
that resolves to 127.0.0.1 (DNS rebinding) reaches them with its own ``Host``. So each server
answers only requests addressed to it by an address — an IP literal, or ``localhost`` — on the port
it serves, and a request that changes something (any method but GET/HEAD/OPTIONS) carrying an
``Origin`` must come from such an address too. Bodies over :data:`MAX_BODY` are refused (413)
before they are read whole; remote answers (an A2A agent's artifacts, an MCP tool's result) are
kept up to :data:`MAX_ANSWER` characters, cut with a note past that.

:class:`Guarded` applies the policy to any ASGI app; :func:`host_allowed` is the check for a server
of another kind.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

MAX_BODY = 16 * 1024 * 1024
"""The largest request body a server takes, in bytes (answered 413 above it)."""
MAX_ANSWER = 1024 * 1024
"""The most characters of one remote answer kept (in the run, its cassette and the prompt)."""
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def host_allowed(host: str | None, port: int) -> bool:
    """Whether a request whose ``Host`` header is ``host`` addresses a server on ``port`` by an address.

    An IP literal or ``localhost``, with ``port`` (or without one, for port 80), is this server;
    a name is whatever a DNS server says it is, so a page could have made it point here.
    """
    if not host:
        return False
    try:
        parts = urlsplit(f"//{host}")
        name, given = parts.hostname, parts.port
    except ValueError:
        return False
    if name is None or (given or 80) != port:
        return False
    if name == "localhost":
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def origin_allowed(origin: str | None, port: int) -> bool:
    """Whether a request's ``Origin`` (absent: not a browser's cross-site request) is a page of this server."""
    if origin is None:
        return True
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and host_allowed(parts.netloc, port)


def kept_answer(text: str, *, source: str) -> str:
    """``text`` as a run keeps it: whole up to :data:`MAX_ANSWER` characters, else cut with a note saying so."""
    if len(text) <= MAX_ANSWER:
        return text
    return (
        text[:MAX_ANSWER]
        + f"\n[{source}'s answer cut: {len(text) - MAX_ANSWER:,} more characters than the {MAX_ANSWER:,} kept]"
    )


class Guarded:
    """An ASGI app behind the policy: ``Host`` and ``Origin`` checked, bodies capped.

    Args:
        app: The app served.
        max_body: The largest body taken, in bytes.
    """

    def __init__(self, app: ASGIApp, *, max_body: int = MAX_BODY) -> None:
        self.app, self.max_body = app, max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer a request the policy refuses, else pass it to the app (its body counted)."""
        if scope["type"] != "http":  # lifespan; none of the servers takes websockets
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        port = int((scope.get("server") or ("", 80))[1] or 80)
        refusal = self._refusal(scope, headers, port)
        if refusal is not None:
            await _answer(send, *refusal)
            return
        await self._capped(scope, receive, send)

    def _refusal(self, scope: Scope, headers: dict[str, str], port: int) -> tuple[int, str] | None:
        host = headers.get("host")
        if not host_allowed(host, port):
            return 421, f"this server answers requests to 127.0.0.1:{port} or localhost:{port}, not to Host {host!r}"
        if scope.get("method", "GET") not in SAFE_METHODS and not origin_allowed(headers.get("origin"), port):
            return 403, f"a request from the page at {headers.get('origin')!r} cannot change anything here"
        length = headers.get("content-length", "0")
        if not length.isdigit():
            return 400, f"Content-Length {length!r} is not a number of bytes"
        if int(length) > self.max_body:
            return 413, f"a body of {int(length)} bytes is over the limit of {self.max_body}; send less"
        return None

    async def _capped(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app; a body without a Content-Length is taken first, up to the limit (past it: a 413)."""
        if any(k.lower() == b"content-length" for k, _ in scope.get("headers", ())):
            await self.app(scope, receive, send)
            return
        chunks, taken = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left
            chunks.append(message.get("body", b""))
            taken += len(chunks[-1])
            if taken > self.max_body:
                await _answer(send, 413, f"the body went past the limit of {self.max_body} bytes; send less")
                return
            if not message.get("more_body", False):
                break
        body, given = b"".join(chunks), False

        async def replayed() -> Message:
            nonlocal given
            if given:
                return await receive()  # after the body: the disconnect, when it comes
            given = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replayed, send)


async def _answer(send: Send, status: int, text: str) -> None:
    body = text.encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
