"""The run's event log: ``events.jsonl``, append-only, one JSON line per round.

The log's events are ``round_start``, the turns' ``observe``, ``think`` and ``act`` (and an agent's
``tool_call``/``tool_result``), ``publish`` (with ``caused_by``: the news its sender had observed),
``deliver``, ``llm_call`` (tokens and cost), ``role_error``, ``dead_letter``, ``dropped`` and
``round_end``, each with a sequence number and its round. A publish whose ``caused_by`` is the one
of the message before it, from the same sender, is written ``["^"]`` (a platform that answers
thousands from the news of thousands would otherwise write the square of them); the readers spell
it out. At the end of each round the log appends them as one line of columns, taken from the bus's
round record (``bus.record``) and encoded by orjson in one call (format 2): ``{"seq": S, "round":
N, "kind": "round", "end": E, "steps": {kind, role, detail}, "published": {role, message_id,
cause_by, send_to, caused_by, to}, ...}`` (a step's detail: the ids an observe took, a think's
action, an act's message, each a list of names; a tool step's fields as one JSON text) —
the events are numbered S (``round_start``) to E (``round_end``) in the order listed above, each
publish followed by a delivery per name in its ``to``. The append is flushed and fsynced before the
round's checkpoint (a round with no checkpoint due leaves the sync to the next one). The readers
(``record.eventread``, re-exported here) spell the lines out, and read the logs written before
(format 1: a line per event, or a publish carrying its deliveries and its sender's turn) the same
way, so every reader sees one stream. On resume the log is cut back to the checkpoint's round, and
a torn last line is dropped with a warning.
Big runs may keep it compressed (``events.jsonl.zst``, ``core.files``): each round's append is one
zstd frame, and every reader here (and pandas) reads the same lines.

The log is a function of the run (seed and model answers), byte for byte. What the clock measured,
each model call's latency, goes beside it into ``timings.jsonl`` (the ``seq`` of its ``llm_call``
and ``latency_s``); :func:`read_events` puts the latencies back on the events it returns.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import orjson

from metaroles.bus.environment import Environment
from metaroles.bus.record import SAID, EnvEvent, Recipients, RoundRecord, Said, Steps, names_of
from metaroles.core.files import append_durably, append_text, create_durably
from metaroles.llm.ledger import LedgerEntry
from metaroles.messages.message import Message
from metaroles.record.eventread import (
    SAME_CAUSES,
    TIMINGS,
    Event,
    check_log,
    copy_events,
    ended,
    iter_events,
    last_seq,
    publish_rounds,
    read_events,
    read_jsonl,
    read_lines,
    rewrite_lines,
    timings_of,
    unfolded,
)

__all__ = [
    "TIMINGS",
    "Event",
    "EventLog",
    "check_log",
    "copy_events",
    "ended",
    "iter_events",
    "last_seq",
    "publish_rounds",
    "read_events",
    "read_jsonl",
    "timings_of",
    "unfolded",
]


class EventLog:
    """Writes one environment's events, a round at a time: one line of columns per round (see the module).

    Args:
        path: The ``events.jsonl`` file; appended to.
        env: The environment whose rounds are logged.
        through_round: Keep only events up to this round from an existing log (resume).
        turns: Also log each turn's observe, think and act events (the round record's steps);
            ``"folded"`` is accepted for the logs of format 1 (where a turn could go on its message's
            line) and means ``True``: a round's line holds its turns in columns either way.
        folded: Accepted for format 1's callers; a round's line always holds its deliveries in columns.
    """

    def __init__(
        self,
        path: Path,
        env: Environment,
        *,
        through_round: int | None = None,
        turns: bool | Literal["folded"] = True,
        folded: bool | None = None,
    ) -> None:
        """Open (and, on resume, cut back) the log."""
        del folded  # every round line folds its deliveries
        self.path = path
        self.env = env
        self.timings = timings_of(path)
        kept = read_lines(path)
        if through_round is not None:
            kept = [(e, line) for e, line in kept if e.get("round", 0) <= through_round]
        if path.exists() or self.timings.exists():
            rewrite_lines(path, kept, timings_from=self.timings)
        else:  # a new run's log: created empty, not written (a checkpoint may claim it before the run's end)
            create_durably(path)
        self.seq = last_seq(kept[-1][0]) if kept else 0
        self.turns = bool(turns)
        self._send_to: dict[frozenset[str], list[str]] = {}
        self._to: dict[int, tuple[Recipients, list[str]]] = {}
        """The names of each set of recipients met (by the object: the record's places, routing's lists)."""
        self._unsynced = False  # lines appended without waiting for the disk (round_done(sync=False))
        self._records = env.record_reader(steps=self.turns)  # what was published before is no part of this log

    def round_done(self, *, sync: bool = True) -> None:
        """Append the line of the round that just ended (or of what happened between rounds).

        ``sync=False``: without waiting for the disk; the checkpoint that claims the round syncs the
        log first (:meth:`unsynced`).
        """
        env = self.env
        line = _Line(self.turns)
        records = self._records.take()
        calls, events = self._take(line, records)
        seq = self.seq + 1
        first_call = seq + len(line.kinds) + len(line.message_ids) + sum(map(len, line.to)) + 1
        self.seq = end = first_call + len(calls) + len(events)
        fields: dict[str, Any] = {"seq": seq, "round": env.round, "kind": "round", "end": end}
        fields |= line.columns()
        timings = [_round_times(seq, env.round, records)]
        if calls:
            fields["llm_calls"] = [
                {"role": c.role, "action": c.action, "model": c.model, "tokens": c.tokens, "cost": c.cost}
                for c in calls
            ]
            timings += [
                f'{{"seq":{first_call + n},"latency_s":{c.latency_s!r},"end_ns":{c.ended_ns}}}\n'
                for n, c in enumerate(calls)
            ]
        if events:
            fields["events"] = [
                {"kind": e.kind, "role": e.role, "message_id": e.message_id, "detail": e.detail} for e in events
            ]
        self._append(orjson.dumps(fields, option=orjson.OPT_APPEND_NEWLINE), sync)
        append_text(self.timings, "".join(timings))  # wall-clock figures, no part of the run: no wait for the disk

    def _take(self, line: _Line, records: list[RoundRecord]) -> tuple[list[LedgerEntry], list[EnvEvent]]:
        """Put the turns and messages of ``records`` on ``line``; their model calls and events."""
        calls: list[LedgerEntry] = []
        events: list[EnvEvent] = []
        for record in records:  # the rounds' records (and what happened between): all, as it happened
            steps = record.steps if self.turns and record.steps else None
            line.part(steps, record.published, record.said, *self._addressed(record.published, record.recipients))
            if steps is not None:
                line.tokens(steps, record.model_calls)
            calls += record.model_calls
            events += record.events
        return calls, events

    def _addressed(
        self, messages: Sequence[Message], delivered: Sequence[Recipients]
    ) -> tuple[list[list[str]], list[list[str]]]:
        """The columns ``send_to`` and ``to`` of ``messages``: addresses, recipients.

        The recipients are the ones delivery found (``delivered``: the round's record, or routing's
        lists for what a missed record's round published). Each column is one comprehension over the
        round's messages: the log costs what the round published, not a loop of Python statements per
        message.
        """
        send_tos, names = self._send_to, self._to
        if len(send_tos) >= 1 << 16:
            send_tos.clear()
        send_to = [send_tos.get(m.send_to) or self._addresses(m.send_to) for m in messages]
        if len(names) >= 1 << 16:
            names.clear()
        to = [
            known[1] if (known := names.get(id(r))) is not None and known[0] is r else self._names(r) for r in delivered
        ]
        return send_to, to

    def _addresses(self, send_to: frozenset[str]) -> list[str]:
        """``send_to`` sorted, kept for the next message sent there."""
        addresses = self._send_to[send_to] = sorted(send_to)
        return addresses

    def _names(self, recipients: Recipients) -> list[str]:
        """The names of ``recipients`` (places, or roles), kept by the object (one per set of addresses)."""
        names = names_of(recipients, self.env.name_at)
        self._to[id(recipients)] = (recipients, names)
        return names

    def unsynced(self) -> list[Path]:
        """The log's file, if lines went to it without waiting for the disk: the caller syncs it now."""
        unsynced, self._unsynced = self._unsynced, False
        return [self.path] if unsynced else []

    def _append(self, text: bytes, sync: bool = True) -> None:
        (append_durably if sync else append_text)(self.path, text)
        self._unsynced = not sync


def _round_times(seq: int, round_no: int, records: list[RoundRecord] | None) -> str:
    """The timings line of a round line: when its round began and ended (``0`` where the records do not say)."""
    started = next((r.started_ns for r in records or () if r.started_ns), 0)
    ended = records[-1].ended_ns if records else 0
    return f'{{"seq":{seq},"round":{round_no},"start_ns":{started},"end_ns":{ended}}}\n'


_CAUSED_BY = SAID.index("caused_by")
"""The column of ``SAID`` written with :data:`SAME_CAUSES`."""


class _Line:
    """A round line's columns, filled part by part (a part: some turns' steps, then some messages)."""

    __slots__ = (
        "_last",
        "cause_by",
        "completion_tokens",
        "details",
        "kinds",
        "message_ids",
        "parts",
        "prompt_tokens",
        "roles",
        "said",
        "send_to",
        "senders",
        "to",
        "turns",
    )

    def __init__(self, turns: bool) -> None:
        self.turns = turns
        self.kinds: list[str] = []
        self.roles: list[str] = []
        self.details: list[Any] = []
        self.senders: list[str] = []
        self.message_ids: list[str] = []
        self.cause_by: list[str] = []
        self.send_to: list[list[str]] = []
        self.said: list[list[Any]] = [[] for _ in SAID]
        """A column per name of ``bus.record.SAID`` (``caused_by`` first)."""
        self._last: tuple[str, list[str]] | None = None
        """The sender and causes of the last message added (the next may be written as the same)."""
        self.to: list[list[str]] = []
        self.parts: list[list[int]] = []
        self.prompt_tokens: list[int] = []
        self.completion_tokens: list[int] = []

    def part(
        self,
        steps: Steps | None,
        messages: Sequence[Message],
        said: Sequence[Said],
        send_to: list[list[str]],
        to: list[list[str]],
    ) -> None:
        """Add ``steps`` (with their details as the log writes them), then ``messages`` with their other columns."""
        count = 0
        if steps is not None:
            count = len(steps.kind)
            self.kinds += steps.kind
            self.roles += steps.role
            self.details += [  # a list of names each (one type per column: polars and DuckDB read it as is)
                [m.id for m in d]
                if k == "observe"
                else ([] if d is None else [d.cause_by])
                if k == "think"
                else ([] if d is None else [d.id])
                if k == "act"
                else [json.dumps(d)]  # an agent's tool_call / tool_result: its fields, as JSON
                for k, d in zip(steps.kind, steps.detail, strict=True)
            ]
        if not count and not messages:
            return
        for column, values in zip(self.said, zip(*said, strict=True) if said else [() for _ in SAID], strict=True):
            column += self._causes(messages, values) if column is self.said[_CAUSED_BY] else values
        self.senders += [m.sent_from for m in messages]
        self.message_ids += [m.id for m in messages]
        self.cause_by += [m.cause_by for m in messages]
        self.send_to += send_to
        self.to += to
        parts = self.parts
        if parts and (parts[-1][1] == 0 or count == 0):  # steps after steps, or messages after messages: one part
            parts[-1][0] += count
            parts[-1][1] += len(messages)
        else:
            parts.append([count, len(messages)])

    def _causes(self, messages: Sequence[Message], caused_by: Sequence[list[str]]) -> list[list[str]]:
        """``caused_by`` as written: :data:`SAME_CAUSES` for the causes of the same sender's message before."""
        written = []
        for message, causes in zip(messages, caused_by, strict=True):
            last = self._last
            same = (
                bool(causes)
                and last is not None
                and message.sent_from == last[0]
                and (causes is last[1] or causes == last[1])
            )
            written.append(SAME_CAUSES if same else causes)
            self._last = (message.sent_from, causes)
        return written

    def tokens(self, steps: Steps, calls: Sequence[LedgerEntry]) -> None:
        """The tokens of each turn of ``steps`` (the part just added), on the row that opens it (its observe)."""
        count = len(steps.kind)
        prompt, completion = [0] * count, [0] * count
        if calls:  # else every row holds 0: a round without model calls costs two lists
            spent: dict[str, list[int]] = {}
            for call in calls:
                tokens = spent.setdefault(call.role, [0, 0])
                tokens[0] += call.prompt_tokens
                tokens[1] += call.completion_tokens
            for at, (kind, role) in enumerate(zip(steps.kind, steps.role, strict=True)):
                if kind == "observe" and (opened := spent.pop(role, None)) is not None:
                    prompt[at], completion[at] = opened
        self.prompt_tokens += prompt
        self.completion_tokens += completion

    def columns(self) -> dict[str, Any]:
        """The line's fields: its steps (if turns are logged), its messages, its parts if more than one."""
        columns: dict[str, Any] = {}
        if self.turns:
            columns["steps"] = {"kind": self.kinds, "role": self.roles, "detail": self.details}
            columns["steps"] |= {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}
        columns["published"] = {
            "role": self.senders,
            "message_id": self.message_ids,
            "cause_by": self.cause_by,
            "send_to": self.send_to,
            **dict(zip(SAID, self.said, strict=True)),
            "to": self.to,
        }
        if len(self.parts) > 1:
            columns["parts"] = self.parts
        return columns
