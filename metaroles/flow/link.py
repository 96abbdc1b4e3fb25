"""A run's controls reached from the process that serves its page (``run --watch``); the page's socket.

A run that serves its own page keeps only its controls in its own process — its
:class:`~metaroles.team.control.RunControl` and, when a person plays a role there, its
:class:`~metaroles.llm.human.PageDesk` — and leaves the page (reading the record, building each
round's delta, the streams) to a ``metaroles watch`` process of its own, so watching takes next
to nothing from the run. The two talk over a socket pair, one JSON object a line, the page's
process asking and the run answering (:func:`answer_link`, in a thread of the run's process):

- ``hello``: the token the page checks, and whether a person is asked on the page;
- ``state``: where the run stands and the questions waiting for a person (asked every
  :data:`POLL_SECONDS`, which also tells the page's process when the run has gone);
- ``pause``, ``resume``, ``step``, ``inject`` (an :class:`~metaroles.team.control.Injection`'s
  fields), ``answer`` (a question's number and the person's text): the run's new state.

:class:`RunLink` is the page's side: it stands where a ``RunControl`` and a ``PageDesk`` stand in
the page's app. The run's side never reads anything but these requests: what it is sent is data.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from contextlib import suppress
from typing import Any, Protocol

import orjson

from metaroles.core.exceptions import ConfigError, InvalidValueError, MetarolesError
from metaroles.llm.human import HumanQuestion, PageDesk
from metaroles.team.control import Injection, RunControl

__all__ = ["POLL_SECONDS", "STEERS", "Answers", "Controls", "LinkLost", "RunLink", "answer_link", "bind", "steer"]

POLL_SECONDS = 0.2
"""How often the page's process asks the run where it stands."""


class LinkLost(MetarolesError):
    """The run's process closed the link: the run ended, or was stopped."""


class Controls(Protocol):
    """What the page steers: a ``RunControl``, or a :class:`RunLink` to one in the run's process."""

    def pause(self) -> None:
        """Wait at the next barrier."""

    def resume(self) -> None:
        """Go on running."""

    def step(self) -> None:
        """Run one more round, then wait."""

    def inject(self, injection: Injection) -> Any:
        """Publish ``injection`` at the next barrier."""

    def state(self) -> dict[str, Any]:
        """Where the run stands: ``paused``, ``waiting_at``, ``round``."""


class Answers(Protocol):
    """Where a person's answers go: a :class:`~metaroles.llm.human.PageDesk`, or a ``RunLink`` to one."""

    def pending(self) -> list[HumanQuestion]:
        """The questions waiting for the person."""

    def answer(self, number: int, text: str) -> None:
        """The person's answer to question ``number``."""


STEERS = ("pause", "resume", "step", "inject")
"""What a page may do to a run it controls (besides answering for a person)."""


def steer(control: Controls, action: str, injection: Injection | None = None) -> None:
    """Do ``action`` (one of :data:`STEERS`) to ``control``; ``inject`` publishes ``injection``.

    Raises:
        InvalidValueError: If ``action`` is none of them, or an injection has nothing to inject.
    """
    if action == "inject" and injection is not None:
        control.inject(injection)
    elif action in ("pause", "resume", "step"):
        getattr(control, action)()
    else:
        raise InvalidValueError(f"no control named {action!r}: pause, resume, step or inject (with its message)")


def answer_link(sock: socket.socket, control: RunControl, desk: PageDesk | None, token: str) -> None:
    """Answer the page process's requests on ``sock`` until it closes.

    Runs in a thread of the run's process; a request it cannot do is answered with its error.
    """
    with sock, sock.makefile("rb") as lines:
        for line in lines:
            try:
                request = orjson.loads(line)
                reply = {"ok": _do(request, control, desk, token)}
            except (MetarolesError, ValueError, TypeError, KeyError) as exc:
                reply = {"error": str(exc) or type(exc).__name__}
            try:
                sock.sendall(orjson.dumps(reply) + b"\n")
            except OSError:
                return  # the page's process has gone


def _do(request: dict[str, Any], control: RunControl, desk: PageDesk | None, token: str) -> Any:
    op = request.get("op")
    if op == "hello":
        return {"token": token, "desk": desk is not None}
    if op in STEERS:
        steer(control, op, Injection.model_validate(request["injection"]) if op == "inject" else None)
    elif op == "answer":
        if desk is None:
            raise InvalidValueError("nobody is asked on this page: run with --human ROLE --watch")
        desk.answer(request["number"], request["text"])
    elif op != "state":
        raise InvalidValueError(f"no request named {op!r}")
    return {"control": control.state(), "human": [q.as_data() for q in desk.pending()] if desk is not None else []}


class RunLink:
    """The run's controls and its person's questions, in the process that serves its page.

    Stands where a :class:`~metaroles.team.control.RunControl` (``pause``, ``resume``, ``step``,
    ``inject``, ``state``) and a :class:`~metaroles.llm.human.PageDesk` (``pending``, ``answer``)
    stand in the page's app; each call asks the run over ``sock``.

    Raises:
        LinkLost: If the run's process has closed the link.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock, self._lines = sock, sock.makefile("rb")
        self._lock, self._closed = threading.Lock(), threading.Event()
        said = self._call("hello")
        self.token: str = said["token"]
        self.asks_people: bool = said["desk"]
        self._seen = self._call("state")

    def _call(self, op: str, **fields: Any) -> Any:
        with self._lock:
            try:
                self._sock.sendall(orjson.dumps({"op": op, **fields}) + b"\n")
                line = self._lines.readline()
            except OSError:
                line = b""
        if not line:
            raise LinkLost("the run has ended: its page has nothing more to steer")
        reply = orjson.loads(line)
        if "error" in reply:
            raise InvalidValueError(reply["error"])
        if isinstance(reply["ok"], dict) and "control" in reply["ok"]:
            self._seen = reply["ok"]
        return reply["ok"]

    def follow(self, lost: Callable[[], None]) -> threading.Thread:
        """Ask the run where it stands every :data:`POLL_SECONDS` in a thread; call ``lost`` once it has gone."""

        def poll() -> None:
            try:
                while not self._closed.wait(POLL_SECONDS):
                    self._call("state")
            except LinkLost:
                lost()

        thread = threading.Thread(target=poll, name="metaroles-link", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        """Stop asking; the run's side sees the link close."""
        self._closed.set()
        with suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._lines.close()
        self._sock.close()

    def state(self) -> dict[str, Any]:
        """Where the run stood when last asked (at most :data:`POLL_SECONDS` ago)."""
        return dict(self._seen["control"])

    def pause(self) -> None:
        """Wait at the run's next barrier."""
        self._call("pause")

    def resume(self) -> None:
        """Let the run go on."""
        self._call("resume")

    def step(self) -> None:
        """Run one more round, then wait."""
        self._call("step")

    def inject(self, injection: Injection) -> None:
        """Publish ``injection`` at the run's next barrier (it is journaled there)."""
        self._call("inject", injection=injection.model_dump())

    def pending(self) -> list[HumanQuestion]:
        """The questions waiting for the person, as the run last said."""
        return [HumanQuestion(**question) for question in self._seen["human"]]

    def answer(self, number: int, text: str) -> None:
        """The person's answer to question ``number``."""
        self._call("answer", number=number, text=text)


def bind(port: int, host: str = "127.0.0.1") -> socket.socket:
    """A listening socket on ``host:port`` (0: any free port).

    Raises:
        ConfigError: If the port is in use or cannot be had, naming it and the fix.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"port {port} on {host} cannot be used ({exc.strerror}); pick another with --port (0: any free one)"
        ) from None
    sock.listen(64)
    return sock
