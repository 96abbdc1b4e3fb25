"""Durable file writes: a file replaced atomically, or text appended and synced.

A crash (even SIGKILL) leaves either the old file or the new one, never half of it; an append
returns only once the text is on disk. Each write passes named points (``replace:NAME`` before
the rename, ``append:NAME`` before an append); ``fault_hook``, ``None`` outside the fault tests,
is called there so a test can kill the process at that exact instant.

A file whose name ends in ``.zst`` is zstd-compressed (the ``zstd`` extra): an append adds one
frame, a replacement writes one, and reading joins the frames — a torn last frame, a crash
mid-append, is left out as a torn last line is. ``zstandard`` is imported only then.

Inside :func:`syncs_deferred` nothing waits for the disk: writes are made as above (a killed
process still leaves old or new files, never torn ones, since what it wrote is the kernel's), and
every file and folder that would have been synced is synced once, together, on leaving. A power
cut before that may leave any of them torn; the caller marks the folder (``record.durability``).
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from itertools import islice
from pathlib import Path
from typing import IO, Any

from metaroles.core import confined
from metaroles.core.exceptions import ConfigError, RunDirCorrupt

ZSTD = ".zst"
"""The suffix of a zstd-compressed file."""

NAMES_A_FILE = "names a file"
"""Marks a config field whose value is a path (``Annotated[str, NAMES_A_FILE]``): a server that runs
configs for others (``metaroles mcp``) resolves it inside its root."""

fault_hook: Callable[[str], None] | None = None
"""Tests only: called with the name of each write point reached (see the module docstring)."""


def reached(point: str) -> None:
    """Pass the write point ``point`` (a no-op unless a fault test installed :data:`fault_hook`)."""
    if fault_hook is not None:
        fault_hook(point)


def zstandard() -> Any:
    """The ``zstandard`` module (the ``zstd`` extra).

    Raises:
        ConfigError: If it is not installed, saying how to install it.
    """
    try:
        import zstandard
    except ImportError:
        raise ConfigError("a compressed event log (.zst) needs the zstd extra: pip install 'metaroles[zstd]'") from None
    return zstandard


def encoded(path: Path, text: str | bytes) -> bytes:
    """``text`` as ``path`` stores it: UTF-8, as one checksummed zstd frame if its name ends in ``.zst``."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    if path.suffix != ZSTD:
        return data
    return bytes(zstandard().ZstdCompressor(level=3, write_content_size=True, write_checksum=True).compress(data))


def read_bytes(path: Path) -> bytes:
    """The bytes of ``path``, its frames joined if compressed (a torn last frame left out).

    Raises:
        RunDirCorrupt: If compressed data is damaged (not a torn tail).
    """
    data = path.read_bytes()
    if path.suffix != ZSTD:
        return data
    zstd = zstandard()
    decompressor, out, at = zstd.ZstdDecompressor(), [], 0
    while data:
        frame = decompressor.decompressobj()
        try:
            out.append(frame.decompress(data))
        except zstd.ZstdError as exc:
            raise RunDirCorrupt(f"{path}: the compressed data is damaged after byte {at} ({exc})") from None
        if not frame.eof:
            break  # a frame cut short: a crash mid-append
        at += len(data) - len(frame.unused_data)
        data = frame.unused_data
    return b"".join(out)


def iter_lines(path: Path) -> Iterator[bytes]:
    """The lines of ``path`` as bytes, one at a time (a compressed file is read as a stream)."""
    with path.open("rb") as handle:
        if path.suffix != ZSTD:
            yield from handle
            return
        zstd = zstandard()
        reader = io.BufferedReader(zstd.ZstdDecompressor().stream_reader(handle, read_across_frames=True))
        try:
            yield from reader
        except zstd.ZstdError as exc:
            raise RunDirCorrupt(f"{path}: the compressed data is damaged ({exc})") from None


def read_text(path: Path) -> str:
    """The UTF-8 text of a run-directory file (decompressed if its name ends in ``.zst``).

    Raises:
        RunDirCorrupt: Naming the file and the first line that is not UTF-8.
    """
    data = read_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise RunDirCorrupt(f"{path}: line {line} is not UTF-8 text; the file is damaged") from None


_DEFERRED: ContextVar[dict[Path, bool] | None] = ContextVar("metaroles_deferred_syncs", default=None)
"""Inside :func:`syncs_deferred`: the files (``False``) and folders (``True``) to sync on leaving, in order."""


@contextmanager
def syncs_deferred(*, sync: bool = True) -> Iterator[dict[Path, bool]]:
    """Within, writes here do not wait for the disk; leaving (also by an error), everything they wrote is synced.

    For runs whose unit is the whole run (a sweep's short trials): a trial of 9 rounds otherwise
    waits for the disk ~36 times, and two trials at once queue behind each other at the disk.
    Yields the files and folders to sync, for a caller that adds its own. ``sync=False``: nothing
    is synced on leaving either; the caller syncs the file system later (:func:`sync_filesystem`).
    """
    pending: dict[Path, bool] = {}
    token = _DEFERRED.set(pending)
    try:
        yield pending
    finally:
        _DEFERRED.reset(token)
        if sync:
            sync_pending(pending)


def sync_filesystem(path: Path) -> None:
    """Wait until everything written to the file system that holds ``path`` is on the disk.

    Linux's ``syncfs``: one wait for many files (a sweep's trials, synced together); elsewhere ``sync``.

    Raises:
        OSError: If the disk reported an error.
    """
    import ctypes

    syncfs = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)  # this process's C library
    if syncfs is None:
        os.sync()
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        if syncfs(fd) != 0:
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error), str(path))
    finally:
        os.close(fd)


def sync_pending(pending: dict[Path, bool]) -> None:
    """Sync the files of ``pending`` together (a few hundred at a time), then its folders; one gone since is skipped."""
    files = [path for path, folder in pending.items() if not folder and path.exists()]
    for at in range(0, len(files), _SYNC_AT_ONCE):
        sync_together(files[at : at + _SYNC_AT_ONCE])
    for folder in [path for path, is_folder in pending.items() if is_folder and path.is_dir()]:
        sync_dir(folder)


_SYNC_AT_ONCE = 256
"""Files opened at once by :func:`sync_pending` (a long run's round files would pass the limit of open files)."""


def _deferred(files: Sequence[Path] = (), folder: Path | None = None) -> bool:
    """Whether syncs wait for :func:`syncs_deferred`'s end; if so, ``files`` and ``folder`` are noted for it."""
    pending = _DEFERRED.get()
    if pending is None:
        return False
    for path in files:
        pending.setdefault(path, False)
    if folder is not None:
        pending.setdefault(folder, True)
    return True


def _open_folder(folder: Path) -> int:
    return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def sync_dir(folder: Path) -> None:
    """Make a rename or a new file in ``folder`` survive a power cut (fsync the directory)."""
    if _deferred(folder=folder):
        return
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(
    path: Path,
    text: str | bytes | Iterable[str],
    *,
    after: Sequence[Path] = (),
    durable: bool = True,
    sync_name: bool = True,
    beneath: Path | None = None,
) -> Path:
    """Replace ``path`` with ``text`` (UTF-8; its pieces, made as written: ``_write``): temp file, fsync, rename.

    The directory is synced too. A ``.zst`` file gets them compressed, as one frame. ``after``: files
    appended to without waiting for the disk (:func:`append_text`) that must be durable before ``path``
    is replaced; they are synced,
    in order, once the new text is written, so a journaling file system commits them all at once.
    ``durable=False``: no waiting for the disk at all (a view rebuilt from other files): readers still
    see the old text or the new, never a mix. ``sync_name=False``: the text is on the disk before the
    rename, but the new name is not waited for — the caller syncs the directory once for several files
    (:func:`sync_dir`); a power cut before that may leave the old file, never a torn one.
    ``beneath``: a folder that untrusted code can change (a workspace): ``path`` lies inside it, and the
    walk to it follows no symbolic link (:mod:`metaroles.core.confined`; ``LinkRefused`` if it meets one).
    New files get mode ``0o666`` less the umask, as any file the process creates.
    """
    if beneath is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        folder = _open_folder(path.parent)
    else:
        parts = confined.parts_of(beneath, path.relative_to(beneath).as_posix())
        folder = confined.open_folder(beneath, parts[:-1], make=True, whole=parts)
    try:
        deferred = bool(after or durable) and _deferred([*after, path] if durable else after)
        tmp, fd = _temp_file(folder, path.name)
        try:
            with os.fdopen(fd, "wb") as handle:
                _write(handle, path, text)
                handle.flush()
                if (after or durable) and not deferred:
                    sync_together(after, handle.fileno() if durable else None)
            reached(f"replace:{path.name}")
            os.replace(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
            raise
        if durable and sync_name and not _deferred(folder=path.parent):
            os.fsync(folder)
    finally:
        os.close(folder)
    return path


def _temp_file(folder: int, name: str) -> tuple[str, int]:
    """A new temp file beside ``name`` in the folder ``folder`` (``.NAMEXXXXXXXX.tmp``), opened for writing.

    Not ``tempfile.mkstemp``: that makes mode 0600 files, and the renamed file keeps the temp file's mode.
    """
    while True:
        tmp = f".{name}{secrets.token_hex(4)}.tmp"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return tmp, os.open(tmp, flags, 0o666, dir_fd=folder)
        except FileExistsError:
            continue


def replace_together(files: Sequence[tuple[Path, str | bytes]]) -> None:
    """Replace each path with its text as :func:`write_atomic` does, waiting for the disk once for all of them.

    Every temp file is written first, then they are synced together (:func:`sync_together`), renamed
    in the order given, and each folder is synced once. A crash leaves each file old or new, never torn;
    a crash before the last rename leaves the later files old. For files that a last one vouches for (a
    run's transcript and ledger, then its report).
    """
    written: list[tuple[Path, str]] = []
    try:
        for path, text in files:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = _open_folder(path.parent)
            try:
                name, handle_fd = _temp_file(fd, path.name)
            finally:
                os.close(fd)
            tmp = str(path.parent / name)
            written.append((path, tmp))
            with os.fdopen(handle_fd, "wb") as handle:
                handle.write(encoded(path, text))
        if not _deferred([path for path, _ in files]):
            sync_together([Path(tmp) for _, tmp in written])
        while written:
            path, tmp = written[0]
            reached(f"replace:{path.name}")
            os.replace(tmp, path)
            written.pop(0)
    except BaseException:
        for _, tmp in written:
            Path(tmp).unlink(missing_ok=True)
        raise
    for folder in dict.fromkeys(path.parent for path, _ in files):
        sync_dir(folder)


def append_text(path: Path, text: str | bytes | Sequence[str]) -> None:
    """Append ``text`` (or its pieces) to ``path`` without waiting for the disk; :func:`sync_together` makes it durable.

    For lines that nothing refers to yet (a checkpoint's message rows, written as its rounds go by).
    """
    reached(f"append:{path.name}")
    with confined.open_own(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT) as handle:
        _write(handle, path, text)


def create_durably(path: Path) -> None:
    """Create ``path`` empty if it does not exist, and make its name survive a power cut (fsync of its folder).

    For a file that only grows by appends (an event log): later appends sync its contents, not its name.
    """
    if not path.exists():
        confined.open_own(path, os.O_WRONLY | os.O_CREAT).close()
        sync_dir(path.parent)


_START_WRITEBACK = getattr(os, "posix_fadvise", None)
"""Starts the disk's writes of a file's dirty pages (Linux); absent elsewhere, where fsync alone does."""


def sync_together(paths: Sequence[Path], last: int | None = None) -> None:
    """Wait until what was written to ``paths``, then to the open file ``last``, is on the disk (fsync each, in order).

    The disk's writes of them all are started first (``posix_fadvise(DONTNEED)`` starts writeback of a
    file's dirty pages), so the file system allocates their blocks in one journal transaction and the
    first fsync commits it for all: three files synced in a row cost ~0.28 ms here instead of ~0.43.
    """
    fds = [os.open(path, os.O_RDONLY) for path in paths]
    try:
        everything = fds if last is None else [*fds, last]
        if _START_WRITEBACK is not None and len(everything) > 1:
            for fd in everything:
                _START_WRITEBACK(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        for fd in everything:
            os.fsync(fd)
    finally:
        for fd in fds:
            os.close(fd)


def append_durably(path: Path, text: str | bytes | Sequence[str]) -> None:
    """Append ``text`` (or its pieces, in order) to ``path`` and fsync it (to a ``.zst`` file: as one more frame)."""
    reached(f"append:{path.name}")
    with confined.open_own(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT) as handle:
        _write(handle, path, text)
        handle.flush()
        if not _deferred([path]):
            os.fsync(handle.fileno())


def _write(handle: IO[bytes], path: Path, text: str | bytes | Iterable[str]) -> None:
    """Write ``text`` (bytes as they are); pieces are joined and encoded a chunk at a time, never all at once.

    A large round's lines are tens of megabytes, a million roles' checkpoint hundreds: one string of
    them all, then its bytes, cost more than writing them (fresh pages each round) and raise the peak
    memory by both. Pieces may be made as they are written (an iterator).
    """
    if isinstance(text, str | bytes) or path.suffix == ZSTD:
        handle.write(encoded(path, text if isinstance(text, str | bytes) else "".join(text)))
        return
    pieces = iter(text)
    while chunk := list(islice(pieces, _PIECES)):
        handle.write("".join(chunk).encode("utf-8"))


_PIECES = 2048
"""Pieces (lines) joined per write by :func:`_write`."""


def truncate_lines(path: Path, count: int) -> None:
    """Keep the first ``count`` lines of ``path`` (drops rows no kept checkpoint refers to)."""
    if not path.exists():
        confined.open_own(path, os.O_WRONLY | os.O_CREAT).close()
        return
    with confined.open_own(path, os.O_RDWR) as handle:
        data = handle.read()
        end = 0
        for _ in range(count):
            end = data.index(b"\n", end) + 1
        handle.truncate(end)
        handle.flush()
        os.fsync(handle.fileno())
