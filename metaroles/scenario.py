"""Running a named scenario and writing its run directory.

A scenario is a module ``scenarios.NAME`` with a pydantic ``Config`` and
``build(config, llm) -> ScenarioPlan``.
"""

from __future__ import annotations

import importlib
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from metaroles.exceptions import ConfigError
from metaroles.llm import LLM
from metaroles.message import Message
from metaroles.team import Team, TeamReport

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
MANIFEST = "manifest.json"
CHECKPOINTS = "checkpoints"
EVENTS = "events.jsonl"


@dataclass(frozen=True)
class ScenarioPlan:
    """A built scenario: the team and how to start it."""

    team: Team
    idea: str
    send_to: str | set[str]
    n_round: int


def load_scenario(name: str) -> ModuleType:
    """Import ``scenarios.NAME``.

    Raises:
        ConfigError: If there is no such scenario (the message lists the known ones).
    """
    if not _NAME.match(name):
        raise ConfigError(f"scenario name {name!r} must be a lowercase identifier, e.g. 'debate'")
    try:
        return importlib.import_module(f"scenarios.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"scenarios.{name}":
            raise
        raise ConfigError(f"no scenario named {name!r}; known scenarios: {known_scenarios()}") from None


def known_scenarios() -> list[str]:
    """Names of the scenarios shipped in the ``scenarios`` package."""
    package = importlib.import_module("scenarios")
    folder = Path(next(iter(package.__path__)))
    return sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))


def format_message(message: Message) -> str:
    """One transcript line: ``[sender → recipients] content``."""
    recipients = ", ".join(sorted(message.send_to))
    return f"[{message.sent_from or message.role.value} → {recipients}] {message.content}"


def transcript(messages: list[Message]) -> str:
    """The transcript of ``messages``, one line each."""
    return "\n".join(format_message(m) for m in messages)


async def run_scenario(
    name: str,
    *,
    llm: LLM,
    options: dict[str, Any],
    out_dir: Path | None,
    manifest: dict[str, Any] | None = None,
) -> tuple[TeamReport, Team]:
    """Build and run scenario ``name``; write its run directory into ``out_dir`` if given.

    The run directory holds ``manifest.json`` (what to rebuild the run from), a checkpoint per
    round in ``checkpoints/``, and at the end the transcript, the state, the report and the ledger.
    """
    module = load_scenario(name)
    config = module.Config.model_validate(options)
    plan: ScenarioPlan = module.build(config, llm)
    if out_dir is None:
        report = await plan.team.run(n_round=plan.n_round, idea=plan.idea, send_to=plan.send_to)
        return report, plan.team
    record = {"scenario": name, "config": config.model_dump(mode="json"), "n_round": plan.n_round, **(manifest or {})}
    write_manifest(out_dir, record)
    report = await plan.team.run(
        n_round=plan.n_round,
        idea=plan.idea,
        send_to=plan.send_to,
        save_to=out_dir / "state.json",
        checkpoints=out_dir / CHECKPOINTS,
        events=out_dir / EVENTS,
    )
    write_run_dir(out_dir, plan.team, report, config.model_dump())
    return report, plan.team


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


async def resume_scenario(run_dir: Path, *, llm: LLM) -> tuple[TeamReport, Team]:
    """Rebuild the run in ``run_dir`` from its manifest and continue from its last checkpoint."""
    manifest = read_manifest(run_dir)
    module = load_scenario(manifest["scenario"])
    config = module.Config.model_validate(manifest["config"])
    plan: ScenarioPlan = module.build(config, llm)
    report = await plan.team.resume(
        run_dir / CHECKPOINTS, manifest["n_round"], save_to=run_dir / "state.json", events=run_dir / EVENTS
    )
    write_run_dir(run_dir, plan.team, report, config.model_dump())
    return report, plan.team


def new_run_dir(root: Path, name: str) -> Path:
    """A fresh directory ``root/NAME-YYYYmmdd-HHMMSS[-n]``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate = root / f"{name}-{stamp}"
    n = 1
    while candidate.exists():
        n += 1
        candidate = root / f"{name}-{stamp}-{n}"
    return candidate


def write_run_dir(out_dir: Path, team: Team, report: TeamReport, config: dict[str, Any]) -> None:
    """Write transcript, report and ledger of a finished run (``Team.run`` saved its state)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    env = team.env
    (out_dir / "transcript.txt").write_text(transcript(env.history.storage) + "\n", encoding="utf-8")
    summary = {"report": report.model_dump(mode="json"), "config": config}
    (out_dir / "report.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    (out_dir / "ledger.json").write_text(json.dumps(env.ledger.dump(), indent=1) + "\n", encoding="utf-8")
