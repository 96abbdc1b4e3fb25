"""A sharded round's checkpoint: each shard writes its roles' part, then the driver writes the round's file.

Each shard keeps a :class:`~metaroles.record.checkpoint.CheckpointWriter` of its own over its own
roles, in a folder of its own under the run's checkpoints (``parts/SSSS-K``: the round the sharded
stretch of the run started from, and the shard), so a round costs each shard what changed on it
and nothing crosses to the driver but the folder's name. The driver's file, written last, holds
the environment (the history as the rows it grew by), the roles pinned to the driver and the
names of the parts; a round is complete once that file exists. A restore reads the driver's
chain, then each part's chain up to the same round (``record.restore``); shards are no part of the
run, so a run resumes or forks on any number of them (the next stretch writes new parts, full
first).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from metaroles.messages.message import Message
from metaroles.record.checkpoint import CheckpointWriter

PARTS = "parts"
"""The folder, inside the run's checkpoints, of the shards' parts."""


def part_name(segment: int, shard: int) -> str:
    """The folder (relative to the checkpoints) of ``shard``'s part in the stretch started at round ``segment``."""
    return f"{PARTS}/{segment:04d}-{shard}"


def part_writer(folder: Path, known: Mapping[str, Message]) -> CheckpointWriter:
    """A shard's writer for its part: a fresh folder (what an earlier attempt of this stretch left is dropped).

    ``known`` are the messages of the driver's history (by id) that the shard has seen: its rows
    name them by id (``{"ref": id}``), so a message is written once, in the driver's table.
    """
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("round-*.json"):
        stale.unlink()
    return CheckpointWriter(folder, replay=False, known=known, each_name=True)  # the driver's file names it
