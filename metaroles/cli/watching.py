"""``metaroles watch``: a run's page, live or replayed; and the page a run serves of itself (``run --watch``).

``metaroles watch RUN_DIR`` serves a read-only page of any run directory — one still being
written (it follows the record) or one that ended (scrub to any round). A run started with
``--watch`` serves its own page with its controls (pause, step, resume, inject), which need the
token it prints; ``--control`` also makes the run wait at its first barrier until someone steps
or resumes it. That page is served by a ``metaroles watch`` process the run starts, linked to the
run's controls (``flow.link``); the run's process only answers its requests.
"""

from __future__ import annotations

import dataclasses
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from metaroles.cli.common import app, fail, reported
from metaroles.core.exceptions import ConfigError

if TYPE_CHECKING:
    from metaroles.flow.link import Answers, Controls
    from metaroles.flow.watch import Interviewer, StateReader, WatchServer
    from metaroles.llm.human import Desk, HumanLLM, PageDesk
    from metaroles.team.control import RunControl

HUMAN_HELP = "a person plays this role (repeat for more): asked on the terminal, or on the page with --watch"
PORT_HELP = "port of the page on 127.0.0.1 (0: any free one; the URL is printed)"


@app.command()
def watch(
    run_dir: Annotated[Path, typer.Argument(help="a run directory, running or ended")],
    port: Annotated[int, typer.Option(min=0, max=65535, help=PORT_HELP)] = 0,
    trust: Annotated[
        bool, typer.Option("--trust", help="let the page's interviews import the scenario's code")
    ] = False,
    compare: Annotated[
        Path | None,
        typer.Option(metavar="OTHER", help="another run beside it: its figures, and the round they first differ"),
    ] = None,
    listen_fd: Annotated[int | None, typer.Option(hidden=True)] = None,
    link_fd: Annotated[int | None, typer.Option(hidden=True)] = None,
) -> None:
    """Watch a run in the browser: live while it runs, a timeline to scrub once it ended (Ctrl-C stops)."""
    with reported():
        if listen_fd is not None or link_fd is not None:  # what a run passes the page it starts (`run --watch`)
            try:
                if listen_fd is None or link_fd is None:
                    raise OSError("both are needed")
                sockets = socket.socket(fileno=listen_fd), socket.socket(fileno=link_fd)
            except OSError as exc:
                raise fail(f"--listen-fd and --link-fd are a run's own page's, not for use by hand ({exc})") from None
            _serve_own_page(run_dir, *sockets)
            return
        for folder in (run_dir, *([compare] if compare is not None else [])):
            if not folder.is_dir():
                raise fail(f"no run directory at {str(folder)!r}")
        server = _reports(run_dir, port) or _server(
            run_dir, bind_port(port), interviewer=interviewer(run_dir, trust=trust), compare=compare,
            states=state_reader(run_dir, trust=trust),
        )  # fmt: skip
        typer.echo(f"watching {run_dir} at {server.url} (Ctrl-C stops)")
        try:
            server.serve()
        except KeyboardInterrupt:
            pass


def _reports(folder: Path, port: int) -> WatchServer | None:
    """The page of an ensemble's, sweep's or evaluation's reports, if ``folder`` is one (not a run)."""
    from metaroles.flow.reports import has_reports, report_app
    from metaroles.flow.watch import WatchServer

    return WatchServer(report_app(folder), bind_port(port)) if has_reports(folder) else None


def _serve_own_page(run_dir: Path, listening: socket.socket, link: socket.socket) -> None:
    """The page of a run started with ``--watch``, served here for the run's process (``flow.link``)."""
    from metaroles.flow.link import RunLink

    steered = RunLink(link)
    server = _server(
        run_dir, listening, steered, steered.token, _once_it_began(run_dir), steered if steered.asks_people else None,
        states=_states_once_it_began(run_dir),
    )  # fmt: skip
    steered.follow(lost=server.end)  # the run has ended, or is gone: so is its page
    try:
        server.serve()
    finally:
        steered.close()


def _once_it_began(run_dir: Path) -> Interviewer:
    """The interviews of a run that writes its manifest after its page is up: looked for when asked."""

    async def ask(roles: str, at_round: int, question: str) -> list[dict[str, Any]]:
        asks = interviewer(run_dir, trust=False)
        if isinstance(asks, str):
            raise ConfigError(asks)
        return await asks(roles, at_round, question)

    return ask


def _states_once_it_began(run_dir: Path) -> StateReader:
    """The state reader of a run that writes its manifest after its page is up: made when first asked."""
    made: list[StateReader] = []

    async def read(at_round: int) -> dict[str, Any]:
        if not made:
            reader = state_reader(run_dir, trust=False)
            if isinstance(reader, str):
                raise ConfigError(reader)
            made.append(reader)
        return await made[0](at_round)

    return read


STATES_KEPT = 4
"""Rounds whose roles' states the page keeps read (scrubbing back and forth rebuilds none of them)."""


def state_reader(run_dir: Path, *, trust: bool) -> StateReader | str:
    """What the page reads the roles' state with: the run rebuilt in memory with its answers; or why it cannot.

    A run whose answers cannot be had again without asking a model (no cassette) is read as its
    last checkpoint up to the round holds it, and said so.
    """
    import anyio

    from metaroles import TestLLM
    from metaroles.cli.common import answers_again, trusted
    from metaroles.project.panel import states_at
    from metaroles.project.rundir import read_manifest

    try:
        manifest = read_manifest(run_dir)
        trusted(manifest["scenario"], run_dir, trust=trust)
    except ConfigError as exc:
        return f"a role's state is read by rebuilding the run's roles: {exc}"
    try:
        llm, role_llms, why = *answers_again(manifest), ""
    except ConfigError as exc:
        llm, role_llms, why = TestLLM(), {}, str(exc)  # not asked: the checkpoint's state, as it is
    kept: dict[int, dict[str, Any]] = {}
    lock = anyio.Lock()

    async def read(at_round: int) -> dict[str, Any]:
        async with lock:
            if at_round not in kept:
                as_of, roles = await states_at(run_dir, at_round, llm, role_llms, again=not why)
                late = f"as its checkpoint of round {as_of} holds it ({why})" if why else f"it stopped at round {as_of}"
                kept[at_round] = {
                    "round": at_round,
                    "as_of": as_of,
                    "note": "" if as_of == at_round else late,
                    "roles": roles,
                }
                if len(kept) > STATES_KEPT:
                    del kept[next(iter(kept))]
            return kept[at_round]

    return read


def interviewer(run_dir: Path, *, trust: bool) -> Interviewer | str:
    """What the page's interviews are asked with: the run's own model on a fork; or why they cannot be asked."""
    from metaroles.cli.common import manifest_model, resolve, trusted
    from metaroles.project.interview import interview_run
    from metaroles.project.rundir import read_manifest

    try:
        manifest = read_manifest(run_dir)
        trusted(manifest["scenario"], run_dir, trust=trust)
    except ConfigError as exc:
        return f"interviews rebuild the run's roles: {exc}"

    model = manifest_model(manifest)
    role_llms = {name: resolve({"llm": str(s)}) for name, s in (manifest.get("role_llms") or {}).items()}

    async def ask(roles: str, at_round: int, question: str) -> list[dict[str, Any]]:
        with tempfile.TemporaryDirectory(prefix="metaroles-asked-") as folder:
            answers = await interview_run(
                run_dir, at_round=at_round, roles=roles, questions=[question], out_dir=Path(folder), llm=model,
                role_llms=role_llms,
            )  # fmt: skip
        return [dataclasses.asdict(answer) for answer in answers]

    return ask


def _server(
    run_dir: Path,
    listening: socket.socket,
    control: Controls | None = None,
    token: str = "",
    interviewer: Interviewer | str = "",
    desk: Answers | None = None,
    compare: Path | None = None,
    states: StateReader | str = "",
) -> WatchServer:
    from metaroles.flow.watch import WatchServer, watch_app

    app_ = watch_app(
        run_dir, control=control, token=token or None, starting=control is not None, interviewer=interviewer,
        desk=desk, compare=compare, states=states,
    )  # fmt: skip
    return WatchServer(app_, listening)


def bind_port(port: int) -> socket.socket:
    """A listening socket for the page on 127.0.0.1:``port``.

    Raises:
        ConfigError: If the port is in use, or the page's extra is not installed (naming the fix).
    """
    from importlib.util import find_spec

    from metaroles.flow.link import bind

    missing = [name for name in ("starlette", "uvicorn") if find_spec(name) is None]
    if missing:
        raise ConfigError(f"the watch page needs its extra ({missing[0]} is missing): pip install 'metaroles[watch]'")
    return bind(port)


def run_control(*, watch: bool, control: bool, interventions: Path | None) -> RunControl | None:
    """The control a run is steered by: from its page (``--watch``, ``--control``: paused at first), a file, or none.

    Raises:
        typer.Exit: If ``interventions`` is not a journal of injections (one line, exit 2).
    """
    if not (watch or control or interventions):
        return None
    from metaroles.team.control import RunControl, read_journal

    schedule = []
    if interventions is not None:
        if not interventions.is_file():
            raise fail(f"--interventions {str(interventions)!r} is not a file; pass a run's interventions.jsonl")
        try:
            schedule = read_journal(interventions)
        except ConfigError as exc:
            raise fail(str(exc)) from None
    return RunControl(schedule=schedule, paused=control)


def people_at(seats: list[str], *, page: bool, seconds: float) -> partial[HumanLLM] | None:
    """A person at ``seats``, asked on the run's page (``page``) or the terminal: wraps the run's model."""
    if not seats:
        return None
    from metaroles.llm.human import HumanLLM, PageDesk, TerminalDesk

    desk: Desk = PageDesk() if page else TerminalDesk()
    return partial(HumanLLM, desk=desk, seats=seats, timeout=seconds)


@contextmanager
def watched(
    run_dir: Path | None, control: RunControl | None, port: int, *, page: bool, desk: Desk | None = None
) -> Iterator[None]:
    """While inside: the run's own page (``page``), with ``control`` behind a token printed on stderr.

    The page is served by a ``metaroles watch`` process of its own, which steers the run through
    its controls here (``flow.link``): reading the record and building the page's rounds takes
    nothing from the run's process. ``desk``: a person answers for some roles; a
    :class:`~metaroles.llm.human.PageDesk` is asked on the page.
    """
    if control is None or not page:
        yield
        return
    if run_dir is None:
        raise fail("--watch and --control need a run directory: drop --no-save")
    from metaroles.llm.human import PageDesk

    with _page_process(run_dir, bind_port(port), control, desk if isinstance(desk, PageDesk) else None) as url:
        typer.echo(f"watch and steer this run at {url} (the token lets a page steer it)", err=True)
        yield


@contextmanager
def _page_process(run_dir: Path, listening: socket.socket, control: RunControl, desk: PageDesk | None) -> Iterator[str]:
    """``metaroles watch`` serving ``run_dir``'s page on ``listening``, linked to ``control``: its URL and token."""
    from metaroles.flow.link import answer_link

    host, port = listening.getsockname()[:2]
    ours, theirs = socket.socketpair()
    token = secrets.token_urlsafe(16)
    threading.Thread(target=answer_link, args=(ours, control, desk, token), name="metaroles-link", daemon=True).start()
    fds = (listening.fileno(), theirs.fileno())
    command = [sys.executable, "-m", "metaroles", "watch", "--listen-fd", str(fds[0]), "--link-fd", str(fds[1])]
    child = subprocess.Popen(
        [*command, "--", str(run_dir)], pass_fds=fds, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C at the terminal is the run's to handle; its page ends with it
    )  # fmt: skip
    listening.close()
    theirs.close()
    try:
        yield f"http://{host}:{port}/#token={token}"  # the socket listens: a page that comes early waits for it
    finally:
        with suppress(OSError):
            ours.shutdown(socket.SHUT_RDWR)  # the page's process sees the link close, and ends by itself
        threading.Thread(target=child.wait, name="metaroles-page-reaper", daemon=True).start()
