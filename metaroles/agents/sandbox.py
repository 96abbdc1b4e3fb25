"""Tools that touch the machine, confined: PythonExecute, FileRead, FileWrite.

``PythonExecute`` runs the code in a separate Python process (isolated mode, a new session) with
a wall-clock timeout, a cap on its address space, a cap on the output kept, and a working
directory: an audit hook installed before the code runs refuses writes outside that directory,
reads outside it and Python's own installation, subprocesses, ``os.system``/``exec``/``fork``,
sockets and ``ctypes`` (so modules that load it, numpy among them, are refused too). Whatever
the code does — loop, allocate, crash, exit — the parent gets an observation back and goes on.
This is a guard for model-written code on a developer's machine, not a security boundary
against a determined attacker (use a container for that).

``FileRead``/``FileWrite`` resolve every path (symlinks included) inside a workspace root and
refuse any that lands outside it.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import ByteReceiveStream
from pydantic import Field

from metaroles.agents.tool import BaseTool, ToolResult
from metaroles.core.exceptions import InvalidValueError, ToolError

_BOOTSTRAP = r"""
import os, sys, resource
root, cap = os.path.realpath(sys.argv[1]), int(sys.argv[2])
if cap:
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
readable = tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path) if p})
refused = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.fork", "os.forkpty", "os.kill",
           "os.killpg", "socket.connect", "socket.bind", "ctypes.dlopen", "pty.spawn")
def inside(path, roots):
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in roots)
def guard(event, args):
    if event in refused:
        raise PermissionError(f"{event} is not allowed in this sandbox")
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        mode, flags = args[1] or "r", args[2] or 0
        writing = any(c in str(mode) for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
        if not inside(path, (root,) if writing else (root, *readable)):
            raise PermissionError(f"{path!r} is outside the working directory {root!r}")
    elif event in ("os.chdir", "os.remove", "os.rmdir", "os.mkdir", "os.rename", "os.replace", "os.symlink",
                   "os.link", "os.truncate", "os.chmod", "os.chown", "shutil.rmtree", "shutil.move"):
        for path in args[:2]:
            if isinstance(path, (str, bytes, os.PathLike)) and not inside(os.fsdecode(path), (root,)):
                raise PermissionError(f"{os.fsdecode(path)!r} is outside the working directory {root!r}")
code = sys.stdin.read()
sys.addaudithook(guard)
exec(compile(code, "<agent code>", "exec"), {"__name__": "__main__"})
"""


class PythonExecute(BaseTool):
    """Runs Python code in a separate process, confined to a working directory; returns stdout and stderr.

    Args:
        workdir: The directory the code runs in and may write to (created if missing).
        timeout: Seconds before the process is killed.
        memory_mb: Cap on the process's address space (0: none).
        max_output: Characters of stdout and of stderr kept.
    """

    name: str = "python_execute"
    description: str = (
        "Executes Python code in a separate process and returns what it printed. Only printed output is "
        "visible: use print(). Files may be written in the working directory only."
    )
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python code to execute."}},
            "required": ["code"],
        }
    )
    workdir: Path
    timeout: float = 5.0
    memory_mb: int = 512
    max_output: int = 10_000

    def model_post_init(self, context: Any, /) -> None:
        """Check the limits and create the working directory."""
        if self.timeout <= 0 or self.memory_mb < 0 or self.max_output < 1:
            raise InvalidValueError(
                f"timeout={self.timeout!r} must be > 0, memory_mb={self.memory_mb!r} >= 0, max_output >= 1"
            )
        self.workdir = Path(self.workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)

    async def execute(self, **arguments: Any) -> ToolResult:
        """Run ``code``; a timeout, a crash or a non-zero exit is reported in ``error`` with the output so far."""
        command = [sys.executable, "-I", "-c", _BOOTSTRAP, str(self.workdir), str(self.memory_mb * 1024 * 1024)]
        out, err = bytearray(), bytearray()
        async with await anyio.open_process(command, cwd=self.workdir, start_new_session=True) as process:
            assert process.stdin is not None and process.stdout is not None and process.stderr is not None
            with anyio.move_on_after(self.timeout) as scope:
                await process.stdin.send(arguments["code"].encode())
                await process.stdin.aclose()
                async with anyio.create_task_group() as group:
                    group.start_soon(_drain, process.stdout, out, self.max_output)
                    group.start_soon(_drain, process.stderr, err, self.max_output)
                await process.wait()
            if scope.cancelled_caught:
                _kill_group(process.pid)
                await process.wait()
        stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
        output = stdout + (f"\n[stderr]\n{stderr}" if stderr else "")
        if scope.cancelled_caught:
            return ToolResult(output=output, error=f"timed out after {self.timeout:g}s; output so far:\n{output}")
        if process.returncode != 0:
            code = process.returncode or 0
            why = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            tail = stderr.strip().splitlines()[-1:]
            return ToolResult(output=output, error=f"{why}{': ' + tail[0] if tail else ''}\n{output}")
        return ToolResult(output=stdout if not stderr else output)


async def _drain(stream: ByteReceiveStream, into: bytearray, cap: int) -> None:
    """Read ``stream`` to its end, keeping the first ``cap`` bytes (the rest is read and dropped)."""
    async for chunk in stream:
        if len(into) < cap:
            into.extend(chunk[: cap - len(into)])


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return


class _Confined(BaseTool):
    """A tool whose paths must stay inside ``root``."""

    root: Path

    def model_post_init(self, context: Any, /) -> None:
        """Create the root."""
        self.root = Path(self.root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def resolve(self, path: str) -> Path:
        """``path`` inside the root, symlinks resolved.

        Raises:
            ToolError: If it lands outside the root.
        """
        target = (self.root / path).resolve()
        if not target.is_relative_to(self.root):
            raise ToolError(f"path {path!r} is outside the workspace {str(self.root)!r}; use a path inside it")
        return target


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
        target = self.resolve(arguments["path"])
        if not target.is_file():
            raise ToolError(f"no file {arguments['path']!r} in the workspace")
        return ToolResult(
            output=(await anyio.Path(target).read_text(encoding="utf-8", errors="replace"))[: self.max_chars]
        )


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
        target = self.resolve(arguments["path"])
        await anyio.Path(target.parent).mkdir(parents=True, exist_ok=True)
        await anyio.Path(target).write_text(arguments["content"], encoding="utf-8")
        return ToolResult(output=f"wrote {len(arguments['content'])} characters to {arguments['path']}")
