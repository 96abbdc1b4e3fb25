"""A real Chat Completions HTTP server on 127.0.0.1 for the provider's tests.

Each test queues replies; the server answers requests in order and records what it received.
A reply is a status with a JSON body, a list of SSE chunks, or a hang that lasts until the test
ends (to exercise client timeouts without sleeping).
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    body: dict[str, Any] | None = None
    chunks: list[dict[str, Any]] | None = None
    hang: bool = False
    cut: bool = False
    """Stream the chunks, then drop the connection without the final event (no finish_reason, no [DONE])."""
    headers: dict[str, str] = field(default_factory=dict)
    trickle: bool = False
    """Stream the chunks, then send a keep-alive byte at every read until the test ends (never finishing)."""
    raw: bytes | None = None
    """Send these bytes as the JSON body (an answer that is not JSON at all)."""
    truncated: bool = False
    """Announce the whole body's length, send half of it, and hold the connection until the test ends."""


def completion(
    content: str | None = "hi", *, tool_calls: list[dict[str, Any]] | None = None, model: str = "served-model"
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }


def chunk(
    content: str | None = None,
    *,
    usage: bool = False,
    tool_call: dict[str, Any] | None = None,
    finish: str | None = None,
) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if tool_call is not None:
        delta["tool_calls"] = [tool_call]
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "served-model",
        "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage:
        body["usage"] = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    return body


@dataclass
class ChatServer:
    replies: deque[Reply] = field(default_factory=deque)
    responder: Callable[[dict[str, Any]], Reply] | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    url: str = ""

    def queue(self, *replies: Reply) -> None:
        self.replies.extend(replies)


def send_json(handler: BaseHTTPRequestHandler, reply: Reply, hold: threading.Event | None = None) -> None:
    data = reply.raw if reply.raw is not None else json.dumps(reply.body or {}).encode()
    handler.send_response(reply.status)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(data)))
    for name, value in reply.headers.items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(data[: len(data) // 2] if reply.truncated else data)
    if reply.truncated and hold is not None:  # the connection stays open, the rest of the body never comes
        handler.wfile.flush()
        hold.wait()


def start(server_state: ChatServer) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", 0))
            body = json.loads(self.rfile.read(length))
            server_state.requests.append(body)
            if server_state.replies:
                reply = server_state.replies.popleft()
            elif server_state.responder is not None:
                reply = server_state.responder(body)
            else:
                reply = Reply(500, {"error": "no reply"})
            if reply.hang:
                server_state.release.wait()
                return
            if reply.chunks is not None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                for item in reply.chunks:
                    self.wfile.write(f"data: {json.dumps(item)}\n\n".encode())
                    self.wfile.flush()
                while reply.trickle and not server_state.release.wait(0.05):
                    self.wfile.write(b": keep-alive\n\n")  # an SSE comment: a byte now and then, never an answer
                    self.wfile.flush()
                if not reply.cut:
                    self.wfile.write(b"data: [DONE]\n\n")
                self.close_connection = True
                return
            send_json(self, reply, hold=server_state.release)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    server_state.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd
