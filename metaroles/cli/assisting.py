"""``metaroles mcp``: the project's verbs as the tools of an MCP server, for an assistant to drive experiments.

An assistant (Claude Desktop, an IDE, a ``ToolCallAgent`` of ours) starts ``metaroles mcp`` over
stdio and calls ``list_scenarios``, ``run``, ``show``, ``fork``, ``diff``, ``eval`` and ``export``.
Each call is the command itself (``python -m metaroles VERB ...``) in a process of its own, so
it checks what it is given as the command line does and says so in the tool's error; its output
is the tool's result. Everything it reads and writes stays inside ``--root`` (runs go to
``ROOT/runs``, evaluations to ``ROOT/evals``); a file a call names (a model's script or cassette,
a scenario's file option such as the feed's ``personas``) must lie inside the root. An assistant
names scenarios, never code: a scenario file or module (to run it or list its options), or a
suite outside the built-in ones, needs ``metaroles mcp --trust``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import typer

from metaroles.cli.common import app, reported
from metaroles.core.exceptions import ConfigError

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

VERB_SECONDS = 3600.0
"""How long one verb may run before it is stopped (a long run: ``metaroles mcp --verb-timeout``)."""


@app.command("mcp")
def mcp_server(
    root: Annotated[Path, typer.Option(help="the folder the tools work in: runs in ROOT/runs, evals in ROOT/evals")] = (
        Path(".")
    ),
    trust: Annotated[
        bool, typer.Option("--trust", help="let the assistant run scenario files and modules (code), not only names")
    ] = False,
    verb_timeout: Annotated[float, typer.Option(min=1.0, help="seconds one tool call may take")] = VERB_SECONDS,
) -> None:
    """Serve the project's verbs (list, run, show, fork, diff, eval, export) as MCP tools over stdio."""
    with reported():
        from importlib.util import find_spec

        if find_spec("mcp") is None:
            raise ConfigError("metaroles mcp needs the MCP SDK: pip install 'metaroles[tools]'")
        if not root.is_dir():
            raise ConfigError(f"--root {str(root)!r} is not a folder; create it, or name another")
    verbs(Verbs(root.resolve(), trust=trust, seconds=verb_timeout)).run("stdio")


class Verbs:
    """The commands the tools run, confined to ``root``."""

    def __init__(self, root: Path, *, trust: bool, seconds: float = VERB_SECONDS) -> None:
        self.root, self.trust, self.seconds = root, trust, seconds

    def inside(self, given: str, what: str) -> str:
        """``given`` (relative to the root) as a path inside the root.

        Raises:
            ToolError: If it leads out of the root (the assistant reads why).
        """
        path = (self.root / given).resolve()
        if not path.is_relative_to(self.root):
            raise _refused(f"{what} {given!r} is outside {str(self.root)!r}, the folder this server works in")
        return str(path)

    def model(self, spec: str) -> str:
        """A model spec whose file (``scripted:PATH``, ``replay:PATH``) lies inside the root."""
        kind, colon, path = spec.partition(":")
        if kind in FILE_MODELS and colon:
            return f"{kind}:{self.inside(path, f'the {kind} file of llm {spec!r}')}"
        return spec

    def options(self, scenario: str, options: dict[str, Any] | None) -> list[str]:
        """``--set`` arguments for ``options``, every path they name (a model's file, a file option) inside the root."""
        files = _file_options(scenario)
        checked = {}
        for key, value in (options or {}).items():
            if key == "llm" or (key.startswith("role.") and key.endswith(".llm")):
                value = self.model(str(value))
            elif key in files and isinstance(value, str):
                value = self.inside(value, f"option {key}")
            checked[key] = value
        return [arg for key, value in checked.items() for arg in ("--set", f"{key}={value}")]

    def recorded_scenario(self, run_dir: str) -> str:
        """The scenario a run directory inside the root was made by ('' when it is no run: fork says why)."""
        from metaroles.project.rundir import read_manifest

        try:
            return str(read_manifest(Path(self.inside(run_dir, "run_dir")))["scenario"])
        except ConfigError:
            return ""

    def scenario(self, name: str) -> str:
        """A scenario the assistant may run: a registered name (a file or module only with ``--trust``)."""
        from metaroles.project.registry import known_scenarios

        return self._named(name, "scenario", list(known_scenarios()))

    def suite(self, name: str) -> str:
        """A suite the assistant may evaluate: a built-in one (a folder of its own only with ``--trust``)."""
        from importlib.resources import files

        folder = Path(str(files("metaroles.scenarios"))) / "suites"
        return self._named(name, "suite", sorted(p.parent.name for p in folder.glob("*/suite.toml")))

    def _named(self, name: str, what: str, known: list[str]) -> str:
        if name in known:
            return name
        if self.trust:
            return self.inside(name, what) if "/" in name or name.endswith((".py", ".yaml", ".yml")) else name
        raise _refused(
            f"no {what} named {name!r}; known: {known} (a {what} of your own is code: the server runs it only "
            "when started with --trust)"
        )

    async def command(self, *argv: str, ok: tuple[int, ...] = (0,)) -> str:
        """Run ``metaroles ARGV`` in the root; its output, or (another exit code) an error with what it said."""
        env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160", "TERM": "dumb"}
        with anyio.fail_after(self.seconds):
            done = await anyio.run_process(
                [sys.executable, "-m", "metaroles", *argv], cwd=self.root, env=env, stdin=subprocess.DEVNULL,
                check=False,
            )  # fmt: skip
        out, err = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
        if done.returncode not in ok:
            said = [line for line in err.splitlines() if line.startswith("error:")] or err.strip().splitlines()[-1:]
            raise _refused(f"metaroles {argv[0]} failed (exit {done.returncode}): {' '.join(said)}")
        return (out + err).strip()


def _refused(message: str) -> Exception:
    """An error the assistant reads whole (the SDK hides the text of any other exception)."""
    from mcp.server.mcpserver.exceptions import ToolError

    return ToolError(message)


FILE_MODELS = ("scripted", "replay")
"""The kinds of model spec that name a file."""


def _file_options(scenario: str) -> set[str]:
    """The options of a registered scenario that name a file (marked :data:`~metaroles.core.files.NAMES_A_FILE`).

    Only a registered scenario is imported for this (names are all an assistant gives without ``--trust``).
    """
    from metaroles.core.files import NAMES_A_FILE
    from metaroles.project.registry import known_scenarios, load_scenario

    if scenario not in known_scenarios():
        return set()
    fields = load_scenario(scenario).Config.model_fields
    return {name for name, field in fields.items() if NAMES_A_FILE in field.metadata}


def verbs(verbs: Verbs) -> MCPServer:
    """The MCP server whose tools are the project's verbs."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("metaroles", instructions=__doc__)
    _making(server, verbs)
    _reading(server, verbs)
    return server


def _making(server: MCPServer, verbs: Verbs) -> None:
    """The verbs that make runs and evaluations: run, fork, eval."""

    @server.tool()
    async def run(
        scenario: str, options: dict[str, Any] | None = None, llm: str = "", seed: int | None = None,
        rounds: int | None = None, idea: str = "", out: str = "",
    ) -> str:  # fmt: skip
        """Run a scenario (options as in `list_scenarios NAME`); its summary and the run directory it wrote."""
        name = verbs.scenario(scenario)
        argv = ["run", name, *verbs.options(name, options), "--runs-dir", verbs.inside("runs", "runs"), "-q"]
        argv += ["--llm", verbs.model(llm)] if llm else []
        argv += ["--seed", str(seed)] if seed is not None else []
        argv += ["--rounds", str(rounds)] if rounds is not None else []
        argv += ["--idea", idea] if idea else []
        argv += ["--out", verbs.inside(out, "out")] if out else []
        return await verbs.command(*argv)

    @server.tool()
    async def fork(
        run_dir: str, from_round: int, options: dict[str, Any] | None = None, idea: str = "", out: str = ""
    ) -> str:
        """A new run from a round of an earlier one, with a change (options, or a message to every role)."""
        changes = verbs.options(verbs.recorded_scenario(run_dir), options)
        argv = ["fork", verbs.inside(run_dir, "run_dir"), "--from-round", str(from_round), *changes, "-q"]
        argv += ["--idea", idea] if idea else []
        return await verbs.command(*argv, *(["--out", verbs.inside(out, "out")] if out else []))

    @server.tool()
    async def eval(suite: str, seeds: int | None = None, llm: str = "", task: list[str] | None = None) -> str:
        """Run a built-in suite (software, debate, werewolf, society, feed, fidelity, studies): its table and report."""
        argv = ["eval", verbs.suite(suite), "--out", verbs.inside(f"evals/{suite}", "out")]
        argv += ["--seeds", str(seeds)] if seeds is not None else []
        argv += ["--llm", verbs.model(llm)] if llm else []
        return await verbs.command(*argv, *(arg for name in task or () for arg in ("--task", name)))


def _reading(server: MCPServer, verbs: Verbs) -> None:
    """The verbs that read: list_scenarios, show, diff, export."""

    @server.tool()
    async def list_scenarios(scenario: str = "") -> str:
        """The scenarios you can run; with a name, that scenario's options and their defaults."""
        named = [verbs.scenario(scenario), *(["--trust"] if verbs.trust else [])] if scenario else []
        return await verbs.command("list", *named)

    @server.tool()
    async def show(run_dir: str, role: str = "", round: int | None = None) -> str:
        """A run's transcript: who said what to whom, round by round (one role's, or one round's)."""
        argv = ["show", verbs.inside(run_dir, "run_dir"), *(["--role", role] if role else [])]
        return await verbs.command(*argv, *(["--round", str(round)] if round is not None else []))

    @server.tool()
    async def diff(run_a: str, run_b: str) -> str:
        """Where two runs part: the first round and event that differ (or that they are the same)."""
        return await verbs.command("diff", verbs.inside(run_a, "run_a"), verbs.inside(run_b, "run_b"), ok=(0, 1))

    @server.tool()
    async def export(run_dir: str, format: str = "jsonl") -> str:
        """A run's events as a table (jsonl, parquet), its model calls (sft) or trajectories; the file written."""
        return await verbs.command("export", verbs.inside(run_dir, "run_dir"), "--format", format)
