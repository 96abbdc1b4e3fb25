"""The ``metaroles`` command: ``metaroles run NAME`` runs a scenario and writes its run directory."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio

from metaroles.cassette import CassetteLLM, CassetteMode
from metaroles.eventlog import read_events
from metaroles.exceptions import MetarolesError
from metaroles.llm import LLM
from metaroles.providers import llm_from_settings
from metaroles.scenario import (
    EVENTS,
    known_scenarios,
    new_run_dir,
    read_manifest,
    resume_scenario,
    run_scenario,
    transcript,
)
from metaroles.settings import LLMSettings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="metaroles", description="Run multi-role scenarios on a message bus.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a scenario and write its run directory")
    run.add_argument("name", help="scenario name, e.g. debate")
    run.add_argument(
        "--llm",
        default=None,
        help="auto (default: $METAROLES_LLM, else an OpenAI-compatible server if OPENAI_BASE_URL is set, else the "
        "embedded local model, else the offline test model), openai, local, test, test:SEED, scripted:PATH, "
        "replay:PATH",
    )
    run.add_argument("--model", default=None, help="model name for an OpenAI-compatible server ($METAROLES_MODEL)")
    run.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint ($OPENAI_BASE_URL)")
    run.add_argument("--seed", type=int, default=None, help="sampling seed (the test model's seed)")
    run.add_argument("--record", type=Path, default=None, metavar="CASSETTE", help="record every model call here")
    run.add_argument("--set", action="append", default=[], metavar="KEY=JSON", help="scenario option, e.g. turns=2")
    run.add_argument("--runs-dir", type=Path, default=Path("runs"), help="where run directories go (default: runs)")
    run.add_argument("--no-save", action="store_true", help="do not write a run directory")
    resume = commands.add_parser("resume", help="continue a run from its last checkpoint")
    resume.add_argument("run_dir", type=Path, help="a run directory written by `metaroles run`")
    graph = commands.add_parser("graph", help="the message-flow graph of a run directory")
    graph.add_argument("run_dir", type=Path, help="a run directory written by `metaroles run`")
    graph.add_argument("--format", choices=["mermaid", "graphml", "json"], default="mermaid")
    graph.add_argument("--out", type=Path, default=None, help="file to write (default: print; graphml needs one)")
    commands.add_parser("list", help="list the scenarios")
    return parser


def _options(pairs: Sequence[str]) -> dict[str, object]:
    options: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set {pair!r}: expected KEY=VALUE, e.g. --set turns=2")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def _resolve(options: dict[str, object]) -> LLM:
    """The model the options and the environment ask for (the only place env vars are read)."""
    llm = llm_from_settings(
        LLMSettings.from_env(os.environ, **options), notify=lambda text: print(text, file=sys.stderr)
    )
    print(f"model: {llm!r}", file=sys.stderr)
    return llm


def _model(args: argparse.Namespace) -> LLM:
    """The model of `metaroles run`, recorded to a cassette if asked."""
    llm = _resolve({"llm": args.llm, "model": args.model, "base_url": args.base_url, "seed": args.seed})
    if args.record is not None:
        return CassetteLLM(args.record, mode=CassetteMode.RECORD, inner=llm)
    return llm


def _graph(run_dir: Path, fmt: str, out: Path | None) -> int:
    from metaroles import flowgraph

    events = read_events(run_dir / EVENTS) if (run_dir / EVENTS).exists() else None
    if events is None:
        print(f"error: {str(run_dir)!r} has no {EVENTS}; pass a run directory `metaroles run` wrote", file=sys.stderr)
        return 2
    if fmt == "graphml":
        target = out or run_dir / "flow.graphml"
        flowgraph.write_graphml(events, target)
        print(f"wrote {target}")
        return 0
    text = flowgraph.to_mermaid(events) if fmt == "mermaid" else flowgraph.to_json(events)
    if out is None:
        print(text, end="")
    else:
        out.write_text(text, encoding="utf-8")
        print(f"wrote {out}")
    return 0


def _resume(run_dir: Path) -> int:
    manifest = read_manifest(run_dir)
    llm = _resolve({key: manifest.get(key) for key in ("llm", "model", "base_url", "seed")})
    report, team = anyio.run(lambda: resume_scenario(run_dir, llm=llm))
    print(transcript(team.env.history.storage))
    print(f"\n{report}\nrun directory: {run_dir}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``metaroles`` command."""
    args = _parser().parse_args(argv)
    if args.command == "list":
        print("\n".join(known_scenarios()))
        return 0
    try:
        if args.command == "resume":
            return _resume(args.run_dir)
        if args.command == "graph":
            return _graph(args.run_dir, args.format, args.out)
        llm = _model(args)
        out_dir = None
        if not args.no_save:
            out_dir = new_run_dir(args.runs_dir, args.name)
        manifest = {"llm": args.llm or "auto", "model": args.model, "base_url": args.base_url, "seed": args.seed}
        report, team = anyio.run(
            lambda: run_scenario(args.name, llm=llm, options=_options(args.set), out_dir=out_dir, manifest=manifest)
        )
    except MetarolesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(transcript(team.env.history.storage))
    print(f"\n{report}")
    if out_dir is not None:
        print(f"run directory: {out_dir}")
    return 0
