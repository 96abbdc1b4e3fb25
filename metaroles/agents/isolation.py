"""How ``PythonExecute`` confines a child process: the kernel's namespaces, or an in-process guard.

**bubblewrap** (``bwrap``, when installed and working): the code runs in new user, PID, IPC,
UTS, cgroup and network namespaces (no network unless asked for), on a read-only view of the
Python installation and the system libraries, with the working directory as the only writable
path, a private ``/tmp``, a clean environment, no capabilities, ``--die-with-parent`` and
``--new-session``. When the code's first process ends, or the tool kills ``bwrap`` at its
deadline, the PID namespace ends and every process in it is killed by the kernel.

**unsafe-guard** (only when asked for by name): a supervisor process marks itself a child
subreaper, runs the code in a fresh interpreter behind an audit hook (writes and reads outside the
working directory, subprocesses, sockets and ``ctypes`` refused), enforces the deadline itself and
kills every descendant it can find before it exits. An audit hook runs inside the code's own
process: it is not a security boundary, and ``docs/sandbox.md`` lists the escapes it loses.
Without bubblewrap, ``PythonExecute`` refuses to run model code unless told to use it.

Both set rlimits (CPU seconds, address space, file size, open files, processes) and pass the
code only the environment the tool names.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Isolation = Literal["bubblewrap", "unsafe-guard"]

TIMED_OUT = 124
"""Exit status the guard's supervisor reports when the code passed its deadline."""


@dataclass(frozen=True, slots=True)
class Limits:
    """The rlimits of the code's processes (0: no limit) and the deadline of the call."""

    seconds: float
    memory_bytes: int
    file_bytes: int
    open_files: int = 256
    processes: int = 64

    def argv(self) -> list[str]:
        """The limits as the bootstrap's command-line arguments."""
        cpu = int(self.seconds) + 1
        return [str(v) for v in (cpu, self.memory_bytes, self.file_bytes, self.open_files, self.processes)]


@functools.cache
def bubblewrap() -> str | None:
    """The path of a working ``bwrap`` on this machine, or ``None`` (probed once per process)."""
    path = shutil.which("bwrap")
    if path is None:
        return None
    probe = [path, "--unshare-all", "--ro-bind", "/", "/", "--die-with-parent", "--", "/bin/true"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=30, check=False, env={})
    except (OSError, subprocess.SubprocessError):
        return None
    return path if done.returncode == 0 else None


def available() -> Isolation | None:
    """The kernel sandbox if it works here, else ``None`` (model code is refused unless the guard is asked for)."""
    return "bubblewrap" if bubblewrap() is not None else None


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    """The code's whole environment: a neutral base plus what the tool passes, never the parent's."""
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"} | extra


def _python_roots() -> list[str]:
    """The folders the code's Python needs to read: the installation, the venv and its packages."""
    paths = sysconfig.get_paths()
    found = {sys.prefix, sys.base_prefix, sys.exec_prefix, paths["purelib"], paths["platlib"], paths["stdlib"]}
    found.add(os.path.dirname(os.path.realpath(sys.executable)))
    roots = sorted(os.path.realpath(p) for p in found if p and os.path.isdir(p))
    return [r for r in roots if not any(r != o and r.startswith(o.rstrip("/") + "/") for o in roots)]


_SYSTEM = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin")
_SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/ssl/certs")


def bubblewrap_command(bwrap: str, workdir: Path, limits: Limits, *, network: bool, env: dict[str, str]) -> list[str]:
    """The ``bwrap`` command line that runs the bootstrap (code on stdin) in ``workdir``."""
    command = _sandbox(bwrap, network=network)
    command += ["--bind", str(workdir), str(workdir), "--chdir", str(workdir), "--remount-ro", "/", "--clearenv"]
    for key, value in sorted(env.items()):
        command += ["--setenv", key, value]
    return [*command, "--", sys.executable, "-I", "-c", _LIMITED, *limits.argv()]


def confined_command(bwrap: str, argv: list[str], *, readable: list[Path], env: dict[str, str]) -> list[str]:
    """``argv`` under ``bwrap``: the system, Python and ``readable`` read-only, an empty ``/tmp``, no network.

    Nothing outside ``/tmp`` (gone when it ends) can be written; ``/tmp`` is its working folder.
    """
    command = _sandbox(bwrap, network=False)
    for path in sorted({os.path.realpath(p) for p in readable}):
        command += ["--ro-bind", path, path]
    command += ["--chdir", "/tmp", "--remount-ro", "/", "--clearenv"]
    for key, value in sorted(env.items()):
        command += ["--setenv", key, value]
    return [*command, "--", *argv]


def _sandbox(bwrap: str, *, network: bool) -> list[str]:
    """What every sandbox has: its own namespaces and no capabilities, the system and Python read-only."""
    command = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    command += ["--uid", "65534", "--gid", "65534", "--hostname", "sandbox"]
    if network:
        command.append("--share-net")
    command += ["--tmpfs", "/tmp"]  # first: the installation or the workdir may live under /tmp
    for path in _SYSTEM:
        command += ["--ro-bind-try", path, path]
    for path in (*_SYSTEM_FILES, *(["/etc/resolv.conf", "/etc/hosts"] if network else [])):
        command += ["--ro-bind-try", path, path]
    for root in _python_roots():
        command += ["--ro-bind", root, root]
    return [*command, "--proc", "/proc", "--dev", "/dev"]


def guard_command(workdir: Path, limits: Limits) -> list[str]:
    """The command that runs the supervisor, which runs the code behind the audit guard in a fresh interpreter."""
    return [sys.executable, "-I", "-c", _SUPERVISED, str(workdir), str(limits.seconds), _CHILD, *limits.argv()]


_SET_LIMITS = r"""
import os, resource, sys
def set_limits(cpu, memory, fsize, nofile, nproc):
    for which, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, memory), (resource.RLIMIT_FSIZE, fsize),
                         (resource.RLIMIT_NOFILE, nofile), (resource.RLIMIT_NPROC, nproc)):
        if int(value):
            resource.setrlimit(which, (int(value), int(value)))
"""

_LIMITED = (
    _SET_LIMITS
    + r"""
set_limits(*sys.argv[1:6])
code = sys.stdin.read()
sys.stdin.close()
exec(compile(code, "<agent code>", "exec"), {"__name__": "__main__"})
"""
)

_GUARD = r"""
def install_guard(root):
    import os, sys, types
    readable = tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path) if p})
    refused = frozenset(("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.fork", "os.forkpty",
        "os.kill", "os.killpg", "signal.pthread_kill", "socket.connect", "socket.bind", "socket.sendto",
        "socket.sendmsg", "socket.getaddrinfo", "socket.gethostbyname", "ctypes.dlopen", "ctypes.dlsym",
        "ctypes.cdata", "pty.spawn", "os.mkfifo", "os.mknod", "os.setxattr", "os.removexattr", "gc.get_referrers",
        "gc.get_objects", "gc.get_referents", "sqlite3.connect", "sys._getframe", "sys._current_frames",
        "code.__new__", "function.__new__", "sys.setprofile", "sys.settrace"))
    # Immutable, and bound at install: code that reaches the hook's frame (a traceback) or zeroes
    # os.O_WRONLY cannot change what the hook checks.
    dir_fds = types.MappingProxyType({"os.chdir": (), "os.remove": (1,), "os.rmdir": (1,), "os.mkdir": (2,),
        "os.rename": (2, 3), "os.replace": (2, 3), "os.symlink": (2,), "os.link": (2, 3), "os.truncate": (),
        "os.chmod": (2,), "os.chown": (3,), "os.utime": (3,), "shutil.rmtree": (1,), "shutil.move": (),
        "os.listdir": (), "os.scandir": ()})
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    realpath, fsdecode, pathlike = os.path.realpath, os.fsdecode, (str, bytes, os.PathLike)
    def inside(path, roots, realpath=realpath):
        real = realpath(path)
        return any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots)
    def guard(event, args, refused=refused, dir_fds=dir_fds, root=root, readable=readable, write_flags=write_flags,
              inside=inside, fsdecode=fsdecode, pathlike=pathlike):
        if event in refused or (event == "object.__setattr__" and args[1] in ("__code__", "__globals__",
                "__defaults__", "__kwdefaults__", "__closure__")) or (event == "object.__getattr__" and args[1] in (
                "tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back", "f_locals", "f_globals")):
            raise PermissionError(f"{event} is not allowed in this sandbox")
        if event == "open" and isinstance(args[0], pathlike):
            mode, flags = args[1] or "r", args[2] or 0
            writing = any(c in str(mode) for c in "wax+") or flags & write_flags
            if not inside(fsdecode(args[0]), (root,) if writing else (root, *readable)):
                raise PermissionError(f"{fsdecode(args[0])!r} is outside the working directory {root!r}")
        elif event in dir_fds:
            if any(i < len(args) and isinstance(args[i], int) and args[i] >= 0 for i in dir_fds[event]):
                raise PermissionError(f"{event} relative to a directory descriptor is not allowed in this sandbox")
            listing = event in ("os.listdir", "os.scandir")
            for path in args[:1] if listing else args[:2]:
                if isinstance(path, pathlike) and not inside(fsdecode(path), (root, *readable) if listing else (root,)):
                    raise PermissionError(f"{fsdecode(path)!r} is outside the working directory {root!r}")
    sys.addaudithook(guard)
"""

_CHILD = (
    _SET_LIMITS
    + _GUARD
    + r"""
root = sys.argv[1]
code = sys.stdin.read()
sys.stdin.close()
set_limits(*sys.argv[2:7])
install_guard(root)
del root, set_limits, install_guard
exec(compile(code, "<agent code>", "exec"), {"__name__": "__main__"})
"""
)
"""The code's own process: a fresh interpreter (nothing of the supervisor's — its ``ctypes`` — in it)."""

_SUPERVISED = r"""
import ctypes, os, select, signal, subprocess, sys
root, seconds = os.path.realpath(sys.argv[1]), float(sys.argv[2])
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come back here
def descendants():
    mine = str(os.getpid())
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[1] == mine:
                    yield int(entry)
        except (OSError, IndexError, ValueError):
            continue
code = sys.stdin.buffer.read()
child = subprocess.Popen([sys.executable, "-I", "-c", sys.argv[3], root, *sys.argv[4:9]], stdin=subprocess.PIPE,
                         close_fds=True)  # the environment is the supervisor's: the tool's clean one
try:
    child.stdin.write(code)
    child.stdin.close()
except BrokenPipeError:
    pass
ready = select.select([os.pidfd_open(child.pid)], [], [], seconds)[0]
timed_out = not ready
if timed_out:
    os.kill(child.pid, signal.SIGKILL)
status = child.wait()
while True:
    found = list(descendants())
    if not found:
        break
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
if timed_out:
    os._exit(124)
if status < 0:
    signal.signal(-status, signal.SIG_DFL)
    os.kill(os.getpid(), -status)
os._exit(status)
"""
