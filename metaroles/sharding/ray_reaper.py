"""A local Ray cluster goes with the process that started it, even one killed by SIGKILL.

Ray ties its GCS, raylet, workers and actors to the driver that started the cluster, but its
per-node agents (``DashboardAgent``, ``RuntimeEnvAgent``) only notice the raylet's end and linger,
45–90 s here, while they try to report to the dead GCS. When metaroles starts the cluster, it
starts a reaper beside it: a small process blocked on a pipe whose write end only the driver
holds. The kernel closes that end when the driver ends, however it ends; the reaper then kills
every process of the cluster (they carry the raylet's pid in ``RAY_RAYLET_PID``), again until none
is left (a worker the raylet started while it was being killed, a process still exiting), and exits.
Linux only (``/proc``); elsewhere nothing is started.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_REAPER = r"""
import os, signal, sys, time
marker = ("RAY_RAYLET_PID=" + sys.argv[1]).encode()
while os.read(0, 4096):  # blocks until the driver, the only writer, is gone
    pass
deadline = time.monotonic() + 30
while time.monotonic() < deadline:  # until a pass finds none: one started during a pass, one still exiting
    found = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as handle:
                    if marker in handle.read().split(b"\0"):
                        found += 1
                        os.kill(int(entry), signal.SIGKILL)
            except OSError:
                continue
    if not found:
        break
    time.sleep(0.05)
"""

_held: list[tuple[int, int]] = []
"""The write end of each reaper's pipe (held, never written, for as long as this process lives), and its pid."""


def raylet_of_this_process() -> int | None:
    """The pid of the raylet this process started (a child named ``raylet``), if any."""
    mine = str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, _, rest = stat.partition(" (")[2].rpartition(") ")
        if name == "raylet" and rest.split()[1] == mine:
            return int(entry.name)
    return None


def reap_with_this_process() -> int | None:
    """Start the reaper of the local cluster this process just started; its pid (``None``: nothing to reap here)."""
    if not sys.platform.startswith("linux"):
        return None
    raylet = raylet_of_this_process()
    if raylet is None:
        return None
    read, write = os.pipe()  # not inheritable: no program this process starts holds the write end open
    try:  # spawned, not a Popen: it outlives this process by design, and no object here waits for it
        reaper = os.posix_spawn(
            sys.executable,
            [sys.executable, "-I", "-c", _REAPER, str(raylet)],
            os.environ,
            file_actions=[(os.POSIX_SPAWN_DUP2, read, 0)],
            setsid=True,  # a terminal's Ctrl-C reaches the driver, not the reaper
        )
    finally:
        os.close(read)
    _held.append((write, reaper))
    return reaper
