"""Record / replay cassettes: a run's model calls on disk, answered again bit for bit.

A cassette is a JSONL file, one call a line: the request's hash, who asked (role, action), the
normalised request and the response. The hash covers what determines the answer — model,
messages, tools, tool choice, output schema and sampling parameters — and nothing incidental
(no timestamps, no ids). Replay answers each hash's recorded responses in the order they were
recorded for the same role and action, so concurrent roles asking the same question each get
their own answer back.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict, deque
from enum import StrEnum
from pathlib import Path
from typing import Any
from warnings import warn

from pydantic import ValidationError

from metaroles.core.exceptions import ConfigError, RunError
from metaroles.core.files import write_atomic
from metaroles.core.text import jsonl_lines
from metaroles.llm.protocol import LLM, LLMRequest, LLMResponse


class CassetteMode(StrEnum):
    """What a :class:`CassetteLLM` does with each call."""

    RECORD = "record"
    """Ask the wrapped model and append the exchange to the cassette."""
    REPLAY = "replay"
    """Answer from the cassette only; a miss is an error."""
    REPLAY_OR_LIVE = "replay_or_live"
    """Answer from the cassette; on a miss ask the wrapped model (and record it)."""


class CassetteMiss(RunError):
    """Replay found no recorded answer for a request (names role, action and hash)."""


RUN_LINE = "run"
"""The ``kind`` of a cassette's first line when it says what run it recorded (its seed): a replay takes it."""


def recorded_run(path: str | Path) -> dict[str, Any]:
    """What a cassette's first line says of the run it recorded (``{}``: nothing, or no such file)."""
    try:
        with Path(path).open(encoding="utf-8") as file:
            first = json.loads(file.readline(1 << 16) or "{}")
    except (OSError, ValueError, RecursionError):
        return {}
    return first if isinstance(first, dict) and first.get("kind") == RUN_LINE else {}


def request_key(request: LLMRequest, model: str) -> str:
    """A stable hash of what determines the answer to ``request`` from ``model``."""
    normalised = {
        "model": model,
        "messages": request.messages,
        "tools": request.tools,
        "tool_choice": request.tool_choice,
        "schema": request.output_schema,
        "params": {"temperature": request.temperature, "max_tokens": request.max_tokens, "seed": request.seed},
    }
    text = json.dumps(normalised, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class CassetteLLM:
    """Wrap a model (or nothing, for pure replay) with a cassette file.

    Args:
        path: The JSONL cassette.
        mode: record, replay or replay_or_live.
        inner: The live model; required unless ``mode`` is replay.
        model: The model name keyed into hashes (default: ``inner.model``, else the cassette's).

    Raises:
        ConfigError: On a mode needing a live model without one, or an unreadable cassette.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        mode: CassetteMode | str,
        inner: LLM | None = None,
        model: str | None = None,
        run: dict[str, Any] | None = None,
    ) -> None:
        """Open the cassette: record starts it afresh (``run``: its first line, of the run), replays read it."""
        self.path = Path(path)
        self.mode = CassetteMode(mode)
        if inner is None and self.mode is not CassetteMode.REPLAY:
            raise ConfigError(f"cassette mode {self.mode.value!r} needs a live model: pass inner=...")
        self.inner = inner
        self.model = model or (inner.model if inner is not None else "")
        self._recorded: dict[tuple[str, str, str], deque[dict[str, Any]]] = defaultdict(deque)
        self._by_key: dict[str, deque[dict[str, Any]]] = defaultdict(deque)
        if self.mode is CassetteMode.RECORD:
            if self.path.is_dir():
                raise ConfigError(
                    f"cassette {str(self.path)!r} is a folder; name a file to record into, e.g. calls.jsonl"
                )
            self.path.parent.mkdir(parents=True, exist_ok=True)
            header = json.dumps({"kind": RUN_LINE, **run}, sort_keys=True) + "\n" if run is not None else ""
            self.path.write_text(header, encoding="utf-8")
        else:
            self._load()

    def _load(self) -> None:
        if not self.path.exists():
            if self.mode is CassetteMode.REPLAY:
                raise ConfigError(f"cassette {str(self.path)!r} does not exist; record it first (mode='record')")
            return
        if self.path.is_dir():
            raise ConfigError(f"cassette {str(self.path)!r} is a folder; name the recorded file")
        try:
            text = self.path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"cassette {str(self.path)!r} is not UTF-8 text (byte {exc.start}); record it again"
            ) from None
        lines = jsonl_lines(text)
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                if number == 1 and isinstance(entry, dict) and entry.get("kind") == RUN_LINE:
                    continue  # what the cassette says of the run it recorded (recorded_run)
                key, role, action = entry["key"], entry["role"], entry["action"]
            except (json.JSONDecodeError, KeyError, TypeError, RecursionError) as exc:
                if number == len(lines) and not text.endswith("\n"):  # the write a kill cut short
                    self._drop_torn(text, number)
                    return
                raise ConfigError(f"cassette {str(self.path)!r} line {number} is not a recorded call: {exc}") from None
            entry["response"] = self._response(entry, number)
            self._recorded[(key, role, action)].append(entry)
            self._by_key[key].append(entry)
            self.model = self.model or str(entry.get("model", ""))

    def _response(self, entry: dict[str, Any], number: int) -> LLMResponse:
        """The recorded answer, checked now: a replay never puts negative tokens or costs into the ledger.

        Raises:
            ConfigError: Naming the line and what is wrong with it.
        """
        if "response" not in entry:
            raise ConfigError(f"cassette {str(self.path)!r} line {number} has no response; record it again")
        try:
            return LLMResponse.model_validate(entry["response"])
        except ValidationError as exc:
            problem = exc.errors()[0]
            where = ".".join(str(p) for p in problem["loc"])
            raise ConfigError(
                f"cassette {str(self.path)!r} line {number}: response.{where}={problem.get('input')!r}: "
                f"{problem['msg']}; record it again"
            ) from None

    def _drop_torn(self, text: str, number: int) -> None:
        """Forget a last line cut short by a kill; a cassette that goes on recording is cut back to its whole lines."""
        warn(
            f"cassette {str(self.path)!r}: line {number} was cut short (the run was killed); it is dropped",
            stacklevel=4,
        )
        if self.mode is not CassetteMode.REPLAY:
            write_atomic(self.path, text[: text.rfind("\n") + 1])

    def _take(self, key: str, role: str, action: str) -> dict[str, Any] | None:
        queued = self._recorded.get((key, role, action))
        if queued:
            entry = queued.popleft()
            self._by_key[key].remove(entry)
            return entry
        shared = self._by_key.get(key)
        if shared:
            entry = shared.popleft()
            self._recorded[(key, entry["role"], entry["action"])].remove(entry)
            return entry
        return None

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Answer from the cassette or the live model, per the mode.

        Raises:
            CassetteMiss: In replay mode, when nothing was recorded for the request.
        """
        key = request_key(request, self.model)
        if self.mode is not CassetteMode.RECORD:
            entry = self._take(key, request.role, request.action)
            if entry is not None:
                response: LLMResponse = entry["response"]
                return response
            if self.mode is CassetteMode.REPLAY:
                raise CassetteMiss(
                    f"cassette {str(self.path)!r} has no answer for role {request.role!r}, action "
                    f"{request.action!r}, request hash {key}; re-record with mode='record' or use 'replay_or_live'"
                )
        assert self.inner is not None  # checked in __init__
        response = await self.inner.complete(request)
        self._append(key, request, response)
        return response

    def _append(self, key: str, request: LLMRequest, response: LLMResponse) -> None:
        entry = {
            "key": key,
            "model": self.model,
            "role": request.role,
            "action": request.action,
            "request": request.model_dump(mode="json", exclude={"role", "action"}),
            "response": response.model_dump(mode="json"),
        }
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry, sort_keys=True, ensure_ascii=False) + "\n")
