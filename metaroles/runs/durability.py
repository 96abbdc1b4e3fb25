"""When a run waits for the disk: after every checkpoint (``"round"``, the default) or once, at its end (``"run"``).

A run that waits each round can lose no checkpoint to a power cut. One that waits at its end
(``RunOptions(durability="run")``, ``--durability run``; a sweep's trials by default) writes
exactly the same files in the same order, so a killed process loses nothing either (what it wrote
is the kernel's); only a power cut or a crash of the machine before its end may leave its files
torn. While it runs, its folder holds ``.unsynced``, naming the boot of the machine
(``/proc/sys/kernel/random/boot_id``). Resuming in the same boot syncs the folder and goes on; after
a restart the folder cannot be trusted: :func:`settle` refuses it, and a sweep runs that trial again
(it gives the same row). A short trial of 9 rounds otherwise waits ~36 times, and two trials at
once queue behind each other at the disk.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from metaroles.core.exceptions import InvalidValueError, RunDirCorrupt
from metaroles.core.files import sync_dir, sync_pending, syncs_deferred, write_atomic

Durability = Literal["round", "run"]
UNSYNCED = ".unsynced"
"""The marker of a run directory written without waiting for the disk, holding the machine's boot id."""
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def checked_durability(value: object) -> Durability:
    """``"round"`` or ``"run"``.

    Raises:
        InvalidValueError: For anything else, naming the value.
    """
    if value == "round" or value == "run":
        return value
    raise InvalidValueError(
        f"durability={value!r} must be 'round' (wait for the disk after each checkpoint) or 'run' (once, at the end)"
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
    """Whether ``run_dir`` stopped before syncing its files, and the machine has restarted since (or cannot say)."""
    try:
        written = (run_dir / UNSYNCED).read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return False
    except (OSError, UnicodeDecodeError):
        return True
    return not written or written != boot_id()


def refuse_restarted(run_dir: Path) -> None:
    """Refuse to read a run directory that :func:`restarted_since` says may be torn.

    Raises:
        RunDirCorrupt: Naming the folder, and saying to run it again.
    """
    if restarted_since(run_dir):
        raise RunDirCorrupt(
            f"{str(run_dir)!r} stopped before it waited for the disk (durability 'run') and the machine has "
            "restarted since: its files may be torn. Run it again into a new folder (the same seed gives the same run)"
        )


def settle(run_dir: Path) -> None:
    """Before continuing ``run_dir``: sync what a run stopped before its end left unsynced, and drop the marker.

    Raises:
        RunDirCorrupt: If the machine restarted since (its files may be torn), saying to run it again.
    """
    marker = run_dir / UNSYNCED
    if not marker.exists():
        return
    refuse_restarted(run_dir)
    pending: dict[Path, bool] = {}
    for folder, subfolders, names in os.walk(run_dir):
        pending.update((Path(folder, name), False) for name in names if name != UNSYNCED)
        pending.update((Path(folder, name), True) for name in subfolders)
    sync_pending(pending)
    marker.unlink()
    sync_dir(run_dir)
