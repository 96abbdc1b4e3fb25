"""Going on from a run's checkpoints: a resume in its folders, a fork into new ones (``Team.resume``, ``fork``).

Each restores the environment, checks what must hold before anything on disk changes, puts the
workspace's files back as they were at the restored round, and gives the checkpoint writer the
run goes on with.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from warnings import warn

from metaroles.bus.environment import Environment
from metaroles.record import workspace
from metaroles.record.checkpoint import CheckpointWriter, fresh_writer
from metaroles.record.eventlog import check_log, copy_events
from metaroles.record.restore import restore_checkpoint


def resumed(
    env: Environment,
    folder: str | Path,
    *,
    events: str | Path | None,
    check: Callable[[int], None] | None,
    files: Path | None,
) -> tuple[CheckpointWriter, workspace.Files | None]:
    """Restore ``env`` from its last complete checkpoint; the writer that goes on alike, and the files kept.

    ``files`` is the team's workspace, if any: it gets the files of the restored round back.
    """
    checkpoints = Path(folder)
    restored = restore_checkpoint(checkpoints, env)
    if events is not None:
        check_log(Path(events), restored.round)  # before anything on disk changes
    if check is not None:
        check(restored.round)
    kept = workspace.recorded(checkpoints, restored.round) if files is not None else None
    writer = CheckpointWriter(checkpoints, restored=restored)
    if files is not None and kept is not None:
        workspace.write_files(files, checkpoints, kept)  # not what a killed round half wrote
        workspace.drop_after(checkpoints, restored.round)
    writer.continue_after(env, restored)
    return writer, kept


def forked(
    env: Environment,
    parent: str | Path,
    from_round: int,
    checkpoints: str | Path,
    *,
    events: str | Path | None,
    parent_events: str | Path | None,
    files: Path | None,
) -> CheckpointWriter:
    """Restore ``env`` from ``parent``'s checkpoint at ``from_round`` (or the last before); a writer for the branch."""
    writer = fresh_writer(Path(checkpoints))
    restored = restore_checkpoint(Path(parent), env, through_round=from_round)
    if restored.round != from_round:
        warn(f"the parent has no checkpoint of round {from_round}; forking from {restored.round}", stacklevel=3)
    kept = workspace.recorded(Path(parent), restored.round) if files is not None else None
    if events is not None and parent_events is not None:
        copy_events(Path(parent_events), Path(events), through_round=restored.round)
    if files is not None and kept is not None:
        workspace.write_files(files, Path(parent), kept)  # the parent's files at the fork round
    return writer
