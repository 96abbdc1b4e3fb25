"""Files of a run directory named by round: ``round-NNNN.json`` (checkpoints), ``workspace-NNNN.json``.

A name whose NNNN is not a number is none of them: readers pass it by, and a resume refuses the
folder (``rundir.check_run_dir``) rather than guess.
"""

from __future__ import annotations

from pathlib import Path


def round_file(folder: Path, round_no: int) -> Path:
    """The checkpoint file of ``round_no`` in ``folder``."""
    return folder / f"round-{round_no:04d}.json"


def numbered(folder: Path, kind: str) -> list[tuple[int, Path]]:
    """The files ``KIND-NNNN.json`` of ``folder`` by round, in order; a name whose NNNN is not a number is not one."""
    found = []
    for path in folder.glob(f"{kind}-*.json"):
        number = path.stem[len(kind) + 1 :]
        if number.isascii() and number.isdigit():
            found.append((int(number), path))
    return sorted(found)
