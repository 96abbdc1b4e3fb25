"""Layer 9, the ``metaroles`` command (typer + rich): run, resume, fork, graph, show, diff, list.

Exit codes: 0 done; 1 the run failed (a role raised, a model failed); 2 bad input (unknown
scenario, not a run directory, bad option). A user never sees a traceback: one line on stderr.
"""

from __future__ import annotations

from collections.abc import Sequence

import typer
from typer._click.exceptions import ClickException  # typer vendors click: usage errors are its own

from metaroles.cli import inspecting, running
from metaroles.cli.common import app, err

__all__ = ["app", "inspecting", "main", "running"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``metaroles`` command; returns the exit code."""
    try:
        code = app(args=list(argv) if argv is not None else None, prog_name="metaroles", standalone_mode=False)
    except typer.Exit as exc:
        return int(exc.exit_code)
    except ClickException as exc:
        exc.show()
        return exc.exit_code
    except typer.Abort:
        err.print("aborted")
        return 130
    except Exception as exc:  # a bug of ours: still one line, never a traceback
        err.print(f"[bold red]error:[/] unexpected {type(exc).__name__}: {exc} (a metaroles bug; please report it)")
        return 1
    return code if isinstance(code, int) else 0
