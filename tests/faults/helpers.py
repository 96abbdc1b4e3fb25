"""Running the command in other processes, killing it at exact points, and comparing run directories."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
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
    """``metaroles ARGS`` in a process of its own, dying or failing as ``when`` says (see driver.py)."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    return subprocess.run(
        [sys.executable, str(DRIVER), when, *args], capture_output=True, text=True, env=env, cwd=cwd, check=False
    )


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
