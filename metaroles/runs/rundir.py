"""Run directories: the manifest, the transcript and the files a finished run leaves.

A run directory holds ``manifest.json`` (what to rebuild the run from, and what produced it:
versions, git revision, the time; the only file that may differ between two runs of one seed),
``events.jsonl`` (or, asked for, ``events.jsonl.zst``: the same lines compressed, a zstd frame per round)
and ``timings.jsonl``, ``checkpoints/``, ``metrics.jsonl`` (when the scenario
measures rounds), and at the end ``transcript.md``, ``state.json``, ``report.json`` and
``ledger.json``.
"""

from __future__ import annotations

import json
import platform
import secrets
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from textwrap import indent
from typing import Any

from metaroles.agents import isolation
from metaroles.core import installed
from metaroles.core.exceptions import ConfigError, RunDirCorrupt
from metaroles.core.files import ZSTD, replace_together, write_atomic
from metaroles.messages.message import Message
from metaroles.messages.render import readable
from metaroles.runs.eventlog import publish_rounds
from metaroles.runs.team import Team, TeamReport

MANIFEST = "manifest.json"
CHECKPOINTS = "checkpoints"
EVENTS = "events.jsonl"
EVENTS_ZST = EVENTS + ZSTD
"""The event log compressed (``metaroles run --zstd``); the manifest's ``events`` names the run's."""
STATE = "state.json"
TRANSCRIPT = "transcript.md"
TRANSCRIPT_LIMIT = 10_000
"""A run of more messages writes no ``transcript.md`` unless asked (``--transcript``); ``metaroles show`` prints it."""
METRICS = "metrics.jsonl"


def events_file(run_dir: Path, manifest: dict[str, Any] | None = None) -> Path:
    """The event log of the run in ``run_dir``: the one its manifest names, else the one the folder holds."""
    named = (manifest or {}).get("events")
    if named == EVENTS_ZST:
        return run_dir / EVENTS_ZST
    if named == EVENTS:
        return run_dir / EVENTS
    plain = run_dir / EVENTS
    return run_dir / EVENTS_ZST if not plain.exists() and (run_dir / EVENTS_ZST).exists() else plain


def format_message(message: Message) -> str:
    """A transcript entry: ``[sender → recipients] text``; a structured answer's fields follow, indented."""
    recipients = ", ".join(sorted(message.send_to))
    return f"[{message.sent_from or message.role.value} → {recipients}]{entry_body(message, ' ')}"


def entry_body(message: Message, lead: str) -> str:
    """What follows an entry's header: ``lead`` and the text, or a structured answer's fields on indented lines."""
    body = readable(message)
    if message.instruct_content is not None and body.startswith("- "):
        return "\n" + indent(body, "  ")
    return lead + body.replace("\n", "\n  ")


def provenance() -> dict[str, Any]:
    """What produced a run: versions, the git revision, and how model-written code is confined here."""
    packages = {}
    for name in ("metaroles", "pydantic", "anyio", "openai", "llama-cpp-python", "llama-index-core", "networkx"):
        version = installed.version(name)
        if version is not None:
            packages[name] = version
    revision = installed.git_revision()
    return {
        "metaroles": packages.get("metaroles"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": packages,
        "git_revision": revision,
        "sandbox": isolation.available(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def write_manifest(run_dir: Path, record: dict[str, Any]) -> None:
    """Write ``manifest.json`` (atomically): what the run is rebuilt from on resume."""
    write_atomic(run_dir / MANIFEST, json.dumps(record, indent=1) + "\n")


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
    try:
        manifest = json.loads(path.read_bytes().decode("utf-8"))
    except ValueError as exc:
        raise RunDirCorrupt(f"{path}: not a JSON manifest ({type(exc).__name__}); the file is damaged") from None
    wanted = {"scenario": str, "config": dict, "n_round": int}
    wrong = [
        key for key, kind in wanted.items() if not isinstance(manifest, dict) or not isinstance(manifest.get(key), kind)
    ]
    if wrong:
        raise RunDirCorrupt(f"{path}: the manifest lacks a valid {', '.join(wrong)}; the file is damaged")
    return dict(manifest)


def scenario_label(name: str) -> str:
    """A scenario's short name: a scenario file's stem, a module's last part, else the name itself."""
    return Path(name).stem if name.endswith(".py") else name.rpartition(".")[2]


def new_run_dir(root: Path, name: str) -> Path:
    """A fresh directory ``root/NAME-YYYYmmdd-HHMMSS-<short id>``."""
    return root / f"{scenario_label(name)}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def transcript_markdown(title: str, messages: Sequence[Message], rounds: dict[str, int]) -> str:
    """The transcript as Markdown: a section per round, or per phase when messages name one.

    A message whose ``metadata["section"]`` is set opens a section of that name (werewolf's
    "Night 1", "Day 1"); without any, sections are rounds. Structured answers are lists of fields.
    """
    lines = [f"# {title}", ""]
    by_phase = any("section" in m.metadata for m in messages)
    current: object = None
    for message in messages:
        round_no = rounds.get(message.id, 0)
        heading = (
            message.metadata.get("section") if by_phase else (f"Round {round_no}" if round_no else "Before round 1")
        )
        if heading is not None and heading != current:
            current = heading
            lines += [*([""] if lines[-1] else []), f"## {heading}", ""]
        action = message.cause_by.rpartition(".")[2]
        recipients = ", ".join(sorted(message.send_to))
        sender = message.sent_from or message.role.value
        lines.append(f"- **{sender}** → {recipients} ({action}):{entry_body(message, ' ')}")
    return "\n".join(lines) + "\n"


def write_run_dir(out_dir: Path, team: Team, report: TeamReport, manifest: dict[str, Any]) -> None:
    """Write transcript, report and ledger of a finished run (``Team.run`` saved its state), waiting for the disk once.

    ``report.json`` is renamed last: a run directory that has one has the others.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    env = team.env
    files: list[tuple[Path, str]] = []
    wanted = manifest.get("transcript")
    if wanted or (wanted is None and len(env.history) <= TRANSCRIPT_LIMIT):
        rounds = publish_rounds(events_file(out_dir, manifest))
        title = str(manifest.get("scenario", "run"))  # not the folder's name: that belongs in the manifest only
        files.append((out_dir / TRANSCRIPT, transcript_markdown(title, env.history.storage, rounds)))
    whole = report.model_copy(update={"rounds": env.round})  # the run's rounds, not this call's (a resume runs fewer)
    summary = {"report": whole.model_dump(mode="json"), "config": manifest.get("config", {})}
    files.append((out_dir / "ledger.json", json.dumps(env.ledger.dump(), indent=1) + "\n"))
    files.append((out_dir / "report.json", json.dumps(summary, indent=1) + "\n"))
    replace_together(files)
