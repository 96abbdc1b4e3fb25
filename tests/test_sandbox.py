"""The confined tools: code runs in its own process with limits; paths stay in the workspace.

Every behaviour is checked under both isolations: bubblewrap (``make test`` installs it) and the
unsafe guard that runs only when asked for by name. The escape probes live in ``tests/faults/test_sandbox_probes.py``.
"""

import os

import pytest

from metaroles.agents import isolation
from metaroles.agents.sandbox import FileRead, FileWrite, PythonExecute, SandboxUnavailable, SandboxWarning
from metaroles.core.exceptions import InvalidValueError, ToolError


@pytest.fixture(params=["bubblewrap", "unsafe-guard"])
def python(request, tmp_path):
    return PythonExecute(workdir=tmp_path / "work", timeout=3, memory_mb=256, isolation=request.param)


def test_bubblewrap_works_on_this_machine():
    assert isolation.bubblewrap() is not None, "make test installs bubblewrap (Debian package); bwrap must run here"
    assert PythonExecute(workdir="/tmp/metaroles-probe-unused").isolation == "bubblewrap"


async def test_code_runs_and_its_output_comes_back(python):
    result = await python(code="import sys\nprint(6 * 7)\nprint('warn', file=sys.stderr)")
    assert not result.error and result.output == "42\n\n[stderr]\nwarn\n"


@pytest.mark.parametrize("kind", ["bubblewrap", "unsafe-guard"])
async def test_an_endless_loop_is_killed_at_the_timeout(tmp_path, kind):
    quick = PythonExecute(workdir=tmp_path / "w", timeout=0.5, isolation=kind)
    result = await quick(code="print('started', flush=True)\nwhile True:\n    pass")
    assert result.error.startswith("timed out after 0.5s") and "started" in result.output


async def test_the_memory_cap_stops_a_runaway_allocation(python):
    result = await python(code="block = bytearray(1_000_000_000)\nprint('allocated')")
    assert "MemoryError" in result.error and "allocated" not in result.output


async def test_crashes_and_exits_are_reported_and_the_parent_survives(python):
    assert (await python(code="raise ValueError('boom')")).error.startswith("exit code 1: ValueError: boom")
    assert (await python(code="import os\nos._exit(7)")).error.startswith("exit code 7")
    killed = await python(code="import signal, os\nos.kill(os.getpid(), signal.SIGSEGV)")
    if python.isolation == "unsafe-guard":
        assert killed.error.startswith("exit code 1: PermissionError"), "the guard refuses even killing itself"
    else:
        assert killed.error.startswith("killed by signal 11")
    assert (await python(code="print('still here')")).output == "still here\n"


@pytest.mark.parametrize(
    "code",
    [
        "open('../escape.txt', 'w').write('x')",
        "import os\nos.chdir('..')\nopen('escape.txt', 'w').write('x')",
        "import os\nos.remove('../victim.txt')",
        "open('../victim.txt', 'w').write('gone')",
        "import os\nos.symlink('../victim.txt', 'link')\nopen('link', 'w').write('gone')",
        "import subprocess\nsubprocess.run(['sh', '-c', 'echo x > ../escape.txt'])",
        "import os\nos.system('echo x > ../escape.txt')",
    ],
)
async def test_the_code_cannot_leave_its_working_directory(tmp_path, python, code):
    (tmp_path / "victim.txt").write_text("keep me")
    result = await python(code=code)
    if python.isolation == "unsafe-guard":
        assert "PermissionError" in result.error, result  # bubblewrap may let it write in its private /tmp
    assert (tmp_path / "victim.txt").read_text() == "keep me"
    assert not (tmp_path / "escape.txt").exists()


async def test_the_parent_environment_never_reaches_the_code(python, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-parent-secret")
    result = await python(code="import os\nprint(sorted(os.environ.items()))")
    assert "sk-parent-secret" not in result.output and "OPENAI_API_KEY" not in result.output
    passed = PythonExecute(workdir=python.workdir, isolation=python.isolation, env={"GREETING": "hi"})
    assert (await passed(code="import os\nprint(os.environ['GREETING'])")).output == "hi\n"


async def test_a_file_past_the_size_limit_is_cut(python):
    capped = PythonExecute(workdir=python.workdir, isolation=python.isolation, file_mb=1)
    result = await capped(code="open('big', 'wb').write(b'x' * 5_000_000)")
    assert "File too large" in result.error
    assert (python.workdir / "big").stat().st_size <= 1024 * 1024


def test_without_bubblewrap_model_code_is_refused_unless_the_guard_is_asked_for(tmp_path, monkeypatch):
    monkeypatch.setattr(isolation, "bubblewrap", lambda: None)
    for asked in ("auto", "bubblewrap"):
        with pytest.raises(SandboxUnavailable, match=r"install it .*or pass isolation='unsafe-guard'.*does NOT"):
            PythonExecute(workdir=tmp_path, isolation=asked)
    with pytest.warns(SandboxWarning, match="not a security boundary"):
        assert PythonExecute(workdir=tmp_path, isolation="unsafe-guard").isolation == "unsafe-guard"
    with pytest.raises(InvalidValueError, match="network=True needs isolation='bubblewrap'"):
        PythonExecute(workdir=tmp_path, isolation="unsafe-guard", network=True)


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
    for path in ("../secret.txt", "/etc/hostname", "a/../../secret.txt"):
        with pytest.raises(ToolError, match="is outside the workspace"):
            await reader(path=path)
        with pytest.raises(ToolError, match="is outside the workspace"):
            await writer(path=path, content="x")
    os.symlink(tmp_path, root / "up")
    for path in ("link.txt", "up/secret.txt"):
        with pytest.raises(ToolError, match="goes through a symbolic link"):
            await reader(path=path)
        with pytest.raises(ToolError, match="goes through a symbolic link"):
            await writer(path=path, content="x")
    assert (tmp_path / "secret.txt").read_text() == "secret"
    with pytest.raises(ToolError, match=r"no file 'missing\.txt'"):
        await reader(path="missing.txt")


@pytest.mark.parametrize("path", ["a\0b.txt", "x" * 300, "lone\ud800surrogate.txt", "d" * 300 + "/f.txt"])
async def test_file_tools_turn_unnameable_paths_into_tool_errors(tmp_path, path):
    writer, reader = FileWrite(root=tmp_path / "ws"), FileRead(root=tmp_path / "ws")
    with pytest.raises(ToolError, match=r"cannot|too long|no file"):
        await writer(path=path, content="x")
    with pytest.raises(ToolError, match=r"cannot|too long|no file"):
        await reader(path=path)


async def test_file_write_refuses_text_that_is_not_unicode_and_reads_no_fifo(tmp_path):
    writer, reader = FileWrite(root=tmp_path / "ws"), FileRead(root=tmp_path / "ws")
    with pytest.raises(ToolError, match="cannot be written as UTF-8"):
        await writer(path="a.txt", content="half \udcff a surrogate")
    assert not (tmp_path / "ws" / "a.txt").exists()
    os.mkfifo(tmp_path / "ws" / "pipe")
    with pytest.raises(ToolError, match="not a regular file"):
        await reader(path="pipe")
