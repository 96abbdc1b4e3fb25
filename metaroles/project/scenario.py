"""Running a named scenario into a run directory: run, resume and fork."""

from __future__ import annotations

import difflib
import functools
import inspect
import tempfile
import threading
import types
import typing
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from types import ModuleType
from typing import Any, ParamSpec, TypeVar

import orjson
from pydantic import ValidationError

from metaroles.agents.remotes import Remotes
from metaroles.bus.environment import Environment
from metaroles.core.exceptions import ConfigError, UnknownRoleError
from metaroles.core.files import write_atomic, zstandard
from metaroles.llm.human import find_human
from metaroles.llm.ledger import Price
from metaroles.llm.offline import TestLLM
from metaroles.llm.protocol import LLM
from metaroles.llm.providers import describe_llm
from metaroles.project.metrics import check_metrics, metrics_recorder, read_metrics
from metaroles.project.registry import ScenarioPlan, load_scenario, recorded_scenario
from metaroles.project.rundir import (
    CHECKPOINTS,
    EVENTS,
    EVENTS_ZST,
    METRICS,
    STATE,
    check_run_dir,
    events_file,
    locked,
    provenance,
    read_manifest,
    refuse_a_run_in,
    refuse_late,
    scenario_label,
    write_manifest,
    write_run_dir,
)
from metaroles.record.durability import checked_durability, finish_syncing, refuse_restarted, synced_at_end
from metaroles.record.eventlog import TIMINGS
from metaroles.sharding.backends import connect
from metaroles.team.control import JOURNAL, RunControl, read_journal
from metaroles.team.options import RunOptions, checked_log_turns
from metaroles.team.surgery import Surgery, edit_history, from_record, operate, recorded
from metaroles.team.team import Team, TeamReport

P = ParamSpec("P")
T = TypeVar("T")


def _plan(
    module: ModuleType, config: Any, llm: LLM, run: RunOptions, run_dir: Path | None = None, tools: Any = None
) -> ScenarioPlan:
    """The scenario's plan, with the run's options applied.

    A ``build`` that takes ``run_dir`` gets the run directory (``None`` for a run that keeps none): a
    role's long-term memory, say, can then live in it and come back on resume and fork. One that
    takes ``tools`` gets the run's MCP client (its roles' tools: ``tools.tools_for(role)``), or ``None``;
    ``tools`` may be :class:`~metaroles.agents.remotes.Remotes`, whose A2A agents join the team.
    """
    mcp = tools.mcp if isinstance(tools, Remotes) else tools
    plan = _built(module, config, llm, _collaborators(module, run_dir, mcp))
    if isinstance(tools, Remotes):
        plan.team.hire(tools.members())  # remote A2A agents join the society
    folder = getattr(config, "workspace", None)
    plan.team.workspace = Path(folder) if folder else None
    if run.seed is not None:
        plan.team.env.reseed(run.seed)
    if run.budget is not None:
        plan.team.invest(run.budget)
    for model, (prompt, completion) in (run.prices or {}).items():
        plan.team.env.ledger.prices[model] = Price(prompt=prompt, completion=completion)
    defaults: dict[str, Any] = getattr(module, "RUN_DEFAULTS", {})
    every = run.checkpoint_every if run.checkpoint_every is not None else defaults.get("checkpoint_every", 1)
    plan.team.checkpoint_every = every
    turns = run.log_turns if run.log_turns is not None else defaults.get("log_turns", True)
    plan.team.log_turns = checked_log_turns(turns)
    plan.team.metric_parts = list(getattr(module, "METRIC_PARTS", ()))
    plan.team.shard_by = getattr(module, "shard_by", None)
    if run.concurrency is not None:
        if isinstance(run.concurrency, bool) or not isinstance(run.concurrency, int) or run.concurrency < 1:
            raise ConfigError(f"concurrency={run.concurrency!r} must be a positive integer (roles mid-turn at once)")
        plan.team.env.concurrency = run.concurrency
    if run.backend is not None:
        plan.team.backend = run.backend
    plan.team.bring_back = False  # a large sharded run's roles stay on their shards: its run directory holds them
    return ScenarioPlan(
        team=plan.team,
        idea=plan.idea if run.idea is None else run.idea,
        send_to=plan.send_to,
        n_round=plan.n_round if run.rounds is None else run.rounds,
    )


def _built(module: ModuleType, config: Any, llm: LLM, collaborators: dict[str, Any]) -> ScenarioPlan:
    """What the scenario's ``build`` makes of ``config``, checked to be a plan."""
    try:
        plan = module.build(config, llm, **collaborators)
    except SystemExit as exc:  # sys.exit() in a scenario's build: not the run's own exit
        raise ConfigError(
            f"{module.__name__}.build() called sys.exit({exc.code!r}); raise an exception saying what is wrong instead"
        ) from None
    if not isinstance(plan, ScenarioPlan):
        raise ConfigError(
            f"{module.__name__}.build() returned {type(plan).__name__}; return "
            "ScenarioPlan(team=..., idea=..., send_to=..., n_round=...) (see the README's 'Write a scenario')"
        )
    return plan


def _collaborators(module: ModuleType, run_dir: Path | None, tools: Any) -> dict[str, Any]:
    """What the scenario's ``build`` takes besides its config and model: the run directory, the run's tools."""
    takes = inspect.signature(module.build).parameters
    if tools is not None and "tools" not in takes:
        raise ConfigError(
            f"scenario {module.__name__.rsplit('.', 1)[-1]!r} takes no tools (its build() has no tools parameter); "
            "run it without --mcp, or run one that does, e.g. assistant"
        )
    given = {"run_dir": run_dir, "tools": tools}
    return {name: value for name, value in given.items() if name in takes}


def _with_tools(run: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """``run`` with its ``tools`` (the run's MCP client) started first and stopped after, whatever happens."""

    @functools.wraps(run)
    async def started(*args: P.args, **options: P.kwargs) -> T:
        tools: Any = options.get("tools")
        backend = options.get("backend") or getattr(options.get("run"), "backend", None)
        if tools is not None and backend is not None:
            raise ConfigError("MCP tools are called from the run's own process: run it without --backend ray")
        async with tools if tools is not None else nullcontext():
            return await run(*args, **options)

    return started


@_with_tools
async def run_scenario(
    name: str,
    *,
    llm: LLM,
    options: dict[str, Any],
    out_dir: Path | None,
    manifest: dict[str, Any] | None = None,
    run: RunOptions | None = None,
    on_round: Callable[[Team], None] | None = None,
    on_progress: Callable[[Team], None] | None = None,
    role_llms: dict[str, LLM] | None = None,
    stopping: threading.Event | None = None,
    control: RunControl | None = None,
    tools: Any = None,
) -> tuple[TeamReport, Team]:
    """Build and run scenario ``name``; write its run directory into ``out_dir`` if given.

    ``tools``: the run's :class:`~metaroles.agents.mcp.MCPClient`, started for the run (``build`` gets it).
    ``stopping``: set it (a signal handler may) to stop the run at the next round barrier (see
    :meth:`Team.stop`). ``control`` pauses, steps and injects at the round barriers, from any
    thread; an injection is journaled (``interventions.jsonl``) before it is published, so resume
    and fork reproduce it. Resume and fork take both. ``role_llms`` give the named roles models of
    their own (record their specs in the manifest's ``role_llms`` for a resume to give them again).

    The run directory's files are listed in :mod:`metaroles.project.rundir`. On shards, the roles
    of a run whose ``state.json`` names its last checkpoint (a large one) stay there when it ends:
    the returned team's environment holds their stand-ins; the run continues from its directory.
    """
    run = run or RunOptions()
    module = load_scenario(name)
    config, recorded = _configured(module, options, out_dir)
    plan = _plan(module, config, llm, run, out_dir, tools)
    _give_models(plan.team, role_llms or {})
    plan.team.stopping = stopping or plan.team.stopping
    _steer(plan.team, control, out_dir)
    seat_people(plan.team, llm)
    plan.team.on_round, plan.team.on_progress = on_round, on_progress
    plan.team.on_record = metrics_recorder(module, out_dir)
    if out_dir is None:
        with _observed(run, plan.team, name, out_dir):
            report = await plan.team.run(n_round=plan.n_round, idea=plan.idea, send_to=plan.send_to)
        return report, plan.team
    if run.zstd:
        zstandard()  # the extra is there before anything is written
    checked_durability(run.durability, sweep=True)
    record = {**_manifest_record(name, module, recorded, plan, run), **(manifest or {}), **describe_llm(llm)}
    record |= provenance()
    with locked(out_dir):
        refuse_a_run_in(out_dir)
        connect(plan.team.backend)
        _sweep(out_dir)
        write_manifest(out_dir, record)
        return await _run_into(out_dir, plan, run, name, record)


async def _run_into(
    out_dir: Path, plan: ScenarioPlan, run: RunOptions, name: str, record: dict[str, Any]
) -> tuple[TeamReport, Team]:
    durability = checked_durability(run.durability, sweep=True)
    with _observed(run, plan.team, name, out_dir), synced_at_end(out_dir, durability):
        report = await plan.team.run(
            n_round=plan.n_round,
            idea=plan.idea,
            send_to=plan.send_to,
            save_to=out_dir / STATE,
            checkpoints=out_dir / CHECKPOINTS,
            events=events_file(out_dir, record),
        )
    write_run_dir(out_dir, plan.team, report, record)
    return report, plan.team


def _observed(run: RunOptions, team: Team, name: str, out_dir: Path | None) -> AbstractContextManager[object]:
    """The run's OpenTelemetry trace when ``run.otel`` asks for one (imported only then), else nothing."""
    if not run.otel:
        return nullcontext()
    from metaroles.telemetry.spans import run_telemetry

    run_id = out_dir.name if out_dir is not None else f"{scenario_label(name)}-{team.env.id_key}"
    return run_telemetry(team.env, scenario=scenario_label(name), run_id=run_id, out_dir=out_dir)


def _manifest_record(
    name: str, module: ModuleType, config: dict[str, Any], plan: ScenarioPlan, run: RunOptions
) -> dict[str, Any]:
    """What a run is rebuilt from: the scenario (a file's module name too: resume makes the same ids), its config."""
    return {
        "scenario": name,
        **({"module": module.__name__} if name.endswith(".py") else {}),
        "config": config,
        "n_round": plan.n_round,
        "rounds": run.rounds,
        "idea": plan.idea,
        "seed": run.seed,
        "budget": run.budget,
        "prices": run.prices,
        "checkpoint_every": plan.team.checkpoint_every,
        "log_turns": plan.team.log_turns,
        "transcript": run.transcript,
        "durability": run.durability,
        "events": EVENTS_ZST if run.zstd else EVENTS,
        **({"concurrency": run.concurrency} if run.concurrency is not None else {}),
    }


def _configured(module: ModuleType, options: dict[str, Any], run_dir: Path | None) -> tuple[Any, dict[str, Any]]:
    """The scenario's validated config, and the config as the manifest records it.

    A scenario with a ``workspace`` option and none given writes its artifacts into the run
    directory's ``workspace/``; the manifest then records none, so the run directory can move
    (and a fork gets a workspace of its own). A relative workspace is relative to the run
    directory, wherever the command runs from.
    """
    if run_dir is None or "workspace" not in module.Config.model_fields:
        config = checked_config(module, options)
        return config, config.model_dump(mode="json")
    given = options.get("workspace")
    place = str(run_dir / (given or "workspace")) if not given or not Path(str(given)).is_absolute() else given
    config = checked_config(module, {**options, "workspace": place})
    return config, {**config.model_dump(mode="json"), "workspace": given or None}


def built_team(name: str, options: dict[str, Any], llm: LLM, *, seed: int | None = None) -> Team:
    """Scenario ``name`` built with ``options`` and no run directory: its team as a run starts it."""
    module = load_scenario(name)
    config, _ = _configured(module, options, None)
    return _plan(module, config, llm, RunOptions(seed=seed)).team


def check_role_models(module: ModuleType, options: dict[str, Any], names: Iterable[str]) -> None:
    """Refuse ``role.NAME.llm`` for a ``NAME`` the scenario has no role of, before any run starts.

    The scenario is built once (with the offline test model, in a scratch folder) to learn its roles.

    Raises:
        ConfigError: Naming the role and the roles there are.
    """
    wanted = sorted(set(names))
    if not wanted:
        return
    with tempfile.TemporaryDirectory(prefix="metaroles-roles-") as scratch:
        config, _ = _configured(module, options, Path(scratch))
        roles = _plan(module, config, TestLLM(0), RunOptions(), Path(scratch)).team.env.roles
        unknown = [name for name in wanted if name not in roles]
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(roles), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"role.{unknown[0]}.llm: no role named {unknown[0]!r}; {hint}roles: {sorted(roles)}")


def checked_config(module: ModuleType, options: dict[str, Any], *, also: Sequence[str] = ()) -> Any:
    """The scenario's ``Config`` from ``options``.

    ``also``: other names the options may have meant (a YAML file's run options), for "did you mean".

    Raises:
        ConfigError: Naming the option, the value and what is wrong (an unknown option included; a
            list option given otherwise shows the list form).
    """
    fields = module.Config.model_fields
    unknown = sorted(set(options) - set(fields))
    if unknown:
        close = difflib.get_close_matches(unknown[0], [*fields, *also], n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(
            f"{unknown[0]!r} is not an option of this scenario; {hint}"
            f"its options: {', '.join(sorted(fields)) or 'none'} (see: metaroles list SCENARIO)"
        )
    try:
        return module.Config.model_validate(options)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = ".".join(str(p) for p in error["loc"])
        field = fields.get(str(error["loc"][0])) if error["loc"] else None
        listed = field is not None and _is_list(field.annotation)
        form = f'; a list is written --set \'{name}=["a", "b"]\' (JSON), or in YAML {name}: [a, b]' if listed else ""
        raise ConfigError(f"option {name}={error.get('input')!r}: {error['msg']}{form}") from None


def _is_list(annotation: Any) -> bool:
    """Whether an option's type is a list (a tuple, a set), or such a list or ``None``."""
    origin = typing.get_origin(annotation)
    if origin in (list, tuple, set, frozenset):
        return True
    return origin in (typing.Union, types.UnionType) and any(_is_list(arg) for arg in typing.get_args(annotation))


def _rebuild(
    manifest: dict[str, Any],
    llm: LLM,
    run_dir: Path,
    changes: dict[str, Any] | None = None,
    backend: Any = None,
    rounds: int | None = None,
    tools: Any = None,
) -> ScenarioPlan:
    """The run's plan again, from its manifest (and a fork's ``changes``).

    Its length: ``rounds`` if given; else the ``--rounds`` the run was given; else what the scenario's
    config makes of it (so a fork's ``--set rounds=20`` or ``turns=5`` counts). A manifest from before
    ``rounds`` was recorded keeps its ``n_round``.
    """
    module = recorded_scenario(manifest)
    config, _ = _configured(module, {**manifest["config"], **(changes or {})}, run_dir)
    if rounds is None:
        rounds = manifest["rounds"] if "rounds" in manifest else manifest["n_round"]
    run = RunOptions(
        rounds=rounds,
        seed=manifest.get("seed"),
        budget=manifest.get("budget"),
        prices={model: (float(p[0]), float(p[1])) for model, p in (manifest.get("prices") or {}).items()},
        checkpoint_every=manifest.get("checkpoint_every"),
        log_turns=manifest.get("log_turns"),
        backend=backend,
        concurrency=manifest.get("concurrency"),
    )
    return _plan(module, config, llm, run, run_dir, tools)


@_with_tools
async def resume_scenario(
    run_dir: Path,
    *,
    llm: LLM,
    role_llms: dict[str, LLM] | None = None,
    on_round: Callable[[Team], None] | None = None,
    on_progress: Callable[[Team], None] | None = None,
    backend: Any = None,
    rounds: int | None = None,
    stopping: threading.Event | None = None,
    control: RunControl | None = None,
    tools: Any = None,
) -> tuple[TeamReport, Team]:
    """Rebuild the run in ``run_dir`` from its manifest and continue from its last checkpoint.

    What was injected into the run (its ``interventions.jsonl``) is published again where it landed,
    unless the checkpoint holds it; ``control`` steers the rest of the run.

    ``role_llms`` give roles the models a fork gave them (the manifest's ``role_llms``). A run
    killed before its first checkpoint starts over from its manifest. ``backend`` runs the roles
    on shards (any count: shards are not part of the run). ``rounds`` extends (or shortens) the
    run to that many rounds in all; the manifest records it. Everything is checked before anything
    in the folder changes, and the folder is held (:func:`~metaroles.project.rundir.locked`) throughout.
    """
    with locked(run_dir):
        manifest = read_manifest(run_dir)
        check_run_dir(run_dir)
        plan = _rebuild(manifest, llm, run_dir, backend=backend, rounds=rounds, tools=tools)
        _give_models(plan.team, role_llms or {}, from_record(manifest.get("interventions")))
        durability = checked_durability(manifest.get("durability", "round"), sweep=True)
        connect(backend)
        finish_syncing(run_dir)
        if rounds is not None and rounds != manifest["n_round"]:
            manifest = {**manifest, "n_round": plan.n_round, "rounds": rounds}
            write_manifest(run_dir, manifest)
        plan.team.on_round, plan.team.on_progress = on_round, on_progress
        plan.team.stopping = stopping or plan.team.stopping
        if control is not None or (run_dir / JOURNAL).is_file():
            control = control or RunControl()
            control.replay(run_dir / JOURNAL)
            plan.team.control = control
        plan.team.on_record = metrics_recorder(recorded_scenario(manifest), run_dir)
        with synced_at_end(run_dir, durability):
            report = await _continue(plan, run_dir, manifest)
        write_run_dir(run_dir, plan.team, report, manifest)
    return report, plan.team


async def _continue(plan: ScenarioPlan, run_dir: Path, manifest: dict[str, Any]) -> TeamReport:
    """Resume the run in ``run_dir`` from its last checkpoint, or run it again if it has none."""
    parent = manifest.get("parent")
    _sweep(run_dir)
    if not any((run_dir / CHECKPOINTS).glob("round-*.json")):  # killed before its first checkpoint
        if isinstance(parent, dict):
            return await _branch(plan, Path(parent["run_dir"]), parent["from_round"], run_dir, manifest)
        return await _start_over(plan, run_dir, manifest)
    return await plan.team.resume(
        run_dir / CHECKPOINTS,
        plan.n_round,
        save_to=run_dir / STATE,
        events=events_file(run_dir, manifest),
        check=check_metrics(recorded_scenario(manifest), run_dir),
    )


def _sweep(run_dir: Path) -> None:
    """Remove the temporary files of writes a kill interrupted (never renamed into place)."""
    for folder in (run_dir, run_dir / CHECKPOINTS, run_dir / CHECKPOINTS / "blobs"):
        for stale in folder.glob(".*.tmp"):
            stale.unlink(missing_ok=True)


async def _start_over(plan: ScenarioPlan, run_dir: Path, manifest: dict[str, Any]) -> TeamReport:
    """Run again from the manifest: nothing before the first checkpoint can be continued."""
    for name in (EVENTS, EVENTS_ZST, TIMINGS, METRICS):
        (run_dir / name).unlink(missing_ok=True)
    return await plan.team.run(
        n_round=plan.n_round,
        idea=manifest.get("idea") or plan.idea,
        send_to=plan.send_to,
        save_to=run_dir / STATE,
        checkpoints=run_dir / CHECKPOINTS,
        events=events_file(run_dir, manifest),
    )


@_with_tools
async def fork_scenario(
    parent: Path,
    *,
    from_round: int,
    out_dir: Path,
    llm: LLM,
    changes: dict[str, Any] | None = None,
    role_llms: dict[str, LLM] | None = None,
    idea: str = "",
    manifest: dict[str, Any] | None = None,
    on_round: Callable[[Team], None] | None = None,
    on_progress: Callable[[Team], None] | None = None,
    backend: Any = None,
    rounds: int | None = None,
    stopping: threading.Event | None = None,
    control: RunControl | None = None,
    tools: Any = None,
    interventions: Sequence[Surgery] = (),
    seed: int | None = None,
) -> tuple[TeamReport, Team]:
    """Branch the run in ``parent`` at ``from_round`` into ``out_dir``, with a change.

    The child's ``interventions.jsonl`` keeps what was injected into the parent before the fork
    point (its state holds those messages); ``control`` steers the child.

    ``changes`` update the scenario's config (its length too: ``rounds=20``, ``turns=5``), ``role_llms``
    give named roles another model, ``rounds`` sets the rounds in all, ``idea`` is published at the fork
    point, ``interventions`` (``team.surgery``; with the parent's, the child's, made again on resume)
    change one thing each, and ``seed`` reseeds the branch at the fork point (an ensemble's branch).

    Raises:
        ConfigError: If ``parent`` is not a run directory, has no checkpoint as late as ``from_round``,
            names an unknown role (an intervention's: UnknownRoleError), or ``out_dir`` holds a run.
    """
    record = read_manifest(parent)
    check_run_dir(parent)
    refuse_restarted(parent)
    refuse_late(parent, from_round)
    changes = {"workspace": None, **(changes or {})} if "workspace" in record["config"] else changes or {}
    surgeries = [*from_record(record.get("interventions")), *interventions]
    plan = _rebuild(record, llm, out_dir, changes, backend, rounds=rounds, tools=tools)
    _give_models(plan.team, role_llms or {}, surgeries)
    plan.team.on_round, plan.team.on_progress = on_round, on_progress
    plan.team.stopping = stopping or plan.team.stopping
    _steer(plan.team, control, out_dir)
    plan.team.on_record = metrics_recorder(recorded_scenario(record), out_dir)
    parent_record = {"run_dir": _absolute(parent), "from_round": from_round, "idea": idea, "changes": changes}
    parent_record |= _surgical(interventions, seed, fork=True)
    child = _forked(record, changes, {**(manifest or {}), **describe_llm(llm)}, _surgical(surgeries, seed))
    child |= {"n_round": plan.n_round, "rounds": record.get("rounds") if rounds is None else rounds}
    child |= provenance() | {"parent": parent_record}
    with locked(out_dir):
        refuse_a_run_in(out_dir)
        connect(backend)
        _sweep(out_dir)
        write_manifest(out_dir, child)
        with synced_at_end(out_dir, checked_durability(child.get("durability", "round"), sweep=True)):
            report = await _branch(plan, parent, from_round, out_dir, child)
        write_run_dir(out_dir, plan.team, report, child)
    return report, plan.team


async def _branch(
    plan: ScenarioPlan, parent: Path, from_round: int, out_dir: Path, child: dict[str, Any]
) -> TeamReport:
    """Run a fork (``child``: its manifest) from its parent's checkpoint (again, if killed before its first)."""
    for name in (EVENTS, EVENTS_ZST, TIMINGS):
        (out_dir / name).unlink(missing_ok=True)
    kept = [i for i in read_journal(parent / JOURNAL) if (i.after_round or 0) < from_round]
    if kept or (out_dir / JOURNAL).is_file():  # what the parent's state at the fork point holds
        write_atomic(out_dir / JOURNAL, b"".join(orjson.dumps(i.model_dump()) + b"\n" for i in kept))
    if (parent / METRICS).is_file():  # the child's first round cuts it back to the rounds before the fork
        write_atomic(out_dir / METRICS, "".join(line + "\n" for _, line in read_metrics(parent / METRICS)))
    return await plan.team.fork(
        parent / CHECKPOINTS,
        from_round,
        plan.n_round,
        checkpoints=out_dir / CHECKPOINTS,
        events=events_file(out_dir, child),
        parent_events=events_file(parent),
        idea=child["parent"]["idea"],
        save_to=out_dir / STATE,
        then=functools.partial(_at_the_fork, child["parent"]),
    )


def _forked(
    record: dict[str, Any], changes: dict[str, Any], given: dict[str, Any], surgical: dict[str, Any]
) -> dict[str, Any]:
    """A fork's manifest from its parent's: the config changed, the fork's model and settings, interventions, seed."""
    return {**record, "config": {**record["config"], **changes}, **given, **surgical}


def _surgical(surgeries: Sequence[Surgery], seed: int | None, *, fork: bool = False) -> dict[str, Any]:
    """A branch's interventions and seed, as far as given (``fork``: its record of the fork, both or none)."""
    if fork:
        return {"interventions": recorded(surgeries), "seed": seed} if surgeries or seed is not None else {}
    return ({"interventions": recorded(surgeries)} if surgeries else {}) | ({"seed": seed} if seed is not None else {})


def _at_the_fork(parent: dict[str, Any], env: Environment) -> None:
    """What a branch changes once its parent's state is restored: its seed, and the messages it edits."""
    if parent.get("seed") is not None:
        env.reseed(parent["seed"])
    edit_history(env, from_record(parent.get("interventions")))


def rebuilt_team(manifest: dict[str, Any], llm: LLM, run_dir: Path, role_llms: dict[str, LLM]) -> Team:
    """The run's team again from its manifest, not yet restored: its roles as hired, named ones on their models."""
    plan = _rebuild(manifest, llm, run_dir)
    _give_models(plan.team, role_llms, from_record(manifest.get("interventions")))
    return plan.team


def seat_people(team: Team, llm: LLM) -> None:
    """Check that the seats the run's :class:`~metaroles.llm.human.HumanLLM` names are roles of the run.

    Raises:
        UnknownRoleError: If a seat names no role of the run.
    """
    human = find_human(llm)
    unknown = sorted((human.seats or set()) - set(team.env.roles)) if human is not None else []
    if unknown:
        raise UnknownRoleError(f"--human {unknown[0]!r} is not a role of this run; its roles: {sorted(team.env.roles)}")


def _steer(team: Team, control: RunControl | None, run_dir: Path | None) -> None:
    """Hand ``control`` to the team; what it injects is journaled in ``run_dir``, if any."""
    if control is not None:
        if run_dir is not None and control.journal is None:
            control.journal = run_dir / JOURNAL
        team.control = control


def _give_models(team: Team, role_llms: dict[str, LLM], surgeries: Sequence[Surgery] = ()) -> None:
    """Give the named roles their own models (a fork's ``role.NAME.llm=...``), then make the run's interventions.

    Raises:
        ConfigError: If a name is not a role of the run.
        UnknownRoleError: If an intervention names a role the run does not have.
    """
    for role_name, role_llm in role_llms.items():
        if role_name not in team.env.roles:
            raise ConfigError(f"no role named {role_name!r} in this run; roles: {sorted(team.env.roles)}")
        team.env.roles[role_name].set_llm(role_llm)
    operate(team.env, surgeries)


def _absolute(path: Path) -> str:
    """``path`` resolved, for a manifest (a fork records where its parent is, wherever it is run from)."""
    return str(path.resolve())
