"""A process that has imported the command once and forks a child for each run of ``driver.py`` it is asked for.

    python tests/faults/warm.py        (started by ``helpers.command``; one per test worker)

The fault tests start hundreds of short runs, each in a process of its own — killed, resumed, compared.
Importing the command (pydantic's models, the CLI, the scenarios) is about half of such a run's time;
here it is done once, and each run is a fork of this process: still a process of its own, killed by a
real SIGKILL, resumed by another, with the environment, folder and arguments the test gave it, a
fresh random source, and ``python driver.py``'s path — what a new interpreter would have, but its
imports (the suite's hash seed is fixed, ``PYTHONHASHSEED=0``, as the driver's runs have it anyway).

Each request is a JSON line on stdin (``args``: the driver's arguments, ``cwd``, ``env``, ``out`` and
``err``: files for the child's output); the answer is a JSON line on stdout: ``{"code": N}``, the exit
code as ``subprocess`` gives it (``-9`` for a SIGKILL).
"""

from __future__ import annotations

import importlib
import json
import os
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCENARIOS = ("debate", "feed", "society", "software_company", "werewolf")
PRELOADED = ("driver", "metaroles.cli", "metaroles.cli.running", *(f"metaroles.scenarios.{name}" for name in SCENARIOS))
"""What every run imports, imported once (the driver's own imports, the command, the scenarios)."""


def serve() -> None:
    sys.path[0] = str(HERE)  # as `python tests/faults/driver.py` has it
    for name in PRELOADED:
        importlib.import_module(name)
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps({"code": os.waitstatus_to_exitcode(status)}) + "\n")


def _child(request: dict) -> None:
    """Become the run the request asks for; never returns."""
    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, request["out"]), (2, request["err"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
        random.seed()  # a new process's own random source, not the one forked
        sys.argv = [str(HERE / "driver.py"), *request["args"]]
        import driver

        code = driver.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    serve()
