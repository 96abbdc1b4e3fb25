"""``metaroles proxy``: an OpenAI-compatible endpoint that records a model server's answers, or answers from them.

Any framework that talks to an OpenAI-compatible server records and replays through it with no
change of its own but its base URL (the proxy's ``…/v1``):

- recording (``--to URL --record CASSETTE``): every request under ``/v1`` goes on to the server at URL
  (the client's headers, its ``Authorization`` included, go along; none is written down), and its
  answer comes back as it comes — a stream event by event — and is kept in CASSETTE, a JSON line per
  exchange;
- replaying (``--replay CASSETTE``): every request is answered from CASSETTE, with no server to reach; a
  stream is replayed event by event. A request the cassette lacks is answered 404 naming the request's
  key (and named to the proxy's ``on_miss``: a line on stderr).

An exchange is keyed by the request's method, path and body, its JSON canonicalised (key order and
spacing do not matter). The same request asked again gets the answers recorded for it in order,
then the last one again, so a test suite that asks one question twice gets both answers back. Only
answers with a status below 400 are kept: a refusal or an outage is passed on, never replayed.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, urlsplit

from metaroles.core.exceptions import ConfigError
from metaroles.core.text import jsonl_lines
from metaroles.llm.endpoint import EndpointHandler, EndpointServer

PREFIX = "/v1"
"""The path the proxy serves: a client's base URL is the proxy's address and this."""
UPSTREAM_SECONDS = 600.0
"""Seconds the upstream may take to answer (a long generation on a slow server)."""
_NOT_FORWARDED = frozenset(
    {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "upgrade", "accept-encoding"}
    | {"proxy-authorization", "proxy-connection", "trailer"}
)


@dataclass(frozen=True)
class Exchange:
    """One request and the answer kept for it: a body, or a stream's events (each ``data: …`` block)."""

    key: str
    method: str
    path: str
    request: Any
    status: int
    content_type: str
    body: str | None = None
    events: list[str] | None = None


def __getattr__(name: str) -> Any:
    """``Tape``, this module's name for :class:`ExchangeCassette` before, with a ``DeprecationWarning``."""
    if name == "Tape":
        warnings.warn("metaroles.llm.proxy.Tape is now ExchangeCassette", DeprecationWarning, stacklevel=2)
        return ExchangeCassette
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def request_key(method: str, path: str, body: bytes) -> str:
    """What identifies a request on a cassette: its method, path and body (JSON canonicalised)."""
    try:
        canonical = json.dumps(json.loads(body), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (ValueError, RecursionError):
        canonical = body.decode("latin-1")
    return hashlib.sha256(f"{method} {path}\n{canonical}".encode()).hexdigest()[:32]


class ExchangeCassette:
    """A proxy's JSONL file: appended to while recording, read whole to replay (see the module).

    Raises:
        ConfigError: Recording into a file that holds exchanges already; replaying one that is
            missing or holds a line that is not an exchange (named by line).
    """

    def __init__(self, path: Path, *, record: bool) -> None:
        """Open ``path`` to record into (it must be new or empty) or to replay."""
        self.path, self.recording = path, record
        self._lock = threading.Lock()
        self._answers: dict[str, list[Exchange]] = {}
        self._asked: dict[str, int] = {}
        if record:
            if path.is_file() and path.stat().st_size:
                raise ConfigError(f"{str(path)!r} holds recorded exchanges already; name a new cassette, or delete it")
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", encoding="utf-8")
            return
        if not path.is_file():
            raise ConfigError(
                f"no cassette at {str(path)!r}; record one with metaroles proxy --to URL --record CASSETTE"
            )
        for number, line in enumerate(jsonl_lines(path.read_text(encoding="utf-8")), 1):
            if not line.strip():
                continue
            try:
                exchange = Exchange(**json.loads(line))
            except (ValueError, TypeError, RecursionError):
                raise ConfigError(f"{path}:{number} is not a recorded exchange; record the cassette again") from None
            self._answers.setdefault(exchange.key, []).append(exchange)

    def __len__(self) -> int:
        """The exchanges on the cassette (replaying) or kept so far (recording)."""
        return sum(map(len, self._answers.values()))

    def answer(self, key: str) -> Exchange | None:
        """The next answer recorded for ``key`` (the last one again past them); ``None`` if there is none."""
        with self._lock:
            answers = self._answers.get(key)
            if not answers:
                return None
            asked = self._asked.get(key, 0)
            self._asked[key] = asked + 1
            return answers[min(asked, len(answers) - 1)]

    def keep(self, exchange: Exchange) -> None:
        """Append ``exchange`` (a line, flushed: a killed proxy loses no answer it relayed)."""
        line = json.dumps(asdict(exchange), ensure_ascii=False) + "\n"
        with self._lock:
            self._answers.setdefault(exchange.key, []).append(exchange)
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        """Make what was recorded durable."""
        if self.recording and not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()


def upstream_url(url: str) -> SplitResult:
    """The server a recording proxy forwards to.

    Raises:
        ConfigError: If ``url`` is not an http(s) URL with a host.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--to {url!r} is not a server's URL; give one like http://127.0.0.1:8080/v1")
    return parts


class ProxyServer:
    """The proxy on ``host:port`` (port 0: a free one): recording to ``cassette`` from ``upstream``, or replaying it.

    Args:
        cassette: The cassette (recording when ``cassette.recording``).
        upstream: The server to record from (``…/v1``); only when recording.
        on_miss: Told of each request a replay has no answer for (its method, path and key).
    """

    def __init__(
        self,
        cassette: ExchangeCassette,
        *,
        upstream: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        on_miss: Callable[[str], None] | None = None,
    ) -> None:
        """Bind the port."""
        if cassette.recording != (upstream is not None):
            raise ConfigError("a recording proxy needs the server to record (--to URL); a replaying one asks none")
        self.cassette, self.on_miss = cassette, on_miss
        self.upstream = upstream_url(upstream) if upstream is not None else None
        self.httpd = _ProxyHTTPServer((host, port), _ProxyHandler)
        self.httpd.proxy = self

    @property
    def url(self) -> str:
        """The base URL a client is given (``…/v1``)."""
        return self.httpd.base_url

    @contextmanager
    def running(self) -> Iterator[ProxyServer]:
        """Serve in a background thread until the block ends; then stop, close the port and the cassette."""
        try:
            with self.httpd.serving("metaroles-proxy"):
                yield self
        finally:
            self.cassette.close()

    def missed(self, method: str, path: str, key: str) -> str:
        """What a replay without an answer says (and tells ``on_miss``)."""
        said = (
            f"the cassette {str(self.cassette.path)!r} has no answer for {method} {path} (request key {key}); "
            "record it with metaroles proxy --to URL --record CASSETTE"
        )
        if self.on_miss is not None:
            self.on_miss(said)
        return said


class _ProxyHTTPServer(EndpointServer):
    proxy: ProxyServer


class _ProxyHandler(EndpointHandler):
    server: _ProxyHTTPServer

    def do_GET(self) -> None:
        self._exchange()

    def do_POST(self) -> None:
        self._exchange()

    def do_DELETE(self) -> None:
        self._exchange()

    def _exchange(self) -> None:
        if not self.addressed() or (length := self.body_length()) is None:
            return
        if self.path != PREFIX and not self.path.startswith(PREFIX + "/"):
            self.error(404, f"no route {self.path!r}; the proxy serves {PREFIX}/…", "not_found_error", close=True)
            return
        body = self.body(length)
        if body is None:
            return
        proxy = self.server.proxy
        key = request_key(self.command, self.path, body)
        if proxy.upstream is None:
            self._replay(key)
        else:
            self._record(proxy.upstream, key, body)

    def _replay(self, key: str) -> None:
        exchange = self.server.proxy.cassette.answer(key)
        if exchange is None:
            self.error(404, self.server.proxy.missed(self.command, self.path, key), "cassette_miss")
        elif exchange.events is not None:
            self._stream_head(exchange.status, exchange.content_type)
            for event in exchange.events:
                self._chunk(event.encode())
            self._chunk(b"")
        else:
            self.send(exchange.status, (exchange.body or "").encode(), exchange.content_type)

    def _record(self, upstream: SplitResult, key: str, body: bytes) -> None:
        kind = http.client.HTTPSConnection if upstream.scheme == "https" else http.client.HTTPConnection
        connection = kind(upstream.hostname or "", upstream.port, timeout=UPSTREAM_SECONDS)
        path = upstream.path.rstrip("/") + self.path.removeprefix(PREFIX)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _NOT_FORWARDED}
        try:
            connection.request(
                self.command, path, body=body or None, headers={**headers, "accept-encoding": "identity"}
            )
            answer = connection.getresponse()
            self._relay(answer, key, body)
        except (OSError, http.client.HTTPException) as exc:
            where = upstream.geturl()
            self.error(502, f"the server {where!r} cannot be reached ({exc}); is it running?", "upstream_error")
        finally:
            connection.close()

    def _relay(self, answer: http.client.HTTPResponse, key: str, body: bytes) -> None:
        kind = answer.getheader("content-type") or "application/json"
        request = _readable(body)
        if "text/event-stream" in kind:
            self._stream_head(answer.status, kind)
            events = list(self._events(answer))
            self._chunk(b"")
            exchange = Exchange(key, self.command, self.path, request, answer.status, kind, events=events)
        else:
            data = answer.read()
            self.send(answer.status, data, kind)
            exchange = Exchange(key, self.command, self.path, request, answer.status, kind, body=data.decode())
        if answer.status < 400:
            self.server.proxy.cassette.keep(exchange)

    def _events(self, answer: http.client.HTTPResponse) -> Iterator[str]:
        """Relay a stream event by event (a block of lines ending in a blank one); yield each."""
        block: list[bytes] = []
        for line in iter(answer.readline, b""):
            block.append(line)
            if line in (b"\n", b"\r\n"):
                event = b"".join(block)
                self._chunk(event)
                block = []
                yield event.decode()
        if block:  # a last event without its blank line
            event = b"".join(block)
            self._chunk(event)
            yield event.decode()

    def _stream_head(self, status: int, kind: str) -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        """One chunk of a chunked answer (empty: the last), sent at once."""
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def _readable(body: bytes) -> Any:
    """A request's body as the cassette shows it: its JSON, else its text."""
    try:
        return json.loads(body) if body else None
    except (ValueError, RecursionError):
        return body.decode("latin-1")
