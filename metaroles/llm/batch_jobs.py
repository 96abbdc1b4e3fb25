"""OpenAI's Batch API on this machine's server: a file of requests in, answered together, a file of answers out.

``metaroles serve`` mounts it (``llm.serving``), so a run's ``--batch`` (``llm.batching``) can be tried
and tested against the embedded engine. The routes, as OpenAI's SDK calls them:

- ``POST /v1/files`` (multipart: ``file``, ``purpose``) → a file object; ``GET /v1/files/{id}`` and
  ``GET /v1/files/{id}/content``;
- ``POST /v1/batches`` (``input_file_id``, ``endpoint`` = ``/v1/chat/completions``, ``completion_window``
  = ``24h``, ``metadata``) → a batch object; ``GET /v1/batches/{id}``, ``POST /v1/batches/{id}/cancel``,
  ``GET /v1/batches``.

A batch's lines (``custom_id``, ``method``, ``url``, ``body``) are answered concurrently by the server's
model, so the engine decodes them together; the batch goes ``validating`` → ``in_progress`` →
``finalizing`` → ``completed``, its output file a line per answer (``{"id", "custom_id", "response":
{"status_code", "request_id", "body"}, "error"}``) and its error file a line per request that failed. A
file whose lines are not requests fails the batch with the lines' errors, as OpenAI's does. Files and
batches live in the server's memory: a server started again knows none of them.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Awaitable, Callable
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

import anyio
from anyio import CancelScope
from anyio.from_thread import BlockingPortal

CHAT = "/v1/chat/completions"
"""The one endpoint a batch's requests may go to here."""
WINDOW = "24h"
"""The one completion window (OpenAI's)."""

Answer = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
"""A Chat Completions body → the completion's body; raises ``ValueError`` for a request the server cannot take."""


class NotFound(LookupError):
    """No file or batch of that id (answered 404)."""


class Refused(ValueError):
    """A request the batch API cannot take (answered 400 with this message)."""


class BatchJobs:
    """The files and batches of one server (see the module).

    Args:
        answer: How the server answers one chat request (on ``portal``'s event loop).
        portal: Where batches run (the server's event loop, in its own thread).
    """

    def __init__(self, answer: Answer, portal: BlockingPortal) -> None:
        """No file, no batch yet."""
        self.answer, self.portal = answer, portal
        self._lock = threading.Lock()
        self._files: dict[str, tuple[dict[str, Any], bytes]] = {}
        self._batches: dict[str, dict[str, Any]] = {}
        self._scopes: dict[str, CancelScope] = {}
        self._ended: dict[str, anyio.Event] = {}
        self._count = 0

    def _next(self, prefix: str) -> str:
        with self._lock:
            self._count += 1
            return f"{prefix}-{self._count}"

    def upload(self, content_type: str, data: bytes) -> dict[str, Any]:
        """Keep the file a multipart ``POST /v1/files`` body holds; its file object."""
        parts = form_parts(content_type, data)
        if "file" not in parts or not parts.get("purpose"):
            raise Refused("POST /v1/files takes a multipart form with a 'file' and a 'purpose' (e.g. purpose=batch)")
        filename, content = parts["file"]
        return self.keep(filename or "upload.jsonl", content, purpose=parts["purpose"][1].decode(errors="replace"))

    def keep(self, filename: str, content: bytes, *, purpose: str) -> dict[str, Any]:
        """Keep ``content`` as a file; its file object."""
        file_id = self._next("file")
        record = {"id": file_id, "object": "file", "bytes": len(content), "created_at": int(time.time()),
                  "filename": filename, "purpose": purpose, "status": "processed"}  # fmt: skip
        with self._lock:
            self._files[file_id] = (record, content)
        return record

    def file(self, file_id: str) -> dict[str, Any]:
        """A file's object."""
        return self._file(file_id)[0]

    def content(self, file_id: str) -> bytes:
        """A file's bytes."""
        return self._file(file_id)[1]

    def _file(self, file_id: str) -> tuple[dict[str, Any], bytes]:
        with self._lock:
            if file_id not in self._files:
                raise NotFound(f"no file {file_id!r} on this server (it keeps files in memory until it stops)")
            return self._files[file_id]

    def create(self, body: Any) -> dict[str, Any]:
        """Start the batch ``POST /v1/batches`` asks for; its batch object."""
        if not isinstance(body, dict) or not isinstance(body.get("input_file_id"), str):
            raise Refused("POST /v1/batches takes a JSON object with an 'input_file_id' (a file uploaded to /v1/files)")
        if body.get("endpoint") != CHAT:
            raise Refused(f"endpoint={body.get('endpoint')!r}: this server answers batches of {CHAT!r} only")
        if body.get("completion_window") != WINDOW:
            raise Refused(f"completion_window={body.get('completion_window')!r} must be {WINDOW!r}")
        try:
            content = self.content(body["input_file_id"])
        except NotFound as exc:
            raise Refused(str(exc)) from None
        batch = {"id": self._next("batch"), "object": "batch", "endpoint": CHAT, "errors": None,
                 "input_file_id": body["input_file_id"], "completion_window": WINDOW, "status": "validating",
                 "output_file_id": None, "error_file_id": None, "created_at": int(time.time()),
                 "in_progress_at": None, "completed_at": None, "cancelled_at": None, "failed_at": None,
                 "request_counts": {"total": 0, "completed": 0, "failed": 0},
                 "metadata": body.get("metadata")}  # fmt: skip
        lines, errors = requests_in(content)
        with self._lock:
            self._batches[batch["id"]] = batch
            if errors:
                batch.update(status="failed", failed_at=int(time.time()), errors={"object": "list", "data": errors})
            else:
                batch.update(status="in_progress", in_progress_at=int(time.time()))
                batch["request_counts"]["total"] = len(lines)
        if not errors:
            self._ended[batch["id"]] = self.portal.call(anyio.Event)
            self.portal.start_task_soon(self._run, batch, lines)
        return self._copy(batch["id"])

    def batch(self, batch_id: str) -> dict[str, Any]:
        """A batch's object as it is now (``GET /v1/batches/{id}``: a client asking after it)."""
        return self._copy(batch_id)

    def _copy(self, batch_id: str) -> dict[str, Any]:
        with self._lock:
            if batch_id not in self._batches:
                raise NotFound(f"no batch {batch_id!r} on this server (it keeps batches in memory until it stops)")
            copy: dict[str, Any] = json.loads(json.dumps(self._batches[batch_id]))
            return copy

    async def ended(self, batch_id: str) -> dict[str, Any]:
        """A batch's object once it has ended (on the server's event loop: ``portal.call``)."""
        event = self._ended.get(batch_id)
        if event is not None:
            await event.wait()
        return self._copy(batch_id)

    def batches(self) -> dict[str, Any]:
        """Every batch, newest first."""
        with self._lock:
            ids = list(self._batches)[::-1]
        return {"object": "list", "data": [self._copy(i) for i in ids], "has_more": False}

    def cancel(self, batch_id: str) -> dict[str, Any]:
        """Stop a batch: what was answered is kept in its output file."""
        batch = self._copy(batch_id)
        with self._lock:
            if batch["status"] in ("validating", "in_progress"):
                self._batches[batch_id]["status"] = "cancelling"
                scope = self._scopes.get(batch_id)
                if scope is not None:
                    self.portal.start_task_soon(_cancel, scope)
        return self._copy(batch_id)

    async def _run(self, batch: dict[str, Any], lines: list[dict[str, Any]]) -> None:
        """Answer every line at once, then write the output and error files."""
        done: list[dict[str, Any] | None] = [None] * len(lines)
        with anyio.CancelScope() as scope:
            with self._lock:
                self._scopes[batch["id"]] = scope
            async with anyio.create_task_group() as tg:
                for n, line in enumerate(lines):
                    tg.start_soon(self._one, batch, n, line, done)
        with self._lock:
            self._scopes.pop(batch["id"], None)
            cancelled = batch["status"] == "cancelling"
            batch["status"] = "finalizing"
        answered = [d for d in done if d is not None]
        good = [d for d in answered if d["response"]["status_code"] == 200]
        bad = [d for d in answered if d["response"]["status_code"] != 200]
        files = {key: self.keep(f"{batch['id']}_{key}.jsonl", _jsonl(rows), purpose="batch_output")["id"]
                 for key, rows in (("output", good), ("error", bad)) if rows}  # fmt: skip
        with self._lock:
            batch.update(output_file_id=files.get("output"), error_file_id=files.get("error"))
            ended = ("cancelled", "cancelled_at") if cancelled else ("completed", "completed_at")
            batch.update({"status": ended[0], ended[1]: int(time.time())})
        self._ended[batch["id"]].set()

    async def _one(self, batch: dict[str, Any], n: int, line: dict[str, Any], done: list[Any]) -> None:
        request_id = f"{batch['id']}-req-{n + 1}"
        try:
            status, body = 200, await self.answer(line["body"])
        except ValueError as exc:  # the request itself: a 400, as the chat route answers it
            status, body = 400, {"error": {"message": str(exc), "type": "invalid_request_error"}}
        except Exception as exc:  # the model failed this one: the batch goes on
            status, body = 500, {"error": {"message": f"{type(exc).__name__}: {exc}", "type": "server_error"}}
        done[n] = {"id": request_id, "custom_id": line["custom_id"], "error": None,
                   "response": {"status_code": status, "request_id": request_id, "body": body}}  # fmt: skip
        with self._lock:
            batch["request_counts"]["completed" if status == 200 else "failed"] += 1


async def _cancel(scope: CancelScope) -> None:
    scope.cancel()


def requests_in(content: bytes) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A batch file's requests, or the errors of its lines (each names its line, as OpenAI's batch errors do)."""
    lines: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, raw in enumerate(content.splitlines(), start=1):
        if not raw.strip():
            continue
        problem = _problem(raw, seen)
        if isinstance(problem, str):
            errors.append({"code": "invalid_request", "message": problem, "param": None, "line": number})
        else:
            lines.append(problem)
    if not lines and not errors:
        errors.append({"code": "empty_file", "message": "the input file holds no request", "param": None, "line": None})
    return lines, errors


def _problem(raw: bytes, seen: set[str]) -> dict[str, Any] | str:
    """The request a line holds, or what is wrong with it."""
    try:
        line = json.loads(raw)
    except (ValueError, RecursionError):
        return "the line is not JSON"
    if not isinstance(line, dict) or not isinstance(line.get("custom_id"), str) or not line["custom_id"]:
        return "each line must be an object with a 'custom_id' string"
    if line["custom_id"] in seen:
        return f"custom_id {line['custom_id']!r} is used twice; each request needs its own"
    if line.get("method") != "POST" or line.get("url") != CHAT or not isinstance(line.get("body"), dict):
        return f"each line must POST a 'body' object to {CHAT!r}"
    seen.add(line["custom_id"])
    return line


def form_parts(content_type: str, data: bytes) -> dict[str, tuple[str | None, bytes]]:
    """A ``multipart/form-data`` body's fields: name → (file name, bytes)."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise Refused(f"Content-Type {content_type!r}: POST /v1/files takes multipart/form-data")
    message = BytesParser(policy=HTTP).parsebytes(b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + data)
    parts: dict[str, tuple[str | None, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if isinstance(name, str) and isinstance(payload, bytes):
            parts[name] = (part.get_filename(), payload)
    return parts


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()
