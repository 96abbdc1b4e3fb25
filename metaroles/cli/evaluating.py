"""``metaroles eval SUITE``: a scenario over a suite's tasks × settings × seeds, each run scored."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from metaroles.cli.common import LLM_HELP, app, err, options_from, reported
from metaroles.cli.estimating import ESTIMATE_HELP, print_trials_estimate, refuse_with
from metaroles.cli.sweeping import drawn_ensemble, shown_trials
from metaroles.core.text import printable


@app.command(name="eval")
def evaluate(
    suite: Annotated[
        str,
        typer.Argument(
            help="a built-in suite — software (the MetaGPT paper's table), debate, werewolf, society, feed "
            "(recommenders compared), fidelity (ultimatum and public goods games against published human data), "
            "studies (ten classic experiments tested as their papers did: replication, effect and its size) — or "
            "a suite folder with a suite.toml"
        ),
    ],
    setting: Annotated[
        list[str] | None,
        typer.Option(
            "--setting",
            metavar="NAME:KEY=VALUE,...",
            help="a setting to compare (repeatable; replaces the suite's), e.g. no_fix:max_fix_loops=0",
        ),
    ] = None,
    without: Annotated[
        list[str] | None,
        typer.Option("--without", metavar="ROLE", help="one more setting: the scenario without ROLE (repeatable)"),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="KEY=VALUE",
            help="one more setting with this change (repeatable), e.g. role.Engineer.llm=openai or max_fix_loops=0",
        ),
    ] = None,
    seeds: Annotated[int | None, typer.Option(min=1, help="run seeds 0..N-1 (default: the suite's)")] = None,
    task: Annotated[list[str] | None, typer.Option("--task", help="only this task (repeatable)")] = None,
    llm: Annotated[str | None, typer.Option(help=LLM_HELP)] = None,
    model: Annotated[str | None, typer.Option(help="model name for an OpenAI-compatible server")] = None,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible endpoint ($OPENAI_BASE_URL)")] = None,
    backend: Annotated[str, typer.Option(help="'local' (processes here) or 'ray' (one Ray task per trial)")] = "local",
    jobs: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=1024,
            help="trials at once on the local backend (default: 1; with the embedded model 32, in threads "
            "sharing its engine)",
        ),
    ] = None,
    ray_address: Annotated[str | None, typer.Option(help="Ray cluster: 'auto' or ray://host:port")] = None,
    out: Annotated[Path | None, typer.Option(help="evaluation folder (default: evals/SUITE)")] = None,
    record: Annotated[bool, typer.Option("--record", help="keep every trial's model answers (cassette.jsonl)")] = False,
    replay: Annotated[
        Path | None, typer.Option(metavar="EVAL_DIR", help="answer every call from an evaluation that recorded them")
    ] = None,
    ablation: Annotated[
        bool, typer.Option("--ablation", help="compare the suite's ablation settings too (software: by role)")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress display")] = False,
    trust: Annotated[
        bool,
        typer.Option("--trust", help="import a scenario the suite names outside its folder, or a module (it is code)"),
    ] = False,
    estimate: Annotated[bool, typer.Option("--estimate", help=ESTIMATE_HELP)] = False,
) -> None:
    """Run a suite's tasks × settings × seeds, score every run, write eval.csv/.parquet, summary.csv and report.md.

    ``--without`` and ``--set`` add settings beside the suite's (or ``--setting``'s): each is
    compared with the first setting, its difference and interval in the table. A suite is code:
    its ``score.py`` runs in a child process, each call with a time limit (``score_timeout``).
    """
    from metaroles.llm.settings import LLMSettings
    from metaroles.project.evaluate import check_model, load_suite, run_eval, trial_batch
    from metaroles.project.trials import default_jobs

    with reported():
        if record and replay is not None:
            raise typer.BadParameter("--record and --replay exclude each other: a replay asks no model")
        extra = {f"without={r}": {"without": [r]} for r in without or []} | {p: options_from([p]) for p in set_ or []}
        seeded = range(seeds) if seeds else None
        settings = LLMSettings.from_env(os.environ, llm=llm or "test", model=model, base_url=base_url)
        check_model(settings.llm, settings)
        chosen = load_suite(
            suite, seeds=seeded, tasks=task, settings=_settings(setting), more_settings=extra, trust=trust,
            ablation=ablation,
        )  # fmt: skip
        spec: dict[str, Any] = settings.model_dump(exclude_none=True)
        folder = out or Path("evals") / chosen.name
        total = len(chosen.tasks) * len(chosen.settings) * len(chosen.seeds)
    if estimate:
        refuse_with(record=record, replay=replay)
        print_trials_estimate(chosen.name, trial_batch(chosen, folder), spec, jobs=jobs or 1, quiet=quiet)
        return
    with reported():
        with shown_trials("eval", total, quiet=quiet) as on_trial:
            rows = run_eval(
                chosen, folder, llm=spec, backend=backend, jobs=jobs or default_jobs(spec), ray_address=ray_address,
                record=record, replay=replay, on_trial=on_trial,
            )  # fmt: skip
        drawn_ensemble(folder)
    _print(folder)
    _told(rows, total, folder, table=bool(chosen.table))


def _told(rows: list[dict[str, Any]], total: int, folder: Path, *, table: bool) -> None:
    """What an evaluation wrote, and each trial that failed (then exit 1)."""
    from metaroles.project.evaluate import SUMMARY, TABLE

    failed = [row for row in rows if row.get("status") != "done"]
    written = f"{TABLE}, {SUMMARY}, report.md, ensemble.md" + (", table.md" if table else "")
    typer.echo(f"{len(rows) - len(failed)} of {total} trials done; in {folder}: {written}")
    for row in failed:
        err.print(
            printable(f"failed: {row['task']} {row['setting']} seed {row['seed']}: {row.get('error')}"), highlight=False
        )
    if failed:
        raise typer.Exit(1)


def _settings(specs: list[str] | None) -> dict[str, dict[str, Any]] | None:
    """``--setting NAME:KEY=VALUE,...`` as the settings an evaluation compares (None: the suite's own)."""
    if not specs:
        return None
    settings: dict[str, dict[str, Any]] = {}
    for spec in specs:
        name, _, pairs = spec.partition(":")
        if not name.strip() or name.strip() in settings:
            raise typer.BadParameter(f"--setting {spec!r}: give each setting a new NAME, e.g. no_fix:max_fix_loops=0")
        settings[name.strip()] = options_from([p for p in pairs.split(",") if p.strip()])
    return settings


def _print(folder: Path) -> None:
    """The summary the evaluation wrote: each metric per setting, its interval, its difference from the first."""
    from metaroles.project.evaluate import SUMMARY, figure

    with (folder / SUMMARY).open(encoding="utf-8", newline="") as table:
        lines = list(csv.DictReader(table))
    for line in lines:
        span = f" [{figure(line['low'])}, {figure(line['high'])}]" if line.get("low") else ""
        diff = f"  Δ {figure(line['diff'])}" if line.get("diff") else ""
        diff += f" [{figure(line['diff_low'])}, {figure(line['diff_high'])}]" if line.get("diff_low") else ""
        typer.echo(f"{line['metric']:<16} {line['setting']:<16} n={line['n']:<4} {figure(line['mean'])}{span}{diff}")
