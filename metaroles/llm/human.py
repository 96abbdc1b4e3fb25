"""People in the loop: a person answers for a role, at a terminal or on the watch page (MetaGPT's ``is_human``).

:class:`HumanLLM` stands where a role's model stands. A request from one of its ``seats`` (role
names; all, when none are named) is put to a person through a :class:`Desk` — :class:`TerminalDesk`
asks on the terminal, :class:`PageDesk` holds the question for the watch page — and the person's
text is the answer; any other request, and a question nobody answered in time (or answered with
something the request's schema refuses), goes to the model it wraps: the role's default. A person
costs no tokens. Wrapped in a cassette as any model is (``--record``), the person's answers are
recorded, so the run replays and forks without them.

A request that wants structured output is answered field by field in plain words: a single field
by its value (``Ben``; ``yes``), several as ``name=value`` pairs (``save=yes poison=nobody``), or JSON.
"""

from __future__ import annotations

import itertools
import json
import select
import sys
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TextIO

import anyio

from metaroles.core.exceptions import InvalidValueError
from metaroles.llm.protocol import LLM, LLMRequest, LLMResponse

__all__ = ["Desk", "HumanLLM", "HumanQuestion", "PageDesk", "TerminalDesk", "find_human", "parse_answer"]

HUMAN_SECONDS = 120.0
"""How long a person has to answer before the role's default answers (``HumanLLM(timeout=...)``)."""


PERSON = "person"
"""The model a person's answer names (in the cassette, the ledger, the events and exports): not a model's."""


@dataclass(frozen=True)
class HumanQuestion:
    """What a person is asked for a role: the prompt, and the fields a structured answer has."""

    number: int
    role: str
    action: str
    prompt: str
    fields: dict[str, list[str]] = field(default_factory=dict)
    """Each field of a structured answer and the values it takes (empty: any text)."""
    refused: str | None = None
    """The person's last answer, when it was not one of the choices (they are asked again)."""

    def choices(self) -> str:
        """The answers it takes, in words (``target: Ann/Ben; save: yes/no``)."""
        return "; ".join(f"{k}: {'/'.join(v) or 'any text'}" for k, v in self.fields.items())

    def as_data(self) -> dict[str, Any]:
        """The question as JSON data (what the watch page shows)."""
        return {"number": self.number, "role": self.role, "action": self.action, "prompt": self.prompt,
                "fields": self.fields, "refused": self.refused}  # fmt: skip


class Desk(Protocol):
    """Where a person is asked: returns their text, or ``None`` when no answer came within ``seconds``."""

    async def ask(self, question: HumanQuestion, seconds: float) -> str | None:
        """The person's answer to ``question``."""
        ...


class TerminalDesk:
    """Asks on the terminal: the question on ``prompt_to`` (stderr), the answer a line of ``answers_from`` (stdin)."""

    def __init__(self, answers_from: TextIO | None = None, prompt_to: TextIO | None = None) -> None:
        self.answers_from = answers_from or sys.stdin
        self.prompt_to = prompt_to or sys.stderr
        self._lock = threading.Lock()

    async def ask(self, question: HumanQuestion, seconds: float) -> str | None:
        """Print the question, wait up to ``seconds`` for a line."""
        return await anyio.to_thread.run_sync(self._ask, question, seconds, abandon_on_cancel=True)

    def _ask(self, question: HumanQuestion, timeout: float) -> str | None:
        with self._lock:  # one question at a time on one terminal
            choices = question.choices()
            if question.refused is not None:
                self.prompt_to.write(f"{question.refused!r} is not a choice ({choices or 'any text'}); try again\n")
            else:
                self.prompt_to.write(f"\n[{question.role} — your turn] {question.prompt}\n")
            self.prompt_to.write(f"answer ({choices}) > " if choices else "answer > ")
            self.prompt_to.flush()
            ready, _, _ = select.select([self.answers_from], [], [], timeout)
            if not ready:
                self.prompt_to.write("(no answer: the role's default answers)\n")
                return None
            line = self.answers_from.readline()
            return line.rstrip("\n") if line else None


class PageDesk:
    """Holds questions for the watch page until a person answers there (:meth:`answer`); safe from any thread."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._waiting: dict[int, HumanQuestion] = {}
        self._answers: dict[int, str] = {}

    def pending(self) -> list[HumanQuestion]:
        """The questions waiting for an answer, oldest first."""
        with self._cond:
            return sorted(self._waiting.values(), key=lambda q: q.number)

    def answer(self, number: int, text: str) -> None:
        """A person's answer to question ``number``.

        Raises:
            InvalidValueError: If no such question waits (answered already, or timed out).
        """
        with self._cond:
            if number not in self._waiting:
                raise InvalidValueError(f"question {number} waits for no answer (answered, or its time ran out)")
            self._answers[number] = text
            del self._waiting[number]
            self._cond.notify_all()

    async def ask(self, question: HumanQuestion, seconds: float) -> str | None:
        """Hold ``question`` until it is answered, or for ``seconds``."""
        with self._cond:
            self._waiting[question.number] = question
        return await anyio.to_thread.run_sync(self._wait, question.number, seconds, abandon_on_cancel=True)

    def _wait(self, number: int, timeout: float) -> str | None:
        with self._cond:
            self._cond.wait_for(lambda: number in self._answers, timeout)
            self._waiting.pop(number, None)
            return self._answers.pop(number, None)


class HumanLLM:
    """A person answers the requests of the roles in ``seats`` (all: ``None``); ``inner`` answers the rest.

    Args:
        inner: The model that answers for everyone else, and for a person who does not answer in time
            (the role's default).
        desk: Where the person is asked.
        seats: The roles a person plays (``None``: every request comes to the desk).
        timeout: Seconds a person has for each answer.
    """

    def __init__(
        self, inner: LLM, desk: Desk, *, seats: Collection[str] | None = None, timeout: float = HUMAN_SECONDS
    ) -> None:
        if not (isinstance(timeout, int | float) and timeout > 0):
            raise InvalidValueError(f"timeout={timeout!r} must be a positive number of seconds, e.g. 120")
        self.inner, self.desk, self.timeout = inner, desk, float(timeout)
        self.seats: set[str] | None = None if seats is None else set(seats)
        """The roles a person plays (a run adds its roles that say ``is_human=True``)."""
        self.model = inner.model  # a cassette keys the person's answers as the model's: replay needs no person
        self._numbers = itertools.count(1)

    def __repr__(self) -> str:
        seats = "every role" if self.seats is None else ", ".join(sorted(self.seats))
        return f"HumanLLM({seats}; else {self.inner!r})"

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """The person's answer for a seat's request (else, or with no answer in time, the default's).

        An answer that is not one of the choices is refused, saying so, and the person asked again
        while their time lasts. A person's answer says who gave it: its model is :data:`PERSON`.
        """
        if self.seats is not None and request.role not in self.seats:
            return await self.inner.complete(request)
        question = _question(next(self._numbers), request)
        deadline = anyio.current_time() + self.timeout
        while (left := deadline - anyio.current_time()) > 0:
            text = await self.desk.ask(question, left)
            if text is None:
                break
            answer = parse_answer(text, request.output_schema)
            if answer is not None:
                return LLMResponse(text=answer, model=PERSON)
            question = replace(question, number=next(self._numbers), refused=text)
        return await self.inner.complete(request)


def _question(number: int, request: LLMRequest) -> HumanQuestion:
    prompt = str(request.messages[-1].get("content") or "") if request.messages else ""
    fields = {name: [str(v) for v in values] for name, values in _fields(request.output_schema or {}).items()}
    return HumanQuestion(number=number, role=request.role, action=request.action, prompt=prompt, fields=fields)


def _fields(schema: Mapping[str, Any]) -> dict[str, list[Any]]:
    """A structured answer's fields and the values each takes (booleans: yes/no; free: none listed)."""
    found: dict[str, list[Any]] = {}
    for name, spec in schema.get("properties", {}).items():
        if "enum" in spec:
            found[name] = list(spec["enum"])
        elif spec.get("type") == "boolean":
            found[name] = ["yes", "no"]
        else:
            found[name] = []
    return found


def parse_answer(text: str, schema: Mapping[str, Any] | None) -> str | None:
    """A person's words as the answer's text: as typed, or the JSON a schema asks for (``None``: not an answer)."""
    text = text.strip()
    if not schema:
        return text or None
    fields = _fields(schema)
    try:
        given = json.loads(text) if text.startswith("{") else _pairs(text, list(fields))
    except ValueError:
        return None
    if not isinstance(given, dict):
        return None
    values: dict[str, Any] = {}
    for name, allowed in fields.items():
        value = given.get(name)
        if allowed == ["yes", "no"]:
            value = {"yes": True, "y": True, "true": True, "no": False, "n": False, "false": False}.get(
                str(value).lower()
            )
        if value is None or (allowed and allowed != ["yes", "no"] and value not in allowed):
            return None
        values[name] = value
    return json.dumps(values)


def _pairs(text: str, names: list[str]) -> dict[str, str]:
    """``a=1 b=2`` (or ``a=1, b=2``) as a dict; a lone value answers the only field."""
    if "=" not in text:
        if len(names) != 1:
            raise ValueError("several fields need name=value")
        return {names[0]: text}
    return dict(part.split("=", 1) for part in text.replace(",", " ").split() if "=" in part)


def find_human(llm: object) -> HumanLLM | None:
    """The :class:`HumanLLM` in a chain of models that wrap one another (``inner``), if any."""
    while llm is not None and not isinstance(llm, HumanLLM):
        llm = getattr(llm, "inner", None)
    return llm
