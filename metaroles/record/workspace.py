"""A scenario's workspace (the files its actions write), kept with the checkpoints.

Before a round's checkpoint is written, the workspace's files are recorded in
``checkpoints/workspace-NNNN.json`` (relative path → SHA-256), when they changed since the last
listing, and each new content once in ``checkpoints/blobs/``. The round's checkpoint file comes
after, so a checkpoint never claims a workspace that was not kept. Resume and fork then make the
workspace hold exactly the files of the newest listing up to their round: a resumed run does not
see what a killed round half wrote, and a fork starts from its parent's files of the fork round,
in a workspace of its own.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from metaroles.core import confined
from metaroles.core.exceptions import RunDirCorrupt
from metaroles.core.files import read_text, write_atomic
from metaroles.record.numbering import numbered

Files = dict[str, str]
"""Relative path → SHA-256 of its content."""


def _listing(folder: Path, round_no: int) -> Path:
    return folder / f"workspace-{round_no:04d}.json"


def current_files(workspace: Path) -> Files:
    """The workspace's regular files now, by relative path, with the hash of each (links are not followed)."""
    return {
        relative: _digest(confined.read_bytes(workspace, relative))
        for relative, regular in confined.entries(workspace)
        if regular and not relative.endswith(".tmp")
    }


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def keep(workspace: Path, folder: Path, round_no: int, last: Files | None) -> Files:
    """Record the workspace for the checkpoint of ``round_no`` (if it changed since ``last``); return it."""
    files = current_files(workspace)
    if files == last:
        return files
    for relative, digest in files.items():
        blob = folder / "blobs" / digest
        if not blob.exists():
            write_atomic(blob, confined.read_bytes(workspace, relative))
    write_atomic(_listing(folder, round_no), json.dumps(files, sort_keys=True, indent=0) + "\n")
    return files


def recorded(folder: Path, round_no: int) -> Files | None:
    """The files recorded for the newest checkpoint up to ``round_no`` (``None`` when none was kept).

    Raises:
        RunDirCorrupt: If that listing is damaged.
    """
    listings = [p for n, p in numbered(folder, "workspace") if n <= round_no]
    if not listings:
        return None
    try:
        files = json.loads(read_text(listings[-1]))
    except ValueError:
        raise RunDirCorrupt(f"{listings[-1]}: not a workspace listing; the file is damaged") from None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise RunDirCorrupt(f"{listings[-1]}: not a workspace listing; the file is damaged")
    return files


def restore(workspace: Path, folder: Path, round_no: int) -> Files | None:
    """Make ``workspace`` hold the files recorded up to ``round_no``; drop later listings of ``folder``.

    Returns the files restored (``None``, and the workspace untouched, when nothing was recorded).
    """
    files = recorded(folder, round_no)
    if files is None:
        return None
    write_files(workspace, folder, files)
    return files


def write_files(workspace: Path, folder: Path, files: Files) -> None:
    """Make ``workspace`` hold exactly ``files``, their contents from ``folder``'s blobs.

    Whatever else is there goes — a half-written file, a link or a FIFO that code run in the
    workspace left, a folder swapped for a link — and nothing is written through a link: the
    workspace becomes the checkpoint's, not what is on disk.
    """
    missing = [d for d in files.values() if not (folder / "blobs" / d).is_file()]
    if missing:
        raise RunDirCorrupt(f"{folder / 'blobs'}: the workspace content {missing[0]} is missing; the folder is damaged")
    present = list(confined.entries(workspace))  # one walk; only the files the listing keeps are read
    have = {r: _digest(confined.read_bytes(workspace, r)) for r, regular in present if regular and r in files}
    for relative, regular in present:
        if not regular or relative not in files or files[relative] != have.get(relative):
            confined.unlink(workspace, relative)
    for relative, digest in files.items():
        if have.get(relative) != digest:
            confined.unlink(workspace, relative)  # an empty folder in its place
            write_atomic(workspace / relative, (folder / "blobs" / digest).read_bytes(), beneath=workspace)


def drop_after(folder: Path, round_no: int) -> None:
    """Remove the workspace listings past ``round_no`` (a resumed run records them again)."""
    for number, path in numbered(folder, "workspace"):
        if number > round_no:
            path.unlink()
