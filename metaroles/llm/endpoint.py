"""An OpenAI-style HTTP endpoint on this machine: what ``metaroles serve`` and ``metaroles proxy`` stand on.

A threading HTTP/1.1 server (keep-alive, a large listen backlog, a client that goes away is no
error) whose handler answers only requests addressed to it (the policy of
:mod:`metaroles.core.guard`), takes a body of at most :data:`~metaroles.core.guard.MAX_BODY` bytes
arriving within :data:`BODY_SECONDS`, and answers errors as OpenAI's clients read them
(``{"error": {"message": …, "type": …}}``).
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from metaroles.core.guard import MAX_BODY, host_allowed, origin_allowed

BODY_SECONDS = 30.0
"""Seconds a body may take to arrive once its headers have."""


class EndpointServer(ThreadingHTTPServer):
    """A thread per connection; hundreds of clients may connect at once."""

    daemon_threads = True
    request_queue_size = 1024  # the listen backlog

    @property
    def base_url(self) -> str:
        """The base URL a client is given (``…/v1``)."""
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    @contextmanager
    def serving(self, name: str) -> Iterator[None]:
        """Serve in a background thread (named ``name``) until the block ends; then stop, and close the port."""
        thread = threading.Thread(target=self.serve_forever, name=name, daemon=True)
        thread.start()
        try:
            yield
        finally:
            self.shutdown()
            self.server_close()
            thread.join()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-answer is no error of the server's; anything else is printed."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class EndpointHandler(BaseHTTPRequestHandler):
    """The checks and answers every endpoint's handler shares (see the module)."""

    protocol_version = "HTTP/1.1"  # keep-alive: a client's connection pool is reused
    server: EndpointServer

    def log_message(self, *args: object) -> None:
        """Nothing on stderr for each request (a server of a run must not scroll its terminal)."""

    def addressed(self) -> bool:
        """Whether the request is addressed to this server by an address (else it has been answered 421 or 403)."""
        port = self.server.server_address[1]
        host = self.headers.get("host")
        if not host_allowed(host, port):
            self.error(421, f"this server answers requests to 127.0.0.1:{port}, not to Host {host!r}",
                       "invalid_request_error", close=True)  # fmt: skip
            return False
        if self.command == "POST" and not origin_allowed(self.headers.get("origin"), port):
            self.error(403, "a request from another site's page is not answered", "invalid_request_error", close=True)
            return False
        return True

    def body_length(self) -> int | None:
        """The announced body's length, if it is one this server reads (else it has been answered 400 or 413)."""
        length = self.headers.get("content-length") or "0"
        if not length.isdigit():
            self.error(400, f"Content-Length: {length!r} is not a byte count", "invalid_request_error", close=True)
            return None
        if int(length) > MAX_BODY:
            message = f"a body of {int(length)} bytes is over the limit of {MAX_BODY}; send a shorter prompt"
            self.error(413, message, "invalid_request_error", close=True)
            return None
        return int(length)

    def body(self, length: int) -> bytes | None:
        """The body, read within :data:`BODY_SECONDS` (a client that trickles it is answered 408)."""
        self.connection.settimeout(BODY_SECONDS)
        try:
            return self.rfile.read(length)
        except TimeoutError:
            self.error(408, f"the body did not arrive within {BODY_SECONDS:g} s", "invalid_request_error", close=True)
            return None
        finally:
            self.connection.settimeout(None)

    def error(self, status: int, message: str, kind: str, *, close: bool = False) -> None:
        """An error body; ``close``: the request's body was not read, so the connection cannot be reused."""
        headers = {"retry-after": "1"} if status == 429 else {}
        if close:
            headers["connection"] = "close"
            self.close_connection = True
        self.json(status, {"error": {"message": message, "type": kind}}, headers)

    def json(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        """A JSON answer."""
        self.send(status, json.dumps(body).encode(), "application/json", headers)

    def send(self, status: int, data: bytes, kind: str, headers: dict[str, str] | None = None) -> None:
        """An answer of ``data`` as ``kind``."""
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
