"""Evaluations: a scenario over a suite's tasks × seeds × settings, every run scored by the suite.

A suite is a folder (``metaroles eval software`` takes a built-in one, ``metaroles eval path/to/suite``
yours)::

    suite.toml          scenario = "software_company"; seeds = [0, 1]; metrics = ["executability"]
                        [options] for every trial; [settings.NAME] for each setting compared
    score.py            def score(run_dir: Path, task: Task) -> dict[str, float | int | str | None]
    tasks/NAME/task.toml   [options] this task gives the scenario (its idea, say), and whatever the scorer reads
    tasks/NAME/...         the task's hidden files (acceptance tests): the scenario never sees them

Each trial (task, setting, seed) is a run directory in the evaluation's folder, run by the sweep's
machinery (processes here or Ray tasks; a trial already finished is not run again, an interrupted
one is resumed). Once they have run, the scorer reads every finished run directory, and
:func:`write_eval` writes ``eval.jsonl``, ``eval.csv`` and ``eval.parquet`` (a row per trial: its
labels, status, the run's tokens and cost, the scores), ``summary.csv`` (per setting and metric:
trials, mean and a 95 % bootstrap interval; per setting after the first, its difference from the
first, paired by task and seed) and ``report.md``. Nothing in them comes from the clock, so
``record=True`` (every trial's model answers on tape) followed by ``replay=DIR`` gives the same
files, byte for byte, with no model.
"""

from __future__ import annotations

import importlib.util
import json
import random
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from statistics import fmean
from types import ModuleType
from typing import Any

from metaroles.core.exceptions import ConfigError
from metaroles.core.files import write_atomic
from metaroles.project.registry import load_scenario
from metaroles.project.scenario import checked_config
from metaroles.project.sweep import Table, TrialBatch, run_trials
from metaroles.project.trials import Row, split_role_llms

TABLE = "eval.jsonl"
SUMMARY = "summary.csv"
LABELS = ("task", "setting", "seed")
RUN_COLUMNS = ("status", "rounds", "messages", "total_tokens", "total_cost")
"""What the trial's row keeps of its run (the wall time is the clock's: it stays in the sweep's table)."""


@dataclass(frozen=True)
class Task:
    """One task of a suite: its folder (hidden files included), the options it gives the scenario, its spec."""

    name: str
    folder: Path
    options: dict[str, Any]
    spec: dict[str, Any]
    """The whole of ``task.toml`` (a scorer reads what it needs)."""


@dataclass(frozen=True)
class Suite:
    """A suite: its scenario, tasks, seeds, settings, the metrics its report compares and its scorer."""

    name: str
    folder: Path
    scenario: str
    tasks: list[Task]
    seeds: list[int]
    options: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, dict[str, Any]] = field(default_factory=lambda: {"default": {}})
    metrics: list[str] = field(default_factory=list)

    def scorer(self) -> Callable[[Path, Task], dict[str, Any]]:
        """The suite's ``score(run_dir, task)`` (from its ``score.py``)."""
        score = getattr(self.scoring(), "score", None)
        if not callable(score):
            raise ConfigError(f"{str(self.folder / 'score.py')!r} must define score(run_dir, task) returning a dict")
        return score  # type: ignore[no-any-return]

    def across(self) -> Callable[[list[Row]], dict[str, float]] | None:
        """The suite's ``across(rows)``, if its ``score.py`` has one: figures of a setting's trials taken together.

        It gets one setting's rows (every task and seed) and returns metric → value; a figure
        over several seeds of a task (a judge's agreement with itself) is one.
        """
        across = getattr(self.scoring(), "across", None)
        return across if callable(across) else None

    def scoring(self) -> ModuleType:
        """The suite's ``score.py``, loaded (once per call: a suite folder may change between evaluations)."""
        path = self.folder / "score.py"
        spec = importlib.util.spec_from_file_location(f"metaroles_suite_{self.name}_score", path)
        if spec is None or spec.loader is None or not path.is_file():
            raise ConfigError(f"suite {self.name!r} has no score.py in {str(self.folder)!r}; add one defining score()")
        module: ModuleType = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module


def load_suite(
    name: str | Path,
    *,
    seeds: Sequence[int] | None = None,
    tasks: Sequence[str] | None = None,
    settings: dict[str, dict[str, Any]] | None = None,
    more_settings: dict[str, dict[str, Any]] | None = None,
) -> Suite:
    """The suite ``name``: a built-in one (``software``, ...) or a folder; other seeds, fewer tasks, other settings.

    ``settings`` replace the suite's own; ``more_settings`` are compared beside them (ablations).

    Raises:
        ConfigError: Naming what is wrong: no such suite, an unreadable ``suite.toml`` or ``task.toml``,
            an unknown task asked for, or options the scenario refuses (checked for every trial now).
    """
    folder = _suite_folder(name)
    spec = _toml(folder / "suite.toml")
    every = sorted(path.parent.name for path in (folder / "tasks").glob("*/task.toml"))
    chosen = list(tasks) if tasks else every
    missing = sorted(set(chosen) - set(every))
    if missing:
        raise ConfigError(f"suite {folder.name!r} has no task {missing[0]!r}; its tasks: {', '.join(every)}")
    loaded = [_task(folder / "tasks" / task) for task in chosen]
    settings = {**(settings or spec.get("settings") or {"default": {}}), **(more_settings or {})}
    suite = Suite(
        name=folder.name,
        folder=folder,
        scenario=str(spec.get("scenario", "")),
        tasks=loaded,
        seeds=list(seeds) if seeds is not None else list(spec.get("seeds", [0])),
        options=dict(spec.get("options", {})),
        settings={str(k): dict(v) for k, v in settings.items()},
        metrics=[str(m) for m in spec.get("metrics", [])],
    )
    module = load_scenario(suite.scenario)
    for task in suite.tasks:  # an option the scenario refuses fails now, not in trial 17
        for setting in suite.settings.values():
            checked_config(module, split_role_llms({**suite.options, **task.options, **setting})[0])
    return suite


def _suite_folder(name: str | Path) -> Path:
    folder = Path(name)
    if (folder / "suite.toml").is_file():
        return folder
    built_in = Path(str(files("metaroles.scenarios"))) / "suites" / str(name)
    if (built_in / "suite.toml").is_file():
        return built_in
    known = sorted(p.parent.name for p in (Path(str(files("metaroles.scenarios"))) / "suites").glob("*/suite.toml"))
    raise ConfigError(
        f"no suite {str(name)!r}: give a folder with a suite.toml, or a built-in suite ({', '.join(known)})"
    )


def _toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {str(path)!r}: {exc}; fix the file") from None


def _task(folder: Path) -> Task:
    spec = _toml(folder / "task.toml")
    return Task(name=folder.name, folder=folder, options=dict(spec.get("options", {})), spec=spec)


def trial_batch(suite: Suite, out: Path) -> TrialBatch:
    """The suite's trials, task by task, then setting, then seed: folder ``task=T,setting=S,seed=N``."""
    names, params, configs = [], [], []
    for task in suite.tasks:
        for setting, options in suite.settings.items():
            for seed in suite.seeds:
                names.append(f"task={task.name},setting={setting},seed={seed}".replace("/", "_"))
                params.append({"task": task.name, "setting": setting, "seed": seed})
                configs.append({**suite.options, **task.options, **options})
    return TrialBatch(suite.scenario, out, names, params, configs)


def run_eval(
    suite: Suite,
    out: Path,
    *,
    llm: dict[str, Any] | None = None,
    backend: str = "local",
    jobs: int = 1,
    ray_address: str | None = None,
    record: bool = False,
    replay: Path | None = None,
    on_trial: Callable[[Row], None] | None = None,
) -> list[Row]:
    """Run the suite's trials not finished yet into ``out``, score them, write the tables; return the rows.

    ``record``: every trial keeps its model answers (``cassette.jsonl``); ``replay``: an evaluation
    folder that recorded them answers every call instead of a model.

    Raises:
        ConfigError: For a bad backend or job count, or ``replay`` without recorded trials.
    """
    if replay is not None and not any(Path(replay).glob("*/cassette.jsonl")):
        raise ConfigError(f"replay={str(replay)!r} holds no recorded trial; record one with metaroles eval --record")
    spec = dict(llm or {})
    if record or replay is not None:
        spec["cassette"] = "record" if replay is None else f"replay:{Path(replay).absolute()}"
    batch = trial_batch(suite, out)
    rows = run_trials(batch, llm=spec, backend=backend, jobs=jobs, ray_address=ray_address, on_trial=on_trial)
    scored = score_rows(suite, out, rows)
    write_eval(suite, out, scored)
    return scored


def score_rows(suite: Suite, out: Path, rows: list[Row]) -> list[Row]:
    """Each trial's row as the evaluation keeps it: labels, its run's figures and (when it finished) its scores."""
    score, tasks = suite.scorer(), {task.name: task for task in suite.tasks}
    scored = []
    for row in rows:
        kept = {key: row.get(key) for key in (*LABELS, *RUN_COLUMNS)}
        if row.get("status") == "done":
            kept.update(score(out / str(row["trial"]), tasks[str(row["task"])]))
        else:
            kept["error"] = row.get("error")
        scored.append(kept)
    return scored


def write_eval(suite: Suite, out: Path, rows: list[Row]) -> None:
    """``eval.jsonl``, ``eval.csv``, ``eval.parquet``, ``summary.csv`` and ``report.md`` (see the module)."""
    table = Table(len(rows))
    for index, row in enumerate(rows):
        table.put(index, row)
    table.write(out, name=TABLE.removesuffix(".jsonl"))
    _parquet(out / "eval.parquet", rows)
    lines = summary(suite, rows)
    summary_table = Table(len(lines))
    for index, line in enumerate(lines):
        summary_table.put(index, line)
    summary_table.write(out, name=SUMMARY.removesuffix(".csv"), jsonl=False)
    drawn = plots(suite, out / "plots", rows, lines)
    write_atomic(out / "report.md", report(suite, rows, lines, plots=drawn))


def _parquet(path: Path, rows: list[Row]) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:  # the csv has it all; parquet comes with the analysis extra
        return
    columns = list(dict.fromkeys(key for row in rows for key in row))
    data = pa.table({key: [_cell(row.get(key)) for row in rows] for key in columns})
    temporary = path.with_name(path.name + ".tmp")
    pq.write_table(data, temporary)
    temporary.replace(path)


def _cell(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, list | dict) else value


def metrics_of(suite: Suite, rows: list[Row]) -> list[str]:
    """The metrics compared: the suite's, else every numeric score the scorer gave."""
    if suite.metrics:
        return suite.metrics
    skip = {*LABELS, *RUN_COLUMNS, "error"}
    numeric = [k for row in rows for k, v in row.items() if k not in skip and isinstance(v, int | float)]
    return list(dict.fromkeys(numeric))


def summary(suite: Suite, rows: list[Row]) -> list[Row]:
    """Per setting and metric: trials scored, mean, 95 % bootstrap interval; past the first, the paired difference."""
    settings = list(suite.settings)
    by_setting = {s: {(r["task"], r["seed"]): r for r in rows if r["setting"] == s} for s in settings}
    lines: list[Row] = []
    for metric in [*metrics_of(suite, rows), "total_tokens", "total_cost"]:
        base = _values(by_setting[settings[0]], metric)
        for setting in settings:
            values = _values(by_setting[setting], metric)
            mean, low, high = interval(list(values.values()))
            line: Row = {"metric": metric, "setting": setting, "n": len(values), "mean": mean, "low": low, "high": high}
            if setting != settings[0]:
                paired = [values[k] - base[k] for k in sorted(values.keys() & base.keys(), key=str)]
                line["diff"], line["diff_low"], line["diff_high"] = interval(paired)
            lines.append(line)
    return lines + _across(suite, rows, settings)


def _across(suite: Suite, rows: list[Row], settings: list[str]) -> list[Row]:
    """The suite's ``across`` figures per setting, with an interval over tasks when it gives them per task too."""
    across = suite.across()
    if across is None:
        return []
    lines = []
    for setting in settings:
        scored = [r for r in rows if r["setting"] == setting and r.get("status") == "done"]
        per_task = [across([r for r in scored if r["task"] == task.name]) for task in suite.tasks]
        for metric, value in across(scored).items():
            values = [figures[metric] for figures in per_task if isinstance(figures.get(metric), int | float)]
            _, low, high = interval(values) if len(values) > 1 else (None, None, None)
            lines.append(
                {"metric": metric, "setting": setting, "n": len(scored), "mean": value, "low": low, "high": high}
            )
    return lines


def _by_task(suite: Suite, rows: list[Row]) -> list[str]:
    """The report's table of each task's mean per metric and setting."""
    metrics = metrics_of(suite, rows)
    head = " | ".join(f"{m} ({s})" for m in metrics for s in suite.settings)
    text = ["", "## By task", "", f"| task | {head} |", "|---|" + "---|" * len(metrics) * len(suite.settings)]
    for task in suite.tasks:
        cells = []
        for metric in metrics:
            for setting in suite.settings:
                values = [
                    float(r[metric])
                    for r in rows
                    if r["task"] == task.name and r["setting"] == setting and isinstance(r.get(metric), int | float)
                ]
                cells.append(f"{round(fmean(values), 3)}" if values else "")
        text.append(f"| {task.name} | {' | '.join(cells)} |")
    return text


def _values(rows: dict[tuple[Any, Any], Row], metric: str) -> dict[tuple[Any, Any], float]:
    return {key: float(row[metric]) for key, row in rows.items() if isinstance(row.get(metric), int | float)}


def interval(values: list[float], *, resamples: int = 2000, seed: int = 0) -> tuple[Any, Any, Any]:
    """Mean and 95 % percentile-bootstrap interval of ``values`` (a fixed seed: the same numbers every time)."""
    if not values:
        return None, None, None
    mean = fmean(values)
    if len(values) == 1:
        return round(mean, 6), None, None
    draw = random.Random(seed)
    means = sorted(fmean(draw.choices(values, k=len(values))) for _ in range(resamples))
    return round(mean, 6), round(means[int(0.025 * resamples)], 6), round(means[int(0.975 * resamples) - 1], 6)


def plots(suite: Suite, folder: Path, rows: list[Row], lines: list[Row]) -> list[tuple[str, str]]:
    """The report's pictures (PNG, matplotlib of the ``graph`` extra; none without it): (caption, file) each.

    Each metric's distribution per setting, tokens against the first metric, and each metric per
    setting with its 95 % interval.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    metrics = metrics_of(suite, rows)[:4]
    if not metrics:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    drawn = []
    figure, axes = plt.subplots(2, len(metrics), figsize=(3.2 * len(metrics), 5.6), squeeze=False)
    for column, metric in enumerate(metrics):
        for setting in suite.settings:
            values = [r[metric] for r in rows if r["setting"] == setting and isinstance(r.get(metric), int | float)]
            axes[0][column].hist(values, bins=10, alpha=0.6, label=setting)
        shown = [line for line in lines if line["metric"] == metric and line["mean"] is not None]
        low = [line["mean"] - (line["low"] if line["low"] is not None else line["mean"]) for line in shown]
        high = [(line["high"] if line["high"] is not None else line["mean"]) - line["mean"] for line in shown]
        axes[1][column].bar([line["setting"] for line in shown], [line["mean"] for line in shown], yerr=[low, high])
        axes[0][column].set_title(metric)
        axes[1][column].tick_params(axis="x", labelrotation=30, labelsize=7)
    axes[0][0].legend(fontsize=7)
    drawn.append(_saved(figure, folder / "scores.png", "each metric's distribution, and its mean per setting (95 %)"))
    figure, axis = plt.subplots(figsize=(5, 3.5))
    for setting in suite.settings:
        mine = [r for r in rows if r["setting"] == setting and isinstance(r.get(metrics[0]), int | float)]
        axis.scatter([r.get("total_tokens") or 0 for r in mine], [r[metrics[0]] for r in mine], label=setting)
    axis.set_xlabel("tokens per trial")
    axis.set_ylabel(metrics[0])
    axis.legend()
    drawn.append(_saved(figure, folder / "cost_vs_score.png", f"tokens against {metrics[0]}, a point per trial"))
    return drawn


def _saved(figure: Any, path: Path, caption: str) -> tuple[str, str]:
    import matplotlib.pyplot as plt

    figure.tight_layout()
    figure.savefig(path, dpi=80, metadata={"Software": None})
    plt.close(figure)
    return caption, f"{path.parent.name}/{path.name}"


def report(suite: Suite, rows: list[Row], lines: list[Row], *, plots: Sequence[tuple[str, str]] = ()) -> str:
    """The Markdown report: what ran, each metric per setting with its interval, the pictures, the failed trials."""
    done = sum(1 for row in rows if row.get("status") == "done")
    text = [
        f"# Evaluation: {suite.name} ({suite.scenario})",
        "",
        f"{len(suite.tasks)} tasks × {len(suite.settings)} settings × {len(suite.seeds)} seeds: "
        f"{done} of {len(rows)} trials ran to the end.",
        "",
        "| metric | setting | n | mean | 95 % interval | difference from the first | its interval |",
        "|---|---|---|---|---|---|---|",
    ]
    for line in lines:
        span = f"{line['low']} – {line['high']}" if line.get("low") is not None else ""
        diff = line.get("diff")
        diff_span = f"{line['diff_low']} – {line['diff_high']}" if line.get("diff_low") is not None else ""
        text.append(
            f"| {line['metric']} | {line['setting']} | {line['n']} | {line['mean']} | {span} | "
            f"{'' if diff is None else diff} | {diff_span} |"
        )
    for caption, file in plots:
        text += ["", f"![{caption}]({file})"]
    text += _by_task(suite, rows)
    failed = [row for row in rows if row.get("status") != "done"]
    if failed:
        text += ["", "## Trials that did not finish", ""]
        text += [f"- {row['task']}, {row['setting']}, seed {row['seed']}: {row.get('error')}" for row in failed]
    return "\n".join(text) + "\n"
