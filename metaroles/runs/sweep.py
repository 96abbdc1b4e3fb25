"""Sweeps: one scenario over a grid of settings, one run directory per trial, one table of results.

``metaroles sweep society --grid seed=0..19 --grid epsilon=0.1,0.2`` runs 40 trials into
``SWEEP_DIR/seed=3,epsilon=0.1/`` and so on, several at once (``--jobs``: processes here, or one
Ray task per trial), and keeps ``sweep.jsonl`` — a row per trial: its settings, status, rounds,
messages, tokens, cost, wall time and the scenario's own ``summary(run_dir)`` — and ``sweep.csv``
beside it. While trials run, ``sweep.jsonl`` gains each one's line as it ends (nothing is rewritten:
a file replaced per trial cost the disk more than a trial); when the sweep ends both are written
in grid order, atomically. Running the same
sweep again skips finished trials and resumes interrupted ones (a trial is a run directory like
any other: ``metaroles resume`` works on it too). A trial's row is a function of its run, so two
sweeps of one grid — on processes or on Ray — write the same table, timings aside.

A trial waits for the disk once, when it ends (``durability="run"``, ``runs.durability``): a killed
sweep loses nothing, and a trial a power cut interrupted is run again from its start, giving the
same row. ``durability="round"`` syncs each checkpoint, for trials too long to run again.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
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
from metaroles.runs.durability import checked_durability, restarted_since
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


def run_trial(
    scenario: str,
    run_dir: str,
    params: dict[str, Any],
    options: dict[str, Any],
    llm: dict[str, Any],
    durability: str = "run",
) -> Row:
    """Run (or resume, or skip if finished) one trial in ``run_dir``; return its row. Runs in a worker."""
    folder = Path(run_dir)
    row: Row = {"trial": folder.name, **params}
    started = time.perf_counter()
    try:
        if (folder / "report.json").is_file():
            row["status"] = "done"
        else:
            anyio.run(_trial, scenario, folder, params, options, llm, durability)
            row["status"] = "done"
    except Exception as exc:  # a trial that fails is a row that says so; the sweep goes on
        row["status"] = "failed"
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    row["wall_s"] = round(time.perf_counter() - started, 3)
    row.update(_measured(scenario, folder))
    return row


def lost_row(scenario: str, run_dir: str, params: dict[str, Any], *_: Any) -> Row:
    """The row of a trial whose process died under it: running the sweep again resumes it."""
    error = "the process running it died (killed, or out of memory); run the sweep again to resume it"
    return {"trial": Path(run_dir).name, **params, "status": "failed", "error": error, "wall_s": None}


async def _trial(
    scenario: str, folder: Path, params: dict[str, Any], options: dict[str, Any], llm: dict[str, Any], durability: str
) -> None:
    seed = params.get("seed", options.get("seed"))
    model = llm_from_settings(LLMSettings(**{**llm, "seed": seed}))
    if restarted_since(folder):  # a power cut stopped it before it synced its files: from the start
        shutil.rmtree(folder)
    if (folder / MANIFEST).is_file():  # interrupted: continue from its last checkpoint
        await resume_scenario(folder, llm=model)
        return
    run = RunOptions(**{k: params[k] for k in RUN_KEYS if k in params}, durability=durability)
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
        left = dict(enumerate(calls))
        while left:  # a worker that dies breaks its pool: trials it had not started go on in a new one
            if not self._pool(left, done):  # none ended: the workers die before any trial can start
                for index in list(left):
                    done(index, lost_row(*left.pop(index)))

    def _pool(self, left: dict[int, tuple[Any, ...]], done: Callable[[int, Row], None]) -> int:
        """Run the trials ``left`` in one pool (each one ended is taken out); how many ended."""
        ended = 0
        # The heap is not frozen before forking: a trial's session settles its heap only where nobody froze
        # it (core.heap), and a worker that inherits a frozen heap ran each trial ~30 % slower than this process.
        with ProcessPoolExecutor(max_workers=self.jobs, mp_context=_context()) as pool:
            futures: dict[Future[Row], int] = {pool.submit(run_trial, *call): i for i, call in left.items()}
            while futures:
                finished, _ = wait(futures, return_when=FIRST_COMPLETED)
                for future in finished:
                    index = futures.pop(future)
                    try:
                        row = future.result()
                    except BrokenProcessPool:  # its worker, or another, died (killed, out of memory)
                        if not (Path(left[index][1]) / MANIFEST).is_file():
                            continue  # not started: the next pool runs it
                        row = lost_row(*left[index])
                    del left[index]
                    ended += 1
                    done(index, row)
        return ended


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
                index = pending.pop(ref)
                try:
                    row = ray.get(ref)
                except ray.exceptions.RayError:  # its worker died past Ray's retries
                    row = lost_row(*calls[index])
                done(index, row)


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
    durability: str = "run",
) -> list[Row]:
    """Run every trial of ``grid`` not finished yet into ``out``; return the rows in grid order.

    ``durability``: when a trial waits for the disk (see the module).

    Raises:
        ConfigError: For an unknown scenario, a grid value or option the scenario refuses
            (checked for every trial before any runs), or a bad backend or job count.
        InvalidValueError: For a durability other than ``"run"`` or ``"round"``.
    """
    if backend not in ("local", "ray"):
        raise ConfigError(f"backend={backend!r} is not a sweep backend; use 'local' (processes) or 'ray'")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"jobs={jobs!r} must be a positive integer, e.g. --jobs 2")
    checked_durability(durability)
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
    calls = [(scenario, str(out / n), p, options, spec, durability) for n, p in zip(names, every, strict=True)]

    with (out / TABLE).open("w", encoding="utf-8") as live:  # a line per trial as it ends; grid order at the end

        def done(index: int, row: Row) -> None:
            live.write(table.put(index, row))
            live.flush()
            if on_trial is not None:
                on_trial(row)

        runner = LocalTrials(jobs) if backend == "local" else RayTrials(ray_address)
        runner.run(calls, done)
    table.write(out)
    return table.rows()


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

    def write(self, out: Path) -> None:
        """Write ``sweep.jsonl`` and ``sweep.csv`` (atomically): a column per key, in the order the rows name them."""
        rows = self.rows()
        write_atomic(out / TABLE, "".join(json.dumps(row) + "\n" for row in rows))
        columns = list(dict.fromkeys(itertools.chain.from_iterable(rows)))
        lines = [_csv_line(columns), *(_csv_line([row.get(k, "") for k in columns]) for row in rows)]
        write_atomic(out / "sweep.csv", "".join(lines))


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
    durability: str = "run",
) -> Any:
    """Run ``scenario`` over ``grid`` (``{"seed": range(20), "turns": [2, 3]}`` or ``["seed=0..19"]``).

    Returns a pandas DataFrame, a row per trial (see the module). Trials already finished in
    ``out`` are not run again; interrupted ones are resumed. ``durability``: see the module.
    """
    import pandas as pd

    parsed = parse_grid(grid) if not isinstance(grid, dict) else {k: list(v) for k, v in grid.items()}
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
