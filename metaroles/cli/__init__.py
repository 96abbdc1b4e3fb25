"""Layer 13, the ``metaroles`` command: run, resume, fork, watch, interview, survey, sweep, eval, graph, ...

Exit codes: 0 done; 1 the run failed (a role raised, a model failed); 2 bad input (unknown
scenario, not a run directory, bad option); 130 interrupted (Ctrl-C: the run directory is left
resumable). A user never sees a traceback: one line on stderr.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from functools import partial

import typer
from rich.markup import escape
from typer._click.exceptions import ClickException  # typer vendors click: usage errors are its own

from metaroles.cli import asking, assisting, evaluating, inspecting, populating, running, serving, sweeping, watching
from metaroles.cli.common import app, err, say
from metaroles.core.exceptions import MetarolesError, RunError
from metaroles.core.text import printable

__all__ = [
    "app",
    "asking",
    "assisting",
    "evaluating",
    "inspecting",
    "main",
    "populating",
    "running",
    "serving",
    "sweeping",
    "watching",
]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``metaroles`` command; returns the exit code.

    Whatever goes wrong is one line on stderr: usage errors (exit 2), bad values (2), a failed
    run (1), and even a bug of ours (1). Warnings are one line too.
    """
    with warnings.catch_warnings():
        said: set[str] = set()  # a warning many trials or roles give alike is said once
        warnings.showwarning = partial(_one_line_warning, said=said)
        try:
            code = app(args=list(argv) if argv is not None else None, prog_name="metaroles", standalone_mode=False)
        except typer.Exit as exc:
            return int(exc.exit_code)
        except ClickException as exc:
            ctx = getattr(exc, "ctx", None)  # a usage error knows its command
            command = "metaroles" if ctx is None or ctx.parent is None else f"metaroles {ctx.info_name}"
            hint = f" (see: {command} --help)"
            say(f"{exc.format_message()}{hint}")
            return exc.exit_code
        except typer.Abort:
            say("aborted")
            return 130
        except MetarolesError as exc:  # raised outside a command's `reported` block: the same one line and code
            say(str(exc))
            return 1 if isinstance(exc, RunError) else 2
        except Exception as exc:  # a bug of ours: still one line, never a traceback
            say(f"unexpected {type(exc).__name__}: {exc} (a metaroles bug; please report it)")
            return 1
    return code if isinstance(code, int) else 0


def _one_line_warning(
    message: Warning | str, category: type[Warning], *args: object, said: set[str], **kwargs: object
) -> None:
    text = " ".join(printable(str(message)).split())
    if text in said:
        return
    said.add(text)
    err.print(f"warning: {escape(text)}", highlight=False, soft_wrap=True)
