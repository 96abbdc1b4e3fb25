"""The run's event log: ``events.jsonl``, append-only, one JSON object per line.

Events are written at the end of each round, in one append that is flushed and fsynced before the
round's checkpoint (a round with no checkpoint due leaves the sync to the next one):
``round_start``, the turns' ``observe``, ``think`` and ``act``, ``publish`` (with ``caused_by``:
the news its sender had observed), ``deliver``, ``dead_letter``, ``role_error``, ``dropped``,
``llm_call`` (tokens and cost) and ``round_end``, each with a sequence number and its round. The
light log (no turn events, as large societies keep it) folds deliveries: a publish line carries
them (``to``: the recipients in delivery order, numbered right after it) instead of a line per
delivery — a fifth of the size. A folded log (``turns="folded"``) puts a default turn on the line
of the message it made (``turn``: its observe's number; think and act follow). The readers
(``record.eventread``, re-exported here) spell both out, so every reader sees one stream whichever
way it was written. On resume
the log is cut back to the checkpoint's round, and a torn last line is dropped with a warning.
Big runs may keep it compressed (``events.jsonl.zst``, ``core.files``): each round's append is one
zstd frame, and every reader here (and pandas) reads the same lines.

The log is a function of the run (seed and model answers), byte for byte. What the clock measured,
each model call's latency, goes beside it into ``timings.jsonl`` (the ``seq`` of its ``llm_call``
and ``latency_s``); :func:`read_events` puts the latencies back on the events it returns.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any, Literal

from metaroles.bus.environment import Environment
from metaroles.bus.record import EnvEvent, RoundRecord, Steps
from metaroles.bus.role import Role
from metaroles.core.files import append_durably, append_text, create_durably
from metaroles.llm.ledger import LedgerEntry
from metaroles.messages.message import Message
from metaroles.record.eventread import (
    TIMINGS,
    Event,
    check_log,
    copy_events,
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
    "publish_rounds",
    "read_events",
    "read_jsonl",
    "timings_of",
    "unfolded",
]


@dataclass(slots=True)
class _Fold:
    """A turn that may go on its message's publish line: its first ``seq``, its place among the round's lines."""

    seq: int
    place: int
    role: str
    news: Any
    action: Any


@dataclass(slots=True)
class _Said:
    """A sender's last addresses, the recipients routing gave them (once asked), and the JSON of its name, addresses."""

    send_to: frozenset[str]
    recipients: Sequence[Role] | None
    name: str
    send_to_json: str


@dataclass(slots=True)
class _Named:
    """A list of recipients routing gave, and their names as JSON."""

    recipients: Sequence[Role]
    json: str


def _ids(messages: Sequence[Message]) -> str:
    """The ids of ``messages`` as JSON strings, comma-separated (ids the bus makes need no escaping: one join)."""
    ids = [m.id for m in messages]
    joined = "".join(ids)
    if joined.isprintable() and '"' not in joined and "\\" not in joined:
        return '"' + '","'.join(ids) + '"' if ids else ""
    return ",".join(map(encode_basestring, ids))


class EventLog:
    """Writes one environment's events, a round at a time.

    Lines are built from memoised JSON pieces rather than one ``json.dumps`` per event: a large
    society logs thousands of events per round, and the log must not cost more than the round.

    Args:
        path: The ``events.jsonl`` file; appended to.
        env: The environment whose rounds are logged.
        through_round: Keep only events up to this round from an existing log (resume).
        turns: Also log each turn's observe, think and act events (the round record's steps); ``"folded"``:
            a default turn (observe, think, then act with the one message it published) goes on that
            message's publish line (``turn``) instead of three lines of its own, if the line tells its
            story; :func:`read_events` spells it out.
        folded: Carry each publish's deliveries on its line (default: when turns are not logged —
            the light log of large societies); else a line per delivery.
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
        self.seq = kept[-1][0]["seq"] if kept else 0
        self._names: dict[str, str] = {}
        self._send_to: dict[frozenset[str], str] = {}
        self._recipients: dict[int, _Named] = {}
        """The JSON of each list of recipients met (by the list: routing's own), while the address book stays."""
        self.heard: Mapping[str, str] = {}
        """On a sharded run's driver: each remote sender's news (the ids, as JSON) in the round being logged."""
        self._senders: dict[str, _Said] = {}
        """Per sender: its last addresses and recipients (the objects) and their JSON, with its name's."""
        self._book: tuple[object, int] | None = None
        self.turns = bool(turns)
        self.folded = not turns if folded is None else folded
        self.fold_turns = turns == "folded"
        self._folds: dict[str, _Fold] = {}
        """The round's turns that may go on their message's publish line, by the message's id."""
        self._unsynced = False  # lines appended without waiting for the disk (round_done(sync=False))
        recording = env.record is not None
        env.keep_records(steps=self.turns)
        self._read = env.round_record().number if recording else 0  # a record already there: rounds before this log
        self._mark()

    def _mark(self) -> None:
        """Where the history, ledger and events stand: what a missed record's round is read from instead."""
        env = self.env
        self._history = len(env.history)
        self._ledger = len(env.ledger.entries)
        self._events = len(env.events)

    def _name(self, text: str) -> str:
        """JSON of a recurring string (role, action), memoised."""
        encoded = self._names.get(text)
        if encoded is None:
            encoded = self._names[text] = encode_basestring(text)
        return encoded

    def round_done(self, *, sync: bool = True) -> None:
        """Append the events of the round that just ended (or of what happened between rounds).

        ``sync=False``: without waiting for the disk; the checkpoint that claims the round syncs the
        log first (:meth:`unsynced`).
        """
        env = self.env
        records = env.records_since(self._read)
        seq = self.seq + 1
        head = f',"round":{env.round},"kind":'
        lines = [f'{{"seq":{seq}{head}"round_start"}}\n']
        seq, calls, events = self._record_lines(lines, seq, head, records)
        self._read = env.recorded.number if env.recorded is not None else 0
        if self._folds:
            self._unfolded(lines, head)
        timings = []
        for entry in calls:
            call = {"action": entry.action, "model": entry.model, "tokens": entry.tokens, "cost": entry.cost}
            fields = json.dumps({"role": entry.role, **call})[1:-1]
            seq += 1
            lines.append(f'{{"seq":{seq}{head}"llm_call",{fields}}}\n')
            timings.append(f'{{"seq":{seq},"latency_s":{entry.latency_s!r}}}\n')
        for event in events:
            fields = json.dumps({"role": event.role, "message_id": event.message_id, "detail": event.detail})[1:-1]
            seq += 1
            lines.append(f'{{"seq":{seq}{head}"{event.kind}",{fields}}}\n')
        self.seq = seq = seq + 1
        lines.append(f'{{"seq":{seq}{head}"round_end"}}\n')
        if timings:  # wall-clock figures, no part of the run: no wait for the disk
            append_text(self.timings, "".join(timings))
        self._append(lines, sync)
        self._mark()

    def _record_lines(
        self, lines: list[str], seq: int, head: str, records: list[RoundRecord] | None
    ) -> tuple[int, list[LedgerEntry], list[EnvEvent]]:
        """The turns and messages of ``records`` (``None``: since the last call, from the bus); its calls, events."""
        calls: list[LedgerEntry] = []
        events: list[EnvEvent] = []
        for record in records or ():  # the rounds' records (and what happened between): all, as it happened
            if self.turns and record.steps:
                seq = self._turn_lines(lines, seq, head, record.steps)
            seq = self._message_lines(lines, seq, head, record.published, record.recipients)
            calls += record.model_calls
            events += record.events
        if records is None:  # records not kept any more (many rounds between two calls): what the bus kept since
            env = self.env
            published = env.history.get(len(env.history) - self._history) if len(env.history) > self._history else []
            seq = self._message_lines(lines, seq, head, published, [None] * len(published))
            calls, events = env.ledger.entries[self._ledger :], env.events[self._events :]
        return seq, calls, events

    def unsynced(self) -> list[Path]:
        """The log's file, if lines went to it without waiting for the disk: the caller syncs it now."""
        unsynced, self._unsynced = self._unsynced, False
        return [self.path] if unsynced else []

    def _turn_lines(self, lines: list[str], seq: int, head: str, steps: Steps) -> int:
        """Observe (the news), think (the action chosen) and act (the message produced) events; the last seq.

        With ``fold_turns``, a role's observe, think and act in a row (a default turn that made one
        message) take their numbers and a place here; the message's publish line carries them if it
        tells the same story (:meth:`_message_lines`), else :meth:`_unfolded` writes them here.
        """
        names, name, add = self._names, self._name, lines.append
        kinds, roles, details = steps.kind, steps.role, steps.detail
        folds, last, skip = self._folds, len(kinds) - 2 if self.fold_turns else 0, 0
        for at, kind in enumerate(kinds):
            if skip:  # the think and act of a turn just taken
                skip -= 1
                continue
            role, detail = roles[at], details[at]
            if (
                kind == "observe"
                and at < last
                and kinds[at + 1] == "think"
                and kinds[at + 2] == "act"
                and roles[at + 1] == roles[at + 2] == role
                and details[at + 1] is not None
                and details[at + 2] is not None
            ):
                folds[details[at + 2].id] = _Fold(seq + 1, len(lines), role, detail, details[at + 1])
                add("")
                seq, skip = seq + 3, 2
                continue
            who = names.get(role) or name(role)
            seq += 1
            if kind == "observe":
                add(f'{{"seq":{seq}{head}"observe","role":{who},"message_ids":[{_ids(detail)}]}}\n')
            elif kind == "think":
                action = "null" if detail is None else names.get(detail.cause_by) or name(detail.cause_by)
                add(f'{{"seq":{seq}{head}"think","role":{who},"action":{action}}}\n')
            elif kind != "act":  # an agent's tool_call / tool_result: rare, spelled out
                add(f'{{"seq":{seq}{head}{json.dumps(kind)},"role":{who},{json.dumps(detail)[1:-1]}}}\n')
            else:
                message_id = "null" if detail is None else encode_basestring(detail.id)
                add(f'{{"seq":{seq}{head}"act","role":{who},"message_id":{message_id}}}\n')
        return seq

    def _unfolded(self, lines: list[str], head: str) -> None:
        """Write, in their places, the turns whose message's publish line did not carry them."""
        names, name = self._names, self._name
        for message_id, turn in self._folds.items():
            seq, cause = turn.seq, turn.action.cause_by
            who, action = names.get(turn.role) or name(turn.role), names.get(cause) or name(cause)
            lines[turn.place] = (
                f'{{"seq":{seq}{head}"observe","role":{who},"message_ids":[{_ids(turn.news)}]}}\n'
                f'{{"seq":{seq + 1}{head}"think","role":{who},"action":{action}}}\n'
                f'{{"seq":{seq + 2}{head}"act","role":{who},"message_id":{encode_basestring(message_id)}}}\n'
            )
        self._folds = {}

    def _message_lines(
        self,
        lines: list[str],
        seq: int,
        head: str,
        messages: Sequence[Message],
        delivered: Sequence[Sequence[Role] | None],
    ) -> int:
        """Per message, the publish event (with the news its sender had observed) and one deliver per recipient.

        The recipients are the ones delivery found (``delivered``, the round's record). Where it has
        none (the shards routed them), routing gives them with the book they were delivered with (the log
        is written before the next round), kept per sender while its addresses and the book stay.
        """
        env, names, name, enc, add = self.env, self._names, self._name, encode_basestring, lines.append
        roles, senders, folded, heard = env.roles, self._senders, self.folded, self.heard
        if self._book != env.routes_version:  # a role joined or moved: the lists routing gives changed
            self._book, self._recipients, self._senders = env.routes_version, {}, {}
            senders = self._senders
        for message, recipients in zip(messages, delivered, strict=True):
            caused = heard.get(message.sent_from)  # a sharded run's remote sender: its shard encoded them
            sender = None
            if caused is None:
                sender = roles.get(message.sent_from)
                caused = _ids(sender.rc.news) if sender is not None else ""
            turned = self._turn_of(message, caused, sender) if self._folds else ""  # its turn, on its line
            said, send_to = senders.get(message.sent_from), message.send_to  # they recur round after round
            if said is None or (said.send_to is not send_to and said.send_to != send_to):
                said = self._said(message)
            if recipients is None:
                recipients = said.recipients if said.recipients is not None else self._routed(said)
            action = names.get(message.cause_by) or name(message.cause_by)
            message_id = enc(message.id)
            seq += 1
            line = (
                f'{{"seq":{seq}{head}"publish","role":{said.name},"message_id":{message_id},"cause_by":{action},'
                f'"send_to":[{said.send_to_json}],"caused_by":[{caused}]{turned}'
            )
            if folded:  # each delivery keeps its number: read_events gives it back as a deliver event
                add(f'{line},"to":[{self._to(recipients)}]}}\n')
                seq += len(recipients)
                continue
            add(line + "}\n")
            for recipient in recipients:
                who = names.get(recipient.name) or name(recipient.name)
                seq += 1
                add(f'{{"seq":{seq}{head}"deliver","role":{who},"message_id":{message_id}}}\n')
        return seq

    def _routed(self, said: _Said) -> Sequence[Role]:
        """The recipients routing gives a sender's addresses now, kept with them (a sharded round's messages)."""
        said.recipients = self.env.route(said.send_to)
        return said.recipients

    def _turn_of(self, message: Message, caused: str, sender: Role | None) -> str:
        """``,"turn":S`` for the publish line of ``message`` if its sender's turn tells its story, else ``""``.

        The turn's events then read back as written: its role sent the message, its action caused it,
        and its news are the ids ``caused_by`` names (``caused``, as JSON).
        """
        turn = self._folds.pop(message.id, None)
        if turn is None:
            return ""
        if turn.role == message.sent_from and turn.action.cause_by == message.cause_by:
            if (sender is not None and turn.news is sender.rc.news) or _ids(turn.news) == caused:
                return f',"turn":{turn.seq}'
        self._folds[message.id] = turn  # written in its place by _unfolded
        return ""

    def _said(self, message: Message) -> _Said:
        """The JSON of ``message``'s sender and addresses, kept for its sender's next message."""
        if len(self._senders) >= 1 << 18:
            self._senders.clear()
        send_to = self._send_to.get(message.send_to)
        if send_to is None:
            send_to = self._send_to[message.send_to] = ",".join([self._name(a) for a in sorted(message.send_to)])
        said = self._senders[message.sent_from] = _Said(message.send_to, None, self._name(message.sent_from), send_to)
        return said

    def _to(self, recipients: Sequence[Role]) -> str:
        """The names of ``recipients`` as JSON, remembered per list (routing hands out one per set of addresses)."""
        known = self._recipients.get(id(recipients))
        if known is None or known.recipients is not recipients:
            if len(self._recipients) >= 1 << 18:
                self._recipients.clear()
            names, name = self._names, self._name
            text = ",".join([names.get(r.name) or name(r.name) for r in recipients])
            known = self._recipients[id(recipients)] = _Named(recipients, text)
        return known.json

    def _append(self, lines: list[str], sync: bool = True) -> None:
        (append_durably if sync else append_text)(self.path, lines)
        self._unsynced = not sync
