"""Running a named scenario and writing its run directory.

A scenario is a module ``scenarios.NAME`` with a pydantic ``Config`` and
``build(config, llm) -> ScenarioPlan``.
"""

from __future__ import annotations

import difflib
import importlib
import json
import platform
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from metaroles.eventlog import publish_rounds
from metaroles.exceptions import ConfigError
from metaroles.llm import LLM
from metaroles.message import Message
from metaroles.team import Team, TeamReport

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
MANIFEST = "manifest.json"
CHECKPOINTS = "checkpoints"
EVENTS = "events.jsonl"
STATE = "state.json"
TRANSCRIPT = "transcript.md"


@dataclass(frozen=True)
class ScenarioPlan:
    """A built scenario: the team and how to start it."""

    team: Team
    idea: str
    send_to: str | set[str]
    n_round: int


ENTRY_POINTS = "metaroles.scenarios"
"""Entry-point group through which installed packages contribute scenarios (name = module)."""


def load_scenario(name: str) -> ModuleType:
    """Import scenario ``name``: ``scenarios.NAME``, else one an installed plug-in contributes.

    Raises:
        ConfigError: If there is no such scenario (the message suggests the closest name).
    """
    if not _NAME.match(name):
        raise ConfigError(f"scenario name {name!r} must be a lowercase identifier, e.g. 'debate'")
    known = known_scenarios()
    if name not in known:
        close = difflib.get_close_matches(name, list(known), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"no scenario named {name!r}; {hint}known scenarios: {sorted(known)}")
    return importlib.import_module(known[name])


def known_scenarios() -> dict[str, str]:
    """Scenario name → module: those in the ``scenarios`` package and those plug-ins contribute."""
    package = importlib.import_module("scenarios")
    folder = Path(next(iter(package.__path__)))
    found = {p.stem: f"scenarios.{p.stem}" for p in folder.glob("*.py") if not p.stem.startswith("_")}
    for entry in metadata.entry_points(group=ENTRY_POINTS):
        found.setdefault(entry.name, entry.value.partition(":")[0])
    return dict(sorted(found.items()))


PLUGIN_KINDS = ("roles", "actions", "environments")
"""Besides scenarios, plug-ins contribute these, each through entry-point group ``metaroles.KIND``."""


def plugins(kind: str) -> dict[str, str]:
    """Name → ``module:attribute`` of the roles, actions or environments installed plug-ins contribute.

    Raises:
        ConfigError: On an unknown kind.
    """
    if kind not in PLUGIN_KINDS:
        raise ConfigError(f"plug-in kind {kind!r} is not one of {PLUGIN_KINDS}")
    return dict(sorted((e.name, e.value) for e in metadata.entry_points(group=f"metaroles.{kind}")))


def load_plugin(kind: str, name: str) -> Any:
    """The role class, action class or environment class a plug-in contributes as ``name``.

    Raises:
        ConfigError: If no installed plug-in contributes it (the message lists those that do).
    """
    for entry in metadata.entry_points(group=f"metaroles.{kind}"):
        if entry.name == name:
            return entry.load()
    raise ConfigError(f"no plug-in contributes {kind[:-1]} {name!r}; installed: {sorted(plugins(kind))}")


RUN_OPTIONS = ("rounds", "idea", "llm", "model", "base_url", "seed", "budget")
"""Keys of a YAML config file that set how to run, not the scenario's own options."""


@dataclass(frozen=True)
class ConfigFile:
    """A scenario config read from YAML."""

    scenario: str
    run: dict[str, Any]
    """Run options (``rounds``, ``idea``, ``llm``, ``seed``, ``budget``...)."""
    config: dict[str, Any]
    """The scenario's own options (validated by its ``Config`` model)."""


def read_config_file(path: Path) -> ConfigFile:
    """A scenario config from YAML: ``scenario: NAME``, run options, and its options (top level or under ``config``).

    Raises:
        ConfigError: If the file is missing, is not YAML, or names no scenario.
    """
    import yaml  # the CLI's dependency; only config files need it

    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("scenario"), str):
        raise ConfigError(f"config file {str(path)!r} must be a mapping with 'scenario: NAME', e.g. 'scenario: debate'")
    nested = data.pop("config", None) or {}
    if not isinstance(nested, dict):
        raise ConfigError(f"'config' in {str(path)!r} must be a mapping of the scenario's options")
    name = data.pop("scenario")
    run = {key: data.pop(key) for key in RUN_OPTIONS if key in data}
    return ConfigFile(scenario=name, run=run, config={**data, **nested})


def format_message(message: Message) -> str:
    """One transcript line: ``[sender → recipients] content``."""
    recipients = ", ".join(sorted(message.send_to))
    return f"[{message.sent_from or message.role.value} → {recipients}] {message.content}"


def transcript(messages: list[Message]) -> str:
    """The transcript of ``messages``, one line each."""
    return "\n".join(format_message(m) for m in messages)


@dataclass(frozen=True)
class RunOptions:
    """How to run a scenario, beside its own config: each overrides the scenario's default."""

    rounds: int | None = None
    idea: str | None = None
    seed: int | None = None
    """Seeds the environment's random source (``env.rng``)."""
    budget: float | None = None
    """Money budget: the run stops cleanly once the ledger reaches it."""
    checkpoint_every: int | None = None
    """A checkpoint every this many rounds (and where the run stops); default: the scenario's, else 1."""
    log_turns: bool | None = None
    """Log each turn's observe, think and act events; default: the scenario's, else yes."""


def _plan(module: ModuleType, config: Any, llm: LLM, run: RunOptions) -> ScenarioPlan:
    plan: ScenarioPlan = module.build(config, llm)
    if run.seed is not None:
        plan.team.env.rng.seed(run.seed)
    if run.budget is not None:
        plan.team.invest(run.budget)
    defaults: dict[str, Any] = getattr(module, "RUN_DEFAULTS", {})
    every = run.checkpoint_every if run.checkpoint_every is not None else defaults.get("checkpoint_every", 1)
    plan.team.checkpoint_every = every
    plan.team.log_turns = run.log_turns if run.log_turns is not None else defaults.get("log_turns", True)
    return ScenarioPlan(
        team=plan.team,
        idea=plan.idea if run.idea is None else run.idea,
        send_to=plan.send_to,
        n_round=plan.n_round if run.rounds is None else run.rounds,
    )


def provenance() -> dict[str, Any]:
    """What produced a run: metaroles and Python versions, key package versions, the git revision."""
    packages = {}
    for name in ("metaroles", "pydantic", "anyio", "openai", "llama-cpp-python", "llama-index-core", "networkx"):
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    try:
        found = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False)
        revision = found.stdout.strip() if found.returncode == 0 else None
    except OSError:
        revision = None
    return {
        "metaroles": packages.get("metaroles"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": packages,
        "git_revision": revision,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


async def run_scenario(
    name: str,
    *,
    llm: LLM,
    options: dict[str, Any],
    out_dir: Path | None,
    manifest: dict[str, Any] | None = None,
    run: RunOptions | None = None,
    on_round: Callable[[Team], None] | None = None,
) -> tuple[TeamReport, Team]:
    """Build and run scenario ``name``; write its run directory into ``out_dir`` if given.

    The run directory holds ``manifest.json`` (what to rebuild the run from, and what produced
    it), ``events.jsonl``, ``checkpoints/`` (one per round), and at the end ``transcript.md``,
    ``state.json``, ``report.json`` and ``ledger.json``.
    """
    run = run or RunOptions()
    module = load_scenario(name)
    if out_dir is not None and "workspace" in module.Config.model_fields and not options.get("workspace"):
        options = {**options, "workspace": str(out_dir / "workspace")}  # artifacts go into the run directory
    config = module.Config.model_validate(options)
    plan = _plan(module, config, llm, run)
    plan.team.on_round = _with_metrics(module, out_dir, on_round)
    if out_dir is None:
        report = await plan.team.run(n_round=plan.n_round, idea=plan.idea, send_to=plan.send_to)
        return report, plan.team
    record = {
        "scenario": name,
        "config": config.model_dump(mode="json"),
        "n_round": plan.n_round,
        "idea": plan.idea,
        "seed": run.seed,
        "budget": run.budget,
        "checkpoint_every": plan.team.checkpoint_every,
        "log_turns": plan.team.log_turns,
        **(manifest or {}),
        **provenance(),
    }
    write_manifest(out_dir, record)
    report = await plan.team.run(
        n_round=plan.n_round,
        idea=plan.idea,
        send_to=plan.send_to,
        save_to=out_dir / STATE,
        checkpoints=out_dir / CHECKPOINTS,
        events=out_dir / EVENTS,
    )
    write_run_dir(out_dir, plan.team, report, record)
    return report, plan.team


METRICS = "metrics.jsonl"


def _with_metrics(
    module: ModuleType, out_dir: Path | None, on_round: Callable[[Team], None] | None
) -> Callable[[Team], None] | None:
    """``on_round``, plus a line in ``metrics.jsonl`` per round when the scenario has ``round_metrics(team)``.

    The first line written drops any from that round on (a resumed run writes them again).
    """
    measure = getattr(module, "round_metrics", None)
    if measure is None or out_dir is None:
        return on_round
    path = out_dir / METRICS
    started = False

    def record(team: Team) -> None:
        nonlocal started
        if not started:
            started = True
            kept = [line for line in _lines(path) if json.loads(line)["round"] < team.env.round]
            path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        with path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({"round": team.env.round, **measure(team)}) + "\n")
        if on_round is not None:
            on_round(team)

    return record


def _lines(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_manifest(run_dir: Path, record: dict[str, Any]) -> None:
    """Write ``manifest.json``: what the run is rebuilt from on resume."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / MANIFEST).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def read_manifest(run_dir: Path) -> dict[str, Any]:
    """The manifest of a run directory.

    Raises:
        ConfigError: If ``run_dir`` is not a run directory.
    """
    path = run_dir / MANIFEST
    if not path.is_file():
        raise ConfigError(
            f"{str(run_dir)!r} is not a run directory (no {MANIFEST}); pass one that `metaroles run` wrote"
        )
    manifest: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return manifest


def _rebuild(manifest: dict[str, Any], llm: LLM, changes: dict[str, Any] | None = None) -> ScenarioPlan:
    module = load_scenario(manifest["scenario"])
    config = module.Config.model_validate({**manifest["config"], **(changes or {})})
    run = RunOptions(
        rounds=manifest["n_round"],
        seed=manifest.get("seed"),
        budget=manifest.get("budget"),
        checkpoint_every=manifest.get("checkpoint_every"),
        log_turns=manifest.get("log_turns"),
    )
    return _plan(module, config, llm, run)


async def resume_scenario(
    run_dir: Path, *, llm: LLM, on_round: Callable[[Team], None] | None = None
) -> tuple[TeamReport, Team]:
    """Rebuild the run in ``run_dir`` from its manifest and continue from its last checkpoint."""
    manifest = read_manifest(run_dir)
    plan = _rebuild(manifest, llm)
    plan.team.on_round = _with_metrics(load_scenario(manifest["scenario"]), run_dir, on_round)
    report = await plan.team.resume(
        run_dir / CHECKPOINTS, plan.n_round, save_to=run_dir / STATE, events=run_dir / EVENTS
    )
    write_run_dir(run_dir, plan.team, report, manifest)
    return report, plan.team


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
) -> tuple[TeamReport, Team]:
    """Branch the run in ``parent`` at ``from_round`` into ``out_dir``, with a change.

    ``changes`` update the scenario's config, ``role_llms`` give named roles another model, and
    ``idea`` is published at the fork point. The child's manifest records its parent.

    Raises:
        ConfigError: If ``parent`` is not a run directory, or names an unknown role.
    """
    record = read_manifest(parent)
    plan = _rebuild(record, llm, changes)
    for role_name, role_llm in (role_llms or {}).items():
        if role_name not in plan.team.env.roles:
            raise ConfigError(f"no role named {role_name!r} in this run; roles: {sorted(plan.team.env.roles)}")
        plan.team.env.roles[role_name].set_llm(role_llm)
    plan.team.on_round = _with_metrics(load_scenario(record["scenario"]), out_dir, on_round)
    child = {
        **record,
        "config": {**record["config"], **(changes or {})},
        **(manifest or {}),
        **provenance(),
        "parent": {"run_dir": str(parent), "from_round": from_round, "idea": idea, "changes": changes or {}},
    }
    write_manifest(out_dir, child)
    report = await plan.team.fork(
        parent / CHECKPOINTS,
        from_round,
        plan.n_round,
        checkpoints=out_dir / CHECKPOINTS,
        events=out_dir / EVENTS,
        parent_events=parent / EVENTS,
        idea=idea,
        save_to=out_dir / STATE,
    )
    write_run_dir(out_dir, plan.team, report, child)
    return report, plan.team


def new_run_dir(root: Path, name: str) -> Path:
    """A fresh directory ``root/NAME-YYYYmmdd-HHMMSS-<short id>``."""
    return root / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def transcript_markdown(title: str, messages: list[Message], rounds: dict[str, int]) -> str:
    """The transcript as Markdown, a section per round."""
    lines = [f"# {title}", ""]
    current = None
    for message in messages:
        round_no = rounds.get(message.id, 0)
        if round_no != current:
            current = round_no
            lines += [f"## Round {round_no}" if round_no else "## Before round 1", ""]
        action = message.cause_by.rpartition(".")[2]
        recipients = ", ".join(sorted(message.send_to))
        body = message.content.replace("\n", "\n  ")
        lines.append(f"- **{message.sent_from or message.role.value}** → {recipients} ({action}): {body}")
    return "\n".join(lines) + "\n"


def write_run_dir(out_dir: Path, team: Team, report: TeamReport, manifest: dict[str, Any]) -> None:
    """Write transcript, report and ledger of a finished run (``Team.run`` saved its state)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    env = team.env
    rounds = publish_rounds(out_dir / EVENTS)
    title = f"{manifest.get('scenario', 'run')} — {out_dir.name}"
    (out_dir / TRANSCRIPT).write_text(transcript_markdown(title, env.history.storage, rounds), encoding="utf-8")
    summary = {"report": report.model_dump(mode="json"), "config": manifest.get("config", {})}
    (out_dir / "report.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    (out_dir / "ledger.json").write_text(json.dumps(env.ledger.dump(), indent=1) + "\n", encoding="utf-8")
