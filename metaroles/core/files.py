"""Durable file writes: a file replaced atomically, or text appended and synced.

A crash (even SIGKILL) leaves either the old file or the new one, never half of it; an append
returns only once the text is on disk. Each write passes named points (``replace:NAME`` before
the rename, ``append:NAME`` before an append); ``fault_hook``, ``None`` outside the fault tests,
is called there so a test can kill the process at that exact instant.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from metaroles.core.exceptions import RunDirCorrupt

fault_hook: Callable[[str], None] | None = None
"""Tests only: called with the name of each write point reached (see the module docstring)."""


def reached(point: str) -> None:
    """Pass the write point ``point`` (a no-op unless a fault test installed :data:`fault_hook`)."""
    if fault_hook is not None:
        fault_hook(point)


def read_text(path: Path) -> str:
    """The UTF-8 text of a run-directory file.

    Raises:
        RunDirCorrupt: Naming the file and the first line that is not UTF-8.
    """
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise RunDirCorrupt(f"{path}: line {line} is not UTF-8 text; the file is damaged") from None


def sync_dir(folder: Path) -> None:
    """Make a rename or a new file in ``folder`` survive a power cut (fsync the directory)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str | bytes) -> Path:
    """Replace ``path`` with ``text`` (UTF-8) or bytes: temp file, fsync, rename, fsync of the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode("utf-8") if isinstance(text, str) else text)
            handle.flush()
            os.fsync(handle.fileno())
        reached(f"replace:{path.name}")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    sync_dir(path.parent)
    return path


def append_durably(path: Path, text: str) -> None:
    """Append ``text`` to ``path`` and fsync it."""
    reached(f"append:{path.name}")
    with path.open("a", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def truncate_lines(path: Path, count: int) -> None:
    """Keep the first ``count`` lines of ``path`` (drops rows no kept checkpoint refers to)."""
    if not path.exists():
        path.write_bytes(b"")
        return
    data = path.read_bytes()
    end = 0
    for _ in range(count):
        end = data.index(b"\n", end) + 1
    with path.open("r+b") as handle:
        handle.truncate(end)
        handle.flush()
        os.fsync(handle.fileno())
