"""The run's event log: ``events.jsonl``, append-only, one JSON object per line.

Events are written at the end of each round, in one append that is flushed and fsynced before the
round's checkpoint: ``round_start``, ``publish`` (with ``caused_by``: the news its sender had
observed), ``deliver``, ``dead_letter``, ``role_error``, ``dropped``, ``llm_call`` (tokens,
latency, cost) and ``round_end``, each with a sequence number and its round. On resume the log is
cut back to the checkpoint's round, and a torn last line is dropped with a warning.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from warnings import warn

from metaroles.environment import Environment
from metaroles.message import Message

Event = dict[str, Any]


def read_events(path: Path) -> list[Event]:
    """The events in ``path``; a torn (unparsable) last line is skipped with a warning."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    events: list[Event] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                warn(f"{path.name}: the last line is torn (a crash while writing); it is skipped", stacklevel=2)
                break
            raise
    return events


class EventLog:
    """Writes one environment's events, a round at a time.

    Args:
        path: The ``events.jsonl`` file; appended to.
        env: The environment whose rounds are logged.
        through_round: Keep only events up to this round from an existing log (resume).
    """

    def __init__(self, path: Path, env: Environment, *, through_round: int | None = None) -> None:
        """Open (and, on resume, cut back) the log."""
        self.path = path
        self.env = env
        kept = read_events(path)
        if through_round is not None:
            kept = [e for e in kept if e.get("round", 0) <= through_round]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(e) + "\n" for e in kept), encoding="utf-8")
        self.seq = kept[-1]["seq"] if kept else 0
        self._mark()

    def _mark(self) -> None:
        env = self.env
        self._history = len(env.history)
        self._ledger = len(env.ledger.entries)
        self._events = len(env.events)

    def round_done(self) -> None:
        """Append the events of the round that just ended."""
        env = self.env
        round_no = env.round
        lines = [self._event("round_start", round_no)]
        for message in env.history.storage[self._history :]:
            lines.extend(self._message_events(message, round_no))
        for entry in env.ledger.entries[self._ledger :]:
            call = {"action": entry.action, "model": entry.model, "tokens": entry.tokens, "cost": entry.cost}
            lines.append(
                self._event("llm_call", round_no, role=entry.role, latency_s=round(entry.latency_s, 6), **call)
            )
        for event in env.events[self._events :]:
            lines.append(self._event(event.kind, round_no, role=event.role, message_id=event.message_id))
        lines.append(self._event("round_end", round_no))
        self._append(lines)
        self._mark()

    def _message_events(self, message: Message, round_no: int) -> list[str]:
        """The publish event (with the news its sender had observed) and one deliver per recipient."""
        sender = self.env.roles.get(message.sent_from)
        caused_by = [m.id for m in sender.rc.news] if sender is not None else []
        sent = {"cause_by": message.cause_by, "send_to": sorted(message.send_to), "caused_by": caused_by}
        lines = [self._event("publish", round_no, role=message.sent_from, message_id=message.id, **sent)]
        for recipient in self.env.recipients(message):
            lines.append(self._event("deliver", round_no, role=recipient.name, message_id=message.id))
        return lines

    def _event(self, kind: str, round_no: int, **fields: Any) -> str:
        self.seq += 1
        return json.dumps({"seq": self.seq, "round": round_no, "kind": kind, **fields})

    def _append(self, lines: list[str]) -> None:
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write("".join(line + "\n" for line in lines))
            handle.flush()
            os.fsync(handle.fileno())
