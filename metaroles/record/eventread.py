"""Reading the run's event log (``record.eventlog`` writes it): events, their timings, cut-backs and copies.

A line is one event (format 1), a publish that carries what it stands for (its deliveries, its
sender's turn: format 1, folded), or a whole round in columns (format 2, ``"kind":"round"``, what
the log writes now). :func:`read_events` spells every event out, so every reader sees one stream
whichever way, and in whichever mix, the log was written.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from operator import itemgetter
from pathlib import Path
from typing import Any
from warnings import warn

from metaroles.bus.record import SAID
from metaroles.core.exceptions import RunDirCorrupt
from metaroles.core.files import iter_lines, write_atomic

Event = dict[str, Any]
TIMINGS = "timings.jsonl"
"""Beside ``events.jsonl``: the latency of each model call, by the ``seq`` of its ``llm_call`` event."""


def timings_of(events: Path) -> Path:
    """The timings file that goes with the event log ``events``."""
    return events.with_name(TIMINGS)


def read_events(path: Path) -> list[Event]:
    """The events in ``path``, model calls with their ``latency_s``; a torn last line is skipped with a warning.

    Raises:
        RunDirCorrupt: If a line before the last is not an event (named by file and line), or the
            numbers go back (the log is duplicated or spliced).
    """
    return list(iter_events(path))


def iter_events(path: Path) -> Iterator[Event]:
    """The events :func:`read_events` gives, one after another, read a round at a time (:func:`iter_rounds`)."""
    for events in iter_rounds(path):
        yield from events


def iter_rounds(path: Path) -> Iterator[list[Event]]:
    """The events of each round in turn (and of what happened between rounds): a log of any size, in one round's memory.

    Raises:
        RunDirCorrupt: As :func:`read_events` does; and if a line's ``seq`` does not follow the line
            before it (the log is duplicated or spliced).
    """
    latencies = {t["seq"]: t["latency_s"] for t in read_timings(path) if "latency_s" in t}
    chunk: list[Event] = []
    previous = 0
    for number, event, _ in _entries(path, _event):
        if event["seq"] <= previous:
            raise RunDirCorrupt(
                f"{path}: line {number}'s seq {event['seq']} does not follow the line before it (the log is "
                "duplicated or spliced); restore it, or fork from an earlier round (metaroles fork DIR --from-round N)"
            )
        previous = event["seq"]
        chunk.append(event)
        if ended(event):
            yield _timed(unfolded(chunk), latencies)
            chunk = []
    if chunk:
        yield _timed(unfolded(chunk), latencies)


def _timed(events: list[Event], latencies: dict[int, float]) -> list[Event]:
    """``events``, each model call with its ``latency_s`` (0.0 when the timings lack it)."""
    if latencies:
        for event in events:
            if event["kind"] == "llm_call":
                event["latency_s"] = latencies.get(event["seq"], 0.0)
    return events


def _entries(path: Path, kind: Callable[[object], bool], *, warn_torn: bool = True) -> Iterator[tuple[int, Any, str]]:
    """Each entry of a JSON-lines file with its line number and line, read line by line (see :func:`read_jsonl`)."""
    if not path.exists():
        return
    pending: tuple[int, bytes] | None = None
    for number, raw in enumerate(iter_lines(path), start=1):
        if pending is not None:
            found = _entry(path, *pending, kind, last=False, warn_torn=warn_torn)
            if found is not None:
                yield found
        pending = (number, raw)
    if pending is not None:
        found = _entry(path, *pending, kind, last=True, warn_torn=warn_torn)
        if found is not None:
            yield found


def _entry(
    path: Path, number: int, raw: bytes, kind: Callable[[object], bool], *, last: bool, warn_torn: bool
) -> tuple[int, Any, str] | None:
    """Line ``number`` as an entry (``None``: a blank line, or a torn last one, skipped with a warning)."""
    try:
        line = raw.decode("utf-8").removesuffix("\n")
    except UnicodeDecodeError:
        raise RunDirCorrupt(f"{path}: line {number} is not UTF-8 text; the file is damaged") from None
    if not line.strip():
        return None
    try:
        entry = json.loads(line)
    except json.JSONDecodeError:
        entry = None
    if kind(entry):
        return number, entry, line
    if last and entry is None:
        if warn_torn:
            warn(f"{path.name}: the last line is torn (a crash while writing); it is skipped", stacklevel=5)
        return None
    raise RunDirCorrupt(
        f"{path}: line {number} is not a valid entry ({line[:60]!r}); the file is damaged — "
        "restore it, or delete the run directory and run again"
    )


def last_seq(event: Event) -> int:
    """The ``seq`` of the last event a line holds (a round line's ``end``)."""
    last: int = event["end"] if "end" in event else event["seq"]
    return last


def ended(event: Event) -> bool:
    """Whether a line ends a round (a ``round_end`` event or a whole round)."""
    return event.get("kind") in ("round_end", "round")


def spelled(line: Event) -> list[Event]:
    """The events of a round line (format 2), numbered from its ``seq`` as a log of one line per event numbers them.

    ``round_start``; per part (``parts``: how many steps, then how many messages; one part if absent)
    the steps (observe with its news' ids, think with its action, act with its message, an agent's
    tool steps with their fields) and the messages (``publish``, then a ``deliver`` per recipient in
    ``to``); the model calls; the bus's events; ``round_end``.
    """
    seq, round_no = line["seq"], line["round"]
    out: list[Event] = [{"seq": seq, "round": round_no, "kind": "round_start"}]
    steps, said = line.get("steps") or _NO_STEPS, _causes_spelled(line.get("published") or _NO_MESSAGES)
    parts = line.get("parts") or [[len(steps["kind"]), len(said["message_id"])]]
    told = [name for name in SAID if name in said]  # caused_by, and a sender's newer columns
    step = message = 0
    tokens = steps.get("prompt_tokens"), steps.get("completion_tokens")  # absent before the column was written
    for count, messages in parts:
        kinds, roles, details = (steps[key][step : step + count] for key in ("kind", "role", "detail"))
        for at, (kind, role, detail) in enumerate(zip(kinds, roles, details, strict=True), start=step):
            seq += 1
            out.append({"seq": seq, "round": round_no, "kind": kind, "role": role, **_step_fields(kind, detail)})
            if kind == "observe" and tokens[0] is not None and tokens[1] is not None:  # the turn's model tokens
                out[-1] |= {"prompt_tokens": tokens[0][at], "completion_tokens": tokens[1][at]}
        step += count
        columns = (said[k][message : message + messages] for k in _PUBLISH_COLUMNS)
        for at, (role, message_id, cause_by, send_to, to) in enumerate(zip(*columns, strict=True), message):
            seq += 1
            out.append({"seq": seq, "round": round_no, "kind": "publish", "role": role, "message_id": message_id})
            out[-1] |= {"cause_by": cause_by, "send_to": send_to} | {name: said[name][at] for name in told}
            out.extend(
                {"seq": seq + n, "round": round_no, "kind": "deliver", "role": name, "message_id": message_id}
                for n, name in enumerate(to, start=1)
            )
            seq += len(to)
        message += messages
    tail = [{"kind": "llm_call", **call} for call in line.get("llm_calls", ())] + list(line.get("events", ()))
    out += [{"seq": seq + n, "round": round_no, **event} for n, event in enumerate(tail, start=1)]
    out.append({"seq": seq + len(tail) + 1, "round": round_no, "kind": "round_end"})
    return out


def _causes_spelled(said: dict[str, Any]) -> dict[str, Any]:
    """A round line's messages with each :data:`SAME_CAUSES` replaced by the causes of the message before it."""
    written = said["caused_by"]
    if SAME_CAUSES not in written:
        return said
    causes: list[list[str]] = []
    for entry in written:
        causes.append(causes[-1] if entry == SAME_CAUSES and causes else entry)
    return {**said, "caused_by": causes}


SAME_CAUSES = ["^"]
"""A publish's ``caused_by`` as written when it is the one of the message before it, from the same sender."""
_MESSAGE_COLUMNS = ("role", "message_id", "cause_by", "send_to", "caused_by", "to")
"""A round line's columns of the messages published (``published``), in the order of a publish event's fields."""
_PUBLISH_COLUMNS = ("role", "message_id", "cause_by", "send_to", "to")
"""The columns a publish event and its deliveries are made of, besides what its sender said (``bus.record.SAID``)."""
_NO_STEPS: dict[str, list[Any]] = {"kind": [], "role": [], "detail": []}
_NO_MESSAGES: dict[str, list[Any]] = {key: [] for key in _MESSAGE_COLUMNS}


def _step_fields(kind: str, detail: list[str]) -> Event:
    """The fields of a step's event from its detail (a list of names: see :func:`spelled`)."""
    if kind == "observe":
        return {"message_ids": detail}
    if kind == "think":
        return {"action": detail[0] if detail else None}
    if kind == "act":
        return {"message_id": detail[0] if detail else None}
    fields: Event = json.loads(detail[0])  # an agent's tool_call / tool_result: its own fields
    return fields


def unfolded(events: list[Event]) -> list[Event]:
    """``events`` with what publish lines carry spelled out: their deliveries and their senders' turns.

    A publish line may carry the roles it was delivered to (``to``, in delivery order: the numbers
    after its own ``seq`` are theirs) and the turn that made it (``turn``: the ``seq`` of its
    sender's observe; think and act follow, with the news ``caused_by`` names, the message's
    action and its id). The events come back in ``seq`` order, one per number, as a log that spells
    everything out (one written before these folds) reads.
    """
    if not any(e["kind"] == "round" or "to" in e or "turn" in e for e in events if e["kind"] in ("publish", "round")):
        return events
    out: list[Event] = []
    turns = False
    for event in events:
        if event["kind"] == "round":
            out += spelled(event)
            continue
        if event["kind"] != "publish":
            out.append(event)
            continue
        to, turn = event.pop("to", None), event.pop("turn", None)
        out.append(event)
        seq, round_no, message_id = event["seq"], event["round"], event.get("message_id")
        if turn is not None:
            turns, role, head = True, event["role"], {"round": round_no}
            out.append({"seq": turn, **head, "kind": "observe", "role": role, "message_ids": list(event["caused_by"])})
            out.append({"seq": turn + 1, **head, "kind": "think", "role": role, "action": event["cause_by"]})
            out.append({"seq": turn + 2, **head, "kind": "act", "role": role, "message_id": message_id})
        if to:
            out.extend(
                {"seq": seq + n, "round": round_no, "kind": "deliver", "role": role, "message_id": message_id}
                for n, role in enumerate(to, start=1)
            )
    if turns:
        out.sort(key=itemgetter("seq"))  # a turn's events come before the round's publishes
    return out


_NAMES_A_MESSAGE = frozenset({"publish", "deliver"})
"""Kinds of event that always name their message (others may, or hold ``null``)."""
_LISTS = ("message_ids", "caused_by", "send_to", "to")
"""Fields that, when present, are lists of names or ids."""


def _event(value: object) -> bool:
    """Whether ``value`` is an event or a round line as the log writes them: the schema every reader relies on."""
    if isinstance(value, dict) and value.get("kind") == "round":
        return _round_line(value)
    if not (
        isinstance(value, dict)
        and type(value.get("seq")) is int
        and type(value.get("round")) is int
        and isinstance(value.get("kind"), str)
    ):
        return False
    message_id = value.get("message_id")
    if not (message_id is None or isinstance(message_id, str)) or not _text_or_none(value.get("role")):
        return False
    if value["kind"] in _NAMES_A_MESSAGE and not isinstance(message_id, str):
        return False
    if "turn" in value and type(value["turn"]) is not int:
        return False
    return all(_names(value[key]) for key in _LISTS if key in value)


def _round_line(value: dict[str, Any]) -> bool:
    """Whether ``value`` is a round line (format 2) whose columns :func:`spelled` can read."""
    if not (type(value.get("seq")) is int and type(value.get("round")) is int and type(value.get("end")) is int):
        return False
    steps, said = value.get("steps", _NO_STEPS), value.get("published", _NO_MESSAGES)
    return _round_columns(steps, said) and _round_numbers(value, steps, said)


def _round_columns(steps: Any, said: Any) -> bool:
    """Whether a round line's step and message columns hold what :func:`spelled` reads, one length each."""
    if not (_columns(steps, ("kind", "role", "detail")) and _columns(said, _MESSAGE_COLUMNS)):
        return False
    if not _columns(said, (*_MESSAGE_COLUMNS, *(name for name in SAID if name in said))):  # a sender's newer columns
        return False
    if not (_names(steps["kind"]) and _names(steps["role"]) and all(map(_names, steps["detail"]))):
        return False
    if not all(_tool_step(d) for k, d in zip(steps["kind"], steps["detail"], strict=True) if k not in _STEPS):
        return False
    if not all(_counts(steps[key], len(steps["kind"])) for key in _TOKENS if key in steps):
        return False
    if not (all(map(_names, said["to"])) and all(map(_names, said["send_to"]))):
        return False
    return _names(said["role"]) and _names(said["message_id"]) and all(map(_names, said["caused_by"]))


_TOKENS = ("prompt_tokens", "completion_tokens")
"""A round line's step columns of each turn's model tokens (on the row that opens it; absent in older logs)."""


def _counts(value: Any, length: int) -> bool:
    """Whether ``value`` is a column of ``length`` whole numbers (a step column of tokens)."""
    return isinstance(value, list) and len(value) == length and all(type(n) is int and n >= 0 for n in value)


def _round_numbers(value: dict[str, Any], steps: dict[str, list[Any]], said: dict[str, list[Any]]) -> bool:
    """Whether a round line's parts, model calls and events are well formed, and ``end`` is the number they reach."""
    parts = value.get("parts", [[len(steps["kind"]), len(said["message_id"])]])
    if not (isinstance(parts, list) and all(isinstance(p, list) and len(p) == 2 and _within(p) for p in parts)):
        return False
    if [sum(p[0] for p in parts), sum(p[1] for p in parts)] != [len(steps["kind"]), len(said["message_id"])]:
        return False
    calls, events = value.get("llm_calls", []), value.get("events", [])
    if not (isinstance(calls, list) and isinstance(events, list)):
        return False
    head = {"seq": 0, "round": 0}
    if not all(isinstance(c, dict) and _event({**head, "kind": "llm_call", **c}) for c in calls):
        return False
    if not all(isinstance(e, dict) and _event({**head, **e}) for e in events):
        return False
    numbered = 2 + len(steps["kind"]) + len(said["message_id"]) + sum(map(len, said["to"])) + len(calls) + len(events)
    return bool(value["end"] == value["seq"] + numbered - 1)  # the numbers spelled() gives: the next line follows on


_STEPS = frozenset({"observe", "think", "act"})
"""Step kinds whose detail is a list of names; any other (an agent's tool steps) holds its fields as one JSON text."""


def _tool_step(detail: list[str]) -> bool:
    """Whether a tool step's detail is its fields: one JSON text of an object."""
    try:
        return len(detail) == 1 and isinstance(json.loads(detail[0]), dict)
    except json.JSONDecodeError:
        return False


def _within(counts: list[Any]) -> bool:
    return all(type(n) is int and n >= 0 for n in counts)


def _columns(table: object, keys: tuple[str, ...]) -> bool:
    """Whether ``table`` holds the columns ``keys``, lists of one length."""
    if not isinstance(table, dict) or not all(isinstance(table.get(key), list) for key in keys):
        return False
    return len({len(table[key]) for key in keys}) == 1


def _text_or_none(value: object) -> bool:
    return value is None or isinstance(value, str)


def _names(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _timing(value: object) -> bool:
    """A model call's latency (and when it ended), or a round's start and end, by ``seq``."""
    return (
        isinstance(value, dict)
        and type(value.get("seq")) is int
        and (isinstance(value.get("latency_s"), int | float) or type(value.get("start_ns")) is int)
    )


def read_timings(events: Path) -> list[Event]:
    """What the clock measured beside the log ``events`` (``timings.jsonl``), in the order written.

    Per model call ``{"seq", "latency_s", "end_ns"}`` (the ``seq`` of its ``llm_call``; ``end_ns``:
    when its answer came, ``time.time_ns``; older logs lack it); per round line ``{"seq", "round",
    "start_ns", "end_ns"}`` (its first ``seq``: when the round began and ended; 0 where unknown).
    """
    return [t for t, _ in read_lines(timings_of(events), warn_torn=False, kind=_timing)]


def read_lines(
    path: Path, *, warn_torn: bool = True, kind: Callable[[object], bool] = _event
) -> list[tuple[Event, str]]:
    """Each entry of ``path`` with its line as written (kept verbatim when a log is cut back).

    A torn last line (a crash mid-append) is skipped; anything else that is not an entry is an error,
    and so is an event log whose lines repeat a ``seq`` (duplicated or spliced).
    """
    entries = read_jsonl(path, kind, warn_torn=warn_torn)
    if kind is _event:
        seen: set[int] = set()
        for event, _ in entries:
            if event["seq"] in seen:
                raise RunDirCorrupt(
                    f"{path}: seq {event['seq']} appears twice (the log is duplicated or spliced); "
                    "restore it, or fork from an earlier round (metaroles fork DIR --from-round N)"
                )
            seen.add(event["seq"])
    return entries


def read_jsonl(path: Path, kind: Callable[[object], bool], *, warn_torn: bool = True) -> list[tuple[Event, str]]:
    """The entries of a JSON-lines file of a run directory, each with its line; ``[]`` if there is none.

    A torn last line (a crash mid-append) is skipped, with a warning if ``warn_torn``.

    Raises:
        RunDirCorrupt: If a line other than the last is not valid UTF-8 JSON accepted by ``kind``.
    """
    return [(entry, line) for _, entry, line in _entries(path, kind, warn_torn=warn_torn)]


def logged_through(path: Path) -> int | None:
    """The round of the log's last whole line (a round's line), read from its end; ``None`` for no round.

    A line cut short by a kill is passed over: the round before it is the last the log holds whole.
    """
    if not path.is_file():
        return None
    with path.open("rb") as file:
        end = file.seek(0, os.SEEK_END)
        tail, at = b"", end
        while at > 0 and tail.count(b"\n") < 2:  # the last whole line lies between the last two newlines
            step = min(1 << 16, at)
            at -= step
            file.seek(at)
            tail = file.read(step) + tail
    lines = tail.split(b"\n")
    whole = lines[:-1] if at == 0 else lines[1:-1]  # the piece after the last newline is cut short, or empty
    for line in reversed(whole):
        found = _ROUND.search(line[:256])
        if found:
            return int(found.group(1))
    return None


_ROUND = re.compile(rb'"round":\s*(\d+)')


def publish_rounds(path: Path) -> dict[str, int]:
    """Message id → the round it was published in, reading only the publish lines of a log."""
    if not path.exists():
        return {}
    rounds: dict[str, int] = {}
    for number, raw in enumerate(iter_lines(path), start=1):
        if b'"publish"' not in raw and b'"published"' not in raw:
            continue
        try:
            event = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise RunDirCorrupt(f"{path}: line {number} is not UTF-8 text; the file is damaged") from None
        except json.JSONDecodeError:
            continue  # a torn last line (read_events warns about it)
        if not isinstance(event, dict) or not isinstance(event.get("round"), int):
            continue
        if event.get("kind") == "publish":
            rounds[str(event.get("message_id"))] = event["round"]
        elif event.get("kind") == "round" and isinstance(event.get("published"), dict):
            for message_id in event["published"].get("message_id", ()):
                rounds[str(message_id)] = event["round"]
    return rounds


def check_log(path: Path, through_round: int) -> None:
    """Check that the log at ``path`` reads whole and records every round up to ``through_round``.

    Raises:
        RunDirCorrupt: If a line is damaged, or the log ends before ``through_round`` (missing,
            emptied or cut short: a resume would continue from a log that lost rounds).
    """
    rounds = [e["round"] for e, _ in read_lines(path) if ended(e)]
    if through_round > 0 and (not rounds or max(rounds) < through_round):
        last = f"ends at round {max(rounds)}" if rounds else "holds no complete round"
        raise RunDirCorrupt(
            f"{path}: the event log {last}, but the last checkpoint is of round {through_round}; "
            "it was lost or cut short, so resuming would write a log that lies — restore it, or fork from an "
            "earlier round (metaroles fork DIR --from-round N)"
        )


def copy_events(source: Path, target: Path, *, through_round: int) -> None:
    """Write the events of ``source`` up to ``through_round`` into ``target`` (a fork's prefix), with their timings."""
    kept = [(e, line) for e, line in read_lines(source) if e.get("round", 0) <= through_round]
    rewrite_lines(target, kept, timings_from=timings_of(source))


def rewrite_lines(events: Path, kept: list[tuple[Event, str]], *, timings_from: Path) -> None:
    """Make ``events`` hold exactly the lines ``kept``, and its timings those of ``kept``'s model calls."""
    last = last_seq(kept[-1][0]) if kept else 0
    timings = [line for t, line in read_lines(timings_from, warn_torn=False, kind=_timing) if t["seq"] <= last]
    write_atomic(events, "".join(line + "\n" for _, line in kept))
    write_atomic(timings_of(events), "".join(line + "\n" for line in timings))
