"""Paths inside a folder that untrusted code can change, walked without following a link.

Model-written code runs in a workspace and may leave anything there: a folder swapped for a
symbolic link to ``/etc``, a file that is a link, a FIFO. Whatever the host reads or writes in such
a folder goes through here: the path is split into components (no absolute path, no ``..``) and
opened one component at a time from a directory descriptor with ``O_NOFOLLOW``, so a link is met,
never followed — even one swapped in between a check and a use. (Linux's ``openat2`` with
``RESOLVE_NO_SYMLINKS`` does the same in one call; Python does not expose it.)
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO

from metaroles.core.exceptions import InvalidValueError, RunDirCorrupt

_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class LinkRefused(InvalidValueError):
    """A path inside a confined folder that leaves it (absolute, ``..``) or goes through a symbolic link."""


def parts_of(root: Path, relative: str | PurePosixPath) -> list[str]:
    """The components of ``relative``, a path inside ``root``.

    Raises:
        LinkRefused: If it is empty, absolute, or climbs with ``..``.
    """
    path = PurePosixPath(relative)
    parts = [p for p in path.parts if p != "."]
    if not parts or path.is_absolute() or ".." in parts:
        raise LinkRefused(f"path {str(relative)!r} is outside the workspace {str(root)!r}; use a path inside it")
    return parts


def open_folder(root: Path, parts: list[str], *, make: bool = False, whole: list[str] | None = None) -> int:
    """A descriptor of the folder ``root/parts...``, walked following no link (``make``: create missing ones).

    ``root`` itself is opened as given (the caller's own path, created if missing and ``make``); only
    what lies inside is untrusted. ``whole``: the path the folder is walked for (named in errors).

    Raises:
        LinkRefused: If a component is a symbolic link (or not a folder).
        FileNotFoundError: If a component is missing and ``make`` is false.
    """
    if make:
        root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for at, part in enumerate(parts):
            if make:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
            try:
                inner = os.open(part, _FOLDER, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _refused(root, whole or parts, at, fd) from None
                raise
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refused(root: Path, parts: list[str], at: int, fd: int) -> LinkRefused:
    """Why the walk of ``parts`` stopped at component ``at`` (opened from ``fd``)."""
    path, where = "/".join(parts), "/".join(parts[: at + 1])
    if stat.S_ISLNK(os.lstat(parts[at], dir_fd=fd).st_mode):
        return LinkRefused(
            f"path {path!r} goes through a symbolic link ({where!r}), which may lead outside the workspace "
            f"{str(root)!r} (code run there may have planted it); nothing there follows a link: remove it"
        )
    return LinkRefused(f"path {path!r}: {where!r} in the workspace {str(root)!r} is not a folder; use another path")


def open_file(root: Path, relative: str | PurePosixPath, flags: int, *, make_parents: bool = False) -> int:
    """A descriptor of the file ``relative`` inside ``root``, opened following no link (new files: mode 0o666 & ~umask).

    Raises:
        LinkRefused: If the path leaves ``root`` or goes through a symbolic link.
    """
    parts = parts_of(root, relative)
    folder = open_folder(root, parts[:-1], make=make_parents, whole=parts)
    try:
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=folder)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refused(root, parts, len(parts) - 1, folder) from None
        raise
    finally:
        os.close(folder)


def read_bytes(root: Path, relative: str | PurePosixPath) -> bytes:
    """The bytes of the regular file ``relative`` inside ``root``.

    Raises:
        LinkRefused: If the path leaves ``root``, goes through a link, or is not a regular file.
    """
    fd = open_file(root, relative, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not hang the host
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise LinkRefused(f"{str(root / relative)!r} is not a regular file; remove it")
        return handle.read()


def unlink(root: Path, relative: str | PurePosixPath) -> None:
    """Remove the entry ``relative`` inside ``root`` (a link itself, never what it points to); gone already is fine."""
    parts = parts_of(root, relative)
    try:
        folder = open_folder(root, parts[:-1])
    except (FileNotFoundError, LinkRefused):
        return  # a parent that is missing or a link holds nothing of ours
    try:
        os.unlink(parts[-1], dir_fd=folder)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        _remove_tree(folder, parts[-1])
    finally:
        os.close(folder)


def _remove_tree(parent: int, name: str) -> None:
    """Remove the folder ``name`` of ``parent`` and everything in it, following no link."""
    fd = os.open(name, _FOLDER, dir_fd=parent)
    try:
        for entry in os.scandir(fd):
            if entry.is_dir(follow_symlinks=False):
                _remove_tree(fd, entry.name)
            else:
                os.unlink(entry.name, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)


def entries(root: Path, folder: str = "") -> Iterator[tuple[str, bool]]:
    """Every entry under ``root/folder`` as (path relative to it, whether it is a regular file), links not followed.

    Folders are walked (and not listed); links, FIFOs, sockets and devices are listed as not regular.
    A ``folder`` that is missing, or is a link, holds nothing.
    """
    if not root.is_dir():
        return
    try:
        fd = open_folder(root, parts_of(root, folder) if folder else [])
    except (FileNotFoundError, LinkRefused):
        return
    try:
        yield from _entries(fd, "")
    finally:
        os.close(fd)


def _entries(fd: int, prefix: str) -> Iterator[tuple[str, bool]]:
    for entry in sorted(os.scandir(fd), key=lambda e: e.name):
        relative = prefix + entry.name
        if entry.is_dir(follow_symlinks=False):
            inner = os.open(entry.name, _FOLDER, dir_fd=fd)
            try:
                yield from _entries(inner, relative + "/")
            finally:
                os.close(inner)
        else:
            yield relative, entry.is_file(follow_symlinks=False)


def open_own(path: Path, flags: int) -> IO[bytes]:
    """``path`` opened with ``flags`` (created with mode 0o666 less the umask), refusing a symbolic link at its name.

    A run directory's files are its own: an append or a truncation through a link planted there would
    change whatever file it points to.

    Raises:
        RunDirCorrupt: If ``path`` is a symbolic link.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RunDirCorrupt(
                f"{path} is a symbolic link; metaroles writes through no link in a run directory: "
                "replace it with the file itself"
            ) from None
        raise
    return os.fdopen(fd, "r+b" if flags & os.O_RDWR else "ab" if flags & os.O_APPEND else "wb")
