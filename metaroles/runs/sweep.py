"""Sweeps: one scenario over a grid of settings, one run directory per trial, one table of results.

``metaroles sweep society --grid seed=0..19 --grid epsilon=0.1,0.2`` runs 40 trials into
``SWEEP_DIR/seed=3,epsilon=0.1/`` and so on, several at once (``--jobs``: processes here, or one
Ray task per trial), and keeps ``sweep.jsonl`` — a row per trial in grid order: its settings,
status, rounds, messages, tokens, cost, wall time and the scenario's own ``summary(run_dir)`` —
and ``sweep.csv`` beside it. Both are rewritten (atomically) as each trial ends. Running the same
sweep again skips finished trials and resumes interrupted ones (a trial is a run directory like
any other: ``metaroles resume`` works on it too). A trial's row is a function of its run, so two
sweeps of one grid — on processes or on Ray — write the same table, timings aside.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing import get_context
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

import anyio

from metaroles.core.exceptions import ConfigError
from metaroles.core.files import write_atomic
from metaroles.core.text import redacted
from metaroles.llm.providers import llm_from_settings
from metaroles.llm.settings import LLMSettings
from metaroles.runs.config import RunOptions
from metaroles.runs.registry import load_scenario
from metaroles.runs.rundir import MANIFEST, scenario_label
from metaroles.runs.scenario import checked_config, resume_scenario, run_scenario

TABLE = "sweep.jsonl"
RUN_KEYS = ("seed", "rounds", "budget")
"""Grid keys that are run options; every other key is an option of the scenario."""
TIMED = ("wall_s",)
"""Columns the clock wrote (the only ones two sweeps of one grid may differ in)."""

Row = dict[str, Any]


def parse_grid(specs: Iterable[str]) -> dict[str, list[Any]]:
    """``["seed=0..3", "turns=2,3"]`` → ``{"seed": [0, 1, 2, 3], "turns": [2, 3]}`` (values parsed as YAML scalars).

    Raises:
        ConfigError: Naming the spec, for one without ``=``, an empty value, a bad range, or a key given twice.
    """
    import yaml

    grid: dict[str, list[Any]] = {}
    for spec in specs:
        key, eq, values = spec.partition("=")
        key = key.strip()
        if not eq or not key or not values.strip():
            raise ConfigError(f"--grid {spec!r} must be KEY=V1,V2,... or KEY=FIRST..LAST, e.g. seed=0..9")
        if key in grid:
            raise ConfigError(f"--grid names {key!r} twice; give all its values at once, e.g. {key}=1,2,3")
        first, dots, last = values.partition("..")
        if dots:
            try:
                low, high = int(first), int(last)
            except ValueError:
                raise ConfigError(f"--grid {spec!r}: a range is FIRST..LAST of integers, e.g. seed=0..19") from None
            if high < low:
                raise ConfigError(f"--grid {spec!r}: the range is empty ({low} > {high})")
            grid[key] = list(range(low, high + 1))
        else:
            grid[key] = [yaml.safe_load(v) if v.strip() else v for v in values.split(",")]
    if not grid:
        raise ConfigError("a sweep needs at least one --grid KEY=VALUES, e.g. --grid seed=0..9")
    return grid


def trials(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid, the first key varying slowest."""
    keys = list(grid)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(grid[k] for k in keys))]


def trial_name(params: dict[str, Any]) -> str:
    """The folder of a trial: its settings, ``key=value`` joined by commas (a value's ``/`` becomes ``_``)."""
    return ",".join(
        f"{k}={json.dumps(v) if not isinstance(v, str) else v}".replace("/", "_") for k, v in params.items()
    )


def run_trial(scenario: str, run_dir: str, params: dict[str, Any], options: dict[str, Any], llm: dict[str, Any]) -> Row:
    """Run (or resume, or skip if finished) one trial in ``run_dir``; return its row. Runs in a worker."""
    folder = Path(run_dir)
    row: Row = {"trial": folder.name, **params}
    started = time.perf_counter()
    try:
        if (folder / "report.json").is_file():
            row["status"] = "done"
        else:
            anyio.run(_trial, scenario, folder, params, options, llm)
            row["status"] = "done"
    except Exception as exc:  # a trial that fails is a row that says so; the sweep goes on
        row["status"] = "failed"
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    row["wall_s"] = round(time.perf_counter() - started, 3)
    row.update(_measured(scenario, folder))
    return row


async def _trial(
    scenario: str, folder: Path, params: dict[str, Any], options: dict[str, Any], llm: dict[str, Any]
) -> None:
    seed = params.get("seed", options.get("seed"))
    model = llm_from_settings(LLMSettings(**{**llm, "seed": seed}))
    if (folder / MANIFEST).is_file():  # interrupted: continue from its last checkpoint
        await resume_scenario(folder, llm=model)
        return
    run = RunOptions(**{k: params[k] for k in RUN_KEYS if k in params})
    config = {**options, **{k: v for k, v in params.items() if k not in RUN_KEYS}}
    record = {"llm": llm.get("llm", "test"), "model": llm.get("model"), "base_url": redacted(llm.get("base_url"))}
    await run_scenario(
        scenario, llm=model, options=config, out_dir=folder, manifest={**record, "sweep": params}, run=run
    )


def _measured(scenario: str, folder: Path) -> Row:
    """What the run directory says: rounds, messages, tokens, cost, and the scenario's summary."""
    report_file = folder / "report.json"
    if not report_file.is_file():
        return {}
    report = json.loads(report_file.read_text(encoding="utf-8"))["report"]
    row = {k: report[k] for k in ("rounds", "messages", "total_tokens", "total_cost", "stop_reason")}
    summary = getattr(load_scenario(scenario), "summary", None)
    if summary is not None:
        row.update({f"summary.{k}": v for k, v in summary(folder).items()})
    return row


class LocalTrials:
    """Trials in worker processes of this machine (no Ray needed)."""

    def __init__(self, jobs: int) -> None:
        """Run up to ``jobs`` trials at once."""
        self.jobs = jobs

    def run(self, calls: list[tuple[Any, ...]], done: Callable[[int, Row], None]) -> None:
        """Run each call of ``run_trial``; ``done(index, row)`` as each ends."""
        if self.jobs == 1:
            for index, call in enumerate(calls):
                done(index, run_trial(*call))
            return
        # The heap is not frozen before forking: a trial's session settles its heap only where nobody froze
        # it (core.heap), and a worker that inherits a frozen heap ran each trial ~30 % slower than this process.
        with ProcessPoolExecutor(max_workers=self.jobs, mp_context=_context()) as pool:
            futures: dict[Future[Row], int] = {pool.submit(run_trial, *call): i for i, call in enumerate(calls)}
            while futures:
                finished, _ = wait(futures, return_when=FIRST_COMPLETED)
                for future in finished:
                    done(futures.pop(future), future.result())


def _context() -> BaseContext:
    """How to start workers: forked (instant: metaroles is already imported) from a one-thread process.

    A process with threads (a notebook's Ray client, a GUI) is not safe to fork; its workers
    start fresh from a fork server instead.
    """
    return get_context("fork" if threading.active_count() == 1 else "forkserver")


class RayTrials:
    """One Ray task per trial (``num_cpus`` each) on a local or remote cluster."""

    def __init__(self, address: str | None = None, num_cpus: float = 1) -> None:
        """Run on the cluster at ``address`` (a local one by default)."""
        self.address = address
        self.num_cpus = num_cpus

    def run(self, calls: list[tuple[Any, ...]], done: Callable[[int, Row], None]) -> None:
        """Submit every trial; ``done(index, row)`` as each ends."""
        from metaroles.runs.ray_shards import ensure_ray

        ray = ensure_ray(self.address)
        task = ray.remote(num_cpus=self.num_cpus)(run_trial)
        pending = {task.remote(*call): i for i, call in enumerate(calls)}
        while pending:
            finished, _ = ray.wait(list(pending), num_returns=1)
            for ref in finished:
                done(pending.pop(ref), ray.get(ref))


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
) -> list[Row]:
    """Run every trial of ``grid`` not finished yet into ``out``; return the rows in grid order.

    Raises:
        ConfigError: For an unknown scenario, a grid value or option the scenario refuses
            (checked for every trial before any runs), or a bad backend or job count.
    """
    if backend not in ("local", "ray"):
        raise ConfigError(f"backend={backend!r} is not a sweep backend; use 'local' (processes) or 'ray'")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"jobs={jobs!r} must be a positive integer, e.g. --jobs 2")
    module = load_scenario(scenario)
    options = dict(options or {})
    every = trials(grid)
    for params in every:  # a typo in the grid fails now, not in trial 17
        checked_config(module, {**options, **{k: v for k, v in params.items() if k not in RUN_KEYS}})
    out.mkdir(parents=True, exist_ok=True)
    names = [trial_name(p) for p in every]
    if len(set(names)) != len(names):
        raise ConfigError("two trials of this grid would share a folder; give distinct values")
    table = Table(len(every))
    spec = {"llm": "test", **(llm or {})}
    calls = [(scenario, str(out / name), params, options, spec) for name, params in zip(names, every, strict=True)]

    def done(index: int, row: Row) -> None:
        table.put(index, row)
        table.write(out, durable=False)
        if on_trial is not None:
            on_trial(row)

    runner = LocalTrials(jobs) if backend == "local" else RayTrials(ray_address)
    runner.run(calls, done)
    table.write(out)
    return table.rows()


class Table:
    """A sweep's rows in grid order as they come in, each encoded once.

    The table is rewritten as each trial ends; joining rows encoded before keeps a sweep of
    hundreds of trials from paying for every earlier row again at each one (7 ms per rewrite
    at 600 rows, when each was encoded anew).
    """

    def __init__(self, size: int) -> None:
        """A table of ``size`` trials, none in yet."""
        self._rows: list[Row | None] = [None] * size
        self._lines: list[str] = [""] * size
        self._columns: list[str] = []
        self._csv: list[str | None] = [None] * size

    def put(self, index: int, row: Row) -> None:
        """Trial ``index``'s row."""
        self._rows[index] = row
        self._lines[index] = json.dumps(row, sort_keys=False) + "\n"
        self._csv[index] = None

    def rows(self) -> list[Row]:
        """The rows in, in grid order."""
        return [row for row in self._rows if row is not None]

    def write(self, out: Path, *, durable: bool = True) -> None:
        """Write ``sweep.jsonl`` and ``sweep.csv`` (atomically): a column per key, in the order the rows name them.

        ``durable=False`` while trials run: the table is rebuilt from the trials' folders by the next run
        of the sweep, so it need not wait for the disk (the workers' own syncs would queue behind it).
        """
        write_atomic(out / TABLE, "".join(self._lines), durable=durable)
        columns = list(dict.fromkeys(itertools.chain.from_iterable(row for row in self._rows if row is not None)))
        if columns != self._columns:  # a key new to the table: every line gets its column
            self._columns, self._csv = columns, [None] * len(self._rows)
        lines = [_csv_line(columns)]
        for index, row in enumerate(self._rows):
            if row is not None:
                line = self._csv[index]
                if line is None:
                    line = self._csv[index] = _csv_line([row.get(k, "") for k in columns])
                lines.append(line)
        write_atomic(out / "sweep.csv", "".join(lines), durable=durable)


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
) -> Any:
    """Run ``scenario`` over ``grid`` (``{"seed": range(20), "turns": [2, 3]}`` or ``["seed=0..19"]``).

    Returns a pandas DataFrame, a row per trial (see the module). Trials already finished in
    ``out`` are not run again; interrupted ones are resumed.
    """
    import pandas as pd

    parsed = parse_grid(grid) if not isinstance(grid, dict) else {k: list(v) for k, v in grid.items()}
    spec = {**(llm_settings or {}), "llm": llm}
    folder = Path(out) if out is not None else default_out(scenario, parsed, options or {}, spec)
    rows = run_sweep(
        scenario, parsed, folder, options=options, llm=spec, backend=backend, jobs=jobs, ray_address=ray_address
    )
    return pd.DataFrame(rows)
