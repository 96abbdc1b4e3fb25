"""Durable file writes: a file replaced atomically, or text appended and synced.

A crash (even SIGKILL) leaves either the old file or the new one, never half of it; an append
returns only once the text is on disk.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, text: str) -> Path:
    """Replace ``path`` with ``text``: temp file, fsync, rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return path


def append_durably(path: Path, text: str) -> None:
    """Append ``text`` to ``path`` and fsync it."""
    with path.open("a", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
