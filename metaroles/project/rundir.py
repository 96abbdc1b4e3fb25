"""Run directories: the manifest, the transcript and the files a finished run leaves.

A run directory holds ``manifest.json`` (what to rebuild the run from, and what produced it:
versions, git revision, the time; the only file that may differ between two runs of one seed),
``events.jsonl`` (or, asked for, ``events.jsonl.zst``: the same lines compressed, a zstd frame per round)
and ``timings.jsonl``, ``checkpoints/``, ``metrics.jsonl`` (when the scenario
measures rounds), and at the end ``transcript.md``, ``state.json``, ``report.json`` and
``ledger.json``.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import secrets
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from textwrap import indent
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from metaroles.agents import isolation
from metaroles.core import installed
from metaroles.core.exceptions import ConfigError, RunDirCorrupt
from metaroles.core.files import ZSTD, replace_together, write_atomic
from metaroles.messages.message import Message
from metaroles.messages.render import readable
from metaroles.record.eventlog import publish_rounds
from metaroles.record.numbering import numbered
from metaroles.team.options import MAX_ROUNDS
from metaroles.team.team import Team, TeamReport

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
LEDGER = "ledger.json"
"""Each model call of the run: role, action, model, tokens, cost and what the request set."""
BATCHES = "batches.json"
"""The batches a ``--batch`` run has pending at a server (``llm.batching``): there only while one is."""


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


class Parent(BaseModel):
    """Where a fork branched from."""

    run_dir: str
    """The parent run directory (absolute)."""
    from_round: int = Field(ge=0)
    """The round whose end state the fork starts from."""
    idea: str = ""
    """What the fork published at the fork point."""
    changes: dict[str, Any] = Field(default_factory=dict)
    """The options the fork changed."""


class Manifest(BaseModel):
    """The fields of ``manifest.json`` that a run is rebuilt from (others — versions, the time — pass through)."""

    model_config = ConfigDict(extra="allow", strict=True)

    scenario: str = Field(min_length=1)
    """A scenario name, module, or ``.py`` file."""
    config: dict[str, Any]
    """The scenario's options."""
    n_round: int = Field(ge=0, le=MAX_ROUNDS)
    """The rounds the run lasts."""
    rounds: int | None = Field(default=None, ge=0, le=MAX_ROUNDS)
    """The rounds given on the command line (``--rounds``), if any; else the scenario's config decides."""
    idea: str | None = None
    seed: int | None = None
    budget: float | int | None = Field(default=None, ge=0)
    prices: dict[str, list[float | int]] | None = None
    checkpoint_every: int | None = Field(default=None, ge=1)
    """A checkpoint every this many rounds."""
    log_turns: bool | Literal["folded"] | None = None
    transcript: bool | None = None
    durability: Literal["round", "run", "sweep"] = "round"
    events: Literal["events.jsonl", "events.jsonl.zst"] | None = None
    parent: Parent | None = None
    role_llms: dict[str, str] | None = None


def read_manifest(run_dir: Path) -> dict[str, Any]:
    """The manifest of a run directory, checked against :class:`Manifest`.

    Raises:
        ConfigError: If ``run_dir`` is not a run directory.
        RunDirCorrupt: If the manifest is not JSON or a field is missing or wrong, naming it.
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
    if not isinstance(manifest, dict):
        raise RunDirCorrupt(f"{path}: not a JSON object; the file is damaged")
    try:
        Manifest.model_validate(manifest)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"])
        raise RunDirCorrupt(
            f"{path}: {where}={error.get('input', '(missing)')!r}: {error['msg']}; the manifest is damaged"
        ) from None
    return dict(manifest)


OWN_FILES = (
    MANIFEST,
    BATCHES,
    EVENTS,
    EVENTS_ZST,
    "timings.jsonl",
    METRICS,
    STATE,
    TRANSCRIPT,
    "report.json",
    "ledger.json",
    "spans.jsonl",
    "interventions.jsonl",
    f"{CHECKPOINTS}/messages.jsonl",
)
"""Files a command writes or appends to in a run directory (beside the round files)."""


def check_run_dir(run_dir: Path) -> None:
    """Check what a resume or fork reads and writes in ``run_dir`` before anything there is changed.

    Raises:
        RunDirCorrupt: If a file the run writes is a symbolic link (a write would land wherever it
            points), ``checkpoints`` is not a folder, or a checkpoint file's name is not the run's own.
    """
    for name in (*OWN_FILES, CHECKPOINTS, f"{CHECKPOINTS}/blobs"):
        path = run_dir / name
        if path.is_symlink():
            raise RunDirCorrupt(
                f"{path} is a symbolic link (to {os.readlink(path)!r}); a run directory's files are its own, "
                "and metaroles writes through no link: replace it with the file itself"
            )
    folder = run_dir / CHECKPOINTS
    if folder.exists() and not folder.is_dir():
        raise RunDirCorrupt(
            f"{folder} is not a folder; restore the run's checkpoints folder (or remove it to start over)"
        )
    if folder.is_dir():
        for path in folder.glob("*.json"):
            kind, _, number = path.stem.partition("-")
            if kind in ("round", "workspace") and not (number.isdigit() and number.isascii()):
                raise RunDirCorrupt(
                    f"{path}: not a checkpoint file of this run (NNNN must be a round number); remove or rename it"
                )


@contextmanager
def locked(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir`` for one command: a second ``run``, ``resume`` or ``fork`` into it is refused meanwhile.

    A lock on the folder itself (``flock``): nothing is written into it, and the kernel drops the
    lock when the holder dies, even by SIGKILL.

    Raises:
        ConfigError: If another process holds it, naming its pid.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(os.fstat(fd).st_ino)
            who = f"process {holder}" if holder else "another process"
            raise ConfigError(
                f"{str(run_dir)!r} is in use by {who} (a run, resume or fork); wait for it to end, or stop it"
            ) from None
        yield
    finally:
        os.close(fd)


def _holder(inode: int) -> int | None:
    """The pid holding a ``flock`` on the file with ``inode`` (Linux's ``/proc/locks``), if it can be told."""
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5].rpartition(":")[2] == str(inode):
            return int(fields[4]) if fields[4].isdigit() else None
    return None


def scenario_label(name: str) -> str:
    """A scenario's short name: a scenario file's stem, a module's last part, else the name itself."""
    return Path(name).stem if name.endswith(".py") else name.rpartition(".")[2]


def new_run_dir(root: Path, name: str) -> Path:
    """A fresh directory ``root/NAME-YYYYmmdd-HHMMSS-<short id>``."""
    return root / f"{scenario_label(name)}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


LATEST = "latest"
"""The link, beside the run directories a command names itself, to the newest of them (``runs/latest``)."""


def point_latest(run_dir: Path) -> None:
    """Create ``run_dir`` and point ``latest`` beside it at it (a relative link: the folder can move)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    link = run_dir.parent / LATEST
    temporary = run_dir.parent / f".{LATEST}.{os.getpid()}.tmp"
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(run_dir.name, target_is_directory=True)
    os.replace(temporary, link)


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
    else:  # a transcript an earlier stop wrote (a run stopped early was short enough) is not this run's
        (out_dir / TRANSCRIPT).unlink(missing_ok=True)
    whole = report.model_copy(update={"rounds": env.round})  # the run's rounds, not this call's (a resume runs fewer)
    summary = {"report": whole.model_dump(mode="json"), "config": manifest.get("config", {})}
    files.append((out_dir / LEDGER, json.dumps(env.ledger.dump(), indent=1) + "\n"))
    files.append((out_dir / "report.json", json.dumps(summary, indent=1) + "\n"))
    replace_together(files)


def refuse_late(parent: Path, from_round: int) -> None:
    """Refuse a fork from a round the parent has not reached.

    Raises:
        ConfigError: Naming the parent's last checkpointed round.
    """
    last = max((n for n, _ in numbered(parent / CHECKPOINTS, "round")), default=None)
    if last is None:
        raise ConfigError(
            f"{str(parent)!r} has no checkpoint to fork from; resume it first (metaroles resume {parent})"
        )
    if from_round > last:
        raise ConfigError(
            f"--from-round {from_round} is past the parent's last checkpoint, round {last}; pick 0..{last}"
        )


def refuse_unkept(parent: Path, from_round: int) -> None:
    """Refuse branches of a round the parent kept no checkpoint of (a fork would start earlier and ask again).

    Raises:
        ConfigError: Naming the rounds the parent kept.
    """
    kept = sorted(n for n, _ in numbered(parent / CHECKPOINTS, "round"))
    if not kept:
        refuse_late(parent, from_round)
    if from_round not in kept:
        shown = ", ".join(map(str, kept[:20])) + (", …" if len(kept) > 20 else "")
        raise ConfigError(
            f"--round {from_round}: the parent kept no checkpoint of that round (it kept {shown}); "
            "pick one of those, or run it again with --checkpoint-every 1"
        )


def refuse_a_run_in(out_dir: Path) -> None:
    """Refuse to write a new run into a folder that holds another run's files (or links where they go).

    Raises:
        ConfigError: Naming the folder.
    """
    check_run_dir(out_dir)
    if any((out_dir / CHECKPOINTS).glob("round-*.json")) and (out_dir / MANIFEST).is_file():
        raise ConfigError(
            f"{str(out_dir)!r} already holds a run; resume it (metaroles resume {out_dir}) or pass a new --out"
        )
