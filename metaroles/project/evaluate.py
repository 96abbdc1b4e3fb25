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
first, paired by task and seed), ``report.md``, and ``ensemble.json``/``.md``
(:mod:`metaroles.project.ensembles`: per task and setting, each score's distribution across the
seeds and which runs agree). Nothing in them comes from the clock, so
``record=True`` (every trial's model answers on a cassette) followed by ``replay=DIR`` gives the same
files, byte for byte, with no model.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from importlib.resources import files
from pathlib import Path
from statistics import fmean
from typing import Any

from metaroles.core.exceptions import ConfigError, MetarolesError
from metaroles.core.files import write_atomic
from metaroles.llm.model_files import MODEL_NAME, local_model_available
from metaroles.llm.providers import resolve_llm
from metaroles.llm.settings import LLMSettings
from metaroles.project.ensembles import Reading, grouped_markdown, grouped_report, write_ensemble
from metaroles.project.registry import load_scenario, unregistered_module
from metaroles.project.rubric import Rubric
from metaroles.project.rundir import read_manifest
from metaroles.project.scenario import check_role_models, checked_config
from metaroles.project.scoring import ScorerError, ScorerProcess
from metaroles.project.scoring import Task as Task  # a suite's score.py may import it from here
from metaroles.project.sweep import MAX_TRIALS, Table, TrialBatch, run_trials
from metaroles.project.tables import TABLE_MD, interval, suite_table, wall_times
from metaroles.project.trials import Row, split_role_llms

TABLE = "eval.jsonl"
SUMMARY = "summary.csv"
LABELS = ("task", "setting", "seed")
SCORE_TIMEOUT = 300.0
"""Seconds a suite's scorer may take per trial unless its ``suite.toml`` says (``score_timeout``)."""
RUN_COLUMNS = ("status", "rounds", "messages", "total_tokens", "total_cost")
"""What the trial's row keeps of its run (the wall time is the clock's: it stays in the sweep's table)."""


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

    score_timeout: float = SCORE_TIMEOUT
    """Seconds a call of the scorer may take (``score_timeout`` in ``suite.toml``)."""
    scales: dict[str, str] = field(default_factory=dict)
    """What each metric's numbers mean (``[scales]`` in ``suite.toml``), for the report."""
    rubric: Rubric | None = None
    """A model's reading of each run against weighted criteria (``[rubric]`` in ``suite.toml``)."""
    table: list[str] = field(default_factory=list)
    """The columns of the suite's own table (``table`` in ``suite.toml``): ``table.md``, per task and overall."""
    per_task: list[str] = field(default_factory=list)
    """Columns of that table shown per task only (``per_task``): a figure in each task's own units, whose
    mean over the tasks would mean nothing."""
    sandboxed: bool = False
    """Whether its ``score.py`` runs in the kernel sandbox (a suite not built in, not trusted)."""

    def scorer(self, reads: Path | None = None) -> ScorerProcess:
        """The suite's ``score.py`` in a child process (a context manager; see :mod:`metaroles.project.scoring`).

        ``reads``: the folder of the runs it scores (all it may read besides the suite, when sandboxed).
        """
        confined = [self.folder, *([reads] if reads is not None else [])] if self.sandboxed else None
        return ScorerProcess(self.folder / "score.py", timeout=self.score_timeout, confined_to=confined)


def load_suite(
    name: str | Path,
    *,
    seeds: Sequence[int] | None = None,
    tasks: Sequence[str] | None = None,
    settings: dict[str, dict[str, Any]] | None = None,
    more_settings: dict[str, dict[str, Any]] | None = None,
    trust: bool = True,
    ablation: bool = False,
) -> Suite:
    """The suite ``name``: a built-in one (``software``, ...) or a folder; other seeds, fewer tasks, other settings.

    ``settings`` replace the suite's own; ``more_settings`` are compared beside them, and with
    ``ablation`` the suite's ``[ablations.NAME]`` settings too (the paper's table by role).
    A ``scenario = "x.py"`` is found from the suite's folder. ``trust=False`` (the command line
    without ``--trust``): a scenario file outside the suite's folder, or a module that is not a
    registered scenario, is refused rather than imported (a suite may come from someone else).
    Its ``score.py`` is loaded in a child process now, so a broken scorer is found before any trial.

    Raises:
        ConfigError: Naming what is wrong: no such suite, an unreadable ``suite.toml`` or ``task.toml``,
            a value of the wrong kind in it, no tasks, an unknown task asked for, too many trials, a
            scenario it may not import, a ``score.py`` that does not load, or options the scenario
            refuses (checked for every trial now).
    """
    folder = _suite_folder(name)
    spec = _toml(folder / "suite.toml")
    loaded = [_task(folder / "tasks" / task) for task in _chosen_tasks(folder, tasks)]
    own = _settings_of(folder, spec)
    settings = {**(settings or own), **_ablations(folder, spec, ablation), **(more_settings or {})}
    suite = Suite(
        name=folder.name,
        folder=folder,
        scenario=_scenario_of(folder, spec, trust=trust),
        tasks=loaded,
        seeds=list(seeds) if seeds is not None else _seeds_of(folder, spec),
        options=_table(folder, spec, "options"),
        settings={str(k): dict(v) for k, v in settings.items()},
        metrics=_strings(folder, spec, "metrics"),
        score_timeout=_positive(folder, spec, "score_timeout", SCORE_TIMEOUT),
        scales={str(k): str(v) for k, v in _table(folder, spec, "scales").items()},
        table=_strings(folder, spec, "table"),
        per_task=_strings(folder, spec, "per_task"),
        rubric=Rubric.from_spec(spec.get("rubric"), str(folder / "suite.toml")),
        sandboxed=not trust and not _built_in(folder),
    )
    _check_trials(suite)
    return suite


def _chosen_tasks(folder: Path, tasks: Sequence[str] | None) -> list[str]:
    """The tasks asked for (all of the suite's by default), each checked to be one of them."""
    every = sorted(path.parent.name for path in (folder / "tasks").glob("*/task.toml"))
    if not every:
        raise ConfigError(f"suite {str(folder)!r} has no tasks; add tasks/NAME/task.toml for each task")
    chosen = list(tasks) if tasks else every
    missing = sorted(set(chosen) - set(every))
    if missing:
        raise ConfigError(f"suite {folder.name!r} has no task {missing[0]!r}; its tasks: {', '.join(every)}")
    return chosen


def _ablations(folder: Path, spec: dict[str, Any], wanted: bool) -> dict[str, dict[str, Any]]:
    """The suite's ``[ablations.NAME]`` settings when ``--ablation`` asks for them."""
    if wanted and not spec.get("ablations"):
        raise ConfigError(f"suite {folder.name!r} has no [ablations.NAME] settings; drop --ablation")
    return _settings_of(folder, spec, "ablations") if wanted else {}


def _check_trials(suite: Suite) -> None:
    """Refuse, before any trial runs, what would fail every one of them.

    Too many trials, options or role models the scenario refuses, a model that cannot be
    configured, a ``score.py`` that does not load.

    Raises:
        ConfigError: Naming the first thing wrong.
    """
    trials = len(suite.tasks) * len(suite.settings) * len(suite.seeds)
    if trials > MAX_TRIALS:
        raise ConfigError(
            f"suite {suite.name!r} asks for {trials} trials (tasks x settings x seeds), more than {MAX_TRIALS}; "
            "use fewer seeds, tasks or settings"
        )
    module = load_scenario(suite.scenario)
    for task in suite.tasks:  # an option the scenario refuses fails now, not in trial 17
        for setting in suite.settings.values():
            checked_config(module, split_role_llms({**suite.options, **task.options, **setting})[0])
    for setting in suite.settings.values():  # a model for a role the scenario lacks, too
        options, specs = split_role_llms({**suite.options, **suite.tasks[0].options, **setting})
        for model_spec in specs.values():
            check_model(model_spec)
        check_role_models(module, options, specs)
    with suite.scorer() as scorer:
        scorer.check()


def check_model(spec: str, settings: LLMSettings | None = None) -> None:
    """Refuse a model an evaluation could not configure, before any trial runs (it would fail every one).

    The embedded model is checked for being installed, not loaded; any other is built and dropped.

    Raises:
        ConfigError: Naming the model and how to configure it.
    """
    settings = settings or LLMSettings(llm=spec)
    if spec == "local":
        if not local_model_available(settings.model or MODEL_NAME):
            resolve_llm("local", settings)  # says what to install
        return
    resolve_llm(spec, settings)


def _scenario_of(folder: Path, spec: dict[str, Any], *, trust: bool) -> str:
    """The suite's scenario: a name, a module, or a ``.py`` found from the suite's folder."""
    scenario = spec.get("scenario")
    if not isinstance(scenario, str) or not scenario:
        raise ConfigError(f'{str(folder / "suite.toml")!r} must name its scenario, e.g. scenario = "debate"')
    if scenario.endswith(".py"):
        path = (folder / scenario).resolve()
        if not trust and not path.is_relative_to(folder.resolve()):
            raise ConfigError(
                f"suite {folder.name!r} names the scenario file {str(path)!r}, outside the suite's folder; "
                "it is code: read it, then pass --trust"
            )
        return str(path)
    if not trust and unregistered_module(scenario):
        raise ConfigError(
            f"suite {folder.name!r} names the module {scenario!r}, which is not a registered scenario; "
            "importing it runs its code: if it is yours, pass --trust"
        )
    return scenario


def _settings_of(folder: Path, spec: dict[str, Any], key: str = "settings") -> dict[str, dict[str, Any]]:
    settings = spec.get(key, {"default": {}} if key == "settings" else {})
    if not isinstance(settings, dict) or not all(isinstance(v, dict) for v in settings.values()):
        raise ConfigError(f"{str(folder / 'suite.toml')!r}: {key}={settings!r} must be tables, e.g. [{key}.default]")
    return settings or ({"default": {}} if key == "settings" else {})


def _seeds_of(folder: Path, spec: dict[str, Any]) -> list[int]:
    seeds = spec.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(type(s) is int for s in seeds):
        raise ConfigError(f"{str(folder / 'suite.toml')!r}: seeds={seeds!r} must be a list of integers, e.g. [0, 1]")
    return seeds


def _table(folder: Path, spec: dict[str, Any], key: str) -> dict[str, Any]:
    value = spec.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{str(folder / 'suite.toml')!r}: {key}={value!r} must be a table, e.g. [{key}]")
    return dict(value)


def _strings(folder: Path, spec: dict[str, Any], key: str) -> list[str]:
    value = spec.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{str(folder / 'suite.toml')!r}: {key}={value!r} must be a list of names")
    return value


def _positive(folder: Path, spec: dict[str, Any], key: str, default: float) -> float:
    value = spec.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e6:
        raise ConfigError(f"{str(folder / 'suite.toml')!r}: {key}={value!r} must be a number of seconds, e.g. 60")
    return float(value)


def _built_in(folder: Path) -> bool:
    """Whether ``folder`` is a suite that ships with metaroles."""
    return folder.resolve().parent == Path(str(files("metaroles.scenarios"))).resolve() / "suites"


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
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {str(path)!r}: {exc}; fix the file (TOML, UTF-8)") from None


def _task(folder: Path) -> Task:
    spec = _toml(folder / "task.toml")
    options = spec.get("options", {})
    if not isinstance(options, dict):
        raise ConfigError(f"{str(folder / 'task.toml')!r}: options={options!r} must be a table, e.g. [options]")
    return Task(name=folder.name, folder=folder, options=dict(options), spec=spec)


def trial_batch(suite: Suite, out: Path) -> TrialBatch:
    """The suite's trials, task by task, then setting, then seed: folder ``task=T,setting=S,seed=N``."""
    names, params, configs = [], [], []
    for task in suite.tasks:
        for setting, options in suite.settings.items():
            for seed in suite.seeds:
                names.append(trial_folder(task.name, setting, seed))
                params.append({"task": task.name, "setting": setting, "seed": seed})
                configs.append({**suite.options, **task.options, **options})
    return TrialBatch(suite.scenario, out, names, params, configs)


def trial_folder(task: str, setting: str, seed: int) -> str:
    """A trial's folder in the evaluation's: ``task=T,setting=S,seed=N`` (a ``/`` becomes ``_``)."""
    return f"task={task},setting={setting},seed={seed}".replace("/", "_")


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
    with suite.scorer(reads=out) as scorer:
        scored = score_rows(suite, out, rows, scorer)
        write_eval(suite, out, scored, scorer)
    return scored


def score_rows(suite: Suite, out: Path, rows: list[Row], scorer: ScorerProcess) -> list[Row]:
    """Each trial's row as the evaluation keeps it: labels, its run's figures and (when it finished) its scores.

    A trial its scorer fails on (it raised, answered badly, ran past its limit) is kept as failed, with why.
    """
    tasks = {task.name: task for task in suite.tasks}
    scored = []
    for row in rows:
        kept = {key: row.get(key) for key in (*LABELS, *RUN_COLUMNS)}
        kept["model"] = _model_of(out / str(row["trial"]))
        if row.get("status") == "done":
            try:
                kept.update(scorer.score(out / str(row["trial"]), tasks[str(row["task"])]))
                if suite.rubric is not None:
                    kept.update(suite.rubric.score(out / str(row["trial"])))
            except (ScorerError, MetarolesError) as exc:
                kept["status"], kept["error"] = "failed", f"scoring: {exc}"
        else:
            kept["error"] = row.get("error")
        scored.append(kept)
    return scored


def _model_of(run_dir: Path) -> str | None:
    """The model a trial ran with, as its manifest names it (a replay names the model on its cassette)."""
    try:
        manifest = read_manifest(run_dir)
    except MetarolesError:  # a trial that never started has none
        return None
    parts = [manifest.get("llm"), manifest.get("model"), manifest.get("base_url")]
    return " ".join(str(part) for part in parts if part) or None


def write_eval(suite: Suite, out: Path, rows: list[Row], scorer: ScorerProcess | None = None) -> None:
    """``eval.jsonl``, ``eval.csv``, ``eval.parquet``, ``summary.csv`` and ``report.md`` (see the module).

    ``scorer``: the suite's scorer, for its ``across`` figures (none without it).
    """
    table = Table(len(rows))
    for index, row in enumerate(rows):
        table.put(index, row)
    table.write(out, name=TABLE.removesuffix(".jsonl"))
    _parquet(out / "eval.parquet", rows)
    lines = summary(suite, rows, scorer)
    summary_table = Table(len(lines))
    for index, line in enumerate(lines):
        summary_table.put(index, line)
    summary_table.write(out, name=SUMMARY.removesuffix(".csv"), jsonl=False)
    drawn = plots(suite, out / "plots", rows, lines)
    write_atomic(out / "report.md", report(suite, rows, lines, plots=drawn))
    title = f"{suite.name}: {len(rows)} trials, each task and setting over {len(suite.seeds)} seeds"
    ensemble = grouped_report(rows, out, title=title, reading=partial(_reading, scores_of(rows)))
    write_ensemble(out, ensemble, grouped_markdown)
    if suite.table:
        write_atomic(out / TABLE_MD, suite_table(suite, rows, wall_times(out)))


def _reading(metrics: list[str], row: Row) -> Reading:
    """A trial's row as an ensemble's reading: its arm is its task and setting, its outcomes the scores."""
    return {
        "run": trial_folder(str(row["task"]), str(row["setting"]), int(row["seed"])),
        "arm": f"{row['task']} · {row['setting']}",
        "seed": row["seed"],
        **{metric: row.get(metric) for metric in metrics},
    }


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
    numeric = [k for row in rows for k in scores_of([row]) if isinstance(row[k], int | float)]
    return list(dict.fromkeys(numeric))


def scores_of(rows: list[Row]) -> list[str]:
    """Every score the scorer gave, numeric or not (a debate's ``winner``), in the order the rows name them."""
    skip = {*LABELS, *RUN_COLUMNS, "error", "model"}
    return list(dict.fromkeys(k for row in rows for k in row if k not in skip))


def summary(suite: Suite, rows: list[Row], scorer: ScorerProcess | None = None) -> list[Row]:
    """Per setting and metric: trials scored, mean, 95 % bootstrap interval; past the first, the paired difference.

    With ``scorer``, the suite's ``across`` figures follow (see :func:`_across`).
    """
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
    return lines + (_across(suite, rows, settings, scorer) if scorer is not None else [])


def _across(suite: Suite, rows: list[Row], settings: list[str], scorer: ScorerProcess) -> list[Row]:
    """The suite's ``across`` figures per setting, with an interval over tasks when it gives them per task too.

    Raises:
        ScorerError: If the suite's ``across`` fails.
    """
    if not scorer.has_across():
        return []
    across = scorer.across
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


PROVIDERS = {
    "test": "the offline test model: answers made from the requests, so scores measure the pipeline, not a model",
    "scripted": "scripted answers",
    "local": "the embedded model, run by llama.cpp in the process",
    "openai": "an OpenAI-compatible server",
}
"""What each kind of model is, as the report says it."""


def report(suite: Suite, rows: list[Row], lines: list[Row], *, plots: Sequence[tuple[str, str]] = ()) -> str:
    """The Markdown report: what ran on which model, each metric's scale, per setting with its interval.

    Figures are printed to 4 significant digits (``summary.csv`` keeps 6 decimals); then the pictures and
    the failed trials.
    """
    done = sum(1 for row in rows if row.get("status") == "done")
    text = [
        f"# Evaluation: {suite.name} ({suite.scenario})",
        "",
        f"{len(suite.tasks)} tasks × {len(suite.settings)} settings × {len(suite.seeds)} seeds: "
        f"{done} of {len(rows)} trials ran to the end.",
        "",
        *_models_said(rows),
        *_scales_said(suite, rows),
        "| metric | setting | n | mean | 95 % interval | difference from the first | its interval |",
        "|---|---|---|---|---|---|---|",
    ]
    for line in lines:
        span = f"{_num(line['low'])} – {_num(line['high'])}" if line.get("low") is not None else ""
        diff = line.get("diff")
        diff_span = f"{_num(line['diff_low'])} – {_num(line['diff_high'])}" if line.get("diff_low") is not None else ""
        text.append(
            f"| {line['metric']} | {line['setting']} | {line['n']} | {_num(line['mean'])} | {span} | "
            f"{'' if diff is None else _num(diff)} | {diff_span} |"
        )
    for caption, file in plots:
        text += ["", f"![{caption}]({file})"]
    text += _by_task(suite, rows)
    text += _references(suite)
    failed = [row for row in rows if row.get("status") != "done"]
    if failed:
        text += ["", "## Trials that did not finish", ""]
        text += [f"- {row['task']}, {row['setting']}, seed {row['seed']}: {row.get('error')}" for row in failed]
    return "\n".join(text) + "\n"


REFERENCE = "reference.toml"
"""A task's published figures, each with its ``source`` (a suite of human studies): the report cites them."""


def _references(suite: Suite) -> list[str]:
    """The figures the tasks compare with, and where each was published (a task's ``reference.toml``).

    A figure is a table with a ``value``, ``low``/``high``, an ``effect``, ``counts`` or ``values``; a
    task that states its ``hypothesis`` has it said first.
    """
    lines: list[str] = []
    for task in suite.tasks:
        path = task.folder / REFERENCE
        if not path.is_file():
            continue
        reference = _toml(path)
        if isinstance(reference.get("hypothesis"), str):
            lines.append(f"- {task.name}: {' '.join(reference['hypothesis'].split())}")
        for name, given in reference.items():
            if isinstance(given, dict) and given.keys() & FIGURE_KEYS:
                source = " ".join(str(given.get("source", "no source given")).split())
                lines.append(f"- {task.name}, {name} = {_stated(given)}: {source}")
    return ["", "## The human figures compared with, and their sources", "", *lines] if lines else []


FIGURE_KEYS = {"value", "low", "high", "effect", "counts", "values"}


def _stated(given: dict[str, Any]) -> str:
    """A reference figure in a few words: its value, range, effect, counts or how many values."""
    low, high = given.get("low"), given.get("high")
    if "value" in given:
        return str(given["value"])
    if "effect" in given:
        return f"effect {given['effect']}" + (f" [{low}, {high}]" if low is not None and high is not None else "")
    if "counts" in given:
        return "counts " + ", ".join(f"{k} of {n}" for k, n in given["counts"])
    if "values" in given:
        return f"{len(given['values'])} values"
    return f"≥ {low}" if high is None else f"≤ {high}" if low is None else f"{low}–{high}"


def _num(value: Any) -> Any:
    """A figure as the report prints it (:func:`figure`)."""
    return figure(value)


def figure(value: Any) -> Any:
    """A number as reports print it: 4 significant digits (0.0001234, 12.35, 1.235e+05), never ``-0``."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return value
    if not isinstance(value, float):
        return value
    text = f"{value:.4g}"
    return "0" if text in ("0", "-0") else text


def _models_said(rows: list[Row]) -> list[str]:
    models = sorted({re.sub(r"^test:\d+", "test", str(row["model"])) for row in rows if row.get("model")})
    said = []
    for model in models:
        kind = model.split(" ")[0].partition(":")[0]
        seeded = " (seeded by each trial's seed)" if model == "test" else ""
        said.append(f"Model: `{model}`{seeded} — {PROVIDERS.get(kind, kind)}.")
    return [*said, ""] if said else []


def _scales_said(suite: Suite, rows: list[Row]) -> list[str]:
    metrics = metrics_of(suite, rows)
    if not metrics:
        return []
    unsaid = "as the suite's score.py computes it"
    said = [f"- **{metric}**: {suite.scales.get(metric, unsaid)}" for metric in metrics]
    return ["Scales:", "", *said, ""]
