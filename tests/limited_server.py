"""A Chat Completions server on 127.0.0.1 that holds a tokens-per-window limit, as providers do.

A call is charged when admitted: its prompt (four characters a token) and its ``max_tokens``.
One that would take the last ``window`` seconds past ``limit`` is refused with 429 and
``retry-after-ms`` (when enough of the window will have passed); an admitted one is answered with
``x-ratelimit-limit-tokens`` and ``x-ratelimit-remaining-tokens`` (``slow`` seconds later: a slow server; none with
``headers=False``). With ``per="requests"`` each call costs 1 and the headers say ``-requests``. What it admitted and
refused, and when, is kept for the test.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def charged(body: dict) -> int:
    """What a call costs at admission."""
    characters = sum(len(str(m.get("content") or "")) for m in body.get("messages", []))
    return characters // 4 + 1 + int(body.get("max_tokens") or 256)


class LimitedServer:
    """The server (``url``); ``admitted`` and ``refused``: (time, tokens) of each call; ``stop()``."""

    def __init__(
        self,
        limit: int,
        window: float,
        *,
        slow: float = 0.0,
        answer: str = "ok",
        headers: bool = True,
        per: str = "tokens",
    ) -> None:
        self.limit, self.window, self.slow, self.answer = limit, window, slow, answer
        self.headers, self.per = headers, per
        self.admitted: list[tuple[float, int]] = []
        self.refused: list[tuple[float, int]] = []
        self.lock = threading.Lock()
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/v1"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def admit(self, tokens: int) -> tuple[bool, float, int]:
        """Whether a call of ``tokens`` is admitted now; else the seconds to wait. And what remains."""
        now = time.monotonic()
        with self.lock:
            recent = [(at, n) for at, n in self.admitted if at > now - self.window]
            used = sum(n for _, n in recent)
            if used + tokens > self.limit:
                self.refused.append((now, tokens))
                freed, wait = self.limit - used, self.window
                for at, n in recent:
                    freed += n
                    if freed >= tokens:
                        wait = at + self.window - now
                        break
                return False, wait, self.limit - used
            self.admitted.append((now, tokens))
            return True, 0.0, self.limit - used - tokens

    def stop(self) -> None:
        self.http.shutdown()
        self.http.server_close()


def _handler(server: LimitedServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            tokens = charged(body)
            admitted, wait, remaining = server.admit(tokens if server.per == "tokens" else 1)
            if not admitted:
                self._send(429, {"error": {"message": "rate limited"}}, {"retry-after-ms": str(int(wait * 1000) + 1)})
                return
            if server.slow:
                threading.Event().wait(server.slow)  # a slow server's decoding, not a test waiting
            answer = int(body.get("max_tokens") or 256) // 2
            completion = {
                "id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": server.answer}}],
                "usage": {"prompt_tokens": tokens - answer * 2, "completion_tokens": answer,
                          "total_tokens": tokens - answer},
            }  # fmt: skip
            per = server.per
            limits = {f"x-ratelimit-limit-{per}": str(server.limit), f"x-ratelimit-remaining-{per}": str(remaining)}
            self._send(200, completion, limits if server.headers else {})

        def _send(self, status: int, body: dict, headers: dict[str, str]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

    return Handler
