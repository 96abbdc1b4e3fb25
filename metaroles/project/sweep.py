"""Sweeps: one scenario over a grid of settings, one run directory per trial, one table of results.

``metaroles sweep society --grid seed=0..19 --grid epsilon=0.1,0.2`` runs 40 trials into
``SWEEP_DIR/seed=3,epsilon=0.1/`` and so on, several at once (``--jobs``: processes here, or one
Ray task per trial), and keeps ``sweep.jsonl`` — a row per trial: its settings, status, rounds,
messages, tokens, cost, wall time and the scenario's own ``summary(run_dir)`` — and ``sweep.csv``
beside it; once they have run, ``ensemble.json``/``.md`` (:mod:`metaroles.project.ensembles`): per
setting (the grid's values but its seeds: ``seed``, ``graph_seed``, any ``*_seed``), each outcome's
distribution across the seeds with intervals, and which runs agree.
While trials run, ``sweep.jsonl`` gains each one's line as it ends (nothing is rewritten: a file
replaced per trial cost the disk more than a trial); when the sweep ends both are written in grid
order, atomically. Running the same sweep again skips finished trials and resumes interrupted
ones (a trial is a run directory like any other: ``metaroles resume`` works on it too). A trial's
row is a function of its run, so two sweeps of one grid — on processes or on Ray — write the same
table, timings aside.

On this machine a trial waits for the disk not even once: the sweep syncs the trials it has ended
together, every few seconds and at its end (``durability="sweep"``, ``record.durability.GroupSync``).
A killed sweep loses nothing, and a trial a power cut may have torn is run again from its start,
giving the same row. ``"run"`` (the default on Ray) syncs each trial as it ends, ``"round"`` each
checkpoint, for trials too long to run again.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from metaroles.core.exceptions import ConfigError
from metaroles.core.files import write_atomic
from metaroles.project.ensembles import Reading, grouped_markdown, grouped_report, write_ensemble
from metaroles.project.registry import load_scenario
from metaroles.project.rundir import scenario_label
from metaroles.project.scenario import checked_config
from metaroles.project.trials import RUN_KEYS, LocalTrials, RayTrials, Row, embedded_engine
from metaroles.record.durability import Durability, GroupSync, checked_durability

TABLE = "sweep.jsonl"
TIMED = ("wall_s",)
"""Columns the clock wrote (the only ones two sweeps of one grid may differ in)."""


MAX_TRIALS = 10_000
"""The most trials a sweep runs unless told otherwise (``--max-trials``): a typo in a range must not run for days."""


def parse_grid(specs: Iterable[str], *, max_trials: int = MAX_TRIALS) -> dict[str, list[Any]]:
    """``["seed=0..3", "turns=2,3"]`` → ``{"seed": [0, 1, 2, 3], "turns": [2, 3]}`` (values parsed as YAML scalars).

    The trials are counted before any list is made: a grid of more than ``max_trials`` is refused.

    Raises:
        ConfigError: Naming the spec, for one without ``=``, an empty value, a bad range, or a key given twice;
            or a grid of more trials than ``max_trials``.
    """
    import yaml

    sized: dict[str, Sequence[Any]] = {}
    for spec in specs:
        key, eq, values = spec.partition("=")
        key = key.strip()
        if not eq or not key or not values.strip():
            raise ConfigError(f"--grid {spec!r} must be KEY=V1,V2,... or KEY=FIRST..LAST, e.g. seed=0..9")
        if key in sized:
            raise ConfigError(f"--grid names {key!r} twice; give all its values at once, e.g. {key}=1,2,3")
        first, dots, last = values.partition("..")
        if dots:
            try:
                low, high = int(first), int(last)
            except ValueError:
                raise ConfigError(f"--grid {spec!r}: a range is FIRST..LAST of integers, e.g. seed=0..19") from None
            if high < low:
                raise ConfigError(f"--grid {spec!r}: the range is empty ({low} > {high})")
            sized[key] = range(low, high + 1)
        else:
            sized[key] = [yaml.safe_load(v) if v.strip() else v for v in values.split(",")]
    if not sized:
        raise ConfigError("a sweep needs at least one --grid KEY=VALUES, e.g. --grid seed=0..9")
    return checked_grid(sized, max_trials=max_trials)


def checked_grid(grid: Mapping[str, Iterable[Any]], *, max_trials: int = MAX_TRIALS) -> dict[str, list[Any]]:
    """``grid`` with its values as lists, once its trials are counted (without making them) and found few enough.

    A ``range`` is counted, not listed; other iterables without a length are listed first.

    Raises:
        ConfigError: If it has more than ``max_trials`` trials, saying how to allow them.
    """
    sized: dict[str, Sequence[Any]] = {
        key: values if isinstance(values, Sequence) else list(values) for key, values in grid.items()
    }
    count = math.prod(len(values) for values in sized.values())
    if count > max_trials:
        sizes = " × ".join(f"{len(values):,} {key}" for key, values in sized.items())
        raise ConfigError(
            f"the grid has {count:,} trials ({sizes}), more than the limit of {max_trials:,}; "
            f"narrow it, or pass --max-trials {count} to run them all"
        )
    return {key: list(values) for key, values in sized.items()}


def trials(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid, the first key varying slowest."""
    keys = list(grid)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(grid[k] for k in keys))]


def trial_name(params: dict[str, Any]) -> str:
    """The folder of a trial: its settings, ``key=value`` joined by commas (a value's ``/`` becomes ``_``)."""
    return ",".join(
        f"{k}={json.dumps(v) if not isinstance(v, str) else v}".replace("/", "_") for k, v in params.items()
    )


def run_sweep(
    scenario: str,
    grid: dict[str, list[Any]],
    out: Path,
    *,
    options: dict[str, Any] | None = None,
    llm: dict[str, Any] | None = None,
    backend: str = "local",
    jobs: int = 1,
    ray_address: str | None = None,
    on_trial: Callable[[Row], None] | None = None,
    durability: str | None = None,
) -> list[Row]:
    """Run every trial of ``grid`` not finished yet into ``out``; return the rows in grid order.

    ``durability``: when a trial waits for the disk (see the module).

    Raises:
        ConfigError: For an unknown scenario, a grid value or option the scenario refuses
            (checked for every trial before any runs), or a bad backend or job count.
        InvalidValueError: For a durability other than ``"run"`` or ``"round"`` (or ``"sweep"``, the local default).
    """
    batch = sweep_batch(scenario, grid, out, options)
    every = batch.params
    rows = run_trials(
        batch, llm=llm, backend=backend, jobs=jobs, ray_address=ray_address, on_trial=on_trial, durability=durability
    )
    settings = len({trial_name({k: v for k, v in p.items() if not _is_seed(k)}) for p in every})
    title = f"{scenario_label(scenario)}: {len(rows)} trials, {settings} setting{'s' if settings > 1 else ''} × seeds"
    write_ensemble(out, grouped_report(rows, out, title=title, reading=partial(_reading, list(grid))), grouped_markdown)
    return rows


def sweep_batch(scenario: str, grid: dict[str, list[Any]], out: Path, options: dict[str, Any] | None) -> TrialBatch:
    """The trials of ``grid`` (each with ``options``), checked: what :func:`run_sweep` runs and an estimate dry-runs.

    Raises:
        ConfigError: For an unknown scenario, a grid value or option the scenario refuses, or two trials that would
            share a folder.
    """
    module = load_scenario(scenario)
    options = dict(options or {})
    every = trials(grid)
    configs = [{**options, **{k: v for k, v in p.items() if k not in RUN_KEYS}} for p in every]
    for config in configs:  # a typo in the grid fails now, not in trial 17
        checked_config(module, config)
    names = [trial_name(p) for p in every]
    if len(set(names)) != len(names):
        raise ConfigError("two trials of this grid would share a folder; give distinct values")
    return TrialBatch(scenario, out, names, every, configs)


def _reading(keys: list[str], row: Row) -> Reading:
    """A trial's row as an ensemble's reading: its arm is its setting but the seeds (``all`` when only seeds vary)."""
    summary = {k.removeprefix("summary."): v for k, v in row.items() if k.startswith("summary.")}
    arm = trial_name({k: row.get(k) for k in keys if not _is_seed(k)}) or "all"
    seeds = [row.get(k) for k in keys if _is_seed(k)]
    return {"run": row["trial"], "arm": arm, "seed": seeds[0] if len(seeds) == 1 else seeds or None, **summary}


def _is_seed(key: str) -> bool:
    """Whether a grid key is a seed (``seed``, ``graph_seed``): the runs it spans are one setting's ensemble."""
    return key == "seed" or key.endswith("_seed")


@dataclass(frozen=True)
class TrialBatch:
    """Trials of one scenario, each named (its folder in ``out``), labelled (its row) and configured."""

    scenario: str
    out: Path
    names: list[str]
    params: list[dict[str, Any]]
    """Each trial's row labels; its ``RUN_KEYS`` (seed, rounds, budget) are its run options."""
    configs: list[dict[str, Any]]
    """Each trial's whole scenario configuration (checked by the caller)."""
    forks: list[dict[str, Any]] | None = None
    """Each trial's branch of a run (its ``run_dir``, ``from_round``, ``interventions``), when trials are branches."""


def run_trials(
    batch: TrialBatch,
    *,
    llm: dict[str, Any] | None = None,
    backend: str = "local",
    jobs: int = 1,
    ray_address: str | None = None,
    on_trial: Callable[[Row], None] | None = None,
    durability: str | None = None,
) -> list[Row]:
    """Run the trials of ``batch`` not finished yet (what :func:`run_sweep` and evaluations share); rows in order.

    Raises:
        ConfigError: For a bad backend or job count.
        InvalidValueError: For a bad durability.
    """
    durability = _checked(backend, jobs, durability)
    out, names = batch.out, batch.names
    out.mkdir(parents=True, exist_ok=True)
    table = Table(len(names))
    spec = {"llm": "test", **(llm or {})}
    calls = [
        (batch.scenario, str(out / n), p, c, spec, durability, fork)
        for n, p, c, fork in zip(names, batch.params, batch.configs, _forks(batch), strict=True)
    ]
    group = GroupSync(out, names) if durability == "sweep" else None
    with (out / TABLE).open("w", encoding="utf-8") as live:  # a line per trial as it ends; grid order at the end

        def done(index: int, row: Row) -> None:
            live.write(table.put(index, row))
            live.flush()
            if group is not None:
                group.end(names[index])
            if on_trial is not None:
                on_trial(row)

        here = LocalTrials(jobs, threads=jobs > 1 and embedded_engine(spec))
        (here if backend == "local" else RayTrials(ray_address)).run(calls, done)
    if group is not None:
        group.finish()
    table.write(out)
    return table.rows()


def _forks(batch: TrialBatch) -> list[dict[str, Any] | None]:
    """Each trial's branch of a run, or ``None`` for a trial that runs from the start."""
    return list(batch.forks) if batch.forks is not None else [None] * len(batch.names)


def _checked(backend: str, jobs: int, durability: str | None) -> Durability:
    """The sweep's durability (by default ``"sweep"`` here, ``"run"`` on Ray), once backend and jobs are checked.

    Raises:
        ConfigError: For a bad backend or job count.
        InvalidValueError: For a bad durability.
    """
    if backend not in ("local", "ray"):
        raise ConfigError(f"backend={backend!r} is not a sweep backend; use 'local' (processes) or 'ray'")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"jobs={jobs!r} must be a positive integer, e.g. --jobs 2")
    local = backend == "local"
    return checked_durability(durability or ("sweep" if local else "run"), sweep=local)


class Table:
    """A sweep's rows in grid order as they come in."""

    def __init__(self, size: int) -> None:
        """A table of ``size`` trials, none in yet."""
        self._rows: list[Row | None] = [None] * size

    def put(self, index: int, row: Row) -> str:
        """Trial ``index``'s row; returns its line of ``sweep.jsonl``."""
        self._rows[index] = row
        return json.dumps(row) + "\n"

    def rows(self) -> list[Row]:
        """The rows in, in grid order."""
        return [row for row in self._rows if row is not None]

    def write(self, out: Path, *, name: str = "sweep", jsonl: bool = True) -> None:
        """Write ``NAME.jsonl`` and ``NAME.csv`` (atomically): a column per key, in the order the rows name them."""
        rows = self.rows()
        if jsonl:
            write_atomic(out / f"{name}.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
        columns = list(dict.fromkeys(itertools.chain.from_iterable(rows)))
        lines = [_csv_line(columns), *(_csv_line([row.get(k, "") for k in columns]) for row in rows)]
        write_atomic(out / f"{name}.csv", "".join(lines))


def _csv_line(values: list[Any]) -> str:
    """One CSV line of ``values`` (as ``csv.DictWriter`` writes a row: ``None`` and missing values empty)."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(values)
    return buffer.getvalue()


def read_table(out: Path) -> list[Row]:
    """The rows of a sweep directory's ``sweep.jsonl``."""
    path = out / TABLE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def default_out(scenario: str, grid: dict[str, list[Any]], options: dict[str, Any], llm: dict[str, Any]) -> Path:
    """``sweeps/SCENARIO-<digest>``: the same sweep gets the same folder, so running it again resumes it."""
    import hashlib

    public = {k: v for k, v in llm.items() if k != "api_key"}
    key = json.dumps([scenario, grid, options, public], sort_keys=True, default=str)
    return Path("sweeps") / f"{scenario_label(scenario)}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def sweep(
    scenario: str,
    grid: dict[str, Iterable[Any]] | Sequence[str],
    *,
    out: str | Path | None = None,
    options: dict[str, Any] | None = None,
    llm: str = "test",
    llm_settings: dict[str, Any] | None = None,
    backend: str = "local",
    jobs: int = 1,
    ray_address: str | None = None,
    durability: str | None = None,
    max_trials: int = MAX_TRIALS,
) -> Any:
    """Run ``scenario`` over ``grid`` (``{"seed": range(20), "turns": [2, 3]}`` or ``["seed=0..19"]``).

    Returns a pandas DataFrame, a row per trial (see the module). Trials already finished in
    ``out`` are not run again; interrupted ones are resumed. ``durability``: see the module.
    """
    import pandas as pd

    parsed = (
        parse_grid(grid, max_trials=max_trials)
        if not isinstance(grid, dict)
        else checked_grid(grid, max_trials=max_trials)
    )
    spec = {**(llm_settings or {}), "llm": llm}
    folder = Path(out) if out is not None else default_out(scenario, parsed, options or {}, spec)
    rows = run_sweep(
        scenario,
        parsed,
        folder,
        options=options,
        llm=spec,
        backend=backend,
        jobs=jobs,
        ray_address=ray_address,
        durability=durability,
    )
    return pd.DataFrame(rows)
