"""The confined tools: code runs in its own process with limits; paths stay in the workspace."""

import os

import pytest

from metaroles.agents.sandbox import FileRead, FileWrite, PythonExecute
from metaroles.core.exceptions import InvalidValueError, ToolError


@pytest.fixture
def python(tmp_path):
    return PythonExecute(workdir=tmp_path / "work", timeout=3, memory_mb=256)


async def test_code_runs_and_its_output_comes_back(python):
    result = await python(code="import sys\nprint(6 * 7)\nprint('warn', file=sys.stderr)")
    assert not result.error and result.output == "42\n\n[stderr]\nwarn\n"


async def test_an_endless_loop_is_killed_at_the_timeout(tmp_path):
    quick = PythonExecute(workdir=tmp_path / "w", timeout=0.5)
    result = await quick(code="print('started', flush=True)\nwhile True:\n    pass")
    assert result.error.startswith("timed out after 0.5s") and "started" in result.output


async def test_the_memory_cap_stops_a_runaway_allocation(python):
    result = await python(code="block = bytearray(1_000_000_000)\nprint('allocated')")
    assert "MemoryError" in result.error and "allocated" not in result.output


async def test_crashes_and_exits_are_reported_and_the_parent_survives(python):
    assert (await python(code="raise ValueError('boom')")).error.startswith("exit code 1: ValueError: boom")
    assert (await python(code="import os\nos._exit(7)")).error.startswith("exit code 7")
    killed = await python(code="import signal, os\nos.kill(os.getpid(), signal.SIGSEGV)")
    assert killed.error.startswith("exit code 1: PermissionError"), "even killing itself is refused"
    assert (await python(code="print('still here')")).output == "still here\n"


@pytest.mark.parametrize(
    "code",
    [
        "open('../escape.txt', 'w').write('x')",
        "open('/tmp/escape.txt', 'a')",
        "print(open('/etc/hostname').read())",
        "import os\nos.chdir('..')",
        "import os\nos.remove('../victim.txt')",
        "import os\nos.symlink('/etc', 'etc')",
        "import subprocess\nsubprocess.run(['ls'])",
        "import os\nos.system('ls')",
        "import socket\nsocket.create_connection(('127.0.0.1', 9))",
    ],
)
async def test_the_code_cannot_leave_its_working_directory(tmp_path, python, code):
    (tmp_path / "victim.txt").write_text("keep me")
    result = await python(code=code)
    assert "PermissionError" in result.error, result
    assert (tmp_path / "victim.txt").read_text() == "keep me"
    assert not (tmp_path / "escape.txt").exists()


async def test_files_inside_the_working_directory_are_fine(python):
    result = await python(code="open('notes.txt', 'w').write('kept')\nprint(open('notes.txt').read())")
    assert result.output == "kept\n" and (python.workdir / "notes.txt").read_text() == "kept"


def test_bad_limits_are_refused(tmp_path):
    with pytest.raises(InvalidValueError, match="timeout=0"):
        PythonExecute(workdir=tmp_path, timeout=0)


async def test_file_tools_stay_in_the_workspace(tmp_path):
    root = tmp_path / "ws"
    writer, reader = FileWrite(root=root), FileRead(root=root)
    assert (await writer(path="a/b.txt", content="hello")).output == "wrote 5 characters to a/b.txt"
    assert (await reader(path="a/b.txt")).output == "hello"
    (tmp_path / "secret.txt").write_text("secret")
    os.symlink(tmp_path / "secret.txt", root / "link.txt")
    for path in ("../secret.txt", "/etc/hostname", "a/../../secret.txt", "link.txt"):
        with pytest.raises(ToolError, match="is outside the workspace"):
            await reader(path=path)
        with pytest.raises(ToolError, match="is outside the workspace"):
            await writer(path=path, content="x")
    assert (tmp_path / "secret.txt").read_text() == "secret"
    with pytest.raises(ToolError, match=r"no file 'missing\.txt'"):
        await reader(path="missing.txt")
