"""The ``metaroles`` command (typer + rich): run, resume, fork, graph, show, diff and list scenarios.

Exit codes: 0 done; 1 the run failed (a role raised, a model failed); 2 bad input (unknown
scenario, not a run directory, bad option). Errors are one line on stderr; the transcript goes
to stdout and the live progress display to stderr, so ``metaroles run x > out.txt`` stays clean.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import anyio
import click
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from metaroles.cassette import CassetteLLM, CassetteMode
from metaroles.eventlog import read_events
from metaroles.exceptions import MetarolesError, RunError
from metaroles.llm import LLM
from metaroles.providers import llm_from_settings
from metaroles.scenario import (
    EVENTS,
    PLUGIN_KINDS,
    RunOptions,
    fork_scenario,
    known_scenarios,
    load_scenario,
    new_run_dir,
    plugins,
    read_config_file,
    read_manifest,
    resume_scenario,
    run_scenario,
    transcript,
)
from metaroles.settings import LLMSettings
from metaroles.team import Team, TeamReport

app = typer.Typer(
    name="metaroles",
    help="Run multi-role scenarios on a message bus; every run leaves a directory you can resume, fork and plot.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
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


def _fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


@contextmanager
def _reported() -> Iterator[None]:
    """Turn metaroles errors into one line on stderr: exit 1 for a failed run, 2 for bad input."""
    try:
        yield
    except RunError as exc:
        raise _fail(str(exc), code=1) from None
    except MetarolesError as exc:
        raise _fail(str(exc)) from None


def _options(pairs: Sequence[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise _fail(f"--set {pair!r}: expected KEY=VALUE, e.g. --set turns=2")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def _resolve(settings: dict[str, Any]) -> LLM:
    """The model the options and the environment ask for (the only place env vars are read)."""
    llm = llm_from_settings(LLMSettings.from_env(os.environ, **settings), notify=lambda text: err.print(text))
    err.print(f"model: {llm!r}", highlight=False)
    return llm


def _run_dir(path: Path) -> Path:
    if not path.is_dir():
        raise _fail(f"no run directory at {str(path)!r}")
    return path


class _Live:
    """A rich progress bar over rounds, with messages, tokens and cost, fed by ``Team.on_round``."""

    def __init__(self, total: int, *, enabled: bool) -> None:
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
        self.task = self.progress.add_task("run", total=total, stats="")

    def __call__(self, team: Team) -> None:
        env = team.env
        active = sum(not role.is_idle for role in env.roles.values())
        stats = (
            f"active {active}/{len(env.roles)} · {len(env.history)} msgs · {env.ledger.total_tokens} tokens · "
            f"cost {env.ledger.total_cost:.4g}"
        )
        self.progress.update(self.task, completed=env.round, stats=stats)


def _execute(work: Callable[[Callable[[Team], None]], Any], total: int, *, quiet: bool) -> tuple[TeamReport, Team]:
    live = _Live(total, enabled=not quiet and err.is_terminal)
    with _reported(), live.progress:
        report, team = anyio.run(lambda: work(live))
    return report, team


def _finish(report: TeamReport, team: Team, run_dir: Path | None, *, quiet: bool) -> None:
    if not quiet:
        typer.echo(transcript(team.env.history.storage))
    typer.echo(f"\n{report}")
    table = Table(show_header=False, box=None)
    table.add_row("rounds", str(team.env.round))
    table.add_row("messages", str(len(team.env.history)))
    table.add_row("tokens", str(team.env.ledger.total_tokens))
    table.add_row("cost", f"{team.env.ledger.total_cost:.6g}")
    if run_dir is not None:
        table.add_row("run directory", str(run_dir))
        typer.echo(f"run directory: {run_dir}")
    err.print(table)


def _model(llm: str | None, model: str | None, base_url: str | None, seed: int | None, replay: Path | None) -> LLM:
    if replay is not None:
        if not replay.is_file():
            raise _fail(f"no cassette at {str(replay)!r}; record one with --record")
        return CassetteLLM(replay, mode=CassetteMode.REPLAY)
    return _resolve({"llm": llm, "model": model, "base_url": base_url, "seed": seed})


@app.command()
def run(
    target: Annotated[str, typer.Argument(help="scenario name (see `metaroles list`) or a YAML config file")],
    rounds: Annotated[int | None, typer.Option(help="rounds to run (default: the scenario's)")] = None,
    idea: Annotated[str | None, typer.Option(help="the idea/topic published at the start")] = None,
    llm: Annotated[str | None, typer.Option(help=LLM_HELP)] = None,
    model: Annotated[str | None, typer.Option(help="model name for an OpenAI-compatible server")] = None,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible endpoint ($OPENAI_BASE_URL)")] = None,
    seed: Annotated[int | None, typer.Option(help="seed of the run's random source and of the test model")] = None,
    budget: Annotated[
        float | None, typer.Option("--budget", "--investment", help="money budget; the run stops cleanly when spent")
    ] = None,
    record: Annotated[Path | None, typer.Option(metavar="CASSETTE", help="record every model call here")] = None,
    replay: Annotated[Path | None, typer.Option(metavar="CASSETTE", help="answer from a recorded cassette")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", metavar="KEY=VALUE", help="scenario option")] = None,
    checkpoint_every: Annotated[
        int | None, typer.Option(min=1, help="a checkpoint every N rounds (default: the scenario's, else 1)")
    ] = None,
    log_turns: Annotated[
        bool | None, typer.Option("--log-turns/--no-log-turns", help="log observe/think/act of every turn")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="run directory (default: RUNS_DIR/NAME-STAMP-ID)")] = None,
    runs_dir: Annotated[Path, typer.Option(help="where run directories go")] = Path("runs"),
    no_save: Annotated[bool, typer.Option("--no-save", help="write no run directory")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no transcript, no progress")] = False,
) -> None:
    """Run a scenario and write its run directory."""
    name, options, settings = target, _options(set_ or []), {}
    if target.endswith((".yaml", ".yml")):
        with _reported():
            config = read_config_file(Path(target))
        name, options, settings = config.scenario, {**config.config, **options}, config.run
    with _reported():
        load_scenario(name)  # a wrong name is reported before any model is loaded
    seed = seed if seed is not None else settings.get("seed")
    chosen = llm or settings.get("llm")
    language_model = _model(chosen, model or settings.get("model"), base_url or settings.get("base_url"), seed, replay)
    if record is not None:
        language_model = CassetteLLM(record, mode=CassetteMode.RECORD, inner=language_model)
    run_options = RunOptions(
        rounds=rounds if rounds is not None else settings.get("rounds"),
        idea=idea if idea is not None else settings.get("idea"),
        seed=seed,
        budget=budget if budget is not None else settings.get("budget"),
        checkpoint_every=checkpoint_every,
        log_turns=log_turns,
    )
    run_dir = None if no_save else (out or new_run_dir(runs_dir, name))
    named = f"replay:{replay}" if replay is not None else chosen or "auto"
    manifest = {"llm": named, "model": model, "base_url": base_url, "cassette": str(record or replay or "")}

    def work(live: Callable[[Team], None]) -> Any:
        return run_scenario(
            name,
            llm=language_model,
            options=options,
            out_dir=run_dir,
            manifest=manifest,
            run=run_options,
            on_round=live,
        )

    report, team = _execute(work, run_options.rounds or 0, quiet=quiet)
    _finish(report, team, run_dir, quiet=quiet)


def _manifest_model(manifest: dict[str, Any]) -> LLM:
    """The model a run was made with, as its manifest names it (a replayed cassette replays again)."""
    return _resolve({key: manifest.get(key) for key in ("llm", "model", "base_url", "seed")})


@app.command()
def resume(
    run_dir: Annotated[Path, typer.Argument(help="a run directory written by `metaroles run`")],
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no transcript, no progress")] = False,
) -> None:
    """Continue a run from its last complete checkpoint (after a crash, a kill, or a budget stop)."""
    with _reported():
        manifest = read_manifest(_run_dir(run_dir))
    llm = _manifest_model(manifest)
    report, team = _execute(
        lambda live: resume_scenario(run_dir, llm=llm, on_round=live), manifest["n_round"], quiet=quiet
    )
    _finish(report, team, run_dir, quiet=quiet)


@app.command()
def fork(
    run_dir: Annotated[Path, typer.Argument(help="the parent run directory")],
    from_round: Annotated[int, typer.Option("--from-round", help="branch from the state at the end of this round")],
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", metavar="KEY=VALUE", help="a scenario option, or role.NAME.llm=MODEL for one role"),
    ] = None,
    idea: Annotated[str, typer.Option(help="a message published to every role at the fork point")] = "",
    out: Annotated[Path | None, typer.Option(help="the new run directory (default: next to the parent)")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no transcript, no progress")] = False,
) -> None:
    """Start a new run from a round of an earlier one, with a change; the new run records its parent."""
    with _reported():
        manifest = read_manifest(_run_dir(run_dir))
    changes, role_llms = {}, {}
    for key, value in _options(set_ or []).items():
        if key.startswith("role.") and key.endswith(".llm"):
            role_llms[key[len("role.") : -len(".llm")]] = _resolve({"llm": str(value)})
        else:
            changes[key] = value
    llm = _manifest_model(manifest)
    child = out or new_run_dir(run_dir.parent, f"{manifest['scenario']}-fork{from_round}")

    def work(live: Callable[[Team], None]) -> Any:
        return fork_scenario(
            run_dir,
            from_round=from_round,
            out_dir=child,
            llm=llm,
            changes=changes,
            role_llms=role_llms,
            idea=idea,
            on_round=live,
        )

    report, team = _execute(work, manifest["n_round"], quiet=quiet)
    _finish(report, team, child, quiet=quiet)


@app.command()
def graph(
    run_dir: Annotated[Path, typer.Argument(help="a run directory written by `metaroles run`")],
    format_: Annotated[Format, typer.Option("--format", "-f", help="what to produce")] = Format.mermaid,
    out: Annotated[
        Path | None, typer.Option(help="file to write (default: RUN_DIR/flow.EXT; text formats print)")
    ] = None,
) -> None:
    """The message-flow graph of a run: a picture, an interactive page, Mermaid, GraphML or JSON."""
    from metaroles import flowgraph, flowhtml, flowplot  # networkx/matplotlib: only for this command

    if not (_run_dir(run_dir) / EVENTS).is_file():
        raise _fail(f"{str(run_dir)!r} has no {EVENTS}; pass a run directory `metaroles run` wrote")
    events = read_events(run_dir / EVENTS)
    title = _title(run_dir)
    if format_ in (Format.mermaid, Format.json) and out is None:
        typer.echo(flowgraph.to_mermaid(events) if format_ is Format.mermaid else flowgraph.to_json(events), nl=False)
        return
    target = out or run_dir / f"flow.{format_.value}"
    if format_ in (Format.png, Format.svg):
        flowplot.render(events, target, title=title)
    elif format_ is Format.html:
        from metaroles.runs import run_messages

        flowhtml.render_html(events, target, title=title, texts={m.id: m.content for m in run_messages(run_dir)})
    elif format_ is Format.graphml:
        flowgraph.write_graphml(events, target)
    else:
        target.write_text(flowgraph.to_mermaid(events) if format_ is Format.mermaid else flowgraph.to_json(events))
    typer.echo(f"wrote {target}")


def _title(run_dir: Path) -> str:
    try:
        manifest = read_manifest(run_dir)
    except MetarolesError:
        return run_dir.name
    return f"{manifest.get('scenario', 'run')} · {run_dir.name}"


@app.command()
def show(
    run_dir: Annotated[Path, typer.Argument(help="a run directory")],
    role: Annotated[str | None, typer.Option(help="only messages from or to this role")] = None,
    round_: Annotated[int | None, typer.Option("--round", help="only this round")] = None,
) -> None:
    """Print a run's transcript, optionally only one role's messages or one round."""
    from metaroles.runs import run_messages

    with _reported():
        messages = run_messages(_run_dir(run_dir))
    if role is not None:
        messages = [m for m in messages if m.sender == role or role in m.recipients or "<all>" in m.recipients]
    if round_ is not None:
        messages = [m for m in messages if m.round == round_]
    for m in messages:
        typer.echo(f"[round {m.round}] [{m.sender} → {', '.join(m.recipients)}] ({m.action}) {m.content}")
    if not messages:
        err.print("no message matches", highlight=False)


@app.command()
def diff(
    run_a: Annotated[Path, typer.Argument(help="a run directory")],
    run_b: Annotated[Path, typer.Argument(help="another, e.g. a fork of the first")],
) -> None:
    """Where two runs part: the first round whose messages differ, and the messages that differ."""
    from metaroles.runs import diff_runs

    with _reported():
        result = diff_runs(_run_dir(run_a), _run_dir(run_b))
    if result.first_divergence_round is None:
        typer.echo(f"identical: {result.common} message(s)")
        return
    typer.echo(f"{result.common} message(s) in common; first divergence in round {result.first_divergence_round}")
    for left, right in result.differing:
        typer.echo(f"- {_line(left)}\n+ {_line(right)}")


def _line(message: Any) -> str:
    if message is None:
        return "(none)"
    return f"[round {message.round}] [{message.sender} → {', '.join(message.recipients)}] {message.content[:200]}"


@app.command("list")
def list_() -> None:
    """The scenarios you can run, and the roles, actions and environments plug-ins contribute."""
    for name, module in known_scenarios().items():
        typer.echo(f"{name}\t{module}")
    for kind in PLUGIN_KINDS:
        for name, target in plugins(kind).items():
            typer.echo(f"{kind[:-1]}: {name}\t{target}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``metaroles`` command; returns the exit code."""
    try:
        code = app(args=list(argv) if argv is not None else None, prog_name="metaroles", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        err.print("aborted")
        return 130
    return code if isinstance(code, int) else 0
