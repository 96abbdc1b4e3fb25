"""Tools that touch the machine, confined: PythonExecute, FileRead, FileWrite.

``PythonExecute`` runs model-written code in a separate process with a deadline, rlimits (CPU,
address space, file size, open files, processes), a cap on the output kept, a working directory
and a clean environment (only what the tool passes: never the parent's keys). The kernel confines
it with bubblewrap (namespaces: no network, the working directory the only writable path, every
process killed with the sandbox). Where bubblewrap is missing the tool refuses to run, unless
``isolation="unsafe-guard"`` asks for an in-process guard that is not a boundary (see
:mod:`metaroles.agents.isolation` and ``docs/sandbox.md``). Whatever the code does — loop,
allocate, crash, exit, fork — the parent gets an observation back.

``FileRead``/``FileWrite`` walk a workspace-relative path one component at a time from a
directory descriptor with ``O_NOFOLLOW``: no ``..``, no absolute path, no symlink, even one
swapped in after a check.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import tempfile
import warnings
from pathlib import Path
from typing import Any, Literal

import anyio
from anyio.abc import ByteReceiveStream, Process
from pydantic import Field

from metaroles.agents import isolation as iso
from metaroles.agents.tool import BaseTool, ToolResult
from metaroles.core import confined
from metaroles.core.exceptions import ConfigError, InvalidValueError, ToolError


class SandboxWarning(UserWarning):
    """Model-written code runs without the kernel sandbox (``isolation="unsafe-guard"`` was asked for)."""


class SandboxUnavailable(ConfigError):
    """Model-written code was to run, and this machine has no working bubblewrap (nor was the guard asked for)."""


NO_SANDBOX = (
    "bubblewrap is missing or does not work here, so model-written code cannot run in the kernel sandbox; "
    "install it (Debian: apt-get install bubblewrap), or pass isolation='unsafe-guard', an in-process guard "
    "that does NOT stop the code from reading your keys, writing outside its folder or outliving the tool"
)
"""What ``PythonExecute`` says when it has no sandbox to run code in."""


class PythonExecute(BaseTool):
    """Runs Python code in a separate, confined process; returns stdout and stderr.

    Args:
        workdir: The directory the code runs in and the only one it may write to (created if missing).
        timeout: Seconds before every process of the call is killed (a call may pass its own ``timeout``).
        max_timeout: The longest ``timeout`` a single call may ask for.
        memory_mb: Cap on each process's address space (0: none).
        file_mb: Cap on the size of any file the code writes (``RLIMIT_FSIZE``; 0: none).
        max_output: Characters of stdout and of stderr kept.
        isolation: ``"auto"`` or ``"bubblewrap"`` (the kernel sandbox; refused where it does not work), or
            ``"unsafe-guard"`` (an audit hook, not a boundary: ``docs/sandbox.md``); after construction it says
            which one runs.
        network: Let the code reach the network (bubblewrap only; off by default).
        env: The code's environment variables, beyond a neutral ``PATH``/``LANG`` (nothing is inherited).
    """

    name: str = "python_execute"
    description: str = (
        "Executes Python code in a separate process and returns what it printed. Only printed output is "
        "visible: use print(). Files may be written in the working directory only."
    )
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "The Python code to execute."},
                "timeout": {"type": "number", "exclusiveMinimum": 0, "description": "Seconds before it is stopped."},
            },
            "required": ["code"],
        }
    )
    workdir: Path = Field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="metaroles-python-")))
    """Where the code runs; by default a new temporary folder (OpenManus' ``PythonExecute()`` takes none)."""
    timeout: float = 5.0
    max_timeout: float = 60.0
    memory_mb: int = 512
    file_mb: int = 64
    max_output: int = 10_000
    isolation: Literal["auto", "bubblewrap", "unsafe-guard"] = "auto"
    network: bool = False
    env: dict[str, str] = Field(default_factory=dict)

    def __init__(self, **data: Any) -> None:
        """Check the limits, choose the isolation and create the working directory.

        (Checked after pydantic's validation rather than inside it, which would turn our
        ``InvalidValueError`` — a ``ValueError`` — into a ``ValidationError``.)
        """
        super().__init__(**data)
        if self.timeout <= 0 or self.memory_mb < 0 or self.file_mb < 0 or self.max_output < 1:
            raise InvalidValueError(
                f"timeout={self.timeout!r} must be > 0, memory_mb={self.memory_mb!r} >= 0, "
                f"file_mb={self.file_mb!r} >= 0, max_output={self.max_output!r} >= 1"
            )
        if self.isolation in ("auto", "bubblewrap"):
            if iso.bubblewrap() is None:
                raise SandboxUnavailable(NO_SANDBOX)
            self.isolation = "bubblewrap"
        else:
            warnings.warn(
                "isolation='unsafe-guard': model-written code runs behind an in-process audit hook, which is not "
                "a security boundary (docs/sandbox.md lists what it loses); install bubblewrap for the kernel sandbox",
                SandboxWarning,
                stacklevel=2,
            )
        if self.network and self.isolation != "bubblewrap":
            raise InvalidValueError("network=True needs isolation='bubblewrap' (the unsafe guard refuses every socket)")
        self.workdir = Path(self.workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)

    def command(self, timeout: float | None = None) -> list[str]:
        """The command line the code runs under (its source goes to stdin); ``timeout`` overrides the tool's."""
        mb = 1024 * 1024
        limits = iso.Limits(self.timeout if timeout is None else timeout, self.memory_mb * mb, self.file_mb * mb)
        bwrap = iso.bubblewrap() if self.isolation == "bubblewrap" else None
        if bwrap is not None:
            env = iso.clean_env({"HOME": str(self.workdir), **self.env})
            return iso.bubblewrap_command(bwrap, self.workdir, limits, network=self.network, env=env)
        return iso.guard_command(self.workdir, limits)

    async def execute(self, **arguments: Any) -> ToolResult:
        """Run ``code``; a timeout, a crash or a non-zero exit is reported in ``error`` with the output so far.

        ``timeout=`` (seconds) sets this call's deadline, as OpenManus' ``execute(code, timeout=5)``;
        the tool's own ``timeout`` otherwise; either way no more than ``max_timeout``. Its schema offers it to models.
        """
        timeout = _call_timeout(arguments.get("timeout"), self.timeout, self.max_timeout)
        out, err = bytearray(), bytearray()
        env = iso.clean_env({"HOME": str(self.workdir), **self.env})
        grace = 0.0 if self.isolation == "bubblewrap" else 5.0  # the guard's supervisor keeps the deadline itself
        async with await anyio.open_process(
            self.command(timeout), cwd=self.workdir, env=env, start_new_session=True
        ) as proc:
            assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
            with anyio.move_on_after(timeout + grace) as scope:
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await proc.stdin.send(arguments["code"].encode())  # gone already: its exit says why
                    await proc.stdin.aclose()
                async with anyio.create_task_group() as group:
                    group.start_soon(_drain, proc.stdout, out, self.max_output)
                    group.start_soon(_drain, proc.stderr, err, self.max_output)
                    if self.isolation != "bubblewrap":
                        group.start_soon(_orphans_go, proc)
                await proc.wait()
            if scope.cancelled_caught:
                sandbox = _first_child(proc.pid)  # bubblewrap's init in the sandbox's pid namespace
                _kill_group(proc.pid)
                await proc.wait()
                if sandbox is not None:
                    await _ended(sandbox)
            if self.isolation != "bubblewrap":
                _kill_group(proc.pid)  # the supervisor may have been killed under the code: what is left goes
                for pid in _group(proc.pid):
                    await _ended(pid)  # ... before the tool returns
        timed_out = scope.cancelled_caught or (self.isolation != "bubblewrap" and proc.returncode == iso.TIMED_OUT)
        return self._result(out, err, proc.returncode or 0, timed_out, timeout)

    def _result(self, out: bytearray, err: bytearray, code: int, timed_out: bool, timeout: float) -> ToolResult:
        stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
        output = stdout + (f"\n[stderr]\n{stderr}" if stderr else "")
        if timed_out:
            return ToolResult(output=output, error=f"timed out after {timeout:g}s; output so far:\n{output}")
        if code != 0:
            if self.isolation == "bubblewrap" and code > 128:
                code = -(code - 128)  # bwrap reports a signal death as 128 + the signal
            why = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            tail = stderr.strip().splitlines()[-1:]
            return ToolResult(output=output, error=f"{why}{': ' + tail[0] if tail else ''}\n{output}")
        return ToolResult(output=stdout if not stderr else output)


async def _drain(stream: ByteReceiveStream, into: bytearray, cap: int) -> None:
    """Read ``stream`` to its end, keeping the first ``cap`` bytes (the rest is read and dropped)."""
    async for chunk in stream:
        if len(into) < cap:
            into.extend(chunk[: cap - len(into)])


async def _orphans_go(proc: Process) -> None:
    """Once the guard's supervisor has exited, what is left of its group goes: code that killed it holds the pipes."""
    await proc.wait()
    _kill_group(proc.pid)


def _first_child(pid: int) -> int | None:
    """The first child of process ``pid``, if any (``/proc``'s children list)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


async def _ended(pid: int, *, within: float = 5.0) -> None:
    """Wait until process ``pid`` has exited (a zombie or gone), at most ``within`` seconds.

    Killing bubblewrap kills the sandbox's pid-namespace init (``--die-with-parent``), and the
    kernel kills every other process of the namespace before that init finishes exiting; so once
    it has, nothing the code started is left. bubblewrap itself dies first: without this wait the
    tool could return while the namespace is still being torn down.
    """
    try:
        descriptor = os.pidfd_open(pid)  # readable once the process has exited
    except OSError:
        return  # already gone
    try:
        with anyio.move_on_after(within):
            await anyio.wait_readable(descriptor)
    finally:
        os.close(descriptor)


def _group(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` that have not exited (``/proc``)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended while we looked
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return


class _Confined(BaseTool):
    """A tool whose paths are walked inside ``root`` from a directory descriptor, following no link."""

    root: Path

    def model_post_init(self, context: Any, /) -> None:
        """Create the root."""
        self.root = Path(self.root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def open(self, path: str, flags: int, *, make_parents: bool = False) -> int:
        """A descriptor of ``path`` inside the root, opened component by component with ``O_NOFOLLOW``.

        Raises:
            ToolError: If the path is absolute, climbs with ``..``, meets a symbolic link, or cannot be named.
        """
        try:
            return confined.open_file(self.root, path, flags, make_parents=make_parents)
        except confined.LinkRefused as exc:
            raise ToolError(str(exc)) from None
        except (ValueError, UnicodeEncodeError) as exc:  # a NUL, a lone surrogate
            raise ToolError(f"path {path!r} cannot name a file ({exc}); use a plain relative path") from None
        except OSError as exc:
            if exc.errno == errno.ENAMETOOLONG:
                raise ToolError(f"path {path[:80]!r}... is too long for this file system; use a shorter name") from None
            raise


class FileRead(_Confined):
    """Reads a text file inside the workspace."""

    name: str = "file_read"
    description: str = "Reads a text file in the workspace and returns its content."
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "Path relative to the workspace."}},
            "required": ["path"],
        }
    )
    max_chars: int = 100_000

    async def execute(self, **arguments: Any) -> ToolResult:
        """Return the file's text (up to ``max_chars``)."""
        return ToolResult(output=await anyio.to_thread.run_sync(self._read, arguments["path"]))

    def _read(self, path: str) -> str:
        try:
            fd = self.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO left there must not hang the tool
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ToolError(f"no file {path!r} in the workspace") from None
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise ToolError(f"no file {path!r} in the workspace (it is not a regular file)")
            return file.read(self.max_chars * 4).decode("utf-8", errors="replace")[: self.max_chars]


class FileWrite(_Confined):
    """Writes a text file inside the workspace (parents created)."""

    name: str = "file_write"
    description: str = "Writes text to a file in the workspace, replacing it."
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Path relative to the workspace."},
                "content": {"type": "string", "description": "The text to write."},
            },
            "required": ["path", "content"],
        }
    )

    async def execute(self, **arguments: Any) -> ToolResult:
        """Write the file; say how much was written."""
        await anyio.to_thread.run_sync(self._write, arguments["path"], arguments["content"])
        return ToolResult(output=f"wrote {len(arguments['content'])} characters to {arguments['path']}")

    def _write(self, path: str, content: str) -> None:
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ToolError(
                f"content cannot be written as UTF-8 ({exc.reason} at {exc.start}); send valid text"
            ) from None
        try:
            fd = self.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK, make_parents=True)
        except OSError as exc:  # a folder there, a FIFO with no reader, no space...
            raise ToolError(f"cannot write {path!r}: {exc.strerror}; choose another path") from None
        with os.fdopen(fd, "wb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise ToolError(f"cannot write {path!r}: it is not a regular file")
            file.write(data)


def _call_timeout(value: object, default: float, longest: float) -> float:
    """One call's deadline: ``value`` seconds if given (a positive number up to ``longest``), else ``default``."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= longest:
        raise InvalidValueError(
            f"timeout={value!r} must be a number of seconds in (0, {longest:g}] (the tool's max_timeout), e.g. 10"
        )
    return float(value)
