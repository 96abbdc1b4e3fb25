"""Running the command in other processes, killing it at exact points, and comparing run directories."""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

DRIVER = Path(__file__).with_name("driver.py")
SEED = 5
SCENARIOS: dict[str, dict[str, object]] = {
    "debate": {},
    "society": {"agents": 40, "rounds": 12, "llm_agents": 4},
    "software_company": {},
    "werewolf": {},
}
MEASURED = {"manifest.json", "timings.jsonl"}
"""Files the clock writes into (the only ones two equal runs may differ in)."""


def command(when: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``metaroles ARGS`` in a process of its own, dying or failing as ``when`` says (see driver.py).

    The process is forked from one that imported the command already (``warm.py``, one per test
    worker): a run of its own, but without the half of its time a new interpreter spends importing.
    """
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    with tempfile.TemporaryDirectory(prefix="metaroles-driver-") as folder:
        out, err = Path(folder) / "out", Path(folder) / "err"
        request = {"args": [when, *args], "cwd": str(cwd or Path.cwd()), "env": env, "out": str(out), "err": str(err)}
        code = _warm().run(request)
        return subprocess.CompletedProcess([str(DRIVER), when, *args], code, out.read_text(), err.read_text())


class _Warm:
    """The worker's ``warm.py`` process: a request a line, an exit code a line back."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        self.process = subprocess.Popen(
            [sys.executable, str(DRIVER.with_name("warm.py"))], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env=env,
        )  # fmt: skip
        self.lock = threading.Lock()
        atexit.register(self.close)

    def run(self, request: dict[str, object]) -> int:
        assert self.process.stdin is not None and self.process.stdout is not None
        with self.lock:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            answer = self.process.stdout.readline()
        assert answer, f"the warm driver process ended (exit {self.process.poll()})"
        return int(json.loads(answer)["code"])

    def close(self) -> None:
        if self.process.poll() is None and self.process.stdin is not None:
            self.process.stdin.close()
            self.process.wait(timeout=60)


_WARM: list[_Warm] = []


def _warm() -> _Warm:
    if not _WARM or _WARM[0].process.poll() is not None:
        _WARM[:] = [_Warm()]
    return _WARM[0]


def ok(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    result = command("none", *args, cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def killed(when: str, *args: str) -> None:
    result = command(when, *args)
    assert result.returncode == -9, f"{when} was never reached: exit {result.returncode}\n{result.stderr[-2000:]}"


def run_args(name: str, out: Path, *extra: str) -> list[str]:
    sets = [arg for key, value in SCENARIOS[name].items() for arg in ("--set", f"{key}={value}")]
    return ["run", name, "--llm", "test", "--seed", str(SEED), *sets, "--out", str(out), "-q", *extra]


def contents(run_dir: Path) -> dict[str, bytes]:
    """Every file of a run directory by relative path, but the clock's."""
    return {
        path.relative_to(run_dir).as_posix(): path.read_bytes()
        for path in sorted(run_dir.rglob("*"))
        if path.is_file() and path.name not in MEASURED and not path.name.endswith(".tmp")
    }


def digest(folder: Path) -> str:
    """One hash of every file (names and bytes) under ``folder``: to show nothing there changed."""
    h = hashlib.sha256()
    for relative, data in contents(folder).items():
        h.update(relative.encode() + b"\0" + data)
    return h.hexdigest()


def differences(a: Path, b: Path) -> list[str]:
    """The files that differ between two run directories (first differing line of each)."""
    left, right = contents(a), contents(b)
    found = [f"only in one: {name}" for name in sorted(set(left) ^ set(right))]
    for name in sorted(set(left) & set(right)):
        if left[name] != right[name]:
            x, y = left[name].splitlines(), right[name].splitlines()
            i = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
            found.append(f"{name} line {i + 1}: {x[i : i + 1]!r} vs {y[i : i + 1]!r}")
    return found


def messages_lost_and_duplicated(straight: Path, other: Path) -> tuple[int, int]:
    """Published messages of ``straight`` missing from ``other``, and ids ``other`` published twice."""
    import json

    def published(run_dir: Path) -> list[str]:
        lines = (run_dir / "events.jsonl").read_text(encoding="utf-8").splitlines()
        ids: list[str] = []
        for line in lines:
            if '"kind":"round"' in line:
                ids += json.loads(line)["published"]["message_id"]
        return ids

    mine, theirs = published(straight), published(other)
    return len(set(mine) - set(theirs)), len(theirs) - len(set(theirs))
