"""Reading finished runs back: their messages with rounds, and what differs between two runs."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import TypeVar

from metaroles.bus.state import EnvironmentState
from metaroles.core.exceptions import ConfigError, RunDirCorrupt
from metaroles.messages.message import Message
from metaroles.messages.render import readable
from metaroles.project.rundir import CHECKPOINTS, STATE, events_file
from metaroles.record.eventlog import Event, publish_rounds, read_events
from metaroles.record.final_state import referenced_checkpoint
from metaroles.record.restore import checkpoint_history

T = TypeVar("T")


@dataclass(frozen=True)
class RunMessage:
    """One published message of a run, as a row a notebook can tabulate."""

    round: int
    sender: str
    action: str
    recipients: tuple[str, ...]
    content: str
    id: str
    text: str = ""
    """The content as people read it (a structured answer's fields as Markdown)."""


def run_messages(run_dir: str | Path) -> list[RunMessage]:
    """The messages of the run in ``run_dir`` (a path or its text), in publish order, each with its round.

    Reads ``state.json`` of a finished run, else the last checkpoint of an interrupted one.

    Raises:
        ConfigError: If ``run_dir`` holds neither.
    """
    run_dir = Path(run_dir)
    history = _history(run_dir)
    rounds = publish_rounds(events_file(run_dir))
    return [
        RunMessage(
            round=rounds.get(m.id, 0),
            sender=m.sent_from,
            action=m.cause_by.rpartition(".")[2],
            recipients=tuple(sorted(m.send_to)),
            content=m.content or "",
            id=m.id,
            text=readable(m),
        )
        for m in history
    ]


def _history(run_dir: Path) -> list[Message]:
    if (run_dir / STATE).is_file() and (reference := referenced_checkpoint(run_dir / STATE)) is not None:
        return checkpoint_history(reference[0].parent, through_round=reference[1])
    if (run_dir / STATE).is_file():
        try:
            return EnvironmentState.model_validate_json((run_dir / STATE).read_bytes()).history
        except ValueError as exc:
            raise RunDirCorrupt(f"{run_dir / STATE}: not a saved state ({str(exc).splitlines()[0]})") from None
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
    events_common: int = 0
    """How many lines of ``events.jsonl``, from the start, the runs share (ids included)."""
    first_event_difference: tuple[Event | None, Event | None] | None = None
    """The first pair of events that differ (``None`` where one log ran out); ``None`` if the logs are equal."""

    @property
    def identical(self) -> bool:
        """Whether the runs published the same messages and logged the same events."""
        return self.first_divergence_round is None and self.first_event_difference is None


def _same(a: RunMessage, b: RunMessage) -> bool:
    return (a.round, a.sender, a.action, a.recipients, a.content) == (
        b.round,
        b.sender,
        b.action,
        b.recipients,
        b.content,
    )


def diff_runs(a: Path, b: Path) -> RunDiff:
    """Compare two runs message by message (sender, action, recipients, content, round; not ids), then event by event.

    Events are compared whole, ids and sequence numbers included: two runs of one seed with the
    same model answers have equal logs, line for line.
    """
    left, right = run_messages(a), run_messages(b)
    events_common, event_difference = _diff_events(read_events(events_file(a)), read_events(events_file(b)))
    common = _common_prefix(left, right, _same)
    rest = list(zip_longest(left[common:], right[common:]))
    return RunDiff(_parting(left, right, common), common, rest, events_common, event_difference)


def first_divergence(left: Sequence[RunMessage], right: Sequence[RunMessage]) -> int | None:
    """The first round whose messages differ between two runs' messages (``None``: the same messages).

    What :func:`diff_runs` reports, for callers that compare one run's messages with many others'.
    """
    return _parting(left, right, _common_prefix(left, right, _same))


def _parting(left: Sequence[RunMessage], right: Sequence[RunMessage], common: int) -> int | None:
    """The round of the first message past the ``common`` prefix, on either side (``None``: none is)."""
    if common == len(left) == len(right):
        return None
    return min(
        m.round
        for m in (left[common] if common < len(left) else None, right[common] if common < len(right) else None)
        if m is not None
    )


def _common_prefix(left: Sequence[T], right: Sequence[T], same: Callable[[T, T], bool]) -> int:
    common = 0
    for x, y in zip(left, right, strict=False):
        if not same(x, y):
            break
        common += 1
    return common


def _diff_events(left: list[Event], right: list[Event]) -> tuple[int, tuple[Event | None, Event | None] | None]:
    """How many events the logs share from the start, and the first differing pair (latencies aside)."""
    left, right = [_untimed(e) for e in left], [_untimed(e) for e in right]
    common = _common_prefix(left, right, operator.eq)
    if common == len(left) == len(right):
        return common, None
    pair = next(zip_longest(left[common:], right[common:]))
    return common, pair


def _untimed(event: Event) -> Event:
    return {k: v for k, v in event.items() if k != "latency_s"}
