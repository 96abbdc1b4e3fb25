"""The final ``state.json`` of a run: the whole state, or for a large run a reference to its last checkpoint.

A run of more than :data:`STATE_LIMIT` messages or roles has just written a checkpoint of its last round,
which holds everything ``state.json`` would (and :func:`~metaroles.record.restore.restore_checkpoint`
rebuilds the environment from it), so its ``state.json`` names that checkpoint instead of writing
hundreds of megabytes again::

    {"kind": "checkpoint_reference", "round": 100, "checkpoint": "checkpoints/round-0100.json", "messages": 1000001}

``metaroles show``, ``diff`` and ``graph`` read either form.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from metaroles.bus.environment import Environment
from metaroles.bus.state import STATE_REFERENCE
from metaroles.core.exceptions import RunDirCorrupt
from metaroles.core.files import write_atomic
from metaroles.record.checkpoint import CheckpointWriter
from metaroles.record.numbering import round_file

STATE_LIMIT = 10_000
"""A run of more messages, or more roles, than this refers to its last checkpoint from ``state.json``."""


def refers_to_checkpoint(env: Environment, checkpoints: CheckpointWriter | None) -> bool:
    """Whether ``state.json`` names the checkpoint ``checkpoints`` just wrote (a large run) instead of all.

    Large: more than :data:`STATE_LIMIT` messages, or roles (a population's not built yet among them:
    writing them all would build each one).
    """
    large = len(env.history) > STATE_LIMIT or len(env.roles) > STATE_LIMIT
    return checkpoints is not None and checkpoints.round == env.round and large


def save_state(env: Environment, path: Path, checkpoints: CheckpointWriter | None, *, whole: bool = False) -> Path:
    """Write ``env``'s final state to ``path``; a reference if ``checkpoints`` just wrote this round of a large run.

    ``whole``: the whole state in any case (a failed run's last checkpoint is not this state). The names of
    the round files ``checkpoints`` wrote are synced with the file, in one wait for the disk.
    """
    names: list[Path] = []
    if checkpoints is not None:
        checkpoints.sync_names(by=names)
    if checkpoints is None or whole or not refers_to_checkpoint(env, checkpoints):
        return env.save(path, after=names)
    target = os.path.relpath(round_file(checkpoints.folder, env.round), path.parent)
    reference = {"kind": STATE_REFERENCE, "round": env.round, "checkpoint": target, "messages": len(env.history)}
    return write_atomic(path, json.dumps(reference) + "\n", after=names)


def referenced_checkpoint(path: Path) -> tuple[Path, int] | None:
    """The checkpoint file and round that the ``state.json`` at ``path`` refers to; ``None`` if it is a whole state.

    Raises:
        RunDirCorrupt: If it is a reference whose checkpoint is missing.
    """
    with path.open("rb") as handle:
        head = handle.read(64)
    if STATE_REFERENCE.encode() not in head:
        return None
    try:
        record = json.loads(path.read_bytes())
        target, round_no = path.parent / record["checkpoint"], int(record["round"])
    except (ValueError, KeyError, TypeError):
        raise RunDirCorrupt(f"{path}: a damaged reference to a checkpoint; restore it from a copy of the run") from None
    if not target.is_file():
        raise RunDirCorrupt(
            f"{path} refers to the checkpoint {target}, which is missing; the run's final state is lost with it — "
            "restore the checkpoints folder, or fork from an earlier round (metaroles fork DIR --from-round N)"
        )
    return target, round_no
