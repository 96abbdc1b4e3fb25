"""``metaroles run``, ``resume`` and ``fork``: make a run directory, continue one, branch one."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from metaroles.cli.common import (
    BACKEND_HELP,
    INTERVENE_SPECS,
    LLM_HELP,
    TRACEBACK_HELP,
    TRUST_HELP,
    Transcript,
    app,
    backend_from,
    execute,
    execution_record,
    fail,
    finish,
    manifest_model,
    model_from,
    options_from,
    prices_from,
    reported,
    resolve,
    resumed_model,
    run_dir_at,
    trusted,
)
from metaroles.cli.estimating import ESTIMATE_HELP, print_run_estimate, refuse_with
from metaroles.cli.tooling import A2A_HELP, MCP_HELP, PERMIT_HELP, resumed_tools, run_tools
from metaroles.cli.watching import HUMAN_HELP, PORT_HELP, people_at, run_control, watched
from metaroles.core.files import zstandard
from metaroles.record.durability import checked_durability
from metaroles.team.options import MAX_ROUNDS, RunOptions, read_config_file

if TYPE_CHECKING:
    from metaroles.agents.remotes import Remotes
    from metaroles.llm.human import Desk, HumanLLM
    from metaroles.llm.protocol import LLM
    from metaroles.team.team import Team

WATCH_HELP = "serve the run's page while it runs: watch it, and steer it with the token printed"
CONTROL_HELP = "as --watch, and the run waits before its first round until the page (or Python) steps or resumes it"
INTERVENTIONS_HELP = "inject the messages of this file where it says (another run's interventions.jsonl)"
DURABILITY_HELP = "when to wait for the disk: 'round' (each checkpoint) or 'run' (once, at the end: faster)"


def _check_extras(*, otel: bool, zstd: bool) -> None:
    """Refuse an option whose extra is not installed, saying what to install."""
    from metaroles.telemetry.tracing import require_otel

    if otel:
        require_otel()
    if zstd:
        zstandard()


@app.command()
def run(
    target: Annotated[
        str,
        typer.Argument(
            help="the scenario: a NAME (see `metaroles list`), a FILE.py, a pkg.module, or a FILE.yaml config; "
            "its options: `metaroles list NAME`"
        ),
    ],
    rounds: Annotated[
        int | None, typer.Option(min=0, max=MAX_ROUNDS, help="rounds to run (default: the scenario's)")
    ] = None,
    idea: Annotated[str | None, typer.Option(help="the idea/topic published at the start")] = None,
    llm: Annotated[str | None, typer.Option(help=LLM_HELP)] = None,
    model: Annotated[str | None, typer.Option(help="model name for an OpenAI-compatible server")] = None,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible endpoint ($OPENAI_BASE_URL)")] = None,
    seed: Annotated[int | None, typer.Option(help="seed of the run's random source and of the test model")] = None,
    temperature: Annotated[
        float | None, typer.Option(min=0.0, max=2.0, help="sampling temperature ($METAROLES_TEMPERATURE)")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(min=0.001, help="seconds per model call before a retry ($METAROLES_TIMEOUT)")
    ] = None,
    rate_limit: Annotated[
        float | None, typer.Option(min=0.001, help="model requests per second at most ($METAROLES_RATE_LIMIT)")
    ] = None,
    tpm: Annotated[
        float | None,
        typer.Option(
            "--tokens-per-minute",
            min=1,
            help="tokens (prompt and answer) per minute at most ($METAROLES_TOKENS_PER_MINUTE)",
        ),
    ] = None,
    rpm: Annotated[
        float | None,
        typer.Option(
            "--requests-per-minute", min=1, help="model calls per minute at most ($METAROLES_REQUESTS_PER_MINUTE)"
        ),
    ] = None,
    max_in_flight: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="model calls in flight at most ($METAROLES_MAX_IN_FLIGHT; a server's pace up to 64; local: 32)",
        ),
    ] = None,
    price: Annotated[
        list[str] | None,
        typer.Option(
            "--price",
            metavar="MODEL=PROMPT,COMPLETION",
            help="a model's price in USD per 1,000 tokens (dated names such as MODEL-2024-07-18 share it)",
        ),
    ] = None,
    budget: Annotated[
        float | None,
        typer.Option("--budget", "--investment", min=0.0, help="money budget; the run stops cleanly when spent"),
    ] = None,
    record: Annotated[Path | None, typer.Option(metavar="CASSETTE", help="record every model call here")] = None,
    replay: Annotated[Path | None, typer.Option(metavar="CASSETTE", help="answer from a recorded cassette")] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", metavar="KEY=VALUE", help="a scenario option, or role.NAME.llm=MODEL for one role"),
    ] = None,
    checkpoint_every: Annotated[
        int | None, typer.Option(min=1, help="a checkpoint every N rounds (default: the scenario's, else 1)")
    ] = None,
    log_turns: Annotated[
        bool | None, typer.Option("--log-turns/--no-log-turns", help="log observe/think/act of every turn")
    ] = None,
    fold_turns: Annotated[
        bool, typer.Option("--fold-turns", help="accepted for old scripts (each round's line folds its turns now)")
    ] = False,
    out: Annotated[Path | None, typer.Option(help="run directory (default: RUNS_DIR/NAME-STAMP-ID)")] = None,
    runs_dir: Annotated[Path, typer.Option(help="where run directories go")] = Path("runs"),
    no_save: Annotated[bool, typer.Option("--no-save", help="write no run directory")] = False,
    backend: Annotated[str | None, typer.Option(help=BACKEND_HELP)] = None,
    shards: Annotated[int | None, typer.Option(min=1, max=4096, help="shards of a Ray run (default 2)")] = None,
    ray_address: Annotated[
        str | None, typer.Option(help="Ray cluster: 'auto' or ray://host:port (default: a local one)")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no transcript, no progress")] = False,
    transcript: Annotated[
        bool | None,
        typer.Option("--transcript/--no-transcript", help="write transcript.md (default: runs ≤ 10,000 messages)"),
    ] = None,
    otel: Annotated[
        bool, typer.Option("--otel", help="trace the run with OpenTelemetry (OTEL_* variables; else spans.jsonl)")
    ] = False,
    zstd: Annotated[
        bool, typer.Option("--zstd", help="write the event log compressed, events.jsonl.zst (a zstd frame per round)")
    ] = False,
    durability: Annotated[str, typer.Option(help=DURABILITY_HELP)] = "round",
    show_traceback: Annotated[bool, typer.Option("--traceback", help=TRACEBACK_HELP)] = False,
    watch: Annotated[bool, typer.Option("--watch", help=WATCH_HELP)] = False,
    control: Annotated[bool, typer.Option("--control", help=CONTROL_HELP)] = False,
    port: Annotated[int, typer.Option(min=0, max=65535, help=PORT_HELP)] = 0,
    interventions: Annotated[Path | None, typer.Option(metavar="FILE", help=INTERVENTIONS_HELP)] = None,
    human: Annotated[list[str] | None, typer.Option(metavar="ROLE", help=HUMAN_HELP)] = None,
    human_timeout: Annotated[float, typer.Option(min=0.001, help="seconds a person has to answer")] = 120.0,
    mcp: Annotated[list[str] | None, typer.Option("--mcp", metavar="NAME=COMMAND|URL", help=MCP_HELP)] = None,
    permit: Annotated[list[str] | None, typer.Option(metavar="ROLE:TOOL=DECISION", help=PERMIT_HELP)] = None,
    a2a: Annotated[list[str] | None, typer.Option("--a2a", metavar="NAME=URL", help=A2A_HELP)] = None,
    estimate: Annotated[bool, typer.Option("--estimate", help=ESTIMATE_HELP)] = False,
    batch: Annotated[bool, typer.Option("--batch", help=BATCH_HELP)] = False,
    batch_deadline: Annotated[
        float | None, typer.Option(min=0.001, help="seconds a batch may take; then the run stops, resumable (24 h)")
    ] = None,
) -> None:
    """Run a scenario and write its run directory (``--estimate``: say what it would cost, run nothing)."""
    from metaroles.project.scenario import run_scenario
    from metaroles.project.trials import split_role_llms

    if estimate:
        refuse_with(record=record, replay=replay or (llm or "").startswith("replay:"), watch=watch, control=control,
                    human=human, interventions=interventions, mcp=mcp, a2a=a2a)  # fmt: skip
    _check_extras(otel=otel, zstd=zstd)  # before anything is loaded or written
    checked_durability(durability)
    steering = run_control(watch=watch, control=control, interventions=interventions)
    name, options, settings = _read_target(target, set_ or [])
    options, specs = split_role_llms(options)  # role.NAME.llm=MODEL: that role's own model
    recorded = replay or (Path(llm.removeprefix("replay:")) if llm and llm.startswith("replay:") else None)
    seed = _run_seed(seed if seed is not None else settings.get("seed"), record, recorded)
    given = {"llm": llm, "model": model, "base_url": base_url, "seed": seed, "temperature": temperature,
             "timeout": timeout, "requests_per_second": rate_limit, "max_in_flight": max_in_flight,
             "tokens_per_minute": tpm, "requests_per_minute": rpm}  # fmt: skip
    planned = None if no_save or estimate else _planned_run_dir(out, runs_dir, name)
    given |= _batching(batch or None, batch_deadline, planned, backend not in (None, "process") or shards)
    people = people_at(human or [], page=watch or control, seconds=human_timeout)
    language_model, manifest = _recorded_model(given, settings, record, replay, people)
    tools, desk = _tools((mcp, permit, a2a), settings, (record, replay), manifest, people, page=watch or control)
    run_options = RunOptions(
        rounds=rounds if rounds is not None else settings.get("rounds"),
        idea=idea if idea is not None else settings.get("idea"),
        seed=seed, budget=budget if budget is not None else settings.get("budget"),
        prices=prices_from(price or []) or None, checkpoint_every=checkpoint_every,
        log_turns="folded" if fold_turns and log_turns is not False else log_turns,
        backend=backend_from(backend, shards, ray_address), otel=otel, transcript=transcript, zstd=zstd,
        durability=durability, concurrency=BATCH_ROUND if given["batch"] else None,
    )  # fmt: skip
    if estimate:
        return print_run_estimate(name, language_model, options, run_options, specs, (tpm, rpm), quiet=quiet)
    run_dir = None if planned is None else _made_run_dir(planned, out)
    manifest |= {"execution": execution_record(run_options.backend), "quiet": quiet}  # resume keeps both
    manifest |= {"role_llms": specs} if specs else {}
    scenario = partial(run_scenario, name, llm=language_model, options=options, out_dir=run_dir, manifest=manifest,
                       control=steering, tools=tools)  # fmt: skip
    with watched(run_dir, steering, port, page=watch or control, desk=desk):
        _execute_run(scenario, run_options, specs, run_dir, quiet=quiet, traceback=show_traceback)


def _execute_run(
    scenario: Callable[..., Any],
    run: RunOptions,
    specs: dict[str, str],
    run_dir: Path | None,
    *,
    quiet: bool,
    traceback: bool,
) -> None:
    """Run ``scenario`` (its roles in ``specs`` on their own models) under the progress display, then report it."""
    role_llms = {role: resolve({"llm": spec}) for role, spec in specs.items()}
    streamed = None if quiet else Transcript(run_dir, wanted=run.transcript)  # each speech as its round ends
    report, team = execute(
        lambda live, stopping: scenario(run=run, role_llms=role_llms, on_progress=live, stopping=stopping),
        run.rounds or 0,
        quiet=quiet,
        run_dir=run_dir,
        show_traceback=traceback,
        transcript=streamed,
    )
    finish(report, team, run_dir, quiet=quiet, transcript=run.transcript, streamed=streamed)


def _tools(
    given: tuple[list[str] | None, list[str] | None, list[str] | None],
    settings: dict[str, Any],
    cassettes: tuple[Path | None, Path | None],
    manifest: dict[str, Any],
    people: partial[HumanLLM] | None,
    *,
    page: bool,
) -> tuple[Remotes | None, Desk | None]:
    """The run's servers and agents, and where a person is asked (for a role, or a call).

    ``given``: what ``--mcp``, ``--permit`` and ``--a2a`` said; the manifest records what the run reaches.
    """
    from metaroles.llm.human import PageDesk

    desk = people.keywords["desk"] if people is not None else (PageDesk() if page else None)
    with reported():
        servers, permits, agents = (list(listed or ()) for listed in given)
        tools, kept = run_tools(servers, permits, agents, settings, record=cassettes[0], replay=cassettes[1], desk=desk)
    manifest |= kept
    asked = people is not None or (tools is not None and tools.mcp is not None and tools.mcp.ask is not None)
    return tools, desk if asked else None


def _recorded_model(
    given: dict[str, Any],
    settings: dict[str, Any],
    record: Path | None,
    replay: Path | None,
    people: Callable[[LLM], HumanLLM] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """The run's model (recording into ``record``, or replaying ``replay``) and what the manifest says of it.

    ``given``: the model's options on the command line; ``settings``: a YAML config's (the command line wins).

    ``people``: a person answers for some roles (the model answers the rest): recorded with the model's calls.
    """
    from metaroles.llm.cassette import CassetteLLM, CassetteMode

    if record is not None and record.is_file() and record.stat().st_size:
        raise fail(
            f"--record {str(record)!r} holds recorded calls already; name a new file, or delete it to record again"
        )
    chosen = {key: settings.get(key) if value is None else value for key, value in given.items()}
    language_model, manifest = model_from(chosen, replay)
    if people is not None:
        language_model = people(language_model)
        manifest["humans"] = sorted(language_model.seats or ())
    if record:
        language_model = CassetteLLM(
            record, mode=CassetteMode.RECORD, inner=language_model, run={"seed": chosen["seed"]}
        )
    manifest["cassette"] = str(record.absolute()) if record else str(replay or "")  # resume goes on recording it
    return language_model, manifest


def _run_seed(seed: int | None, record: Path | None, replay: Path | None) -> int | None:
    """The run's seed: the one given; else a recording's own (drawn now, kept on its cassette), else the replayed one's.

    A replay then makes the very ids the recorded run made, so its run directory is the same, byte for byte.
    """
    from metaroles.llm.cassette import recorded_run

    if seed is not None:
        return seed
    if record is not None:
        return secrets.randbelow(1 << 31)
    recorded = recorded_run(replay) if replay is not None else {}
    return recorded.get("seed") if isinstance(recorded.get("seed"), int) else None


def _child_manifest(parent: dict[str, Any], backend: Any, specs: dict[str, str]) -> dict[str, Any]:
    """What a fork's manifest takes besides its parent's: how it runs, its roles' models, the parent's MCP servers."""
    kept = {"role_llms": specs} if specs else {}
    return {"execution": execution_record(backend), **kept, **{k: parent[k] for k in ("mcp", "a2a") if k in parent}}


def _new_run_dir(out: Path | None, runs_dir: Path, name: str) -> Path:
    """``--out``, or a new folder in ``runs_dir`` that ``runs_dir/latest`` then points at."""
    return _made_run_dir(_planned_run_dir(out, runs_dir, name), out)


def _planned_run_dir(out: Path | None, runs_dir: Path, name: str) -> Path:
    """Where the run will go: ``--out``, or a new folder's name in ``runs_dir`` (nothing is made yet)."""
    from metaroles.project.rundir import new_run_dir

    if out is not None:
        if not out.name or out.resolve() == Path.cwd().resolve():
            raise fail(f"--out {str(out)!r} is the current folder; name a new folder for the run, e.g. --out runs/mine")
        return out
    return new_run_dir(runs_dir, name)


def _made_run_dir(run_dir: Path, out: Path | None) -> Path:
    """``run_dir``, made and pointed at by ``latest`` beside it when metaroles named it (no ``--out``)."""
    from metaroles.project.rundir import point_latest

    if out is None:
        with reported():
            point_latest(run_dir)  # runs/latest: the newest run, whatever its name
    return run_dir


BATCH_HELP = (
    "send each round's model calls as one batch of the server's Batch API (OpenAI's files and batches: "
    "about half the price); a run stopped while its batch is pending resumes without paying again"
)
BATCH_ROUND = 100_000
"""Roles mid-turn at once in a ``--batch`` run: a round's calls wait together to go as one batch."""


def _batching(batch: bool | None, deadline: float | None, run_dir: Path | None, sharded: object) -> dict[str, Any]:
    """The model settings ``--batch`` gives: the batch, its deadline, and where pending batches are kept."""
    from metaroles.project.rundir import BATCHES

    if batch and sharded:
        raise fail("--batch gathers a round's calls in one process: drop --backend/--shards, or drop --batch")
    if deadline is not None and not batch:
        raise fail(f"--batch-deadline {deadline:g} is for a --batch run: add --batch, or drop it")
    journal = str(run_dir / BATCHES) if batch and run_dir is not None else None
    return {"batch": batch, "batch_deadline": deadline, "batch_journal": journal}


def _read_target(target: str, pairs: list[str]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """Scenario name, its options and the run settings, from a name or a YAML file plus ``--set`` pairs.

    A wrong name is reported here, before any model is loaded.
    """
    from metaroles.project.registry import load_scenario
    from metaroles.project.scenario import checked_config

    name, options, settings = target, options_from(pairs), {}
    if target.endswith((".yaml", ".yml")):
        with reported():
            config = read_config_file(Path(target))
        name, options, settings = config.scenario, {**config.config, **options}, config.run
    if name.endswith(".py"):
        name = str(Path(name).resolve())  # resume and fork find it from anywhere
    from metaroles.project.trials import split_role_llms
    from metaroles.team.options import RUN_OPTIONS

    own = {k: v for k, v in split_role_llms(options)[0].items() if k != "workspace"}
    with reported():
        checked_config(load_scenario(name), own, also=RUN_OPTIONS)
    return name, options, settings


@app.command()
def resume(
    run_dir: Annotated[Path, typer.Argument(help="a run directory written by `metaroles run`")],
    backend: Annotated[str | None, typer.Option(help=BACKEND_HELP)] = None,
    shards: Annotated[int | None, typer.Option(min=1, max=4096, help="shards of a Ray run (default 2)")] = None,
    ray_address: Annotated[
        str | None, typer.Option(help="Ray cluster: 'auto' or ray://host:port (default: a local one)")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no transcript, no progress")] = False,
    rounds: Annotated[
        int | None, typer.Option(min=0, max=MAX_ROUNDS, help="rounds in all: extend a run stopped by --rounds")
    ] = None,
    trust: Annotated[bool, typer.Option("--trust", help=TRUST_HELP)] = False,
    show_traceback: Annotated[bool, typer.Option("--traceback", help=TRACEBACK_HELP)] = False,
    watch: Annotated[bool, typer.Option("--watch", help=WATCH_HELP)] = False,
    control: Annotated[bool, typer.Option("--control", help=CONTROL_HELP)] = False,
    port: Annotated[int, typer.Option(min=0, max=65535, help=PORT_HELP)] = 0,
) -> None:
    """Continue a run from its last complete checkpoint (after a crash, a kill, or a budget stop).

    It runs where it ran before (the manifest's backend) unless ``--backend``/``--shards`` say
    otherwise: any count of shards continues it alike.
    """
    from metaroles.project.rundir import check_run_dir, read_manifest
    from metaroles.project.scenario import resume_scenario

    with reported():
        manifest = read_manifest(run_dir_at(run_dir))
        check_run_dir(run_dir)
        trusted(manifest["scenario"], run_dir, trust=trust)
    chosen = backend_from(backend, shards, ray_address, manifest.get("execution"))
    with reported():
        llm, tools = resumed_model(manifest, run_dir), resumed_tools(manifest, desk=None, trust=trust)  # asks: terminal
    role_llms = {name: resolve({"llm": str(spec)}) for name, spec in (manifest.get("role_llms") or {}).items()}
    quiet = quiet or manifest.get("quiet") is True
    steering = run_control(watch=watch, control=control, interventions=None)
    with watched(run_dir, steering, port, page=watch or control):
        report, team = execute(
            lambda live, stopping: resume_scenario(
                run_dir, llm=llm, role_llms=role_llms, on_progress=live, backend=chosen, rounds=rounds,
                stopping=stopping, control=steering, tools=tools,
            ),
            manifest["n_round"] if rounds is None else rounds,
            quiet=quiet,
            run_dir=run_dir,
            show_traceback=show_traceback,
        )  # fmt: skip
    finish(report, team, run_dir, quiet=quiet, transcript=manifest.get("transcript"))


@app.command()
def fork(
    run_dir: Annotated[Path, typer.Argument(help="the parent run directory")],
    from_round: Annotated[
        int, typer.Option("--from-round", min=0, help="branch from the state at the end of this round")
    ],
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", metavar="KEY=VALUE", help="a scenario option, or role.NAME.llm=MODEL for one role"),
    ] = None,
    idea: Annotated[str, typer.Option(help="a message published to every role at the fork point")] = "",
    intervene: Annotated[
        list[str] | None,
        typer.Option(
            "--intervene",
            metavar="SPEC",
            help=f"one change, recorded as such: {INTERVENE_SPECS}",
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="the new run directory (default: next to the parent)")] = None,
    backend: Annotated[str | None, typer.Option(help=BACKEND_HELP)] = None,
    shards: Annotated[int | None, typer.Option(min=1, max=4096, help="shards of a Ray run (default 2)")] = None,
    ray_address: Annotated[
        str | None, typer.Option(help="Ray cluster: 'auto' or ray://host:port (default: a local one)")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no transcript, no progress")] = False,
    rounds: Annotated[
        int | None, typer.Option(min=0, max=MAX_ROUNDS, help="rounds in all (default: as the config says)")
    ] = None,
    trust: Annotated[bool, typer.Option("--trust", help=TRUST_HELP)] = False,
    show_traceback: Annotated[bool, typer.Option("--traceback", help=TRACEBACK_HELP)] = False,
) -> None:
    """Start a new run from a round of an earlier one, with a change; the new run records its parent."""
    from metaroles.project.rundir import check_run_dir, read_manifest, scenario_label
    from metaroles.project.scenario import fork_scenario
    from metaroles.project.trials import split_role_llms
    from metaroles.team.surgery import model_swaps, parse_interventions

    with reported():
        manifest = read_manifest(run_dir_at(run_dir))
        check_run_dir(run_dir)
        trusted(manifest["scenario"], run_dir, trust=trust)
        tools = resumed_tools({**manifest, "cassette": None}, desk=None, trust=trust)  # the parent's servers, live
        surgeries = parse_interventions(intervene or [])
    changes, more = split_role_llms(options_from(set_ or []) | model_swaps(surgeries))  # a swap: the role's model
    specs = {**(manifest.get("role_llms") or {}), **more}  # a fork of a fork keeps its parent's models
    role_llms = {name: resolve({"llm": spec}) for name, spec in specs.items()}
    llm = manifest_model(manifest)
    chosen = backend_from(backend, shards, ray_address, manifest.get("execution"))
    child = _new_run_dir(out, run_dir.parent, f"{scenario_label(manifest['scenario'])}-fork{from_round}")

    def work(live: Callable[[Team], None], stopping: threading.Event) -> Any:
        return fork_scenario(
            run_dir,
            from_round=from_round,
            out_dir=child,
            llm=llm,
            changes=changes,
            role_llms=role_llms,
            idea=idea,
            manifest=_child_manifest(manifest, chosen, specs),
            on_progress=live,
            backend=chosen,
            rounds=rounds,
            stopping=stopping,
            tools=tools,
            interventions=surgeries,
        )

    total = manifest["n_round"] if rounds is None else rounds
    report, team = execute(work, total, quiet=quiet, run_dir=child, show_traceback=show_traceback)
    finish(report, team, child, quiet=quiet, transcript=manifest.get("transcript"))
