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
from collections.abc import Callable
from importlib import metadata
from typing import Any, TypeVar

__all__ = ["entry_points", "version"]

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
