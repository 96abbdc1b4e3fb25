"""``metaroles serve``: the embedded model as an OpenAI-compatible server with continuous batching.

The server is an HTTP front of :class:`~metaroles.llm.local.LocalLLM` with ``batch`` slots and
the prefix cache on: every request goes to the one batching engine (``llm.engine``), so the calls
of many clients are decoded together, and a prompt that begins as an earlier one did (the same
system prompt and scenario) is mostly read from a slot's cache. Routes:

- ``POST /v1/chat/completions``: ``messages``, ``max_tokens`` (or ``max_completion_tokens``),
  ``temperature``, ``seed``, ``response_format`` (``json_schema`` answers follow the schema's
  grammar), ``tools`` with a forced ``tool_choice`` (the arguments follow the tool's schema),
  ``stream`` (the answer as one chunk, then the usage). ``usage.prompt_tokens_details.cached_tokens``
  says how much of the prompt came from the cache.
- ``POST /v1/files``, ``POST /v1/batches`` and the rest of OpenAI's Batch API (``llm.batch_jobs``): a file
  of requests answered together, for a run's ``--batch``.
- ``GET /v1/models``, ``GET /health``.
- ``GET /metrics``: the engine's counters in Prometheus' text format (requests, prompt, cached and
  completion tokens, calls running and waiting).

More requests than ``max_waiting`` beyond the slots get ``429`` with ``Retry-After: 1``, as a
serving engine sheds load, so a client that adapts its concurrency sees where the engine's edge is.
Requests run on an anyio event loop in a thread of the server (``BlockingPortal``); HTTP is the
standard library's threading server, one thread per connection (the engine's thread does the work).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from anyio.from_thread import BlockingPortal, start_blocking_portal

from metaroles.core.exceptions import ConfigError, MetarolesError
from metaroles.llm.batch_jobs import BatchJobs, NotFound, Refused
from metaroles.llm.endpoint import EndpointHandler, EndpointServer
from metaroles.llm.local import LocalLLM, grammar_of
from metaroles.llm.protocol import LLM, LLMRequest, LLMResponse


class BadRequest(ValueError):
    """A request the server cannot take (answered 400 with this message)."""


def chat_request(body: Any) -> tuple[LLMRequest, bool]:
    """The model request a Chat Completions body asks for, and whether it asked for a stream.

    Raises:
        BadRequest: Naming the field that is missing or malformed.
    """
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
        raise BadRequest("the body must be a JSON object with a non-empty 'messages' list")
    messages = [_message(index, m) for index, m in enumerate(body["messages"])]
    fields: dict[str, Any] = {"messages": messages}
    for name, key in (("max_tokens", "max_tokens"), ("max_tokens", "max_completion_tokens"), ("seed", "seed")):
        if body.get(key) is not None:
            fields[name] = _number(body, key, int)
            if name == "max_tokens" and fields[name] < 1:
                raise BadRequest(f"{key}={body[key]!r} must be at least 1")
    if body.get("temperature") is not None:
        fields["temperature"] = _number(body, "temperature", float)
        if not 0 <= fields["temperature"] <= 2:
            raise BadRequest(f"temperature={body['temperature']!r} must be a number from 0 to 2")
    fields["output_schema"] = _schema(body.get("response_format"))
    if body.get("tools"):
        fields["tools"], fields["tool_choice"] = body["tools"], _tool_choice(body.get("tool_choice"))
    return LLMRequest(**fields), bool(body.get("stream"))


def _message(index: int, message: Any) -> dict[str, str]:
    if not isinstance(message, dict) or not isinstance(message.get("role", "user"), str):
        raise BadRequest(f"messages[{index}]={message!r} must be an object with a 'role' and a 'content'")
    content = message.get("content")
    if not (content is None or isinstance(content, str | list)):
        raise BadRequest(f"messages[{index}].content={content!r} must be text or a list of content parts")
    return {"role": message.get("role", "user"), "content": _text(content)}


def _text(content: Any) -> str:
    if isinstance(content, list):  # content parts: the text ones, joined
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _number(body: dict[str, Any], key: str, kind: type[int] | type[float]) -> Any:
    value = body[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRequest(f"{key}={value!r} must be a finite number")
    if kind is int and not float(value).is_integer():
        raise BadRequest(f"{key}={value!r} must be a number{' (whole)' if kind is int else ''}")
    return kind(value)


def _schema(response_format: Any) -> dict[str, Any] | None:
    if not isinstance(response_format, dict) or response_format.get("type") == "text":
        return None
    if response_format.get("type") == "json_object":
        return {"type": "object"}
    schema = (response_format.get("json_schema") or {}).get("schema")
    if response_format.get("type") != "json_schema" or not isinstance(schema, dict):
        raise BadRequest("response_format must be text, json_object, or json_schema with a 'schema' object")
    try:
        grammar_of(schema)
    except (ValueError, TypeError, KeyError, RecursionError, AttributeError) as exc:
        raise BadRequest(f"response_format's schema cannot be followed: {type(exc).__name__}: {exc}") from None
    return schema


def _tool_choice(choice: Any) -> str | None:
    if isinstance(choice, dict):  # {"type": "function", "function": {"name": ...}}
        return str((choice.get("function") or {}).get("name", ""))
    return None if choice is None else str(choice)


def chat_completion(response: LLMResponse, *, created: int, number: int) -> dict[str, Any]:
    """``response`` as a Chat Completions body."""
    message: dict[str, Any] = {"role": "assistant", "content": response.text or None}
    if response.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in response.tool_calls
        ]
    finish = "tool_calls" if response.tool_calls else "stop"
    return {
        "id": f"chatcmpl-{number}",
        "object": "chat.completion",
        "created": created,
        "model": response.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage_of(response),
    }


def usage_of(response: LLMResponse) -> dict[str, Any]:
    """The answer's usage, in the OpenAI form (cached prompt tokens in ``prompt_tokens_details``)."""
    usage = response.usage
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def stream_chunks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A completion body as the chunks of a stream: the message, its end, then the usage."""
    choice = body["choices"][0]
    delta = {key: value for key, value in choice["message"].items() if value is not None}
    for n, call in enumerate(delta.get("tool_calls", [])):
        call["index"] = n
    base = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"], "model": body["model"]}
    return [
        {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]},
        {**base, "choices": [], "usage": body["usage"]},
    ]


class ModelServer:
    """The engine behind an HTTP server on ``host:port`` (port 0: a free one); see the module.

    Args:
        llm: The embedded model, with ``batch`` slots (and, as ``metaroles serve`` makes it, the prefix cache);
            or any other model (a test's), answering ``slots`` calls at once.
        host: Interface to listen on.
        port: Port, or 0 for any free one.
        max_waiting: Requests queued beyond the slots before the server answers 429.
        slots: Calls a model other than the embedded one answers at once.
    """

    def __init__(
        self, llm: LLM, *, host: str = "127.0.0.1", port: int = 0, max_waiting: int = 256, slots: int = 16
    ) -> None:
        """Bind the port (the model loads on :meth:`running`)."""
        if isinstance(llm, LocalLLM) and not llm.batch:
            raise ConfigError("the server decodes calls together: pass LocalLLM(batch=N) with N ≥ 1")
        if max_waiting < 0:
            raise ConfigError(f"max_waiting={max_waiting!r} must be 0 or more")
        self.llm, self.max_waiting = llm, max_waiting
        self.engine = llm.engine() if isinstance(llm, LocalLLM) else None
        self.slots = self.engine.slots if self.engine is not None else slots
        self.httpd = _HTTPServer((host, port), _Handler)
        self.httpd.model = self
        self.portal: BlockingPortal | None = None
        self.jobs: BatchJobs | None = None
        self._lock = threading.Lock()
        self._in_flight = self._numbered = 0

    @property
    def url(self) -> str:
        """The base URL a client is given (``…/v1``)."""
        return self.httpd.base_url

    @contextmanager
    def running(self) -> Iterator[ModelServer]:
        """Serve in a background thread until the block ends; then stop, and close the port."""
        with ExitStack() as stack:
            self.portal = stack.enter_context(start_blocking_portal())
            self.jobs = BatchJobs(self.batch_answer, self.portal)
            stack.enter_context(self.httpd.serving("metaroles-serve"))
            yield self

    def admit(self) -> bool:
        """Take a request if the engine's queue has room; the caller must :meth:`release` it."""
        with self._lock:
            if self._in_flight >= self.slots + self.max_waiting:
                return False
            self._in_flight += 1
            self._numbered += 1
            return True

    def release(self) -> None:
        """A request taken by :meth:`admit` is done."""
        with self._lock:
            self._in_flight -= 1

    def answer(self, request: LLMRequest) -> dict[str, Any]:
        """Complete ``request`` on the engine (from an HTTP thread) as a Chat Completions body."""
        assert self.portal is not None, "serve within running()"
        response = self.portal.call(self.llm.complete, request)
        return chat_completion(response, created=int(time.time()), number=self._numbered)

    async def batch_answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """Complete a batch's request (on the server's event loop) as a Chat Completions body."""
        request, _ = chat_request(body)
        with self._lock:
            self._numbered += 1
            number = self._numbered
        return chat_completion(await self.llm.complete(request), created=int(time.time()), number=number)

    def metrics(self) -> str:
        """The engine's counters in Prometheus' text format (none for a model that is not the engine)."""
        if self.engine is None:
            return ""
        counters, engine = self.engine.counters, self.engine
        rows = [
            ("requests_total", "counter", counters.requests),
            ("prompt_tokens_total", "counter", counters.prompt_tokens),
            ("prompt_tokens_cached_total", "counter", counters.cached_tokens),
            ("completion_tokens_total", "counter", counters.completion_tokens),
            ("requests_running", "gauge", engine.running),
            ("requests_waiting", "gauge", engine.waiting),
            ("slots", "gauge", engine.slots),
        ]
        return "".join(
            f"# TYPE metaroles_engine_{name} {kind}\nmetaroles_engine_{name} {value}\n" for name, kind, value in rows
        )


class _HTTPServer(EndpointServer):
    model: ModelServer


class _Handler(EndpointHandler):
    server: _HTTPServer

    def do_GET(self) -> None:
        if not self.addressed():
            return
        if self.path == "/metrics":
            self.send(200, self.server.model.metrics().encode(), "text/plain; version=0.0.4")
        elif self.path == "/health":
            self.json(200, {"status": "ok"})
        elif self.path.rstrip("/") == "/v1/models":
            self.json(200, {"object": "list", "data": [{"id": self.server.model.llm.model, "object": "model"}]})
        elif self.path.startswith(("/v1/files/", "/v1/batches")):
            self._batch_api(None)
        else:
            self.error(404, f"no route {self.path!r}; POST /v1/chat/completions", "not_found_error")

    def do_POST(self) -> None:
        if not self.addressed() or (length := self.body_length()) is None:
            return
        if self.path.startswith(("/v1/files", "/v1/batches")):
            self._batch_api(self.body(length))
            return
        if self.path.rstrip("/") != "/v1/chat/completions":
            self.error(404, f"no route {self.path!r}; POST /v1/chat/completions", "not_found_error", close=True)
            return
        if not self.server.model.admit():  # before the body is read: a full queue costs no memory
            self.error(429, "the engine's queue is full; retry after a second", "rate_limit_error", close=True)
            return
        try:
            body = self.body(length)
            if body is not None:
                self._complete(body)
        finally:
            self.server.model.release()

    def _complete(self, raw: bytes) -> None:
        try:
            request, stream = chat_request(json.loads(raw or b"null"))
            answer = self.server.model.answer(request)
        except RecursionError:  # JSON nested deeper than Python can read
            self.error(400, "the body's JSON is nested too deeply", "invalid_request_error")
            return
        except (ValueError, MetarolesError) as exc:  # a bad body, or a prompt that does not fit
            self.error(400, str(exc), "invalid_request_error")
            return
        except Exception as exc:  # the engine failed this call: the server goes on
            self.error(500, f"{type(exc).__name__}: {exc}", "server_error")
            return
        if not stream:
            self.json(200, answer)
            return
        events = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in stream_chunks(answer))
        self.send(200, (events + "data: [DONE]\n\n").encode(), "text/event-stream")

    def _batch_api(self, body: bytes | None) -> None:
        """A route of the Batch API (``llm.batch_jobs``); ``body``: a POST's (``None``: a GET)."""
        jobs = self.server.model.jobs
        assert jobs is not None, "serve within running()"
        parts = self.path.split("?")[0].strip("/").split("/")[1:]  # files/ID/content, batches/ID/cancel, ...
        try:
            if self.command == "POST" and body is None:
                return  # the body never came: answered already
            answer = _route(jobs, parts, self.command, body, self.headers.get("content-type") or "")
        except NotFound as exc:
            self.error(404, str(exc), "not_found_error")
            return
        except (Refused, ValueError, RecursionError) as exc:
            self.error(400, str(exc) or "the body's JSON is nested too deeply", "invalid_request_error")
            return
        if isinstance(answer, bytes):
            self.send(200, answer, "application/octet-stream")
        else:
            self.json(200, answer)


def _route(jobs: BatchJobs, parts: list[str], method: str, body: bytes | None, content_type: str) -> Any:
    """What a Batch API route answers (``parts``: the path after ``/v1``)."""
    match method, parts:
        case "POST", ["files"]:
            return jobs.upload(content_type, body or b"")
        case "GET", ["files", file_id]:
            return jobs.file(file_id)
        case "GET", ["files", file_id, "content"]:
            return jobs.content(file_id)
        case "POST", ["batches"]:
            return jobs.create(json.loads(body or b"null"))
        case "GET", ["batches"]:
            return jobs.batches()
        case "GET", ["batches", batch_id]:
            return jobs.batch(batch_id)
        case "POST", ["batches", batch_id, "cancel"]:
            return jobs.cancel(batch_id)
    raise NotFound(f"no route {method} /v1/{'/'.join(parts)}; the Batch API: POST /v1/files, POST /v1/batches")
