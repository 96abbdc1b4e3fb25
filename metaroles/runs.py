"""Reading finished runs back: their messages with rounds, and what differs between two runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path

from metaroles.eventlog import publish_rounds
from metaroles.exceptions import ConfigError
from metaroles.message import Message
from metaroles.restore import checkpoint_history
from metaroles.scenario import CHECKPOINTS, EVENTS, STATE
from metaroles.state import EnvironmentState


@dataclass(frozen=True)
class RunMessage:
    """One published message of a run, as a row a notebook can tabulate."""

    round: int
    sender: str
    action: str
    recipients: tuple[str, ...]
    content: str
    id: str


def run_messages(run_dir: Path) -> list[RunMessage]:
    """The messages of the run in ``run_dir``, in publish order, each with its round.

    Reads ``state.json`` of a finished run, else the last checkpoint of an interrupted one.

    Raises:
        ConfigError: If ``run_dir`` holds neither.
    """
    history = _history(run_dir)
    rounds = publish_rounds(run_dir / EVENTS)
    return [
        RunMessage(
            round=rounds.get(m.id, 0),
            sender=m.sent_from,
            action=m.cause_by.rpartition(".")[2],
            recipients=tuple(sorted(m.send_to)),
            content=m.content,
            id=m.id,
        )
        for m in history
    ]


def _history(run_dir: Path) -> list[Message]:
    if (run_dir / STATE).is_file():
        return EnvironmentState.model_validate_json((run_dir / STATE).read_text(encoding="utf-8")).history
    if (run_dir / CHECKPOINTS).is_dir():
        return checkpoint_history(run_dir / CHECKPOINTS)
    raise ConfigError(f"{str(run_dir)!r} holds no {STATE} and no {CHECKPOINTS}/; pass a run directory")


@dataclass(frozen=True)
class RunDiff:
    """Where two runs part: the first round whose messages differ, and the differing pairs."""

    first_divergence_round: int | None
    """``None`` when both runs published the same messages."""
    common: int
    """How many messages, from the start, the runs share."""
    differing: list[tuple[RunMessage | None, RunMessage | None]] = field(default_factory=list)
    """From the first difference on: (message of run a, message of run b); ``None`` where one ran out."""


def _same(a: RunMessage, b: RunMessage) -> bool:
    return (a.round, a.sender, a.action, a.recipients, a.content) == (
        b.round,
        b.sender,
        b.action,
        b.recipients,
        b.content,
    )


def diff_runs(a: Path, b: Path) -> RunDiff:
    """Compare two runs message by message (sender, action, recipients, content and round; not ids)."""
    left, right = run_messages(a), run_messages(b)
    common = 0
    for x, y in zip(left, right, strict=False):
        if not _same(x, y):
            break
        common += 1
    if common == len(left) == len(right):
        return RunDiff(first_divergence_round=None, common=common)
    rest = list(zip_longest(left[common:], right[common:]))
    first = rest[0]
    rounds = [m.round for m in first if m is not None]
    return RunDiff(first_divergence_round=min(rounds), common=common, differing=rest)
