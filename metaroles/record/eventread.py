"""Reading the run's event log (``record.eventlog`` writes it): events, their timings, cut-backs and copies.

A publish line may carry what it stands for (its deliveries, its sender's turn); :func:`read_events`
spells every event out, so every reader sees one stream whichever way the log was written.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from operator import itemgetter
from pathlib import Path
from typing import Any
from warnings import warn

from metaroles.core.exceptions import RunDirCorrupt
from metaroles.core.files import iter_lines, read_text, write_atomic

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
    events = unfolded([event for event, _ in read_lines(path)])
    latencies = {t["seq"]: t["latency_s"] for t, _ in read_lines(timings_of(path), warn_torn=False, kind=_timing)}
    if latencies:
        for event in events:
            if event["kind"] == "llm_call":
                event["latency_s"] = latencies.get(event["seq"], 0.0)
    return events


def unfolded(events: list[Event]) -> list[Event]:
    """``events`` with what publish lines carry spelled out: their deliveries and their senders' turns.

    A publish line may carry the roles it was delivered to (``to``, in delivery order: the numbers
    after its own ``seq`` are theirs) and the turn that made it (``turn``: the ``seq`` of its
    sender's observe; think and act follow, with the news ``caused_by`` names, the message's
    action and its id). The events come back in ``seq`` order, one per number, as a log that spells
    everything out (one written before these folds) reads.
    """
    if not any("to" in e or "turn" in e for e in events if e["kind"] == "publish"):
        return events
    out: list[Event] = []
    turns = False
    for event in events:
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
    """Whether ``value`` is an event as the log writes it: the schema every reader relies on, checked once here."""
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


def _text_or_none(value: object) -> bool:
    return value is None or isinstance(value, str)


def _names(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _timing(value: object) -> bool:
    return isinstance(value, dict) and type(value.get("seq")) is int and isinstance(value.get("latency_s"), int | float)


def read_lines(
    path: Path, *, warn_torn: bool = True, kind: Callable[[object], bool] = _event
) -> list[tuple[Event, str]]:
    """Each record of ``path`` with its line as written (kept verbatim when a log is cut back).

    A torn last line (a crash mid-append) is skipped; anything else that is not a record is an error,
    and so is an event log whose lines repeat a ``seq`` (duplicated or spliced).
    """
    records = read_jsonl(path, kind, warn_torn=warn_torn)
    if kind is _event:
        seen: set[int] = set()
        for event, _ in records:
            if event["seq"] in seen:
                raise RunDirCorrupt(
                    f"{path}: seq {event['seq']} appears twice (the log is duplicated or spliced); "
                    "restore it, or fork from an earlier round (metaroles fork DIR --from-round N)"
                )
            seen.add(event["seq"])
    return records


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
    ended = [e["round"] for e, _ in read_lines(path) if e["kind"] == "round_end"]
    if through_round > 0 and (not ended or max(ended) < through_round):
        last = f"ends at round {max(ended)}" if ended else "holds no complete round"
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
    last = kept[-1][0]["seq"] if kept else 0
    timings = [line for t, line in read_lines(timings_from, warn_torn=False, kind=_timing) if t["seq"] <= last]
    write_atomic(events, "".join(line + "\n" for _, line in kept))
    write_atomic(timings_of(events), "".join(line + "\n" for line in timings))
