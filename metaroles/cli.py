"""The ``metaroles`` command: ``metaroles run NAME`` runs a scenario and writes its run directory."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio

from metaroles.exceptions import MetarolesError
from metaroles.offline import TestLLM
from metaroles.providers import resolve_llm
from metaroles.scenario import known_scenarios, new_run_dir, run_scenario, transcript


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="metaroles", description="Run multi-role scenarios on a message bus.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a scenario and write its run directory")
    run.add_argument("name", help="scenario name, e.g. debate")
    run.add_argument("--llm", default="test", help="model: 'test', 'test:SEED' or 'scripted:PATH' (default: test)")
    run.add_argument("--seed", type=int, default=0, help="seed of the offline test model (default: 0)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=JSON", help="scenario option, e.g. turns=2")
    run.add_argument("--runs-dir", type=Path, default=Path("runs"), help="where run directories go (default: runs)")
    run.add_argument("--no-save", action="store_true", help="do not write a run directory")
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``metaroles`` command."""
    args = _parser().parse_args(argv)
    if args.command == "list":
        print("\n".join(known_scenarios()))
        return 0
    try:
        llm = TestLLM(args.seed) if args.llm == "test" else resolve_llm(args.llm)
        out_dir = None
        if not args.no_save:
            out_dir = new_run_dir(args.runs_dir, args.name)
        report, team = anyio.run(lambda: run_scenario(args.name, llm=llm, options=_options(args.set), out_dir=out_dir))
    except MetarolesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(transcript(team.env.history.storage))
    print(f"\n{report}")
    if out_dir is not None:
        print(f"run directory: {out_dir}")
    return 0
