"""``metaroles sweep``: one scenario over a grid of settings, a run directory per trial, one table."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from metaroles.cli.common import (
    INTERVENE_SPECS,
    LLM_HELP,
    TRUST_HELP,
    app,
    err,
    options_from,
    reported,
    run_dir_at,
    trusted,
)
from metaroles.cli.estimating import ESTIMATE_HELP, print_trials_estimate
from metaroles.core.text import printable


@app.command()
def sweep(
    scenario: Annotated[str, typer.Argument(help="scenario name (see `metaroles list`)")],
    grid: Annotated[
        list[str],
        typer.Option("--grid", metavar="KEY=VALUES", help="values to sweep: seed=0..19 or turns=2,3 (repeatable)"),
    ],
    set_: Annotated[list[str] | None, typer.Option("--set", metavar="KEY=VALUE", help="scenario option")] = None,
    llm: Annotated[str | None, typer.Option(help=LLM_HELP)] = None,
    model: Annotated[str | None, typer.Option(help="model name for an OpenAI-compatible server")] = None,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible endpoint ($OPENAI_BASE_URL)")] = None,
    backend: Annotated[str, typer.Option(help="'local' (processes here) or 'ray' (one Ray task per trial)")] = "local",
    jobs: Annotated[int, typer.Option(min=1, max=1024, help="trials at once on the local backend")] = 1,
    ray_address: Annotated[str | None, typer.Option(help="Ray cluster: 'auto' or ray://host:port")] = None,
    out: Annotated[
        Path | None, typer.Option(help="sweep directory (default: sweeps/SCENARIO-<digest of the sweep>)")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress display")] = False,
    max_trials: Annotated[
        int | None,
        typer.Option(min=1, help="refuse a grid of more trials than this (default 10000: a typo runs for days)"),
    ] = None,
    durability: Annotated[
        str | None,
        typer.Option(help="'sweep' (trials synced together; local default), 'run' (each at its end), 'round'"),
    ] = None,
    estimate: Annotated[bool, typer.Option("--estimate", help=ESTIMATE_HELP)] = False,
) -> None:
    """Run a scenario once per combination of the grid; re-running skips finished trials and resumes the rest."""
    from metaroles.llm.settings import LLMSettings
    from metaroles.project.sweep import MAX_TRIALS, TABLE, default_out, parse_grid, run_sweep, sweep_batch, trials

    with reported():
        parsed = parse_grid(grid, max_trials=max_trials or MAX_TRIALS)
        settings = LLMSettings.from_env(os.environ, llm=llm or "test", model=model, base_url=base_url)
        spec: dict[str, Any] = settings.model_dump(exclude_none=True)
        options = options_from(set_ or [])
        folder = out or default_out(scenario, parsed, options, spec)
        if estimate:
            batch = sweep_batch(scenario, parsed, folder, options)
    if estimate:
        print_trials_estimate(scenario, batch, spec, jobs=jobs, quiet=quiet)
        return
    with reported():
        total = len(trials(parsed))
        with shown_trials("sweep", total, quiet=quiet) as on_trial:
            rows = run_sweep(
                scenario,
                parsed,
                folder,
                options=options,
                llm=spec,
                backend=backend,
                jobs=jobs,
                ray_address=ray_address,
                on_trial=on_trial,
                durability=durability,
            )
        drawn_ensemble(folder)
    failed = [row for row in rows if row["status"] != "done"]
    typer.echo(f"{len(rows) - len(failed)} of {total} trials done; table: {folder / TABLE}")
    plots = "plots: ensemble.svg, rounds.svg"
    typer.echo(f"ensemble: {folder / 'ensemble.md'} (each setting's outcomes across seeds; {plots})")
    for row in failed:
        err.print(printable(f"failed: {row['trial']}: {row.get('error', '')}"), highlight=False)
    if failed:
        raise typer.Exit(1)


def drawn_ensemble(folder: Path) -> None:
    """Draw ``ensemble.svg`` and ``rounds.svg`` from the ``ensemble.json`` a branch, sweep or evaluation wrote."""
    import json

    from metaroles.flow.ensemble import render_ensemble, render_rounds
    from metaroles.project.ensembles import ENSEMBLE

    report = json.loads((folder / ENSEMBLE).read_text(encoding="utf-8"))
    render_ensemble(report, folder / "ensemble.svg")
    render_rounds(report, folder, folder / "rounds.svg")


@contextmanager
def shown_trials(label: str, total: int, *, quiet: bool) -> Iterator[Callable[[dict[str, Any]], None]]:
    """The live display of ``total`` trials while the block runs; yields what to call as each ends (its row)."""
    progress = trial_progress(quiet)
    bar = progress.add_task(label, total=total, last="")

    def on_trial(row: dict[str, Any]) -> None:
        progress.update(bar, advance=1, last=printable(f"{row['trial']}: {row['status']}"))

    with progress:
        yield on_trial


def trial_progress(quiet: bool) -> Progress:
    """The live display: trials done of all, the last one's status, the time so far (off if quiet or not a terminal)."""
    return Progress(
        TextColumn("trial"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("{task.fields[last]}"),
        TimeElapsedColumn(),
        console=err,
        disable=quiet or not err.is_terminal,
    )


@app.command()
def branch(
    run_dir: Annotated[Path, typer.Argument(help="the parent run directory")],
    from_round: Annotated[
        int, typer.Option("--round", min=0, help="branch from the parent's checkpoint of this round")
    ],
    n: Annotated[int, typer.Option("--n", help="how many branches (each on its own seed)")],
    seed: Annotated[
        int | None, typer.Option("--seed", help="the first branch's seed; the others follow (default: parent's + 1)")
    ] = None,
    intervene: Annotated[
        list[str] | None,
        typer.Option(
            "--intervene",
            metavar="SPEC",
            help=f"a change in a second arm of branches, paired by seed: {INTERVENE_SPECS}",
        ),
    ] = None,
    llm: Annotated[
        str | None, typer.Option(help="the branches' model (default: the parent's, on each branch's seed)")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="ensemble directory (default: RUN-branchesK next to the run)")
    ] = None,
    backend: Annotated[str, typer.Option(help="'local' (processes here) or 'ray' (one Ray task per branch)")] = "local",
    jobs: Annotated[int, typer.Option(min=1, max=1024, help="branches at once on the local backend")] = 1,
    ray_address: Annotated[str | None, typer.Option(help="Ray cluster: 'auto' or ray://host:port")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress display, no report on stdout")] = False,
    trust: Annotated[bool, typer.Option("--trust", help=TRUST_HELP)] = False,
) -> None:
    """N branches of a run from round K on their own seeds: each outcome's distribution with intervals, and a plot."""
    from metaroles.project.branches import Ensemble, run_branches
    from metaroles.project.ensembles import ENSEMBLE_MD
    from metaroles.project.rundir import read_manifest

    with reported():
        trusted(read_manifest(run_dir_at(run_dir))["scenario"], run_dir, trust=trust)
        plan = Ensemble(run_dir, from_round, n, first_seed=seed, interventions=list(intervene or []))
        folder = out or run_dir.parent / f"{run_dir.name}-branches{from_round}"
        model = None if llm is None else {"llm": llm}
        arms = 2 if intervene else 1
        with shown_trials("branch", n * arms if n > 0 else 0, quiet=quiet) as on_trial:
            report = run_branches(
                plan, folder, llm=model, backend=backend, jobs=jobs, ray_address=ray_address, on_trial=on_trial
            )
        drawn_ensemble(folder)
    if not quiet:
        typer.echo((folder / ENSEMBLE_MD).read_text(encoding="utf-8"), nl=False)
    typer.echo(f"report: {folder / ENSEMBLE_MD} (data: ensemble.json, plots: ensemble.svg, rounds.svg)")
    for name in report["failed"]:
        err.print(printable(f"failed: {name} (run the same command again to resume it)"), highlight=False)
    if report["failed"]:
        raise typer.Exit(1)
