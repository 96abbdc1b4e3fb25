"""The ``metaroles`` command's shared parts: the typer app, error reporting, model choice, progress.

Exit codes: 0 done; 1 the run failed (a role raised, a model failed); 2 bad input (unknown
scenario, not a run directory, bad option). Errors are one line on stderr; the transcript goes
to stdout and the live progress display to stderr, so ``metaroles run x > out.txt`` stays clean.

The command modules import what a command runs inside that command (and types under
``TYPE_CHECKING``): ``metaroles --help`` and ``metaroles show`` load no model, bus or sharding code.
"""

from __future__ import annotations

import errno
import json
import math
import os
import signal
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from metaroles.core.exceptions import ConfigError, MetarolesError, RoleFailed, RunError, UserError
from metaroles.core.text import REDACTED, printable, redacted

if TYPE_CHECKING:
    from metaroles.llm.protocol import LLM
    from metaroles.llm.settings import LLMSettings
    from metaroles.messages.message import Message
    from metaroles.team.team import Team, TeamReport

app = typer.Typer(
    name="metaroles",
    help="Run multi-role scenarios on a message bus; every run leaves a directory you can resume, fork and plot.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: an option's text wraps under it, readable at 80 columns
)
err = Console(stderr=True)

LLM_HELP = (
    "auto (default: $METAROLES_LLM, else an OpenAI-compatible server if OPENAI_BASE_URL is set, else the embedded "
    "local model, else the offline test model), openai, local, test, test:SEED, scripted:PATH, replay:PATH"
)


class Format(StrEnum):
    """Renderings of the message-flow graph."""

    png = "png"
    svg = "svg"
    html = "html"
    mermaid = "mermaid"
    graphml = "graphml"
    json = "json"


def say(message: str) -> None:
    """One error line on stderr, whatever the message holds (newlines, markup, escape sequences)."""
    text = " ".join(printable(message).split("\n"))
    err.print(f"[bold red]error:[/] {escape(text)}", highlight=False, soft_wrap=True)


def fail(message: str, code: int = 2) -> typer.Exit:
    """One error line on stderr; the exit to raise (2: bad input, 1: the run failed)."""
    say(message)
    return typer.Exit(code)


_DISK = {
    errno.ENOSPC: "the disk is full: free space",
    errno.EDQUOT: "the disk quota is exhausted: free space",
    errno.EROFS: "the file system is read-only: remount it writable",
    errno.EACCES: "permission denied: make the run directory writable",
    errno.EPERM: "permission denied: make the run directory writable",
    errno.EIO: "the disk reported an I/O error: check it",
}


@contextmanager
def reported(run_dir: Path | None = None, *, show_traceback: bool = False) -> Iterator[None]:
    """Turn errors into one line on stderr: exit 1 for a failed run, 2 for bad input, 130 for Ctrl-C.

    A failed run, or a disk that refused a write, says how to continue: the run directory keeps
    its last complete checkpoint, so ``metaroles resume DIR`` goes on from there. ``show_traceback``
    (``--traceback``): a failed run's cause (a role's exception) is printed whole before that line.
    """
    then = f"; then: metaroles resume {run_dir}" if run_dir is not None else ""
    try:
        yield
    except KeyboardInterrupt:  # Ctrl-C: the run stopped between two writes, its last checkpoint whole
        going_on = f"; to go on: metaroles resume {run_dir}" if run_dir is not None else ""
        raise fail(f"interrupted{going_on}", code=130) from None
    except RunError as exc:
        if isinstance(exc, RoleFailed) and isinstance(exc.__cause__, UserError):  # a setting no call can meet
            raise fail(f"{exc.__cause__}{then}") from None
        if show_traceback and exc.__cause__ is not None:
            err.print(escape("".join(traceback.format_exception(exc.__cause__)).rstrip()), highlight=False)
        raise fail(f"{exc}{then.replace('; then', '; to retry it') if then else ''}", code=1) from None
    except MetarolesError as exc:
        raise fail(str(exc)) from None
    except ValidationError as exc:
        raise fail(_validation(exc)) from None
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        what = _DISK.get(exc.errno or 0)
        if what is None:
            raise fail(f"{exc.strerror or exc}{where}: pass a path that can be written") from None
        raise fail(f"{exc.strerror}{where}: {what}{then}", code=1) from None


def _validation(exc: ValidationError) -> str:
    """A pydantic error as one line naming each bad value and why."""
    parts = []
    for error in exc.errors()[:3]:
        where = ".".join(str(p) for p in error["loc"]) or exc.title
        parts.append(f"{where}={error.get('input')!r}: {error['msg']}")
    return f"{exc.title}: " + "; ".join(parts)


def options_from(pairs: Sequence[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` pairs as a dict (values parsed as JSON when they are JSON)."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise fail(f"--set {pair!r}: expected KEY=VALUE, e.g. --set turns=2")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def prices_from(pairs: Sequence[str]) -> dict[str, tuple[float, float]]:
    """``--price MODEL=PROMPT,COMPLETION`` options as model → (prompt, completion) per 1,000 tokens."""
    prices: dict[str, tuple[float, float]] = {}
    for pair in pairs:
        model, _, values = pair.partition("=")
        try:
            prompt, completion = (float(v) for v in values.split(","))
            if not model or not all(math.isfinite(v) and v >= 0 for v in (prompt, completion)):
                raise ValueError
        except ValueError:
            raise fail(
                f"--price {pair!r}: expected MODEL=PROMPT,COMPLETION in USD per 1,000 tokens, "
                "e.g. --price gpt-4o-mini=0.00015,0.0006"
            ) from None
        prices[model] = (prompt, completion)
    return prices


def resolve(settings: dict[str, Any]) -> LLM:
    """The model the options and the environment ask for (the only place env vars are read)."""
    return _resolved(_settings(settings))


def _settings(settings: dict[str, Any]) -> LLMSettings:
    from metaroles.llm.settings import LLMSettings

    with reported():
        return LLMSettings.from_env(os.environ, **settings)


def _resolved(settings: LLMSettings) -> LLM:
    from metaroles.llm.providers import llm_from_settings

    with reported():
        llm = llm_from_settings(settings, notify=lambda text: err.print(escape(printable(text)), soft_wrap=True))
    embedded = _embedded(llm)
    said = SMALL_MODEL.format(name=embedded, batch=getattr(llm, "batch", 1)) if embedded else model_name(llm)
    err.print(escape(printable(f"model: {said}")), highlight=False, soft_wrap=True)
    return llm


SMALL_MODEL = (
    "the embedded {name} ({batch} calls at once), a small model: expect plain answers; "
    "for a large one pass --llm openai --base-url URL --model NAME"
)
"""The line that names an embedded model: which one ran, that it is small, and how to use a large one."""


def _embedded(llm: LLM) -> str | None:
    """The readable name of the embedded model ``llm`` is, if it is one."""
    from metaroles.llm.model_files import EMBEDDED

    model = EMBEDDED.get(str(getattr(llm, "model", None)))
    return model.title if model is not None else None


def model_name(llm: LLM) -> str:
    """A readable name of a model: its kind, the model it asks and where (never a key)."""
    if type(llm).__repr__ is not object.__repr__:
        return repr(llm)
    kind = type(llm).__name__
    parts = [str(part) for part in (getattr(llm, "model", None), getattr(llm, "base_url", None)) if part]
    return f"{kind} ({', '.join(parts)})" if parts else kind


def run_dir_at(path: Path) -> Path:
    """``path``, which must be a directory (else a one-line error, exit 2)."""
    if not path.is_dir():
        raise fail(f"no run directory at {str(path)!r}")
    return path


class Live:
    """A rich progress bar over rounds, fed by ``Team.on_progress``.

    It shows messages, the round's model calls (their completion tokens per second, the share of
    prompt tokens the server's cache served, the calls in flight a limit allows now), and the run's
    tokens and cost.
    """

    def __init__(self, total: int, *, enabled: bool, transcript: Transcript | None = None) -> None:
        self.transcript = transcript
        self.progress = Progress(
            TextColumn("round"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            console=err,
            disable=not enabled,
            transient=False,
        )
        self.task = self.progress.add_task("run", total=total or None, stats="")
        self._counted, self._clock = -1, time.monotonic()
        self.enabled = enabled

    def __call__(self, team: Team) -> None:
        """Show the round just ended (its record: messages and model calls), with the run's totals."""
        env = team.env
        if self.transcript is not None:
            self.transcript(env.history.storage)
        if not self.enabled:  # nothing shown: the bus keeps no round record for it
            return
        record = env.round_record() if env.record is not None else None
        if record is None:
            env.keep_records(steps=False)  # from the next round on: what the round did, as the bus recorded it
        said = f"+{len(record.published)} " if record is not None and record.round == env.round else ""
        stats = (
            f"ready {env.ready_count}/{len(env.roles)} · {said}{len(env.history)} msgs · {self._calls(team)}"
            f"{env.ledger.total_tokens} tokens · cost {env.ledger.total_cost:.4g}"
        )
        total = team.last_round if team.last_round is not None else self.progress.tasks[0].total
        self.progress.update(self.task, completed=env.round, total=max(total or 0, env.round), stats=stats)

    def _calls(self, team: Team) -> str:
        """The model calls since the last update: how many, tokens/s, cache share, calls in flight allowed."""
        ledger, now = team.env.ledger, time.monotonic()
        usage = ledger.usage_since(self._counted) if self._counted >= 0 else None  # none before the first update
        seconds, self._clock, self._counted = now - self._clock, now, len(ledger.entries)
        if not usage or not usage["calls"]:
            return ""
        shown = f"{usage['calls']} calls · {usage['completion_tokens'] / max(seconds, 1e-9):.0f} tok/s · "
        if usage["cached_tokens"]:
            shown += f"cache {usage['cached_tokens'] / max(usage['prompt_tokens'], 1):.0%} · "
        allowed = in_flight(team.llm)
        return shown + (f"≤{allowed} in flight · " if allowed else "")


def in_flight(llm: object) -> int | None:
    """The calls in flight the limit around ``llm`` allows now (learnt, when adaptive), if it has one."""
    from metaroles.llm.limits import LimitedLLM

    while llm is not None and not isinstance(llm, LimitedLLM):
        llm = getattr(llm, "inner", None)  # a cassette's model
    if llm is None:
        return None
    return llm.adaptive.allowed if llm.adaptive is not None else llm.max_in_flight


def execute(
    work: Callable[[Callable[[Team], None], threading.Event], Any],
    total: int,
    *,
    quiet: bool,
    run_dir: Path | None = None,
    show_traceback: bool = False,
    transcript: Transcript | None = None,
) -> tuple[TeamReport, Team]:
    """Run ``work(progress, stopping)`` under the progress display; errors become one line and an exit code.

    ``transcript`` prints the messages as each round ends.

    The first Ctrl-C sets ``stopping``: the run stops at its next round barrier and writes what a
    stopped run writes (:func:`finish` then exits 130); a second one stops it at once, its last
    checkpoint whole. See :func:`reported` for the errors.
    """
    live = Live(total, enabled=not quiet and err.is_terminal, transcript=transcript)
    stopping = threading.Event()
    with (
        reported(run_dir, show_traceback=show_traceback),
        live.progress,
        interrupts(stopping),
    ):  # the run's session settles the heap after each round (core.heap)
        try:
            report, team = anyio.run(lambda: work(live, stopping))
        except BaseExceptionGroup as group:  # a second Ctrl-C raised inside a task of the round
            if group.subgroup(KeyboardInterrupt) is None:
                raise
            raise KeyboardInterrupt from None
    return report, team


@contextmanager
def interrupts(stopping: threading.Event) -> Iterator[None]:
    """While inside: the first SIGINT sets ``stopping`` (and says so), the next raises ``KeyboardInterrupt``.

    Installed before the event loop starts, so asyncio keeps it (it cancels its main task on SIGINT
    only where the default handler stands, which a round that never awaits would not see).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def asked(signum: int, frame: object) -> None:
        if stopping.is_set():
            raise KeyboardInterrupt
        stopping.set()
        if err.is_terminal:  # at a terminal, say what happens next (a log keeps its one error line)
            os.write(2, b"\nstopping at the end of this round (Ctrl-C again stops at once) ...\n")

    before = signal.signal(signal.SIGINT, asked)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def finish(
    report: TeamReport,
    team: Team,
    run_dir: Path | None,
    *,
    quiet: bool,
    transcript: bool | None = None,
    streamed: Transcript | None = None,
) -> None:
    """Print the transcript (unless quiet, or ``streamed`` as the rounds ended), the report, and a summary table.

    A transcript longer than a run directory keeps (``rundir.TRANSCRIPT_LIMIT`` messages) is printed only
    when ``transcript`` asks for it (``--transcript``); else a line on stderr says how to see it.
    """
    if streamed is None and not quiet:
        streamed = Transcript(run_dir, wanted=transcript)  # a resume or fork: the transcript once it ended
    if streamed is not None:
        streamed(team.env.history.storage)  # what is left unprinted
    typer.echo(f"\n{report}")
    if report.stop_reason == "interrupted":  # StopReason.INTERRUPTED
        going_on = f"; to go on: metaroles resume {run_dir}" if run_dir is not None else ""
        raise fail(f"interrupted{going_on}", code=130)
    table = Table(show_header=False, box=None)
    table.add_row("rounds", str(team.env.round))
    table.add_row("messages", str(len(team.env.history)))
    table.add_row("tokens", str(team.env.ledger.total_tokens))
    table.add_row("cost", f"{team.env.ledger.total_cost:.6g}")
    if run_dir is not None:
        table.add_row("run directory", str(run_dir))
        typer.echo(f"run directory: {run_dir}")
    err.print(table)
    if not quiet:
        for line in what_the_bus_did(team.env.history.storage, run_dir, rounds=team.env.round):
            err.print(printable(line), markup=False, highlight=False, soft_wrap=True)


FLOW_LINES = 8
"""Who-spoke-to-whom lines the end of a run shows (the busiest first, once past this many)."""


def what_the_bus_did(messages: Sequence[Message], run_dir: Path | None, *, rounds: int) -> list[str]:
    """The end of a run: who spoke to whom how often, the last structured answer as the object it is, what next."""
    flows = Counter((message.sent_from, message.send_to) for message in messages)  # recipient sets are shared
    shown = list(flows.items())
    if len(shown) > FLOW_LINES:
        shown = flows.most_common(FLOW_LINES)
    lines = ["", "what the bus did (who spoke to whom, how often):"]
    lines += [f"  {sender or 'Human'} → {', '.join(sorted(to))}: {count}" for (sender, to), count in shown]
    if len(flows) > len(shown):
        lines.append(f"  … and {len(flows) - len(shown):,} more pairs (metaroles graph RUN_DIR)")
    made = next((m for m in reversed(messages) if m.instruct_content is not None), None)
    if made is not None and made.instruct_content is not None:
        lines.append(f"{made.sent_from}'s answer as an object (instruct_content): {made.instruct_content!r}")
    if run_dir is not None:
        lines.append(
            f"next: metaroles show {run_dir} · metaroles graph {run_dir} --format png · metaroles watch {run_dir} · "
            f"metaroles interview {run_dir} --round {rounds} --role NAME 'Why?' · "
            f"metaroles fork {run_dir} --from-round 1"
        )
    return lines


class Transcript:
    """A run's messages printed as its rounds end, a line each, up to ``rundir.TRANSCRIPT_LIMIT`` unless wanted."""

    def __init__(self, run_dir: Path | None, *, wanted: bool | None) -> None:
        self.run_dir, self.wanted = run_dir, wanted
        self.printed = 0
        self.stopped = False

    def __call__(self, messages: Sequence[Message]) -> None:
        """Print the messages of ``messages`` (the run's history) not printed yet."""
        from metaroles.project import rundir
        from metaroles.project.rundir import format_message

        if self.stopped or len(messages) == self.printed:
            return
        if not self.wanted and len(messages) > rundir.TRANSCRIPT_LIMIT:
            self.stopped = True
            where = f"metaroles show {self.run_dir}" if self.run_dir is not None else "run it with --transcript"
            said = f"the transcript goes on past {rundir.TRANSCRIPT_LIMIT:,} messages: not printed; to read it: {where}"
            err.print(said, markup=False, highlight=False, soft_wrap=True)
            return
        for start in range(self.printed, len(messages), 1000):
            chunk = messages[start : min(start + 1000, len(messages))]
            typer.echo(printable("\n".join(format_message(m) for m in chunk)))
        self.printed = len(messages)


MODEL_SETTINGS = (
    "llm", "model", "base_url", "seed", "temperature", "timeout", "requests_per_second", "max_in_flight",
    "tokens_per_minute", "requests_per_minute", "batch", "batch_deadline",
)  # fmt: skip
"""What a manifest records of how its model was reached (never a key), and what resume and fork reuse."""


def model_from(settings: dict[str, Any], replay: Path | None) -> tuple[LLM, dict[str, Any]]:
    """The model to run with (a cassette to replay, or what the options and environment ask for), and its record.

    The record holds what the options and the environment said; ``run_scenario`` adds the provider
    ``auto`` resolved to (``describe_llm``), so resume and fork reach the same one.
    """
    from metaroles.llm.cassette import CassetteLLM, CassetteMode

    if replay is not None:
        if not replay.is_file():
            raise fail(f"no cassette at {str(replay)!r}; record one with --record")
        return CassetteLLM(replay, mode=CassetteMode.REPLAY), {"llm": f"replay:{replay}"}
    chosen = _settings(settings)
    llm = _resolved(chosen)
    record = chosen.model_dump(include=set(MODEL_SETTINGS))  # what the options and the environment said
    record["base_url"] = redacted(record["base_url"])
    return llm, record


TRACEBACK_HELP = "when a role fails, print its whole traceback (the event log keeps where it was raised)"
BACKEND_HELP = "where the roles run: 'process' (this one) or 'ray' (shards on a Ray cluster; the run is the same)"


def backend_from(backend: str | None, shards: int | None, address: str | None, recorded: Any = None) -> Any:
    """The backend the options ask for (else the one a manifest recorded; else none: one process).

    Raises:
        typer.Exit: For an unknown backend, or shards without Ray (a one-line error, exit 2).
    """
    saved = recorded if isinstance(recorded, dict) else {}
    kind = backend or (saved.get("backend") if shards is None else "ray") or "process"
    if kind not in ("process", "ray"):
        raise fail(f"--backend {kind!r} is not a backend; use 'process' or 'ray'")
    if kind == "process":
        if shards is not None:
            raise fail(f"--shards {shards} needs --backend ray (shards run on Ray)")
        return None
    from metaroles.sharding.ray import RayBackend

    count = shards if shards is not None else int(saved.get("shards") or 2)
    return RayBackend(count, address=address or saved.get("address"))


def execution_record(backend: Any) -> dict[str, Any]:
    """How a run was executed, for its manifest (not part of the run: any count of shards resumes it)."""
    if backend is None:
        return {"backend": "process"}
    return {"backend": "ray", "shards": backend.shards, "address": backend.address}


def manifest_model(manifest: dict[str, Any], *, batches: Path | None = None) -> LLM:
    """The model a run was made with, as its manifest names it (a replayed cassette replays again).

    A base URL recorded without its credentials comes from ``OPENAI_BASE_URL`` again. A run made with
    ``--batch`` sends batches again when ``batches`` says where its pending ones are kept (a resume's, a
    fork's run directory); else (an interview) each call is asked at once.
    """
    settings = {key: manifest.get(key) for key in MODEL_SETTINGS}
    if REDACTED in str(settings["base_url"] or ""):
        settings["base_url"] = None
    if batches is None:
        settings["batch"] = None
    elif settings["batch"]:
        settings["batch_journal"] = str(batches)
    return resolve(settings)


def resumed_model(manifest: dict[str, Any], run_dir: Path | None = None) -> LLM:
    """The model a resumed run goes on with: the manifest's, through the cassette it was recording.

    The calls made after the last checkpoint, before the stop, are answered again from the cassette
    as they were the first time (a served model's answer may vary with what else it was decoding);
    the calls after them are asked live and recorded, so the cassette stays the whole run's.
    """
    from metaroles.llm.cassette import CassetteLLM, CassetteMode
    from metaroles.project.rundir import BATCHES

    llm = manifest_model(manifest, batches=run_dir / BATCHES if run_dir is not None else None)
    cassette = manifest.get("cassette")
    if not cassette or str(manifest.get("llm") or "").startswith("replay:"):
        return llm
    return CassetteLLM(cassette, mode=CassetteMode.REPLAY_OR_LIVE, inner=llm)


OFFLINE_MODELS = ("test", "scripted", "replay")
"""The model specs that answer without asking a model: a run made with them can be run again anywhere."""


def answers_again(manifest: dict[str, Any]) -> tuple[LLM, dict[str, LLM]]:
    """The run's model answers again without asking a model: its cassette replayed, or its offline models.

    Raises:
        ConfigError: If the run asked a model whose answers it did not record (naming how to record them).
    """
    from metaroles.llm.cassette import CassetteLLM, CassetteMode

    specs = {str(name): str(spec) for name, spec in (manifest.get("role_llms") or {}).items()}
    live = sorted(name for name, spec in specs.items() if spec.partition(":")[0] not in OFFLINE_MODELS)
    cassette = str(manifest.get("cassette") or "")
    if cassette and Path(cassette).is_file():
        llm: LLM = CassetteLLM(cassette, mode=CassetteMode.REPLAY)
    elif str(manifest.get("llm") or "").partition(":")[0] in OFFLINE_MODELS:
        llm = manifest_model(manifest)
    else:
        recorded = f"its cassette {cassette!r} is not there" if cassette else "it recorded no cassette"
        raise ConfigError(
            f"the run asked {manifest.get('llm')!r} and {recorded}; run with --record to keep its answers"
        )
    if live:
        raise ConfigError(f"role {live[0]!r} asked {specs[live[0]]!r}, whose answers no cassette keeps")
    return llm, {name: resolve({"llm": spec}) for name, spec in specs.items()}


TRUST_HELP = "import the scenario file or module the manifest names even if it is not yours (it is code)"
INTERVENE_SPECS = "freeze:NAME, mute:A>B, model:NAME=SPEC, persona:NAME=TEXT, rule:NAME=TEXT, edit:ID=TEXT (repeatable)"
"""The ``--intervene`` specs (``metaroles.team.surgery``), as ``fork`` and ``branch`` list them in their help."""


def trusted(scenario: str, run_dir: Path | None, *, trust: bool) -> None:
    """Refuse to import the code a scenario name leads to unless ``--trust`` says to.

    A run directory may come from someone else; resuming or forking it imports the scenario its
    manifest names. Listing a scenario's options (``run_dir`` None) imports it too. Without
    ``--trust`` that is a scenario that ships with metaroles or that an installed plug-in
    registers, or a ``.py`` file in the current folder that is not inside the run directory
    itself. Any other file, and any other module (``venv.__main__`` runs when imported), needs
    ``--trust``.

    Raises:
        ConfigError: Showing what the manifest (or the command line) names and how to run it anyway.
    """
    from metaroles.project.registry import unregistered_module

    if trust:
        return
    doing = "resuming" if run_dir is not None else "listing its options"
    if scenario.endswith(".py"):
        path = Path(scenario).resolve()
        if run_dir is not None and path.is_relative_to(run_dir.resolve()):
            where = "inside the run directory"
        elif not path.is_relative_to(Path.cwd().resolve()):
            where = "outside the current folder"
        else:
            return
        made = "this run directory was made by" if run_dir is not None else "this is"
        raise ConfigError(
            f"{made} the scenario file {str(path)!r}, {where}; {doing} runs that file's code: "
            "read it, then pass --trust"
        )
    if unregistered_module(scenario):
        named = "this run directory names" if run_dir is not None else "you named"
        raise ConfigError(
            f"{named} the module {scenario!r}, which is not a registered scenario; "
            "importing it runs its code: if it is yours, pass --trust"
        )
