"""A suite's ``score.py`` run in a child process, each call with a time limit.

A suite is code someone may have sent: its scorer does not run in the process that holds the
evaluation. :class:`ScorerProcess` starts ``python -m metaroles.project.scoring SCORE_PY``, sends it
one JSON request per line (``score`` a trial, or ``across`` a setting's rows) and reads one JSON
answer per line. A suite that is not built in is code someone may have sent: its child runs in the kernel sandbox
(bubblewrap: the run directories and the suite read-only, nothing written outside its own ``/tmp``,
no network) unless its user trusts it (``--trust``). A call that outlives its limit kills the child
(the next call starts another);
a scorer that raises, returns something other than a dict, or does not load is a
:class:`ScorerError` naming the file and what to fix, never a crash of the evaluation.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import selectors
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from metaroles.agents import isolation
from metaroles.core.exceptions import ConfigError, RunError


@dataclass(frozen=True)
class Task:
    """One task of a suite: its folder (hidden files included), the options it gives the scenario, its spec."""

    name: str
    folder: Path
    options: dict[str, Any]
    spec: dict[str, Any]
    """The whole of ``task.toml`` (a scorer reads what it needs)."""


STARTUP = 120.0
"""Seconds the child may take to start and load ``score.py`` (imports are slow on a busy machine)."""


class ScorerError(RunError):
    """A suite's scorer failed on one call (it raised, answered badly, or ran past its limit)."""


class ScorerProcess:
    """The child process that runs a suite's ``score.py`` (see the module)."""

    def __init__(self, score_py: Path, *, timeout: float, confined_to: list[Path] | None = None) -> None:
        """Prepare to run ``score_py``; each call may take ``timeout`` seconds.

        ``confined_to``: run it in the kernel sandbox (bubblewrap), reading only these folders (and
        the suite's, Python's and the system's), writing nothing outside its own ``/tmp``, with no
        network; ``None``: as plain code (a built-in suite, or ``--trust``).
        """
        self.score_py = score_py
        self.timeout = timeout
        self.confined_to = confined_to
        self._child: subprocess.Popen[str] | None = None
        self._across = False

    def __enter__(self) -> ScorerProcess:
        """Start the child lazily (at the first call)."""
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        """Stop the child."""
        self.close()

    def close(self) -> None:
        """Stop the child if it runs."""
        child, self._child = self._child, None
        if child is not None:
            child.kill()
            child.wait()
            for stream in (child.stdin, child.stdout):
                if stream is not None:
                    stream.close()

    def score(self, run_dir: Path, task: Task) -> dict[str, Any]:
        """``score(run_dir, task)`` of the suite: metric → number or text.

        Raises:
            ScorerError: If the scorer raised, answered other than a dict of scores, or ran past its limit.
        """
        data = dataclasses.asdict(task) | {"folder": str(task.folder)}
        return self._call({"op": "score", "run_dir": str(run_dir), "task": data})

    def across(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """``across(rows)`` of the suite (see :meth:`has_across`): figures of a setting's trials taken together.

        Raises:
            ScorerError: As :meth:`score`.
        """
        return self._call({"op": "across", "rows": rows})

    def has_across(self) -> bool:
        """Whether the suite's ``score.py`` defines ``across(rows)``.

        Raises:
            ScorerError: If ``score.py`` does not load.
        """
        self._started()
        return self._across

    def check(self) -> None:
        """Load ``score.py`` in the child now: a syntax error or a missing ``score()`` is found before any trial.

        Raises:
            ConfigError: Naming the file and what is wrong.
        """
        try:
            self._started()
        except ScorerError as exc:
            raise ConfigError(str(exc)) from None

    def _started(self) -> subprocess.Popen[str]:
        """The child, started (and ``score.py`` loaded: it says so first) if it is not running."""
        if self._child is not None and self._child.poll() is None:
            return self._child
        self._child = subprocess.Popen(
            self._command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            encoding="utf-8",
        )
        ready = self._answer(self._child, max(STARTUP, self.timeout), "to load")
        self._across = bool(ready["across"])
        return self._child

    def _command(self) -> list[str]:
        argv = [sys.executable, "-m", "metaroles.project.scoring", str(self.score_py)]
        if self.confined_to is None:
            return argv
        bwrap = isolation.bubblewrap()
        if bwrap is None:
            raise ConfigError(
                f"{str(self.score_py)!r} is code from a suite that is not built in: it runs in the kernel "
                "sandbox, and bubblewrap is not here (Debian: apt-get install bubblewrap); if the suite is yours, "
                "pass --trust"
            )
        readable = [*self.confined_to, self.score_py.parent]
        for name in ("metaroles", "metaroles.actions", "metaroles.environments", "metaroles.scenarios"):
            spec = importlib.util.find_spec(name)  # the packages the scorer imports from (an editable install's too)
            readable += [Path(p) for p in (spec.submodule_search_locations or [])] if spec is not None else []
        return isolation.confined_command(bwrap, argv, readable=readable, env=isolation.clean_env({"HOME": "/tmp"}))

    def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        child = self._started()
        assert child.stdin is not None
        try:
            child.stdin.write(json.dumps(request) + "\n")
            child.stdin.flush()
        except BrokenPipeError:
            self.close()
            raise ScorerError(f"{str(self.score_py)!r} stopped before it answered; run it alone to see why") from None
        return self._answer(child, self.timeout, "to answer")

    def _answer(self, child: subprocess.Popen[str], limit: float, doing: str) -> dict[str, Any]:
        """The child's next answer, waited for at most ``limit`` seconds.

        Raises:
            ScorerError: If it took longer (the child is stopped), ended, or answered with an error.
        """
        assert child.stdout is not None
        deadline = time.monotonic() + limit
        with selectors.DefaultSelector() as selector:
            selector.register(child.stdout, selectors.EVENT_READ)
            while not selector.select(max(0.0, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    self.close()
                    raise ScorerError(
                        f"{str(self.score_py)!r} took more than {limit:g} s {doing} and was stopped; "
                        "make it faster or raise score_timeout in suite.toml"
                    )
        line = child.stdout.readline()
        if not line:
            code = child.wait()
            self.close()
            raise ScorerError(
                f"{str(self.score_py)!r} exited (code {code}) before it answered; run it alone to see why"
            )
        answer = json.loads(line)
        if "error" in answer:
            raise ScorerError(f"{str(self.score_py)!r}: {answer['error']}")
        return dict(answer["result"])


def _load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"metaroles_suite_score_{abs(hash(str(path)))}", path)
    if spec is None or spec.loader is None:
        raise ValueError("it cannot be loaded as Python")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "score", None)):
        raise ValueError("it must define score(run_dir, task) returning a dict")
    return module


def _answer(module: Any, request: dict[str, Any]) -> Any:
    if request["op"] == "across":
        return module.across(request["rows"])
    task = request["task"]
    return module.score(
        Path(request["run_dir"]), Task(task["name"], Path(task["folder"]), task["options"], task["spec"])
    )


def _checked(result: Any, op: str) -> dict[str, Any]:
    name = "score()" if op == "score" else "across()"
    if not isinstance(result, dict) or not all(isinstance(key, str) for key in result):
        raise ValueError(f"{name} returned {type(result).__name__}; return a dict of metric name → number or text")
    for key, value in result.items():
        if not (value is None or isinstance(value, str | int | float | bool)):
            raise ValueError(f"{name} gave {key}={value!r} ({type(value).__name__}); a score is a number, text or None")
    return result


def main(argv: list[str]) -> None:
    """The child's loop: load ``argv[0]`` and say so, then answer each request line with a line (see the module)."""
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # what the scorer prints goes to stderr, never into the answers
    sys.stdout = sys.stderr
    try:
        module = _load(Path(argv[0]))
        _say(answers, {"result": {"across": callable(getattr(module, "across", None))}})
    except SyntaxError as exc:
        _say(answers, {"error": f"line {exc.lineno}: {exc.msg}; fix the file"})
        return
    except Exception as exc:  # the suite's code failed to load: the evaluation says so and stops
        _say(answers, {"error": f"{type(exc).__name__}: {exc}"})
        return
    for line in sys.stdin:
        request = json.loads(line)
        reply: dict[str, Any]
        try:
            reply = {"result": _checked(_answer(module, request), request["op"])}
        except Exception as exc:  # the suite's code failed: the evaluation names it and goes on
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        _say(answers, reply)


def _say(answers: Any, reply: dict[str, Any]) -> None:
    answers.write(json.dumps(reply, default=str) + "\n")
    answers.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
