"""A round's calls as one batch: OpenAI's Batch API (files and batches), for ``metaroles run --batch``.

:class:`BatchedLLM` stands where a server's client stands. The calls that arrive together — a round's:
the bus runs its roles' turns at once — wait until every other task of the run is waiting too (or
until no call joined them for ``gather`` seconds), then go as one JSONL file to ``POST /files`` and
one ``POST /batches``; the batch is asked after, less and less often, until it ends (at most
``deadline`` seconds), and each call gets its line of the output file. The answers are the server's
own completions: the cassette, the ledger and the run record them as any call's.

A request's ``custom_id`` is its hash (``llm.cassette.request_key``) and its count among the same
requests in the batch. Pending batches are kept in ``journal`` (a run directory's ``batches.json``)
from their creation to their end: a run killed while its batch is pending, or stopped by the
deadline, asks for no new one when resumed — the same calls are answered from the batch it left, once
it ends. The file is deleted when no batch is pending: a run's directory is the same whether it was
killed or not. A batch the server no longer knows (it was restarted) is sent again.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import openai

from metaroles.core.exceptions import ProviderError
from metaroles.core.files import write_atomic
from metaroles.core.text import redacted
from metaroles.llm.cassette import request_key
from metaroles.llm.openai_compat import OpenAICompatibleLLM
from metaroles.llm.protocol import LLMRequest, LLMResponse

CHAT = "/v1/chat/completions"
ENDED = ("completed", "failed", "expired", "cancelled")
"""A batch's statuses once it has ended."""
FIRST_POLL, MAX_POLL = 0.2, 10.0
"""Seconds before a batch is first asked after, growing by half each time up to the most."""
DAY = 86_400.0
"""The Batch API's completion window, and the deadline unless the run sets another."""


class BatchPending(ProviderError):
    """A batch did not end within the deadline; it is kept pending (a resumed run waits for it again)."""


@dataclass
class _Call:
    request: LLMRequest
    custom_id: str = ""
    response: LLMResponse | None = None
    error: BaseException | None = None
    lead: bool = False
    wake: anyio.Event = field(default_factory=anyio.Event)

    @property
    def answered(self) -> bool:
        return self.response is not None or self.error is not None


class BatchedLLM:
    """Send the calls that come together as one batch of an OpenAI-compatible server (see the module).

    Args:
        endpoint: The server's client: its model, request bodies, answers and SDK client.
        journal: Where pending batches are kept (``None``: in memory only: a killed run's batch is lost).
        deadline: Seconds a batch may take before the call fails with :class:`BatchPending`.
        gather: Seconds the calls wait for another to join them while some task is busy (one that never waits).
        sleep: How to wait between asking after a batch.
    """

    def __init__(
        self,
        endpoint: OpenAICompatibleLLM,
        *,
        journal: str | Path | None = None,
        deadline: float = DAY,
        gather: float = 2.0,
        sleep: Callable[[float], Awaitable[object]] = anyio.sleep,
    ) -> None:
        """Batch ``endpoint``'s calls; a journal that names pending batches is taken up."""
        self.endpoint, self.model = endpoint, endpoint.model
        self.journal = Path(journal) if journal is not None else None
        self.deadline, self.gather, self._sleep = deadline, gather, sleep
        self._waiting: list[_Call] = []
        self._leading = False
        self._pending: dict[str, list[str]] = _read_journal(self.journal)
        self._answers: dict[str, tuple[int, dict[str, Any]]] = {}
        self.batches = 0
        """Batches this client created."""

    def __repr__(self) -> str:
        """The model, where, and that its calls go in batches."""
        where = redacted(self.endpoint.base_url)
        return f"BatchedLLM(model={self.model!r}, base_url={where!r}: a round's calls a batch)"

    @property
    def inner(self) -> OpenAICompatibleLLM:
        """The server's client the batches go through."""
        return self.endpoint

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Answer ``request`` from the batch it joins.

        Raises:
            ProviderError: When the server refused the batch or the request, or the batch failed.
            BatchPending: When the batch did not end within the deadline.
        """
        call = _Call(request)
        self._waiting.append(call)
        if not self._leading:
            self._leading = call.lead = True
        while not call.answered:
            if call.lead:
                call.lead = False
                try:
                    await self._send()
                finally:
                    self._pass_lead()
            else:
                await call.wake.wait()
                call.wake = anyio.Event()
        if call.error is not None:
            raise call.error
        assert call.response is not None
        return call.response

    def _pass_lead(self) -> None:
        """The first call still waiting sends the next batch."""
        if self._waiting:
            self._waiting[0].lead = True
            self._waiting[0].wake.set()
        else:
            self._leading = False

    async def _send(self) -> None:
        """Once the run is still, send every waiting call as one batch (or take them from a pending one)."""
        while True:  # until every other task waits, or no call joined for ``gather`` seconds
            joined = len(self._waiting)
            with anyio.move_on_after(self.gather) as waited:
                await anyio.wait_all_tasks_blocked()
            if not waited.cancelled_caught or len(self._waiting) == joined:
                break
        calls, self._waiting = self._waiting, []
        try:
            await self._answer(calls)
        except BaseException as exc:
            failed = exc if isinstance(exc, Exception) else ProviderError("the call sending the batch was stopped")
            for call in calls:
                if not call.answered:
                    call.error = failed
            raise
        finally:
            for call in calls:
                call.wake.set()

    async def _answer(self, calls: list[_Call]) -> None:
        counts: Counter[str] = Counter()
        for call in calls:
            key = request_key(call.request, self.model)
            call.custom_id = f"{key}-{counts[key]}"
            counts[key] += 1
        wanted = {call.custom_id for call in calls} - set(self._answers)
        for batch_id, ids in list(self._pending.items()):  # a batch a killed run left: its answers, once it ends
            if wanted & set(ids):
                self._answers |= await self._outcome(batch_id)
        new = [call for call in calls if call.custom_id not in self._answers]
        if new:
            self._answers |= await self._outcome(await self._create(new))
        for call in calls:
            self._settle(call)

    def _settle(self, call: _Call) -> None:
        """Give ``call`` its answer (or what went wrong with it)."""
        outcome = self._answers.pop(call.custom_id, None)
        request = call.request
        said = f"{self.model!r} (batch) for role {request.role!r}, action {request.action!r}"
        if outcome is None:
            call.error = ProviderError(f"{said}: the batch ended without answering it; run again")
            return
        status, body = outcome
        if status != 200:
            message = ((body.get("error") or {}) if isinstance(body, dict) else {}).get("message", body)
            call.error = ProviderError(f"{said}: the server answered {status}: {message}")
            return
        try:
            call.response = self.endpoint.answer_of(body)
        except ProviderError as exc:
            call.error = exc

    async def _create(self, calls: list[_Call]) -> str:
        """Upload the calls' requests and start their batch; it is kept in the journal until it ends."""
        lines = [
            {"custom_id": c.custom_id, "method": "POST", "url": CHAT, "body": self.endpoint.request_body(c.request)}
            for c in calls
        ]
        data = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode()
        client = self.endpoint.client
        uploaded = await self._api("upload the batch's file (POST /files)", client.files.create,
                                   file=("requests.jsonl", data), purpose="batch")  # fmt: skip
        batch = await self._api("start the batch (POST /batches)", client.batches.create,
                                input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")  # fmt: skip
        self.batches += 1
        self._pending[batch.id] = [c.custom_id for c in calls]
        self._write_journal()
        return str(batch.id)

    async def _outcome(self, batch_id: str) -> dict[str, tuple[int, dict[str, Any]]]:
        """A batch's answers by ``custom_id``, once it has ended (none for a batch the server does not know)."""
        client, started, wait = self.endpoint.client, time.monotonic(), FIRST_POLL
        while True:
            try:
                batch = await self._api(f"ask after batch {batch_id!r}", client.batches.retrieve, batch_id)
            except ProviderError as exc:
                if isinstance(exc.__cause__, openai.NotFoundError):  # the server forgot it: the calls go again
                    self._forget(batch_id)
                    return {}
                raise
            if batch.status in ENDED:
                break
            if time.monotonic() - started + wait > self.deadline:
                raise BatchPending(
                    f"batch {batch_id!r} of {self.endpoint.base_url} is still {batch.status!r} after "
                    f"{self.deadline:g} s (the batch deadline); it is kept pending: resume the run to wait for it again"
                )
            await self._sleep(wait)
            wait = min(MAX_POLL, wait * 1.5)
        answers: dict[str, tuple[int, dict[str, Any]]] = {}
        for file_id in (batch.output_file_id, batch.error_file_id):
            if file_id:
                answers |= _lines(await self._api(f"read batch {batch_id!r}'s answers", client.files.content, file_id))
        self._forget(batch_id)
        if batch.status == "failed" and not answers:
            errors = "; ".join(f"line {e.line}: {e.message}" for e in (batch.errors.data if batch.errors else []) or [])
            raise ProviderError(f"batch {batch_id!r} of {self.endpoint.base_url} failed: {errors or 'no reason given'}")
        return answers

    async def _api(self, what: str, call: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
        """One Batch API request, retried as a chat call is (connection, 429, 5xx), errors said in one line."""
        endpoint = self.endpoint
        for attempt in range(endpoint.max_retries + 1):
            try:
                with anyio.fail_after(endpoint.timeout):
                    return await call(*args, **kwargs)
            except (openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError, TimeoutError) as exc:
                if attempt == endpoint.max_retries:
                    raise ProviderError(f"could not {what} at {endpoint.base_url}: {exc}; check the server") from exc
                await self._sleep(min(MAX_POLL, endpoint.backoff * 2**attempt))
            except openai.APIStatusError as exc:
                missing = exc.status_code in (404, 405, 501) and what.startswith(("upload", "start"))
                hint = "; the server has no Batch API: drop --batch" if missing else ""
                raise ProviderError(
                    f"could not {what} at {endpoint.base_url}: {exc.status_code} {_message(exc)}{hint}"
                ) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _forget(self, batch_id: str) -> None:
        if self._pending.pop(batch_id, None) is not None:
            self._write_journal()

    def _write_journal(self) -> None:
        if self.journal is None:
            return
        if self._pending:
            write_atomic(self.journal, json.dumps({"pending": self._pending}, indent=1) + "\n")
        else:
            self.journal.unlink(missing_ok=True)


def _read_journal(journal: Path | None) -> dict[str, list[str]]:
    """The pending batches a journal names (none when it is missing or not one)."""
    if journal is None or not journal.is_file():
        return {}
    try:
        pending = json.loads(journal.read_text(encoding="utf-8")).get("pending")
    except (OSError, ValueError, AttributeError, RecursionError):
        return {}
    if not isinstance(pending, dict):
        return {}
    return {str(k): [str(i) for i in v] for k, v in pending.items() if isinstance(v, list)}


def _lines(content: Any) -> dict[str, tuple[int, dict[str, Any]]]:
    """An output or error file's answers by ``custom_id``: (status, body)."""
    answers: dict[str, tuple[int, dict[str, Any]]] = {}
    for raw in content.text.splitlines():
        try:
            line = json.loads(raw)
            response = line.get("response") or {}
            status = int(response.get("status_code") or 500)
            body = response.get("body")
            answers[str(line["custom_id"])] = (status, body if isinstance(body, dict) else {"error": line.get("error")})
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
            continue  # a line that is no answer: its call is told the batch did not answer it
    return answers


def _message(exc: openai.APIStatusError) -> str:
    body: dict[str, Any] = exc.body if isinstance(exc.body, dict) else {}
    error = body.get("error")
    return str((error if isinstance(error, dict) else body).get("message") or exc.message)
