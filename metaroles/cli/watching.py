"""``metaroles watch``: a run's page, live or replayed; and the page a run serves of itself (``run --watch``).

``metaroles watch RUN_DIR`` serves a read-only page of any run directory — one still being
written (it follows the record) or one that ended (scrub to any round). A run started with
``--watch`` serves its own page with its controls (pause, step, resume, inject), which need the
token it prints; ``--control`` also makes the run wait at its first barrier until someone steps
or resumes it.
"""

from __future__ import annotations

import dataclasses
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from metaroles.cli.common import app, fail, reported
from metaroles.core.exceptions import ConfigError

if TYPE_CHECKING:
    from metaroles.flow.watch import Interviewer, WatchServer
    from metaroles.llm.human import Desk, HumanLLM
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
) -> None:
    """Watch a run in the browser: live while it runs, a timeline to scrub once it ended (Ctrl-C stops)."""
    with reported():
        if not run_dir.is_dir():
            raise fail(f"no run directory at {str(run_dir)!r}")
        server = _server(run_dir, port, interviewer=interviewer(run_dir, trust=trust))
        typer.echo(f"watching {run_dir} at {server.url} (Ctrl-C stops)")
        try:
            server.serve()
        except KeyboardInterrupt:
            pass


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
    port: int,
    control: RunControl | None = None,
    token: str = "",
    interviewer: Interviewer | str = "",
    desk: Desk | None = None,
) -> WatchServer:
    from metaroles.flow.watch import WatchServer, bind, watch_app
    from metaroles.llm.human import PageDesk

    try:
        app_ = watch_app(
            run_dir, control=control, token=token or None, starting=control is not None, interviewer=interviewer,
            desk=desk if isinstance(desk, PageDesk) else None,
        )  # fmt: skip
    except ImportError as exc:
        raise ConfigError(
            f"the watch page needs its extra ({exc.name} is missing): pip install 'metaroles[watch]'"
        ) from None
    return WatchServer(app_, bind(port))


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

    ``desk``: a person answers for some roles; a :class:`~metaroles.llm.human.PageDesk` is asked on the page.
    """
    if control is None or not page:
        yield
        return
    if run_dir is None:
        raise fail("--watch and --control need a run directory: drop --no-save")
    token = secrets.token_urlsafe(16)
    server = _server(run_dir, port, control, token, interviewer(run_dir, trust=False), desk)
    server.start()
    typer.echo(f"watch and steer this run at {server.url}#token={token} (the token lets a page steer it)", err=True)
    try:
        yield
    finally:
        server.stop()
