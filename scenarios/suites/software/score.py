"""Scores a software_company run: its code against the task's hidden acceptance tests, in the sandbox.

The code of ``workspace/src/`` and the task's ``acceptance.py`` are copied into a scratch folder,
and a runner in ``PythonExecute`` (bubblewrap: no network, only that folder writable, killed at
the suite's ``timeout``) imports every module, gathers their public names into a module
``solution`` (what the tests import from, whatever files the engineer chose) and runs each
``test_*`` function, printing a line per step as it goes, so a program cut at the limit keeps the
steps it finished. Besides, the paper's code statistics: files, lines of code (``loc``) and per file,
and productivity: tokens (the ledger's prompt and completion tokens) per line of code.
Executability, in the MetaGPT paper's sense:

- 0: it does not start (no code, a syntax error, an import that fails or hangs, or writes outside
  its folder at import, which the sandbox refuses);
- 1: it starts, but lacks what the task asked for (the tests cannot import it);
- 2: it has it, and passes no acceptance test;
- 3: it passes some;
- 4: it passes them all.
"""

from __future__ import annotations

import ast
import json
import shutil
import tempfile
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio

from metaroles.agents.sandbox import PythonExecute
from metaroles.project.scoring import Task

RUNNER = r"""
import glob, importlib, json, os, sys, types
def say(**fields):
    print(json.dumps(fields), flush=True)
solution = types.ModuleType("solution")
sys.modules["solution"] = solution
sys.path.insert(0, os.path.abspath("src"))
paths = sorted(glob.glob("src/*.py"))
if not paths:
    say(step="load", ok=False, error="no source file")
    raise SystemExit
for path in paths:
    try:
        module = importlib.import_module(os.path.basename(path)[:-3])
    except BaseException as exc:
        say(step="load", ok=False, error=f"{path}: {type(exc).__name__}: {exc}"[:300])
        raise SystemExit
    for name, value in vars(module).items():
        if not name.startswith("_"):
            setattr(solution, name, value)
say(step="load", ok=True)
scope = {"__name__": "acceptance"}
try:
    exec(compile(open("acceptance.py").read(), "acceptance.py", "exec"), scope)
except BaseException as exc:
    say(step="entry", ok=False, error=f"{type(exc).__name__}: {exc}"[:300])
    raise SystemExit
say(step="entry", ok=True)
for name in sorted(k for k, v in scope.items() if k.startswith("test_") and callable(v)):
    try:
        scope[name]()
        say(step="test", name=name, ok=True)
    except BaseException as exc:
        say(step="test", name=name, ok=False, error=f"{type(exc).__name__}: {exc}"[:300])
"""


def score(run_dir: Path, task: Task) -> dict[str, Any]:
    """Executability (0-4), acceptance tests passed of all and their share, lines of code, fix attempts."""
    workspace = run_dir / "workspace"
    sources = sorted(p for p in (workspace / "src").glob("*.py") if p.is_file() and not p.is_symlink())
    tests = task.folder / "acceptance.py"
    total = sum(
        1
        for node in ast.parse(tests.read_text(encoding="utf-8")).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    )
    steps, timed_out = _run(sources, tests, _timeout(task))
    loaded = any(s.get("step") == "load" and s.get("ok") for s in steps)
    entry = any(s.get("step") == "entry" and s.get("ok") for s in steps)
    passed = sum(1 for s in steps if s.get("step") == "test" and s.get("ok"))
    executability = 0 if not loaded else 1 if not entry else 2 if passed == 0 else 3 if passed < total else 4
    problems = [s["error"] for s in steps if s.get("error")]
    loc = sum(1 for p in sources for line in p.read_text(errors="replace").splitlines() if line.strip())
    tokens = _tokens(run_dir)
    return {
        "executability": executability,
        "tests_passed": passed,
        "tests_total": total,
        "pass_rate": round(passed / total, 6) if total else None,
        "timed_out": timed_out,
        "loc": loc,
        "files": len(sources),
        "loc_per_file": round(loc / len(sources), 6) if sources else None,
        "tokens_per_line": round(tokens / loc, 6) if loc else None,
        "fix_attempts": max(len(list((workspace / "attempts").glob("*/src"))) - 1, 0),
        "first_problem": (problems[0] if problems else "timed out" if timed_out else None),
    }


def _tokens(run_dir: Path) -> int:
    """Prompt and completion tokens of every model call of the run (its ledger)."""
    ledger = run_dir / "ledger.json"
    entries = json.loads(ledger.read_text(encoding="utf-8")) if ledger.is_file() else []
    return sum(int(e.get("prompt_tokens", 0)) + int(e.get("completion_tokens", 0)) for e in entries)


def _timeout(task: Task) -> float:
    suite = tomllib.loads((task.folder.parent.parent / "suite.toml").read_text(encoding="utf-8"))
    return float(task.spec.get("timeout", suite.get("timeout", 10)))


def _run(sources: list[Path], tests: Path, timeout: float) -> tuple[list[dict[str, Any]], bool]:
    """The runner's steps (see the module) and whether it was cut at ``timeout``."""
    with tempfile.TemporaryDirectory(prefix="metaroles-score-") as scratch:
        folder = Path(scratch)
        (folder / "src").mkdir()
        for source in sources:
            shutil.copyfile(source, folder / "src" / source.name)
        shutil.copyfile(tests, folder / "acceptance.py")
        tool = PythonExecute(workdir=folder, timeout=timeout, max_timeout=max(timeout, 60.0))
        with ThreadPoolExecutor(1) as thread:  # its own event loop: the caller may be inside one (a notebook)
            result = thread.submit(anyio.run, _execute, tool).result()
    steps = []
    for line in str(result.output).splitlines():
        try:
            step = json.loads(line)
        except ValueError:
            continue
        if isinstance(step, dict) and "step" in step:
            steps.append(step)
    return steps, "timed out" in str(result.error or "")


async def _execute(tool: PythonExecute) -> Any:
    return await tool(code=RUNNER)
