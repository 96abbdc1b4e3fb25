"""When a run waits for the disk: after every checkpoint (``"round"``, the default) or once, at its end (``"run"``).

A run that waits each round can lose no checkpoint to a power cut. One that waits at its end
(``RunOptions(durability="run")``, ``--durability run``; a sweep's trials by default) writes
exactly the same files in the same order, so a killed process loses nothing either (what it wrote
is the kernel's); only a power cut or a crash of the machine before its end may leave its files
torn. While it runs, its folder holds ``.unsynced``, naming the boot of the machine
(``/proc/sys/kernel/random/boot_id``). Resuming in the same boot syncs the folder and goes on; after
a restart the folder cannot be trusted: :func:`finish_syncing` refuses it, and a sweep runs that trial again
(it gives the same row). A short trial of 9 rounds otherwise waits ~36 times, and two trials at
once queue behind each other at the disk.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from metaroles.core.exceptions import InvalidValueError, RunDirCorrupt
from metaroles.core.files import (
    append_durably,
    sync_dir,
    sync_filesystem,
    sync_pending,
    syncs_deferred,
    write_atomic,
)

Durability = Literal["round", "run", "sweep"]
UNSYNCED = ".unsynced"
"""The marker of a run directory (or a sweep's folder) written without waiting for the disk: the boot id."""
SYNCED = "synced.txt"
"""In a sweep's folder, while it is marked: the trials synced so far, a name per line."""
GROUP_EVERY = 5.0
"""Seconds between two syncs of the trials a sweep has ended (and one at its end)."""
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def checked_durability(value: object, *, sweep: bool = False) -> Durability:
    """``"round"`` or ``"run"`` (or, for a sweep's trials on this machine, ``"sweep"``).

    Raises:
        InvalidValueError: For anything else, naming the value.
    """
    if value == "round" or value == "run" or (sweep and value == "sweep"):
        return value
    also = ", 'sweep' (trials synced together by the sweep, on this machine)" if sweep else ""
    raise InvalidValueError(
        f"durability={value!r} must be 'round' (wait for the disk after each checkpoint), 'run' (once, at the "
        f"end){also}"
    )


def boot_id() -> str:
    """This boot of the machine (Linux); ``""`` where unknown, which no marker matches."""
    try:
        return BOOT_ID.read_text(encoding="ascii").strip()
    except OSError:
        return ""


@contextmanager
def synced_at_end(run_dir: Path, durability: Durability) -> Iterator[None]:
    """Run the body waiting for the disk as ``durability`` says; with ``"run"``, once when it ends (also by an error).

    The marker is on the disk before anything goes unsynced, and removed only once everything is.
    ``"sweep"``: as ``"round"`` here; a sweep's trial runs inside its sweep's own deferral (:class:`GroupSync`).
    """
    if durability != "run":
        yield
        return
    write_atomic(run_dir / UNSYNCED, boot_id() + "\n")
    with syncs_deferred() as pending:
        pending.setdefault(run_dir, True)
        yield
    (run_dir / UNSYNCED).unlink()
    sync_dir(run_dir)


def restarted_since(run_dir: Path) -> bool:
    """Whether ``run_dir`` stopped before syncing its files, and the machine has restarted since (or cannot say).

    A sweep's trial counts as synced once its sweep's folder lists it (:class:`GroupSync`).
    """
    own = _mark(run_dir)
    if own is not None:
        return _foreign(own)
    sweep = _mark(run_dir.parent)
    return sweep is not None and _foreign(sweep) and run_dir.name not in synced_trials(run_dir.parent)


def _foreign(mark: str) -> bool:
    """Whether a marker is not this boot's (or cannot be read, or this machine cannot say its boot)."""
    return not mark or mark != boot_id()


def _mark(folder: Path) -> str | None:
    """The boot id in ``folder``'s marker; ``None`` if it has none, ``""`` if it cannot be read."""
    try:
        return (folder / UNSYNCED).read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError):
        return ""


def synced_trials(folder: Path) -> set[str]:
    """The trials a sweep's folder lists as synced."""
    try:
        return set((folder / SYNCED).read_text(encoding="utf-8").splitlines())
    except (OSError, UnicodeDecodeError):
        return set()


def refuse_restarted(run_dir: Path) -> None:
    """Refuse to read a run directory that :func:`restarted_since` says may be torn.

    Raises:
        RunDirCorrupt: Naming the folder, and saying to run it again.
    """
    if restarted_since(run_dir):
        raise RunDirCorrupt(
            f"{str(run_dir)!r} stopped before its files were all on the disk, and the machine has "
            "restarted since: its files may be torn. Run it again into a new folder (the same seed gives the same run)"
        )


def finish_syncing(run_dir: Path) -> None:
    """Before continuing ``run_dir``: sync what a run stopped before its end left unsynced, and drop the marker.

    Raises:
        RunDirCorrupt: If the machine restarted since (its files may be torn), saying to run it again.
    """
    refuse_restarted(run_dir)  # its own marker, or its sweep's
    marker = run_dir / UNSYNCED
    if not marker.exists():
        return
    pending: dict[Path, bool] = {}
    for folder, subfolders, names in os.walk(run_dir):
        pending.update((Path(folder, name), False) for name in names if name != UNSYNCED)
        pending.update((Path(folder, name), True) for name in subfolders)
    sync_pending(pending)
    marker.unlink()
    sync_dir(run_dir)


class GroupSync:
    """A sweep's trials, synced together: every :data:`GROUP_EVERY` seconds and at its end, never each on its own.

    Its trials wait for nothing (``durability="sweep"``); the sweep marks its folder with this boot,
    syncs the file system now and then, and lists the trials that had ended before (``synced.txt``).
    A sweep that starts in a folder marked by another boot first removes every trial of its grid
    that the list lacks: a power cut may have torn it, and it runs again.
    """

    def __init__(self, out: Path, names: Sequence[str]) -> None:
        """Mark ``out`` (after dropping what a restart may have torn of the trials ``names``)."""
        self.out, self.ended, self.last = out, list[str](), time.monotonic()
        mark = _mark(out)
        if mark is not None and _foreign(mark):
            kept = synced_trials(out)
            for name in names:
                if name not in kept and (out / name).exists():
                    shutil.rmtree(out / name)
        write_atomic(out / UNSYNCED, boot_id() + "\n")

    def end(self, name: str) -> None:
        """Trial ``name`` ended; sync the ended ones if the last sync is old."""
        self.ended.append(name)
        if time.monotonic() - self.last >= GROUP_EVERY:
            self.sync()

    def sync(self) -> None:
        """Wait for the disk once for every trial ended so far, then list them as synced."""
        names, self.ended = self.ended, []
        sync_filesystem(self.out)
        if names:
            append_durably(self.out / SYNCED, "".join(f"{name}\n" for name in names))
        self.last = time.monotonic()

    def finish(self) -> None:
        """Sync what is left and unmark the folder: every trial in it is on the disk."""
        self.sync()
        (self.out / UNSYNCED).unlink()
        (self.out / SYNCED).unlink(missing_ok=True)
        sync_dir(self.out)
