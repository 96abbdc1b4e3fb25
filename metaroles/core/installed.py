"""What is installed: entry points and package versions, read once per state of the import path.

``importlib.metadata`` reads every installed distribution's files on each call: ~10 ms for the
entry points of a venv like ours, ~1.5 ms per version. A run asks for both (its scenario by name,
its manifest's provenance), so a sweep of short runs in one process paid that again for every
trial. The answers are kept until a folder on ``sys.path`` changes — installing or removing a
package touches its ``site-packages`` folder — or the path itself does.

The git revision of the working folder (a manifest records it) is read from the repository's
files, as ``git rev-parse HEAD`` finds it, instead of starting ``git`` for every run (~4 ms each).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["entry_points", "git_revision", "version"]

_T = TypeVar("_T")
_Key = tuple[tuple[str, int], ...]
_seen: dict[str, tuple[_Key, Any]] = {}
"""Per question (an entry-point group, a version): the import path's state it was answered in, and the answer."""


def _path_state() -> _Key:
    """Each folder on ``sys.path`` with its modification time (``-1``: missing)."""
    state = []
    for folder in sys.path:
        try:
            state.append((folder, os.stat(folder or ".").st_mtime_ns))
        except OSError:
            state.append((folder, -1))
    return tuple(state)


def _answer(question: str, read: Callable[[], _T]) -> _T:
    """``read()``'s answer to ``question``, read again only when the import path changed since."""
    key = _path_state()
    known = _seen.get(question)
    if known is None or known[0] != key:
        known = _seen[question] = (key, read())
    answer: _T = known[1]
    return answer


def entry_points(group: str) -> tuple[metadata.EntryPoint, ...]:
    """The installed entry points of ``group``, in ``importlib.metadata``'s order."""
    return _answer(f"group:{group}", lambda: tuple(metadata.entry_points(group=group)))


def version(name: str) -> str | None:
    """The installed version of distribution ``name``, or ``None`` if it is not installed."""

    def read() -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return _answer(f"version:{name}", read)


_SHA = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")


def git_revision(folder: Path | None = None) -> str | None:
    """The commit checked out in the git repository holding ``folder`` (default: the working folder), or ``None``.

    ``None`` outside a repository and on a branch with no commit yet, as ``git rev-parse HEAD`` says.
    Read from ``HEAD``, the branch's ref file or ``packed-refs`` (worktrees included); a layout it
    does not know, or ``GIT_DIR`` set, asks ``git`` itself.
    """
    try:
        start = (folder or Path.cwd()).resolve()
        found = next((place / ".git" for place in (start, *start.parents) if (place / ".git").exists()), None)
    except OSError:  # the working folder was deleted, or a parent cannot be read
        return None
    if found is None or "GIT_DIR" in os.environ:
        return None if found is None else _rev_parse(start)
    try:
        gitdir = found if found.is_dir() else _pointed(found, "gitdir:")
        common = (gitdir / (gitdir / "commondir").read_text().strip()) if (gitdir / "commondir").is_file() else gitdir
        head = (gitdir / "HEAD").read_text().strip()
        if not head.startswith("ref:"):
            return head if _SHA.fullmatch(head) else _rev_parse(start)
        ref = head[4:].strip()
        for base in (gitdir, common):
            if (base / ref).is_file():
                sha = (base / ref).read_text().strip()
                return sha if _SHA.fullmatch(sha) else _rev_parse(start)
        packed = common / "packed-refs"
        lines = packed.read_text().splitlines() if packed.is_file() else []
        return next((line[:40] for line in lines if line.endswith(" " + ref) and _SHA.match(line)), None)
    except (OSError, UnicodeDecodeError, ValueError):
        return _rev_parse(start)


def _pointed(file: Path, prefix: str) -> Path:
    """The folder a ``.git`` file points to (``gitdir: PATH``, relative to the file's folder)."""
    text = file.read_text().strip()
    if not text.startswith(prefix):
        raise ValueError(f"{file} does not start with {prefix!r}")
    return file.parent / text[len(prefix) :].strip()


def _rev_parse(folder: Path) -> str | None:
    try:
        found = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if found.returncode != 0:
        return None
    return found.stdout.strip() or None
