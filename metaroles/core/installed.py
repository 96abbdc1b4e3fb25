"""What is installed: entry points and package versions, read once per state of the import path.

``importlib.metadata`` reads every installed distribution's files on each call: ~10 ms for the
entry points of a venv like ours, ~1.5 ms per version. A run asks for both (its scenario by name,
its manifest's provenance), so a sweep of short runs in one process paid that again for every
trial. The answers are kept until a folder on ``sys.path`` changes — installing or removing a
package touches its ``site-packages`` folder — or the path itself does.
"""

from __future__ import annotations

import os
import sys
from importlib import metadata

__all__ = ["entry_points", "version"]

_Key = tuple[tuple[str, int], ...]
_seen: dict[str, tuple[_Key, object]] = {}
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


def entry_points(group: str) -> tuple[metadata.EntryPoint, ...]:
    """The installed entry points of ``group``, in ``importlib.metadata``'s order."""
    key, question = _path_state(), f"group:{group}"
    known = _seen.get(question)
    if known is None or known[0] != key:
        known = _seen[question] = (key, tuple(metadata.entry_points(group=group)))
    return known[1]  # type: ignore[return-value]


def version(name: str) -> str | None:
    """The installed version of distribution ``name``, or ``None`` if it is not installed."""
    key, question = _path_state(), f"version:{name}"
    known = _seen.get(question)
    if known is None or known[0] != key:
        try:
            found: str | None = metadata.version(name)
        except metadata.PackageNotFoundError:
            found = None
        known = _seen[question] = (key, found)
    return known[1]  # type: ignore[return-value]
