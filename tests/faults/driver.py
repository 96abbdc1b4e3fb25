"""Run the ``metaroles`` command in this process and die (SIGKILL) or fail at an exact moment.

    python tests/faults/driver.py WHEN CLI-ARGS...

WHEN is one of
- ``none``: just run the command;
- ``point=NAME:K``: SIGKILL the K-th time the writer reaches write point NAME (``replace:events.jsonl``,
  ``append:metrics.jsonl``, ... see ``metaroles.core.files``);
- ``write=K``: SIGKILL at the K-th write point of any name (a random moment that is exactly reproducible);
- ``interrupt=K``: Ctrl-C (SIGINT) at the K-th write point of any name;
- ``interrupt2=K``: Ctrl-C twice there (the second stops the run at once);
- ``call=K``: SIGKILL as the K-th model call is asked (mid-turn);
- ``fail=K``: the K-th model call fails as a provider does past its retries (``ProviderError``);
- ``count``: run, then print ``writes=N calls=M`` (write points reached, model calls asked) on stderr.

The process exits with the command's exit code; a kill shows as -9 to the parent.
"""

from __future__ import annotations

import os
import signal
import sys

from metaroles.core import files
from metaroles.core.exceptions import ProviderError
from metaroles.llm.offline import TestLLM


def main() -> int:
    when, args = sys.argv[1], sys.argv[2:]
    # Ctrl-C as at a terminal: a shell's background job (``make test &``) starts with it ignored, and so would this
    signal.signal(signal.SIGINT, signal.default_int_handler)
    kind, _, value = when.partition("=")
    if kind == "count":
        return _counted(args)
    if kind in ("point", "write", "interrupt", "interrupt2"):
        name, _, count = value.rpartition(":") if kind == "point" else ("", "", value)
        seen = 0

        def hook(point: str) -> None:
            nonlocal seen
            if kind != "point" or point == name:
                seen += 1
                if seen == int(count):
                    _strike(kind)

        files.fault_hook = hook
    elif kind in ("call", "fail"):
        answer, calls = TestLLM.complete, 0

        async def complete(self, request):  # type: ignore[no-untyped-def]
            nonlocal calls
            calls += 1
            if calls == int(value):
                if kind == "call":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise ProviderError("the model server answered 503 three times; giving up (fault test)")
            return await answer(self, request)

        TestLLM.complete = complete  # type: ignore[method-assign]
    from metaroles.cli import main as cli

    return cli(args)


def _strike(kind: str) -> None:
    """SIGKILL, or Ctrl-C (twice for ``interrupt2``)."""
    for _ in range(2 if kind == "interrupt2" else 1):
        os.kill(os.getpid(), signal.SIGINT if kind.startswith("interrupt") else signal.SIGKILL)


def _counted(args: list[str]) -> int:
    from metaroles.cli import main as cli

    counts = {"writes": 0, "calls": 0}
    answer = TestLLM.complete

    def hook(point: str) -> None:
        counts["writes"] += 1

    async def complete(self, request):  # type: ignore[no-untyped-def]
        counts["calls"] += 1
        return await answer(self, request)

    files.fault_hook = hook
    TestLLM.complete = complete  # type: ignore[method-assign]
    code = cli(args)
    print(f"writes={counts['writes']} calls={counts['calls']}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
