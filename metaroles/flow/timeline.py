"""A run directory as a timeline a page can follow and scrub: each round's delta, a role's panel, as data.

A :class:`Timeline` reads a run's files — never imports anything they name — while the run writes
them or after it ended: ``events.jsonl`` (format 2: one line per round) indexed by byte offset, so
opening a run of a million messages reads no line and jumping to a round parses one;
``checkpoints/messages.jsonl`` for the text of a message (its rows are in publish order, so a
message is found by bisection on its id; a round's rows are appended as it is recorded, checkpoint or
not — on shards while the next round runs — so until then a message's text is ``None``);
``metrics.jsonl`` for the scenario's figures; the run's cassette, if it kept one, for the prompts and
answers of a role's model calls.

A round's :meth:`Timeline.delta` is what a watcher is sent for it: counts by action, tokens and
cost, the interventions and errors, and the flow (who → whom, the action, the text) of at most
:data:`FLOW_ROWS` of its messages — a society of 10,000 agents costs the stream some kilobytes a
round, not its history.
"""

from __future__ import annotations

import functools
import itertools
import mmap
import os
import re
import threading
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple, ParamSpec, TypeVar

import orjson

from metaroles.core.exceptions import ConfigError, RunDirCorrupt
from metaroles.project.rundir import CHECKPOINTS, EVENTS, EVENTS_ZST, METRICS, read_manifest

__all__ = ["FLOW_ROWS", "Timeline"]

NETWORK_ROLES = 300
"""The most roles the page's network view draws (the busiest: a sample of a larger society)."""
THREAD_ROWS = 200
"""The most messages a conversation view shows (a thread that grows past them is cut)."""
FLOW_ROWS = 200
"""The most messages of one round whose flow a delta carries (the rest are counted)."""
TEXT_CHARS = 280
"""A message's text in a delta is cut to this many characters (the role panel shows it whole)."""
CALL_ROWS = 20
"""A role panel's newest model calls (the count says how many there were)."""
TAIL_ROWS = 256
"""Rows looked through from the end of the message table for a message the bisection misses."""
_HEAD = re.compile(rb'^\{"seq":(\d+),"round":(\d+),"kind":"round"')
_ROW_ID = re.compile(rb'^\{"id": ?"([^"]*)"')  # rows with structured answers are written with spaces
_TAPED_ROLE = re.compile(rb'"role": ("(?:[^"\\]|\\.)*")\}$')
"""A cassette line's role: its last key (the lines are written with sorted keys)."""


class Lines:
    """The complete lines of a file that may still grow: their byte offsets, indexed as far as the file goes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.starts: list[int] = []
        self.end = 0
        """Where the indexed lines end (a line not yet ended is not indexed)."""
        self._fd: int | None = None

    def refresh(self) -> int:
        """Index the lines written since the last call; how many there are now."""
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            return len(self.starts)
        if size <= self.end:
            return len(self.starts)
        with _mapped(self.path, size) as data:
            position, starts = self.end, self.starts
            while (newline := data.find(b"\n", position, size)) >= 0:
                starts.append(position)
                position = newline + 1
            self.end = position
        return len(self.starts)

    def read(self, index: int, limit: int | None = None, *, last: bool = False) -> bytes:
        """Line ``index`` (without its newline); its first ``limit`` bytes, if given (``last``: its last ones)."""
        start = self.starts[index]
        stop = self.starts[index + 1] if index + 1 < len(self.starts) else self.end
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)  # kept: a page reads many rows of one file
        length = stop - start - 1  # an indexed line ends with its newline
        size = min(length, limit or length)
        return os.pread(self._fd, size, start + length - size if last else start)

    def read_many(self, index: int, count: int) -> list[bytes]:
        """Lines ``index`` to ``index + count`` (as far as there are), read at once."""
        stop_index = min(index + count, len(self.starts))
        if stop_index <= index:
            return []
        start = self.starts[index]
        stop = self.starts[stop_index] if stop_index < len(self.starts) else self.end
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        return os.pread(self._fd, stop - start, start).splitlines()

    def close(self) -> None:
        """Let go of the file."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@contextmanager
def _mapped(path: Path, size: int) -> Iterator[mmap.mmap]:
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_READ) as data:
        yield data


class Said(NamedTuple):
    """A message as the page shows it: its text, sender, the action that made it, a structured answer's fields."""

    text: str
    sender: str
    action: str
    fields: dict[str, Any] | None


class CassetteCalls:
    """A run's cassette (``--record``) read for its calls role by role, as far as it is written; data only.

    A file that does not begin as a cassette does (its ``run`` line) is no cassette: nothing of it is shown.
    """

    def __init__(self, path: Path | None) -> None:
        self.lines = Lines(path) if path is not None else None
        self._by_role: dict[str, list[int]] = {}
        self._indexed = 0
        self._valid: bool | None = None

    def of(self, role: str, start: int, stop: int) -> list[dict[str, Any]]:
        """``role``'s calls on the cassette in the order they were made, ``start`` to ``stop`` (at most), parsed."""
        lines = self.lines
        if lines is None or not lines.path.is_file():
            return []
        lines.refresh()
        if self._valid is None and lines.starts:
            self._valid = lines.read(0, 16).startswith(b'{"kind": "run"')
        if not self._valid:
            return []
        for index in range(self._indexed, len(lines.starts)):
            match = _TAPED_ROLE.search(lines.read(index, 200, last=True))  # the role, not the prompt
            if match is not None:
                self._by_role.setdefault(orjson.loads(match.group(1)), []).append(index)
        self._indexed = len(lines.starts)
        return [orjson.loads(lines.read(index)) for index in self._by_role.get(role, [])[start:stop]]


P = ParamSpec("P")
T = TypeVar("T")


def _one_reader(method: Callable[P, T]) -> Callable[P, T]:
    """``method`` of a :class:`Timeline`, run by one thread at a time: what it reads, it caches as it goes."""

    @functools.wraps(method)
    def locked(*args: P.args, **kwargs: P.kwargs) -> T:
        with args[0].lock:  # type: ignore[attr-defined]
            return method(*args, **kwargs)

    return locked


class Timeline:
    """A run directory's rounds, read as the run writes them (see the module).

    A page serves it from worker threads at once (a round, the series, a thread): its readers take
    :attr:`lock` in turn, as its caches (the lines indexed, the metrics) grow while they read.

    ``starting``: the run is about to write the folder (its own page): no manifest yet is no error.

    Raises:
        ConfigError: If ``run_dir`` is not a run directory, or its log is compressed (zstd: not followed).
        RunDirCorrupt: If its manifest is damaged.
    """

    def __init__(self, run_dir: Path, *, starting: bool = False) -> None:
        self.run_dir = run_dir
        self.lock = threading.RLock()
        self.manifest: dict[str, Any] = {}
        self.cassette = CassetteCalls(None)
        """The run's cassette, if its manifest names one (read when a role's model calls are shown)."""
        if not starting:
            self._read_manifest()
        self.events = Lines(run_dir / EVENTS)
        self.rows = Lines(run_dir / CHECKPOINTS / "messages.jsonl")
        self.rounds: list[int] = []
        """The rounds the log holds, in order (the idea's round 0 first)."""
        self.line_of: dict[int, int] = {}
        self._metrics: dict[int, dict[str, Any]] = {}
        self._metric_lines = Lines(run_dir / METRICS)
        self._tail_rows: tuple[int, dict[bytes, int]] = (-1, {})

    def _read_manifest(self) -> None:
        self.manifest = read_manifest(self.run_dir)
        cassette = self.manifest.get("cassette")
        self.cassette = CassetteCalls(Path(cassette) if isinstance(cassette, str) and cassette else None)
        if self.manifest.get("events") == EVENTS_ZST:
            raise ConfigError(
                f"{self.run_dir} keeps its log compressed ({EVENTS_ZST}); watch a run written without --zstd"
            )

    @_one_reader
    def refresh(self) -> list[int]:
        """Index what the run wrote since the last call; the rounds it added, in order."""
        if not self.manifest:
            if not (self.run_dir / "manifest.json").is_file():
                return []
            self._read_manifest()
        before = len(self.events.starts)
        self.events.refresh()
        added: list[int] = []
        for index in range(before, len(self.events.starts)):
            number = self._round_of(index)
            if number not in self.line_of:
                self.rounds.append(number)
                added.append(number)
            self.line_of[number] = index
        return added

    def _round_of(self, index: int) -> int:
        head = self._head(index)
        match = _HEAD.match(head)
        if match is None:
            raise RunDirCorrupt(
                f"{self.events.path}: line {index + 1} is not a round line (a log of format 2, which "
                "`metaroles run` writes); watch a run this version wrote"
            )
        return int(match.group(2))

    def _head(self, index: int) -> bytes:
        return self.events.read(index, 64)

    @_one_reader
    def line(self, number: int) -> dict[str, Any]:
        """Round ``number``'s line of the log, parsed.

        Raises:
            KeyError: If the log holds no such round (yet).
        """
        return dict(orjson.loads(self.events.read(self.line_of[number])))

    @_one_reader
    def delta(self, number: int) -> dict[str, Any]:
        """What a watcher is sent for round ``number`` (see the module).

        Only the columns it needs are read from the round's line (a society's round carries megabytes of
        recipients and caused-by ids a delta does not show): see :func:`said_columns`.
        """
        line = said_columns(self.events.read(self.line_of[number]))
        said = line.get("published", {})
        ids, senders, actions = said.get("message_id", []), said.get("role", []), said.get("cause_by", [])
        calls = line.get("llm_calls", [])
        texts = self.texts(ids[:FLOW_ROWS])
        flow = [
            [senders[i], said["to"][i], _short(actions[i]), ids[i], _cut(texts.get(ids[i]))]
            for i in range(min(len(ids), FLOW_ROWS))
        ]
        per_sender = Counter(senders)
        return {
            "round": number,
            "messages": len(ids),
            "senders": len(per_sender),
            "actions": _by_action(actions),
            "per_sender": {str(k): v for k, v in sorted(Counter(per_sender.values()).items())},
            "tokens": sum(call.get("tokens", 0) for call in calls),
            "cost": round(sum(call.get("cost", 0.0) for call in calls), 6),
            "calls": len(calls),
            "events": line.get("events", [])[:FLOW_ROWS],
            "flow": flow,
            "metrics": self.metrics().get(number, {}),
        }

    @_one_reader
    def texts(self, ids: list[str]) -> dict[str, str]:
        """The text of each of ``ids`` the message table holds (yet)."""
        return {i: said[0] for i, said in self.messages(ids).items()}

    @_one_reader
    def messages(self, ids: list[str]) -> dict[str, Said]:
        """Each of ``ids`` the message table holds (yet): its text, sender, action and a structured answer's fields.

        A message is found by bisection over the rows (ids rise with them), else among the last rows
        (one published between rounds — an injection, the idea — may be written after the round that
        follows it); the messages after it in ``ids`` are most often the rows after its row, read at once.
        """
        if not ids:
            return {}
        self.rows.refresh()
        found: dict[str, Said] = {}
        at = 0
        while at < len(ids):
            row = self._row_of(ids[at].encode())
            if row is None:
                at += 1
                continue
            for line in self.rows.read_many(row, len(ids) - at):
                entry = orjson.loads(line)
                if not (isinstance(entry, dict) and entry.get("id") == ids[at]):
                    break
                structured = entry.get("instruct_content")
                fields = structured.get("value") if isinstance(structured, dict) else None
                found[ids[at]] = Said(
                    str(entry.get("content", "")),
                    str(entry.get("sent_from", "")),
                    _short(str(entry.get("cause_by", ""))),
                    fields if isinstance(fields, dict) else None,
                )
                at += 1
                if at == len(ids):
                    break
        return found

    def _row_of(self, key: bytes) -> int | None:
        """The row of the message whose id is ``key`` (see :meth:`texts`).

        A message not in the table yet (its checkpoint is still to come) costs a dict lookup: its
        id is past the last row's, and not among the last rows.
        """
        tail = self._tail()
        if key in tail:
            return tail[key]
        count = len(self.rows.starts)
        if count == 0 or key > self._row_id(count - 1):
            return None
        return self._bisect(key)

    def _tail(self) -> dict[bytes, int]:
        """The ids of the table's last :data:`TAIL_ROWS` rows, by id (read again when the table grew)."""
        count = len(self.rows.starts)
        if self._tail_rows[0] != count:
            first = max(count - TAIL_ROWS, 0)
            self._tail_rows = (count, {self._row_id(i): i for i in range(first, count)})
        return self._tail_rows[1]

    def _bisect(self, key: bytes) -> int | None:
        low, high = 0, len(self.rows.starts)
        while low < high:
            middle = (low + high) // 2
            row_id = self._row_id(middle)
            if row_id == key:
                return middle
            if row_id < key:
                low = middle + 1
            else:
                high = middle
        return None

    def _row_id(self, index: int) -> bytes:
        match = _ROW_ID.match(self.rows.read(index, 80))
        return match.group(1) if match else b""

    @_one_reader
    def metrics(self) -> dict[int, dict[str, Any]]:
        """The scenario's figures by round (``metrics.jsonl``), as far as the run wrote them."""
        before = len(self._metric_lines.starts)
        for index in range(before, self._metric_lines.refresh()):
            try:
                row = orjson.loads(self._metric_lines.read(index))
            except orjson.JSONDecodeError:
                continue
            if isinstance(row, dict) and type(row.get("round")) is int:
                self._metrics[row["round"]] = {k: v for k, v in row.items() if k != "round"}
        return self._metrics

    @_one_reader
    def network(self, through: int, most: int = NETWORK_ROLES) -> dict[str, Any]:
        """Who sent how many messages to whom up to round ``through``, among the ``most`` most active roles.

        ``nodes``: the roles drawn with the messages each sent and received; ``edges``: ``[from, to,
        count]``; ``roles``: how many took part in all (a society past ``most`` is shown by its busiest).
        """
        pairs: Counter[tuple[str, str]] = Counter()
        for number in (r for r in self.rounds if r <= through):
            published = self.line(number).get("published") or {}
            for sender, recipients in zip(published.get("role", ()), published.get("to", ()), strict=False):
                pairs.update((sender, to) for to in recipients if to != sender)
        activity: Counter[str] = Counter()
        for (sender, to), count in pairs.items():
            activity[sender] += count
            activity[to] += count
        drawn = {name for name, _ in sorted(activity.items(), key=lambda item: (-item[1], item[0]))[:most]}
        return {
            "round": through,
            "roles": len(activity),
            "nodes": sorted(drawn),
            "edges": sorted([a, b, n] for (a, b), n in pairs.items() if a in drawn and b in drawn),
        }

    @_one_reader
    def thread(self, root: str, most: int = THREAD_ROWS) -> dict[str, Any]:
        """Message ``root`` and what it caused, and what that caused…, in the order they were published.

        ``messages``: ``[id, round, sender, action, text, caused_by]`` each (``caused_by``: the earlier
        messages of the thread it answers); at most ``most`` of them.

        Raises:
            KeyError: If no round holds ``root``.
        """
        chosen: dict[str, list[Any]] = {}
        for number in self.rounds:
            published = self.line(number).get("published") or {}
            causes = published.get("caused_by") or [[] for _ in published.get("message_id", ())]
            for i, message in enumerate(published.get("message_id", ())):
                if len(chosen) < most and (message == root or any(c in chosen for c in causes[i])):
                    action = _short(str(published["cause_by"][i]))
                    chosen[message] = [
                        message,
                        number,
                        published["role"][i],
                        action,
                        [c for c in causes[i] if c in chosen],
                    ]
        if root not in chosen:
            raise KeyError(root)
        texts = self.texts(list(chosen))
        return {"root": root, "messages": [[*row[:4], texts.get(row[0]), row[4]] for row in chosen.values()]}

    @_one_reader
    def series(self) -> dict[str, Any]:
        """The scenario's numeric figures by round: ``rounds``, and per figure its value in each (or ``None``)."""
        by_round = self.metrics()
        rounds = sorted(by_round)
        names = sorted({k for row in by_round.values() for k, v in row.items() if _number(v)})
        values = {n: [v if _number(v := by_round[r].get(n)) else None for r in rounds] for n in names}
        return {"rounds": rounds, "series": values}

    @_one_reader
    def role(self, name: str, through: int, limit: int = 50) -> dict[str, Any]:
        """Role ``name`` as it stood at the end of round ``through``: its todo, news, what it said and was sent.

        Raises:
            KeyError: If ``name`` appears in no round up to ``through`` (no such role).
        """
        said: list[str] = []
        sent: list[str] = []
        news: list[str] | None = None
        todo = ""
        seen = False
        for number in reversed([r for r in self.rounds if r <= through]):
            line = self.line(number)
            seen, todo, news = _turn_of(line, name, seen, todo, news)
            published = line.get("published", {})
            for i, sender in enumerate(published.get("role", [])):
                if sender == name and len(said) < limit:
                    said.append(published["message_id"][i])
                    seen = True
                elif name in published["to"][i] and len(sent) < limit:
                    sent.append(published["message_id"][i])
                    seen = True
            if len(said) >= limit and len(sent) >= limit and news is not None:
                break
        if not seen:
            raise KeyError(name)
        known = self.messages([*said, *sent, *(news or [])])

        def shown(i: str) -> list[Any]:
            return [i, *known.get(i, ("", "", "", None))]  # id, text, sender, action, fields

        return {
            "role": name,
            "round": through,
            "todo": todo,
            "news": [shown(i) for i in news or []],
            "said": [shown(i) for i in said],
            "memory": [shown(i) for i in sorted({*said, *sent})[-limit:]],
            "calls": self.calls(name, through),
        }

    @_one_reader
    def calls(self, name: str, through: int, most: int = CALL_ROWS) -> dict[str, Any]:
        """Role ``name``'s model calls up to round ``through``: how many, and the newest ``most`` of them.

        Each is its round, action, model, tokens and cost (the log's); with the run's cassette, its
        prompt (the messages sent) and its answer too — the role's k-th call on the cassette, shown only
        if its tokens are the log's (a cassette recorded over a resumed run may hold a call twice).
        """
        mine: list[dict[str, Any]] = []
        for number in (r for r in self.rounds if r <= through):
            for call in said_columns(self.events.read(self.line_of[number])).get("llm_calls") or ():
                if isinstance(call, dict) and call.get("role") == name:
                    mine.append({"round": number, **{k: call.get(k) for k in ("action", "model", "tokens", "cost")}})
        first = max(len(mine) - most, 0)
        for row, entry in zip(mine[first:], self.cassette.of(name, first, len(mine)), strict=False):
            response = entry.get("response") or {}
            usage = response.get("usage") or {}
            if usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0) == row["tokens"]:
                row["prompt"] = (entry.get("request") or {}).get("messages") or []
                row["answer"] = response.get("text") or orjson.dumps(response.get("tool_calls")).decode()
        return {"count": len(mine), "calls": mine[first:]}


_LISTED = re.compile(rb"\[([^\[\]]*)\]")
_TAIL = (b',"llm_calls":[', b',"events":[', b',"parts":[')


def said_columns(line: bytes) -> dict[str, Any]:
    """The parts of a round line a delta shows, read by themselves; the whole line parsed if it is not as written.

    The published ``role``, ``message_id`` and ``cause_by`` whole, ``to`` for the first
    :data:`FLOW_ROWS` messages, and the model calls and events.
    """
    start, at = line.find(b',"published":{'), line.rfind(b'"to":[') + 6  # "to": the published columns' last
    tails = [i for i in (line.find(key, at) for key in _TAIL) if i >= 0]
    if start < 0 or at < start:
        return dict(orjson.loads(line))
    try:
        said = {key: _flat(line, key, start) for key in ("role", "message_id", "cause_by")}
        first = itertools.islice(_LISTED.finditer(line, at), min(FLOW_ROWS, len(said["message_id"])))
        said["to"] = [orjson.loads(b"[" + match.group(1) + b"]") for match in first]
        rest = orjson.loads(b"{" + line[min(tails) + 1 :]) if tails else {}
    except (ValueError, orjson.JSONDecodeError):
        return dict(orjson.loads(line))
    return {"published": said, **rest}


def _flat(line: bytes, key: str, start: int) -> list[str]:
    """A published column of names or ids (no list inside), read by itself."""
    at = line.index(b'"' + key.encode() + b'":[', start) + len(key) + 3
    return list(orjson.loads(line[at : line.index(b"]", at) + 1]))


def _turn_of(
    line: dict[str, Any], name: str, seen: bool, todo: str, news: list[str] | None
) -> tuple[bool, str, list[str] | None]:
    """The role's latest think (its todo) and observe (its news) in a round line, if not found later already."""
    steps = line.get("steps", {})
    for kind, role, detail in zip(steps.get("kind", []), steps.get("role", []), steps.get("detail", []), strict=False):
        if role != name:
            continue
        seen = True
        if kind == "think" and not todo:
            todo = _short(detail[0]) if detail else ""
        elif kind == "observe" and news is None:
            news = list(detail)
    return seen, todo, news


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value  # not NaN


def _by_action(actions: list[str]) -> dict[str, int]:
    """How many messages each action made (by its class name), most first."""
    counts: Counter[str] = Counter()
    for action, count in Counter(actions).items():
        counts[_short(action)] += count
    return dict(counts.most_common())


def _cut(text: str | None) -> str | None:
    """A message's text as a delta carries it (``None``: not in the message table until the next checkpoint)."""
    return None if text is None else text[:TEXT_CHARS]


def _short(action: str) -> str:
    """An action's class name (``metaroles.actions.debate.SpeakAloud`` → ``SpeakAloud``)."""
    return action.rpartition(".")[2] or "message"


def bisect_round(rounds: list[int], number: int) -> int:
    """The last of ``rounds`` at or before ``number`` (a page's scrub lands on a round the log holds)."""
    index = bisect_right(rounds, number)
    return rounds[max(index - 1, 0)]
