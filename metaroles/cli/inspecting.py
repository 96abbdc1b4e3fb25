"""``metaroles graph``, ``show``, ``export``, ``diff`` and ``list``: look into run directories and what is installed."""

from __future__ import annotations

import json
import warnings
from enum import StrEnum
from functools import partial
from pathlib import Path
from textwrap import indent
from typing import TYPE_CHECKING, Annotated, Any

import typer

from metaroles.cli.common import Format, app, err, fail, reported, run_dir_at, trusted
from metaroles.core.exceptions import ConfigError, MetarolesError, RunDirCorrupt
from metaroles.core.files import read_text, write_atomic
from metaroles.core.text import printable

if TYPE_CHECKING:
    from metaroles.project.diff import RunDiff


@app.command()
def graph(
    run_dir: Annotated[Path, typer.Argument(help="a run directory written by `metaroles run`")],
    format_: Annotated[Format, typer.Option("--format", "-f", help="what to produce")] = Format.mermaid,
    out: Annotated[
        Path | None, typer.Option(help="file to write (default: RUN_DIR/flow.EXT; text formats print)")
    ] = None,
    from_spans: Annotated[
        bool, typer.Option("--from-spans", help="build it from the spans.jsonl of a run made with --otel")
    ] = False,
) -> None:
    """The message-flow graph of a run: a picture, an interactive page, Mermaid, GraphML or JSON."""
    from metaroles.project.diff import run_messages

    try:
        from metaroles.flow import graph as flowgraph  # networkx/matplotlib: only for this command
        from metaroles.flow import page as flowhtml
        from metaroles.flow import plot as flowplot
    except ModuleNotFoundError as exc:
        raise fail(
            f"metaroles graph needs the graph extra ({exc.name} is missing): pip install 'metaroles[graph]'"
        ) from None

    events = _graph_events(run_dir, from_spans=from_spans)
    with reported():
        texts = {m.id: m.text for m in run_messages(run_dir)} if format_ is Format.html else {}
    title = _title(run_dir)
    if format_ in (Format.mermaid, Format.json) and out is None:
        typer.echo(flowgraph.to_mermaid(events) if format_ is Format.mermaid else flowgraph.to_json(events), nl=False)
        return
    if out is not None and (not out.name or out.is_dir()):
        raise fail(
            f"--out {str(out)!r} is a folder; name the file to write, e.g. {str(out / f'flow.{format_.value}')!r}"
        )
    target = out or run_dir / f"flow.{format_.value}"
    with reported():
        if format_ in (Format.png, Format.svg):
            flowplot.render(events, target, title=title)
        elif format_ is Format.html:
            flowhtml.render_html(events, target, title=title, texts=texts)
        elif format_ is Format.graphml:
            flowgraph.write_graphml(events, target)
        else:
            text = flowgraph.to_mermaid(events) if format_ is Format.mermaid else flowgraph.to_json(events)
            write_atomic(target, text, durable=False)
    typer.echo(f"wrote {target}")


def _graph_events(run_dir: Path, *, from_spans: bool) -> list[dict[str, Any]]:
    """The events a graph is drawn from: the run's log, or the spans a run made with ``--otel`` wrote."""
    from metaroles.project.rundir import events_file
    from metaroles.record.eventlog import read_events
    from metaroles.telemetry.spans import SPANS, events_from_spans, read_spans

    source = SPANS if from_spans else events_file(run_dir_at(run_dir)).name
    if not (run_dir_at(run_dir) / source).is_file():
        hint = "run it with --otel" if from_spans else "pass a run directory `metaroles run` wrote"
        raise fail(f"{str(run_dir)!r} has no {source}; {hint}")
    with reported():
        return events_from_spans(read_spans(run_dir / SPANS)) if from_spans else read_events(events_file(run_dir))


def _title(run_dir: Path) -> str:
    from metaroles.project.rundir import read_manifest

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
    from metaroles.project.diff import run_messages

    with reported():
        messages = run_messages(run_dir_at(run_dir))
    if role is not None:
        messages = [m for m in messages if m.sender == role or role in m.recipients or "<all>" in m.recipients]
    if round_ is not None:
        messages = [m for m in messages if m.round == round_]
    for m in messages:
        text = "\n" + indent(m.text, "  ") if m.text != m.content and m.text.startswith("- ") else " " + m.text
        typer.echo(printable(f"[round {m.round}] [{m.sender} → {', '.join(m.recipients)}] ({m.action}){text}"))
    if not messages:
        err.print("no message matches", highlight=False)


class ExportAs(StrEnum):
    """What ``metaroles export`` writes: the event table, or the model calls as training data."""

    jsonl = "jsonl"
    parquet = "parquet"
    sft = "sft"
    trajectories = "trajectories"
    atif = "atif"
    panel = "panel"


@app.command()
def export(
    run_dir: Annotated[Path, typer.Argument(help="a run directory (for sft and trajectories: or an eval folder)")],
    format_: Annotated[
        ExportAs,
        typer.Option(
            "--format",
            "-f",
            help="jsonl/parquet: the event table; panel: a row per role and round (Parquet); sft: a line per "
            "model call (chat messages and answer); trajectories: a line per role and run; atif: the same as "
            "ATIF v1.7 trajectories",
        ),
    ] = ExportAs.jsonl,
    out: Annotated[Path | None, typer.Option(help="file to write (default: RUN_DIR/export/events.FORMAT)")] = None,
    reward: Annotated[
        str | None, typer.Option(metavar="METRIC", help="sft/trajectories of an eval: the score that is the reward")
    ] = None,
    trust: Annotated[
        bool,
        typer.Option(
            "--trust", help="panel: run the run's scenario code again for its roles' state (a file not yours)"
        ),
    ] = False,
    otlp: Annotated[
        bool,
        typer.Option(
            "--otlp",
            help="send the run's trace to an OpenTelemetry collector over OTLP/HTTP instead of writing a table",
        ),
    ] = False,
    endpoint: Annotated[
        str | None,
        typer.Argument(
            help="with --otlp: the collector's URL (default: the OTEL_EXPORTER_OTLP_* variables, else "
            "http://localhost:4318)",
            show_default=False,
        ),
    ] = None,
) -> None:
    """The run's events as a table of a row per event (JSON lines, or Parquet): for pandas, polars and DuckDB.

    The log keeps a line per round; the table spells it out, numbers and latencies included, a round
    at a time (a log of any size), and reads the logs of earlier versions alike. With ``--otlp``, the
    run's trace instead — the spans ``metaroles run --otel`` makes, timed from its record — even for a
    run recorded without tracing.
    """
    from metaroles.project.rundir import events_file
    from metaroles.record.export import export_events

    with reported():
        if format_ in (ExportAs.sft, ExportAs.trajectories, ExportAs.atif):
            _export_training(run_dir, format_.value, out, reward)
            return
        log = events_file(run_dir_at(run_dir))
        if not log.is_file():
            raise ConfigError(f"{str(run_dir)!r} has no event log; pass a run directory `metaroles run` wrote")
        if endpoint is not None and not otlp:
            raise ConfigError(f"{endpoint!r}: an endpoint goes with --otlp (metaroles export RUN --otlp [ENDPOINT])")
        if otlp:
            count, where = _send_trace(run_dir, log, endpoint)
            typer.echo(f"exported {count} spans of {run_dir} to {where}")
            return
        target = out or run_dir / "export" / (
            "panel.parquet" if format_ is ExportAs.panel else f"events.{format_.value}"
        )
        if target.is_dir():
            raise ConfigError(f"--out {str(target)!r} is a folder; name the file to write")
        if format_ is ExportAs.panel:
            rows = _panel(run_dir_at(run_dir), log, target, trust=trust)
            typer.echo(f"wrote {target} ({rows} rows: a role and a round each)")
            return
        count = export_events(log, target, "parquet" if format_ is ExportAs.parquet else "jsonl")
    typer.echo(f"wrote {target} ({count} events)")


def _panel(run_dir: Path, log: Path, target: Path, *, trust: bool) -> int:
    """Write the run's panel: with its roles' state when the run can be run again here without a model call."""
    import anyio

    from metaroles.cli.common import answers_again
    from metaroles.project.panel import replayed_states, write_panel
    from metaroles.project.rundir import read_manifest

    manifest = read_manifest(run_dir)
    try:
        trusted(manifest["scenario"], run_dir, trust=trust)
        llm, role_llms = answers_again(manifest)
    except ConfigError as exc:
        warnings.warn(f"the roles' state columns are left empty: {exc}", stacklevel=1)
        return anyio.run(write_panel, run_dir, log, target)
    states = partial(replayed_states, run_dir, llm, role_llms)
    return anyio.run(write_panel, run_dir, log, target, lambda last: states(through=last))


def _export_training(source: Path, form: str, out: Path | None, reward: str | None) -> None:
    """The model calls of a run, or of an evaluation's trials, as training data (``project.training``)."""
    from metaroles.project.training import export_training

    if not source.is_dir():
        raise ConfigError(f"{str(source)!r} is not a folder; pass a run directory or an eval folder")
    target = out or source / "export" / f"{form}.jsonl"
    if target.is_dir():
        raise ConfigError(f"--out {str(target)!r} is a folder; name the file to write")
    count = export_training(source, target, form, reward=reward)
    typer.echo(f"wrote {target} ({count} {'calls' if form == 'sft' else 'trajectories'})")


def _send_trace(run_dir: Path, log: Path, endpoint: str | None) -> tuple[int, str]:
    """Send the run's span tree over OTLP/HTTP (``telemetry.export``): how many spans, and where."""
    from metaroles.project.rundir import LEDGER, read_manifest, scenario_label
    from metaroles.telemetry.tracing import require_otel

    require_otel()
    from metaroles.telemetry.export import RunFacts, send_otlp

    manifest = read_manifest(run_dir)
    ledger_path = run_dir / LEDGER
    ledger = json.loads(read_text(ledger_path)) if ledger_path.is_file() else []
    if not isinstance(ledger, list):
        raise RunDirCorrupt(f"{ledger_path}: not a list of model calls; the file is damaged")
    facts = RunFacts(
        scenario=scenario_label(str(manifest.get("scenario", ""))),
        run_id=run_dir.resolve().name,
        llm=str(manifest.get("llm") or ""),
        model=str(manifest.get("model") or ""),
    )
    return send_otlp(log, ledger, facts, endpoint)


@app.command()
def diff(
    run_a: Annotated[Path, typer.Argument(help="a run directory")],
    run_b: Annotated[Path, typer.Argument(help="another, e.g. a fork of the first")],
) -> None:
    """Where two runs part: the first round whose messages differ, those messages, and the first differing event.

    Exits 0 when the runs are identical, 1 when they differ (as ``diff`` does), 2 when one cannot be read.
    """
    from metaroles.project.diff import diff_runs

    with reported():
        result = diff_runs(run_dir_at(run_a), run_dir_at(run_b))
        unseeded = _unseeded(run_a, run_b)
    if result.identical:
        typer.echo(f"identical: {result.common} message(s), {result.events_common} event(s)")
        return
    if result.first_divergence_round is None and unseeded:
        typer.echo(f"same messages: {result.common} (by content; {unseeded})")
        return
    if result.first_divergence_round is None:
        typer.echo(f"same messages: {result.common}")
    else:
        typer.echo(f"{result.common} message(s) in common; first divergence in round {result.first_divergence_round}")
        for left, right in result.differing:
            typer.echo(printable(f"- {_line(left)}\n+ {_line(right)}"))
    _echo_event_difference(result)
    raise typer.Exit(1)


def _unseeded(*run_dirs: Path) -> str:
    """Why two runs' ids differ when neither fixed a seed (empty when both did)."""
    from metaroles.project.rundir import read_manifest

    manifests = [read_manifest(run_dir_at(run_dir)) for run_dir in run_dirs]
    if all(manifest.get("seed") is not None for manifest in manifests):
        return ""
    said = "their ids and events differ because a run without --seed draws fresh ids; run both with --seed N"
    if any(str(manifest.get("llm", "")).startswith("test:") for manifest in manifests):
        said += " (--llm test:N seeds the test model's answers, not the run)"
    return said


def _echo_event_difference(result: RunDiff) -> None:
    if result.first_event_difference is None:
        typer.echo(f"same events: {result.events_common}")
        return
    left, right = result.first_event_difference
    typer.echo(f"{result.events_common} event(s) in common; first differing event:")
    typer.echo(printable(f"- {json.dumps(left, ensure_ascii=False) if left else '(none)'}"))
    typer.echo(printable(f"+ {json.dumps(right, ensure_ascii=False) if right else '(none)'}"))


def _line(message: Any) -> str:
    if message is None:
        return "(none)"
    return f"[round {message.round}] [{message.sender} → {', '.join(message.recipients)}] {message.content[:200]}"


@app.command("list")
def list_(
    scenario: Annotated[
        str | None, typer.Argument(help="a scenario (name, FILE.py or pkg.module): list its options")
    ] = None,
    trust: Annotated[
        bool,
        typer.Option("--trust", help="import a scenario file outside the current folder, or a module (it is code)"),
    ] = False,
) -> None:
    """The scenarios you can run, and what plug-ins contribute; with a scenario, its options (``--set KEY=VALUE``)."""
    from metaroles.project.registry import PLUGIN_KINDS, known_scenarios, load_scenario, plugins, scenario_options

    if scenario is not None:
        with reported():
            trusted(scenario, None, trust=trust)
            options = scenario_options(load_scenario(scenario))
        for option in options:
            typer.echo(f"{option.name}: {option.kind} = {option.default}")
            if option.description:
                typer.echo(f"    {option.description}")
        if not options:
            typer.echo(f"{scenario} takes no options")
        return
    for name, module in known_scenarios().items():
        typer.echo(f"{name}\t{module}")
    for kind in PLUGIN_KINDS:
        for name, target in plugins(kind).items():
            typer.echo(f"{kind[:-1]}: {name}\t{target}")
