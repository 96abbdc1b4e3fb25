"""A run's events as a table of a row per event: JSON lines or Parquet (``metaroles export``).

The log holds a line per round (``record.eventlog``); a table of a row per event is what pandas,
polars and DuckDB read fastest, and what a log of format 1 was. The events are the ones
:func:`~metaroles.record.eventread.read_events` gives, numbers and latencies included, read a round
at a time (:func:`~metaroles.record.eventread.iter_rounds`), so a log of any size exports in the
memory of one round. The file appears whole or not at all (written beside it, then renamed).

Parquet needs pyarrow (the ``analysis`` extra). Its columns are :data:`COLUMNS`; an event's other
fields (an agent's tool steps carry their own) go into ``fields``, as JSON.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import orjson

from metaroles.core.exceptions import ConfigError
from metaroles.record.eventread import Event, iter_rounds

ExportFormat = Literal["jsonl", "parquet"]
COLUMNS: dict[str, str] = {
    "seq": "int64",
    "round": "int64",
    "kind": "string",
    "role": "string",
    "message_id": "string",
    "cause_by": "string",
    "send_to": "list",
    "caused_by": "list",
    "message_ids": "list",
    "action": "string",
    "model": "string",
    "tokens": "int64",
    "cost": "float64",
    "prompt_tokens": "int64",
    "completion_tokens": "int64",
    "latency_s": "float64",
    "detail": "string",
}
"""The Parquet table's columns (besides ``fields``) and their types: an event lacking one holds null there."""


def export_events(log: Path, target: Path, how: ExportFormat) -> int:
    """Write the events of the log at ``log`` into ``target`` as ``how``; return how many were written.

    Raises:
        ConfigError: For Parquet without pyarrow, saying how to install it.
        RunDirCorrupt: If the log is damaged (named by file and line).
    """
    rounds = iter_rounds(log)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    try:
        count = _parquet(rounds, partial) if how == "parquet" else _jsonl(rounds, partial)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return count


def _jsonl(rounds: Iterator[list[Event]], path: Path) -> int:
    count = 0
    with path.open("wb") as file:
        for chunk in rounds:
            file.write(b"".join(orjson.dumps(event, option=orjson.OPT_APPEND_NEWLINE) for event in chunk))
            count += len(chunk)
    return count


def _parquet(rounds: Iterator[list[Event]], path: Path) -> int:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("exporting Parquet needs pyarrow: pip install 'metaroles[analysis]'") from None
    types = {"int64": pa.int64(), "float64": pa.float64(), "string": pa.string(), "list": pa.list_(pa.string())}
    schema = pa.schema([*((name, types[kind]) for name, kind in COLUMNS.items()), ("fields", pa.string())])
    count = 0
    with pq.ParquetWriter(path, schema) as writer:
        for chunk in rounds:
            writer.write_table(pa.table(_columns(chunk), schema=schema))
            count += len(chunk)
    return count


def _columns(chunk: list[Event]) -> dict[str, list[Any]]:
    """The table's columns for ``chunk``; each event's fields outside :data:`COLUMNS` as JSON in ``fields``."""
    columns: dict[str, list[Any]] = {name: [event.get(name) for event in chunk] for name in COLUMNS}
    columns["fields"] = [
        json.dumps(rest) if (rest := {k: v for k, v in event.items() if k not in COLUMNS}) else None for event in chunk
    ]
    return columns
