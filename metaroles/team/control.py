"""Steering a running team at its round barriers: pause, step, resume, and messages injected as interventions.

A :class:`RunControl` is handed to a team (``Team.control``) and driven from any thread — the watch
page's server, a notebook, a test. At each round barrier (after a round is logged and checkpointed,
before the next one starts) the team calls :meth:`RunControl.barrier`: the injections due there are
published (``Environment.inject``: an ``intervention`` event records each), then, if the run is
paused, it waits there until it is resumed, stepped or stopped.

An injection is data (:class:`Injection`: a name, the message's fields, the barrier it lands at);
with a ``journal`` each is appended to it, on the disk, before it is published — so a resumed run
publishes it again at the same barrier, a fork keeps those before its round, and a run given the
same file (``metaroles run ... --interventions FILE``) is the same run, byte for byte.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import anyio
import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from metaroles.bus.environment import Environment
from metaroles.core.exceptions import ConfigError, InvalidValueError
from metaroles.core.files import append_durably
from metaroles.core.schema import MESSAGE_ROUTE_TO_ALL, to_addresses
from metaroles.messages.message import Message

__all__ = ["JOURNAL", "Injection", "RunControl", "read_journal"]

JOURNAL = "interventions.jsonl"
"""In a run directory: the messages injected into the run, one JSON line each, in the order published."""

INJECTED = "metaroles.team.control.Inject"
"""``cause_by`` of an injected message that names none."""


class Injection(BaseModel):
    """A message published at a round barrier as a named intervention (one line of a journal)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=200)
    """What the intervention is called (the ``intervention`` event's detail)."""
    content: str
    sent_from: str = "Intervention"
    send_to: list[str] = Field(default_factory=lambda: [MESSAGE_ROUTE_TO_ALL], min_length=1)
    cause_by: str = INJECTED
    after_round: int | None = Field(default=None, ge=0)
    """The barrier it lands at: after this round (``None``: the next barrier the run reaches)."""

    @classmethod
    def of(cls, message: Message | str, *, name: str = "inject", after_round: int | None = None) -> Injection:
        """An injection of ``message`` (a Message, or its text to every role).

        Raises:
            InvalidValueError: If a field is not what an injection takes (named).
        """
        fields: dict[str, Any] = {"content": message} if isinstance(message, str) else _fields(message)
        try:
            return cls(name=name, after_round=after_round, **fields)
        except ValidationError as exc:
            raise InvalidValueError(f"cannot inject {message!r} as {name!r}: {_first(exc)}") from None

    def message(self) -> Message:
        """The message to publish (its id is made where it is published)."""
        return Message(
            self.content, sent_from=self.sent_from, send_to=to_addresses(self.send_to), cause_by=self.cause_by
        )


def _fields(message: Message) -> dict[str, Any]:
    if not isinstance(message, Message):
        raise InvalidValueError(f"inject takes a Message or a str, not {type(message).__name__}")
    return {
        "content": message.content,
        "sent_from": message.sent_from or "Intervention",
        "send_to": sorted(message.send_to),
        "cause_by": message.cause_by or INJECTED,
    }


def _first(exc: ValidationError) -> str:
    error = exc.errors()[0]
    return f"{'.'.join(map(str, error['loc'])) or 'value'}: {error['msg']}"


def read_journal(path: Path) -> list[Injection]:
    """The injections a journal holds, in order (none if there is no file).

    Raises:
        ConfigError: If a line is not an injection (named by file and line), or the rounds go back.
    """
    if not path.is_file():
        return []
    injections: list[Injection] = []
    for number, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            injection = Injection.model_validate(orjson.loads(line))
        except (orjson.JSONDecodeError, ValidationError) as exc:
            raise ConfigError(f"{path}: line {number} is not an injection ({exc}); fix or remove that line") from None
        if injection.after_round is None or (injections and injection.after_round < (injections[-1].after_round or 0)):
            raise ConfigError(f"{path}: line {number}'s after_round goes back or is missing; the journal is damaged")
        injections.append(injection)
    return injections


class RunControl:
    """Pause, step, resume and inject into a running team; every method is safe from any thread.

    Args:
        schedule: Injections to publish at the barriers they name (a journal read back, a plan).
        journal: Append each injection here, on the disk, before it is published.
        paused: Start paused: the run waits at its first barrier.
    """

    def __init__(self, *, schedule: Iterable[Injection] = (), journal: Path | None = None, paused: bool = False):
        self._cond = threading.Condition()
        self._schedule = sorted(schedule, key=lambda i: -1 if i.after_round is None else i.after_round)
        self._replayed: list[Injection] = []
        self.journal = journal
        self._paused, self._steps = paused, 0
        self.waiting_at: int | None = None
        """The round whose barrier the run waits at (``None``: running)."""
        self.barrier_round: int | None = None
        """The last barrier the run reached."""
        self.listeners: list[Callable[[RunControl], None]] = []
        """Called (from the run's thread) whenever the run reaches a barrier, waits or goes on."""

    def replay(self, journal: Path) -> None:
        """Publish the injections ``journal`` holds again where they landed, unless the run's state has them.

        A resumed run's control replays its run directory's journal: what the restored state holds
        (an ``intervention`` event at that round) is skipped, the rest is published at its barrier and
        not written again. New injections go on to the journal.

        Raises:
            ConfigError: If the journal is damaged (as :func:`read_journal` says).
        """
        self._replayed = read_journal(journal)
        self.journal = journal

    @property
    def paused(self) -> bool:
        """Whether the run stops at its next barrier (or waits at one now)."""
        return self._paused

    def pause(self) -> None:
        """Wait at the next round barrier (the round under way finishes first)."""
        with self._cond:
            self._paused, self._steps = True, 0
            self._cond.notify_all()

    def resume(self) -> None:
        """Go on running."""
        with self._cond:
            self._paused, self._steps = False, 0
            self._cond.notify_all()

    def step(self, rounds: int = 1) -> None:
        """Run ``rounds`` more rounds, then wait again (the run is paused after them)."""
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise InvalidValueError(f"step(rounds={rounds!r}) takes a positive number of rounds, e.g. step(1)")
        with self._cond:
            self._paused, self._steps = True, self._steps + rounds
            self._cond.notify_all()

    def inject(
        self, message: Message | str | Injection, *, name: str = "inject", after_round: int | None = None
    ) -> Injection:
        """Publish ``message`` at the next barrier (or after ``after_round``) as the intervention ``name``.

        Raises:
            InvalidValueError: If ``message`` is not a Message, a text or an Injection, naming the field.
        """
        if isinstance(message, Injection):
            injection = message
        else:
            injection = Injection.of(message, name=name, after_round=after_round)
        with self._cond:
            self._schedule.append(injection)
            self._cond.notify_all()
        return injection

    def state(self) -> dict[str, Any]:
        """Where the run stands, as data (what a page shows)."""
        with self._cond:
            return {"paused": self._paused, "waiting_at": self.waiting_at, "round": self.barrier_round}

    async def barrier(self, env: Environment, stopping: threading.Event) -> None:
        """At the barrier after ``env.round``: publish what is due, then wait while paused (until stopped)."""
        self.barrier_round = env.round
        self._publish_due(env)
        if not self._go_on():
            self.waiting_at = env.round
            self._tell()
            try:
                while True:  # an injection while waiting is published at once, then the run waits on
                    await anyio.to_thread.run_sync(self._wait, stopping, abandon_on_cancel=True)
                    self._publish_due(env)
                    if stopping.is_set() or self._go_on():
                        break
            finally:
                self.waiting_at = None
        self._tell()

    def _go_on(self) -> bool:
        """Whether the run goes on past this barrier now (taking one of the steps asked for)."""
        with self._cond:
            if self._steps:
                self._steps -= 1
                return True
            return not self._paused

    def _wait(self, stopping: threading.Event) -> None:
        """Wait until the run may go on, is stopped, or an injection is due."""
        with self._cond:
            while not (stopping.is_set() or self._steps or not self._paused or self._due_now()):
                self._cond.wait(timeout=0.25)  # the stop flag is set from a signal handler, which cannot notify

    def _due_now(self) -> bool:
        """Whether an injection is due at the barrier the run is at (called holding the lock)."""
        return any(i.after_round is None or i.after_round <= (self.barrier_round or 0) for i in self._schedule)

    def _publish_due(self, env: Environment) -> None:
        """Journal, then publish, each injection due at this barrier, in the order given (replayed ones first)."""
        if self._replayed:
            self._replay_due(env)
        with self._cond:
            due = [i for i in self._schedule if i.after_round is None or i.after_round <= env.round]
            self._schedule = [i for i in self._schedule if i not in due]
        for injection in due:
            if injection.after_round is not None and injection.after_round < env.round:
                raise ConfigError(
                    f"intervention {injection.name!r} was due after round {injection.after_round}, but the run is "
                    f"past it (round {env.round}); schedule it for round {env.round} or later"
                )
            landed = injection.model_copy(update={"after_round": env.round})
            if self.journal is not None:
                append_durably(self.journal, orjson.dumps(landed.model_dump()) + b"\n")
            with env.id_scope():
                message = landed.message()
            env.inject(message, landed.name)

    def _replay_due(self, env: Environment) -> None:
        """Publish the journal's injections due by this barrier that the state does not hold yet."""
        due = [i for i in self._replayed if (i.after_round or 0) <= env.round]
        self._replayed = self._replayed[len(due) :]
        held = Counter(e.round for e in env.events if e.kind == "intervention")
        for injection in due:
            if injection.after_round != env.round:
                continue  # before the restored round: in the history already
            if held[env.round]:
                held[env.round] -= 1
                continue
            with env.id_scope():
                message = injection.message()
            env.inject(message, injection.name)

    def _tell(self) -> None:
        for listener in self.listeners:
            listener(self)
