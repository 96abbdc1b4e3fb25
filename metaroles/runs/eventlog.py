"""The run's event log: ``events.jsonl``, append-only, one JSON object per line.

Events are written at the end of each round, in one append that is flushed and fsynced before the
round's checkpoint: ``round_start``, ``publish`` (with ``caused_by``: the news its sender had
observed), ``deliver``, ``dead_letter``, ``role_error``, ``dropped``, ``llm_call`` (tokens and
cost) and ``round_end``, each with a sequence number and its round. The light log (no turn
events, as large societies keep it) folds deliveries: a publish line carries them (``to``: the
recipients in delivery order, numbered right after it) instead of a line per delivery — a fifth
of the size — and :func:`read_events` gives them back as ``deliver`` events, so every reader
sees one stream whichever way it was written. On resume
the log is cut back to the checkpoint's round, and a torn last line is dropped with a warning.
Big runs may keep it compressed (``events.jsonl.zst``, ``core.files``): each round's append is one
zstd frame, and every reader here (and pandas) reads the same lines.

The log is a function of the run (seed and model answers), byte for byte. What the clock measured,
each model call's latency, goes beside it into ``timings.jsonl`` (the ``seq`` of its ``llm_call``
and ``latency_s``); :func:`read_events` puts the latencies back on the events it returns.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any
from warnings import warn

from metaroles.bus.environment import Environment
from metaroles.bus.role import Role
from metaroles.core.exceptions import RunDirCorrupt
from metaroles.core.files import append_durably, append_text, create_durably, iter_lines, read_text, write_atomic
from metaroles.messages.message import Message

Event = dict[str, Any]
TIMINGS = "timings.jsonl"
"""Beside ``events.jsonl``: the latency of each model call, by the ``seq`` of its ``llm_call`` event."""


def timings_of(events: Path) -> Path:
    """The timings file that goes with the event log ``events``."""
    return events.with_name(TIMINGS)


def read_events(path: Path) -> list[Event]:
    """The events in ``path``, model calls with their ``latency_s``; a torn last line is skipped with a warning.

    Raises:
        RunDirCorrupt: If a line before the last is not an event (named by file and line).
    """
    events = unfolded([event for event, _ in _read_lines(path)])
    latencies = {t["seq"]: t["latency_s"] for t, _ in _read_lines(timings_of(path), warn_torn=False, kind=_timing)}
    if latencies:
        for event in events:
            if event["kind"] == "llm_call":
                event["latency_s"] = latencies.get(event["seq"], 0.0)
    return events


def unfolded(events: list[Event]) -> list[Event]:
    """``events`` with each publish's deliveries (its ``to``) as the ``deliver`` events they stand for.

    A publish line carries the roles it was delivered to, in delivery order, and the numbers
    after its own ``seq`` are theirs; a log written before (one line per delivery) reads the same.
    """
    if not any("to" in e for e in events if e["kind"] == "publish"):
        return events
    out: list[Event] = []
    for event in events:
        to = event.pop("to", None) if event["kind"] == "publish" else None
        out.append(event)
        if to:
            seq, round_no, message_id = event["seq"], event["round"], event.get("message_id")
            out.extend(
                {"seq": seq + n, "round": round_no, "kind": "deliver", "role": role, "message_id": message_id}
                for n, role in enumerate(to, start=1)
            )
    return out


def _event(value: object) -> bool:
    return (
        isinstance(value, dict)
        and type(value.get("seq")) is int
        and type(value.get("round")) is int
        and isinstance(value.get("kind"), str)
    )


def _timing(value: object) -> bool:
    return isinstance(value, dict) and type(value.get("seq")) is int and isinstance(value.get("latency_s"), int | float)


def _read_lines(
    path: Path, *, warn_torn: bool = True, kind: Callable[[object], bool] = _event
) -> list[tuple[Event, str]]:
    """Each record of ``path`` with its line as written (kept verbatim when a log is cut back).

    A torn last line (a crash mid-append) is skipped; anything else that is not a record is an error.
    """
    return read_jsonl(path, kind, warn_torn=warn_torn)


def read_jsonl(path: Path, kind: Callable[[object], bool], *, warn_torn: bool = True) -> list[tuple[Event, str]]:
    """The records of a JSON-lines file of a run directory, each with its line; ``[]`` if there is none.

    Raises:
        RunDirCorrupt: If a line other than the last is not valid UTF-8 JSON accepted by ``kind``.
    """
    if not path.exists():
        return []
    lines = read_text(path).split("\n")
    records: list[tuple[Event, str]] = []
    record: Any
    last = len(lines) - (1 if lines[-1] == "" else 0)
    for number, line in enumerate(lines[:last], start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if kind(record):
            records.append((record, line))
        elif number == last and record is None:
            if warn_torn:
                warn(f"{path.name}: the last line is torn (a crash while writing); it is skipped", stacklevel=3)
        else:
            raise RunDirCorrupt(
                f"{path}: line {number} is not a valid record ({line[:60]!r}); the file is damaged — "
                "restore it, or delete the run directory and run again"
            )
    return records


def publish_rounds(path: Path) -> dict[str, int]:
    """Message id → the round it was published in, reading only the publish lines of a log."""
    if not path.exists():
        return {}
    rounds: dict[str, int] = {}
    for number, raw in enumerate(iter_lines(path), start=1):
        if b'"publish"' not in raw:
            continue
        try:
            event = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise RunDirCorrupt(f"{path}: line {number} is not UTF-8 text; the file is damaged") from None
        except json.JSONDecodeError:
            continue  # a torn last line (read_events warns about it)
        if isinstance(event, dict) and event.get("kind") == "publish" and isinstance(event.get("round"), int):
            rounds[str(event.get("message_id"))] = event["round"]
    return rounds


def check_log(path: Path, through_round: int) -> None:
    """Check that the log at ``path`` reads whole and records every round up to ``through_round``.

    Raises:
        RunDirCorrupt: If a line is damaged, or the log ends before ``through_round`` (missing,
            emptied or cut short: a resume would continue from a log that lost rounds).
    """
    ended = [e["round"] for e, _ in _read_lines(path) if e["kind"] == "round_end"]
    if through_round > 0 and (not ended or max(ended) < through_round):
        last = f"ends at round {max(ended)}" if ended else "holds no complete round"
        raise RunDirCorrupt(
            f"{path}: the event log {last}, but the last checkpoint is of round {through_round}; "
            "it was lost or cut short, so resuming would write a log that lies — restore it, or fork from an "
            "earlier round (metaroles fork DIR --from-round N)"
        )


def copy_events(source: Path, target: Path, *, through_round: int) -> None:
    """Write the events of ``source`` up to ``through_round`` into ``target`` (a fork's prefix), with their timings."""
    kept = [(e, line) for e, line in _read_lines(source) if e.get("round", 0) <= through_round]
    _rewrite(target, kept, timings_from=timings_of(source))


def _rewrite(events: Path, kept: list[tuple[Event, str]], *, timings_from: Path) -> None:
    """Make ``events`` hold exactly the lines ``kept``, and its timings those of ``kept``'s model calls."""
    last = kept[-1][0]["seq"] if kept else 0
    timings = [line for t, line in _read_lines(timings_from, warn_torn=False, kind=_timing) if t["seq"] <= last]
    write_atomic(events, "".join(line + "\n" for _, line in kept))
    write_atomic(timings_of(events), "".join(line + "\n" for line in timings))


_Said = tuple[frozenset[str], Sequence[Role], str, str, str]
"""A sender's addresses, the recipients routing gave them, and the JSON of its name, addresses and recipients."""


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
        turns: Also log each turn's observe, think and act events (switches on ``env.trace``).
        folded: Carry each publish's deliveries on its line (default: when turns are not logged —
            the light log of large societies); else a line per delivery.
    """

    def __init__(
        self,
        path: Path,
        env: Environment,
        *,
        through_round: int | None = None,
        turns: bool = True,
        folded: bool | None = None,
    ) -> None:
        """Open (and, on resume, cut back) the log."""
        self.path = path
        self.env = env
        self.timings = timings_of(path)
        kept = _read_lines(path)
        if through_round is not None:
            kept = [(e, line) for e, line in kept if e.get("round", 0) <= through_round]
        if path.exists() or self.timings.exists():
            _rewrite(path, kept, timings_from=self.timings)
        else:  # a new run's log: created empty, not written (a checkpoint may claim it before the run's end)
            create_durably(path)
        self.seq = kept[-1][0]["seq"] if kept else 0
        self._names: dict[str, str] = {}
        self._send_to: dict[frozenset[str], str] = {}
        self._recipients: dict[int, tuple[Sequence[Role], str]] = {}
        """The JSON of each list of recipients met (by the list: routing's own), while the address book stays."""
        self.heard: Mapping[str, str] = {}
        """On a sharded run's driver: each remote sender's news (the ids, as JSON) in the round being logged."""
        self._senders: dict[str, _Said] = {}
        """Per sender: its last addresses and recipients (the objects) and their JSON, with its name's."""
        self._book: tuple[object, int] | None = None
        self.turns = turns
        self.folded = not turns if folded is None else folded
        self._unsynced = False  # lines appended without waiting for the disk (round_done(sync=False))
        if turns and env.trace is None:
            env.trace = []
        self._seen: object = env.trace  # a trace already there belongs to rounds before this log
        self._mark()

    def _mark(self) -> None:
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
        seq = self.seq + 1
        head = f',"round":{env.round},"kind":'
        lines = [f'{{"seq":{seq}{head}"round_start"}}\n']
        if self.turns and env.trace is not None and env.trace is not self._seen:
            self._seen = env.trace
            seq = self._turn_lines(lines, seq, head)
        if len(env.history) > self._history:
            seq = self._message_lines(lines, seq, head, env.history.get(len(env.history) - self._history))
        timings = []
        for entry in env.ledger.entries[self._ledger :]:
            call = {"action": entry.action, "model": entry.model, "tokens": entry.tokens, "cost": entry.cost}
            fields = json.dumps({"role": entry.role, **call})[1:-1]
            seq += 1
            lines.append(f'{{"seq":{seq}{head}"llm_call",{fields}}}\n')
            timings.append(f'{{"seq":{seq},"latency_s":{entry.latency_s!r}}}\n')
        for event in env.events[self._events :]:
            fields = json.dumps({"role": event.role, "message_id": event.message_id, "detail": event.detail})[1:-1]
            seq += 1
            lines.append(f'{{"seq":{seq}{head}"{event.kind}",{fields}}}\n')
        self.seq = seq = seq + 1
        lines.append(f'{{"seq":{seq}{head}"round_end"}}\n')
        if timings:  # wall-clock figures, no part of the run: no wait for the disk
            append_text(self.timings, "".join(timings))
        self._append(lines, sync)
        self._mark()

    def unsynced(self) -> list[Path]:
        """The log's file, if lines went to it without waiting for the disk: the caller syncs it now."""
        unsynced, self._unsynced = self._unsynced, False
        return [self.path] if unsynced else []

    def _turn_lines(self, lines: list[str], seq: int, head: str) -> int:
        """Observe (the news), think (the action chosen) and act (the message produced) events; the last seq."""
        names, name, add = self._names, self._name, lines.append
        for kind, role, detail, _ in self.env.trace or ():
            who = names.get(role) or name(role)
            seq += 1
            if kind == "observe":
                add(f'{{"seq":{seq}{head}"observe","role":{who},"message_ids":[{_ids(detail)}]}}\n')
            elif kind == "think":
                action = "null" if detail is None else names.get(detail._action_id) or name(detail._action_id)
                add(f'{{"seq":{seq}{head}"think","role":{who},"action":{action}}}\n')
            elif kind != "act":  # an agent's tool_call / tool_result: rare, spelled out
                add(f'{{"seq":{seq}{head}{json.dumps(kind)},"role":{who},{json.dumps(detail)[1:-1]}}}\n')
            else:
                message_id = "null" if detail is None else encode_basestring(detail.id)
                add(f'{{"seq":{seq}{head}"act","role":{who},"message_id":{message_id}}}\n')
        return seq

    def _message_lines(self, lines: list[str], seq: int, head: str, messages: Iterable[Message]) -> int:
        """Per message, the publish event (with the news its sender had observed) and one deliver per recipient.

        A message reaches the roles routing gives its ``send_to`` now (the address book is the one it
        was delivered with: the log is written before the next round). A sender's recipients are kept
        with its addresses while the book stays, so a round is not routed again (a sharded driver's
        shards routed it): only a sender whose addresses changed is.
        """
        env, names, name, enc, add = self.env, self._names, self._name, encode_basestring, lines.append
        roles, senders, folded, heard, route = env.roles, self._senders, self.folded, self.heard, env._book.route
        if self._book != (env._book, env._book.version):  # a role joined or moved: the lists routing gives changed
            self._book, self._recipients, self._senders = (env._book, env._book.version), {}, {}
            senders = self._senders
        for message in messages:
            caused = heard.get(message.sent_from)  # a sharded run's remote sender: its shard encoded them
            if caused is None:
                sender = roles.get(message.sent_from)
                caused = _ids(sender.rc.news) if sender is not None else ""
            said, send_to = senders.get(message.sent_from), message.send_to  # they recur round after round
            if said is None or (said[0] is not send_to and said[0] != send_to):
                said = self._said(message, route(send_to))
            recipients = said[1]
            action = names.get(message.cause_by) or name(message.cause_by)
            message_id = enc(message.id)
            seq += 1
            line = (
                f'{{"seq":{seq}{head}"publish","role":{said[2]},"message_id":{message_id},"cause_by":{action},'
                f'"send_to":[{said[3]}],"caused_by":[{caused}]'
            )
            if folded:  # each delivery keeps its number: read_events gives it back as a deliver event
                add(f'{line},"to":[{said[4]}]}}\n')
                seq += len(recipients)
                continue
            add(line + "}\n")
            for recipient in recipients:
                who = names.get(recipient.name) or name(recipient.name)
                seq += 1
                add(f'{{"seq":{seq}{head}"deliver","role":{who},"message_id":{message_id}}}\n')
        return seq

    def _said(self, message: Message, recipients: Sequence[Role]) -> _Said:
        """The JSON of ``message``'s sender, addresses and (folded) recipients, kept for its sender's next message."""
        if len(self._senders) >= 1 << 18:
            self._senders.clear()
        send_to = self._send_to.get(message.send_to)
        if send_to is None:
            send_to = self._send_to[message.send_to] = ",".join([self._name(a) for a in sorted(message.send_to)])
        to = self._to(recipients) if self.folded else ""
        said = self._senders[message.sent_from] = (
            message.send_to,
            recipients,
            self._name(message.sent_from),
            send_to,
            to,
        )
        return said

    def _to(self, recipients: Sequence[Role]) -> str:
        """The names of ``recipients`` as JSON, remembered per list (routing hands out one per set of addresses)."""
        known = self._recipients.get(id(recipients))
        if known is None or known[0] is not recipients:
            if len(self._recipients) >= 1 << 18:
                self._recipients.clear()
            names, name = self._names, self._name
            text = ",".join([names.get(r.name) or name(r.name) for r in recipients])
            known = self._recipients[id(recipients)] = (recipients, text)
        return known[1]

    def _append(self, lines: list[str], sync: bool = True) -> None:
        (append_durably if sync else append_text)(self.path, lines)
        self._unsynced = not sync
