"""A sweep's trials: each a run directory, run here and in worker processes, or as Ray tasks.

With ``--jobs N`` this process runs trials too, beside N - 1 workers forked from it: they take the
next trial from one shared counter, so none waits for another and nobody hands work out. Each
process started and stopped costs milliseconds, and a fork makes the first trial on either side
of it slower than the next (each page both share is copied at its first write): one process
fewer pays that once less. A thread here gives each worker's rows to the sweep as they come. A
worker that dies (killed, out of memory) fails only the trial it was running; the others go on,
and running the sweep again resumes it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any, cast

import anyio

from metaroles.core.files import syncs_deferred
from metaroles.core.text import redacted
from metaroles.llm.cassette import CassetteLLM, CassetteMode
from metaroles.llm.model_files import MODEL_NAME, local_model_available
from metaroles.llm.providers import llm_from_settings
from metaroles.llm.settings import LLMSettings
from metaroles.project.registry import load_scenario
from metaroles.project.rundir import MANIFEST, read_manifest
from metaroles.project.scenario import fork_scenario, resume_scenario, run_scenario
from metaroles.record.durability import restarted_since
from metaroles.team.options import RunOptions
from metaroles.team.surgery import parse_interventions

RUN_KEYS = ("seed", "rounds", "budget")
"""Grid keys that are run options; every other key is an option of the scenario."""

CASSETTE = "cassette.jsonl"
"""A trial's recorded model answers (when its sweep or eval records them)."""

Row = dict[str, Any]
Done = Callable[[int, Row], None]


def run_trial(
    scenario: str,
    run_dir: str,
    params: dict[str, Any],
    options: dict[str, Any],
    llm: dict[str, Any],
    durability: str = "run",
    fork: dict[str, Any] | None = None,
) -> Row:
    """Run (or resume, or skip if finished) one trial in ``run_dir``; return its row. Runs in a worker.

    ``params`` label the row and give the run options (``RUN_KEYS``); ``options`` is the
    scenario's whole configuration. ``llm["cassette"]``: ``"record"`` records the trial's model
    answers in its ``cassette.jsonl``; ``"replay:DIR"`` answers from ``DIR/<this trial>/cassette.jsonl``.
    ``fork``: the trial is a branch of a run (``run_dir`` of the parent, ``from_round``,
    ``interventions``) on its own seed, not a run from the start (``metaroles branch``).
    """
    folder = Path(run_dir)
    row: Row = {"trial": folder.name, **params}
    started = time.perf_counter()
    try:
        if (folder / "report.json").is_file():
            row["status"] = "done"
        else:
            with syncs_deferred(sync=False) if durability == "sweep" else nullcontext():  # its sweep syncs it
                anyio.run(_trial, scenario, folder, params, options, llm, durability, fork)
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
    scenario: str,
    folder: Path,
    params: dict[str, Any],
    options: dict[str, Any],
    llm: dict[str, Any],
    durability: str,
    fork: dict[str, Any] | None,
) -> None:
    seed = params.get("seed", options.get("seed"))
    if restarted_since(folder):  # a power cut stopped it before it synced its files: from the start
        shutil.rmtree(folder)
    resuming = (folder / MANIFEST).is_file()
    options, specs = split_role_llms(options)
    model, role_llms, cassette = _models(llm, specs, folder, seed, resuming=resuming)
    if resuming:  # interrupted: continue from its last checkpoint
        await resume_scenario(folder, llm=model, role_llms=role_llms)
        return
    record = {**_answered_by(llm, folder), "sweep": params}
    record |= {**({"cassette": cassette} if cassette else {}), **({"role_llms": specs} if specs else {})}
    if fork is not None:
        await fork_scenario(
            Path(fork["run_dir"]),
            from_round=fork["from_round"],
            out_dir=folder,
            llm=model,
            role_llms=role_llms,
            manifest={**record, "durability": durability},
            interventions=parse_interventions(fork.get("interventions") or ()),
            seed=seed,
        )
        return
    run = RunOptions(**{k: params[k] for k in RUN_KEYS if k in params}, durability=durability)
    await run_scenario(
        scenario,
        llm=model,
        options=options,
        out_dir=folder,
        manifest=record,
        run=run,
        role_llms=role_llms,
    )


def _answered_by(llm: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The model a trial's manifest names: the one asked, or for a replay the one on the cassette it replays."""
    record = {"llm": llm.get("llm", "test"), "model": llm.get("model"), "base_url": redacted(llm.get("base_url"))}
    cassette = str(llm.get("cassette") or "")
    if cassette.startswith("replay:"):  # the model that answered is the one on the cassette, not the one standing by
        recorded = read_manifest(Path(cassette.removeprefix("replay:")) / folder.name)
        record = {key: recorded.get(key) for key in ("llm", "model", "base_url")}
        record["replayed_from"] = _replayed_cassette(cassette, folder)  # what `metaroles export` reads for the calls
    return record


def _replayed_cassette(cassette: str, folder: Path) -> str:
    """The cassette a replayed trial answers from, as an absolute path."""
    return str(Path(os.path.abspath(cassette.removeprefix("replay:"))) / folder.name / CASSETTE)


def _models(
    llm: dict[str, Any], specs: dict[str, str], folder: Path, seed: Any, *, resuming: bool
) -> tuple[Any, dict[str, Any], str]:
    """The trial's model and its roles' own (``specs``), through their cassettes; the path of the main cassette.

    ``llm["cassette"] == "record"``: each model records into the trial's ``cassette.jsonl`` (a
    role's own into ``cassette.NAME.jsonl``), and a resumed trial answers the calls its cassette holds
    from it before asking live; ``"replay:DIR"``: each answers from the same cassette of ``DIR``'s trial.
    """
    cassette = str(llm.get("cassette") or "")
    wanted = {"": {k: v for k, v in llm.items() if k != "cassette"}, **{n: {"llm": s} for n, s in specs.items()}}
    models: dict[str, Any] = {}
    for name, settings in wanted.items():
        file = folder / (f"cassette.{name}.jsonl" if name else CASSETTE)
        if cassette.startswith("replay:"):
            recorded = Path(cassette.removeprefix("replay:")) / folder.name / file.name
            models[name] = CassetteLLM(recorded, mode=CassetteMode.REPLAY)
            continue
        model = llm_from_settings(LLMSettings(**{**settings, "seed": seed}))
        if cassette == "record":
            folder.mkdir(parents=True, exist_ok=True)
            mode = CassetteMode.REPLAY_OR_LIVE if resuming and file.is_file() else CassetteMode.RECORD
            model = CassetteLLM(file, mode=mode, inner=model)
        models[name] = model
    main_cassette = str((folder / CASSETTE).absolute()) if cassette == "record" else ""
    return models.pop(""), models, main_cassette


def embedded_engine(llm: dict[str, Any]) -> bool:
    """Whether trials with the model ``llm`` describes ask the embedded model (an engine in this process)."""
    if str(llm.get("cassette") or "").startswith("replay:"):
        return False
    kind = str(llm.get("llm") or "auto")
    if kind == "auto" and not (llm.get("base_url") or llm.get("api_key")):
        return local_model_available(str(llm.get("model") or MODEL_NAME))
    return kind == "local"


EMBEDDED_JOBS = 32
"""Trials at once with the embedded model unless ``--jobs`` says: as many as its engine decodes together."""


def default_jobs(llm: dict[str, Any]) -> int:
    """Trials to run at once when the user did not say: the engine's batch for the embedded model, else 1."""
    return EMBEDDED_JOBS if embedded_engine(llm) else 1


def split_role_llms(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``options`` without its ``role.NAME.llm`` keys, and those as role name → model spec."""
    specs = {
        key.removeprefix("role.").removesuffix(".llm"): str(value)
        for key, value in options.items()
        if key.startswith("role.") and key.endswith(".llm")
    }
    rest = {k: v for k, v in options.items() if not (k.startswith("role.") and k.endswith(".llm"))}
    return rest, specs


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
    """Trials in this process and ``jobs - 1`` worker processes of this machine (no Ray needed).

    With ``threads``, the trials run in ``jobs`` threads of this process instead: for the embedded
    model, whose engine decodes the calls of every trial together (each process would load its own
    and the engines would fight over the cores; ``bench/engine.py``).
    """

    def __init__(self, jobs: int, *, threads: bool = False) -> None:
        """Run up to ``jobs`` trials at once."""
        self.jobs = jobs
        self.threads = threads

    def run(self, calls: list[tuple[Any, ...]], done: Done) -> None:
        """Run each call of ``run_trial``; ``done(index, row)`` as each ends (from one thread at a time)."""
        ended: set[int] = set()

        def record(index: int, row: Row) -> None:
            ended.add(index)
            done(index, row)

        (self._threaded if self.threads else self._run)(calls, record)
        for index in sorted(set(range(len(calls))) - ended):  # taken by a worker that died before it sent its row
            done(index, lost_row(*calls[index]))

    def _threaded(self, calls: list[tuple[Any, ...]], done: Done) -> None:
        """Every trial in a thread of this process, ``jobs`` at once; a trial's row as it ends."""
        lock = threading.Lock()
        pending = iter(range(len(calls)))
        failed: list[BaseException] = []

        def work() -> None:
            while not failed:
                with lock:
                    index = next(pending, None)
                if index is None:
                    return
                row = run_trial(*calls[index])
                with lock:
                    try:
                        done(index, row)
                    except BaseException as exc:  # the sweep's own failure: the calling thread raises it
                        failed.append(exc)

        workers = [threading.Thread(target=work, daemon=True) for _ in range(min(self.jobs, len(calls)))]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        if failed:
            raise failed[0]

    def _run(self, calls: list[tuple[Any, ...]], done: Done) -> None:
        context: Any = _context()
        lock = threading.Lock()
        taken = context.Value("i", 0)
        workers: list[tuple[BaseProcess, Connection]] = []
        here = not _in_event_loop()  # a notebook's cell runs in one: its trials all go to workers
        # The heap is not frozen before forking: a trial's session settles its heap only where nobody froze
        # it (core.heap), and a worker that inherits a frozen heap ran each trial ~30 % slower than this process.
        for _ in range(min(self.jobs, len(calls)) - here):
            receive, send = context.Pipe(duplex=False)
            worker = context.Process(target=_work, args=(calls, taken, send), daemon=True)
            worker.start()
            send.close()
            workers.append((worker, receive))
        failed: list[BaseException] = []
        collector = threading.Thread(target=_collect, args=(workers, done, lock, failed), daemon=True)
        collector.start()
        try:
            while here and (index := _take(taken, len(calls))) is not None:
                row = run_trial(*calls[index])
                with lock:
                    done(index, row)
            collector.join()
        finally:
            for worker, _ in workers:  # stopped early (an interrupt, a failure): the workers stop too
                if collector.is_alive():
                    worker.terminate()
                worker.join()
        if failed:
            raise failed[0]


def _in_event_loop() -> bool:
    """Whether this thread runs an event loop (a trial here would need its own)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _take(taken: Synchronized[int], count: int) -> int | None:
    """The next trial nobody has taken, if any."""
    with taken.get_lock():
        index = taken.value
        if index >= count:
            return None
        taken.value = index + 1
    return index


def _work(calls: Sequence[tuple[Any, ...]], taken: Synchronized[int], out: Connection) -> None:
    """A worker: take trials until none is left, sending each one's row."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the sweep's process, which stops its workers
    while (index := _take(taken, len(calls))) is not None:
        out.send((index, run_trial(*calls[index])))
    out.close()


def _collect(
    workers: list[tuple[BaseProcess, Connection]], done: Done, lock: threading.Lock, failed: list[BaseException]
) -> None:
    """Give the workers' rows to ``done`` as they come, until every worker has ended (or died: see ``run``)."""
    open_ = {receive: worker for worker, receive in workers}
    while open_:
        for receive in cast(list[Connection], wait(list(open_))):
            try:
                index, row = receive.recv()
            except EOFError:  # its worker ended: nothing left to take, or it died
                open_.pop(receive).join()
                continue
            try:
                with lock:
                    done(index, row)
            except BaseException as exc:  # the sweep's own failure: the main thread raises it
                failed.append(exc)
                return


def _context() -> BaseContext:
    """How to start workers: forked (instant: metaroles is already imported) from a one-thread process.

    A process with threads (a notebook's Ray client, a GUI) is not safe to fork, nor is one inside
    an event loop (the child would find it running and could not start its own); their workers
    start fresh from a fork server instead.
    """
    return get_context("fork" if threading.active_count() == 1 and not _in_event_loop() else "forkserver")


class RayTrials:
    """One Ray task per trial (``num_cpus`` each) on a local or remote cluster."""

    def __init__(self, address: str | None = None, num_cpus: float = 1) -> None:
        """Run on the cluster at ``address`` (a local one by default)."""
        self.address = address
        self.num_cpus = num_cpus

    def run(self, calls: list[tuple[Any, ...]], done: Callable[[int, Row], None]) -> None:
        """Submit every trial; ``done(index, row)`` as each ends."""
        from metaroles.sharding.ray import ensure_ray

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
