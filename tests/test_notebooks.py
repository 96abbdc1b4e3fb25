"""Notebooks run top to bottom (code cells compiled with top-level await, as Jupyter runs them)."""

import ast
import contextlib
import io
import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


async def run_notebook(path: Path) -> str:
    namespace: dict = {"__name__": "__notebook__"}
    out = io.StringIO()
    for cell in cells(path):
        if cell["cell_type"] != "code":
            continue
        assert not cell["outputs"], f"{path.name}: outputs are stripped from committed notebooks"
        source = "".join(cell["source"])
        code = compile(source, str(path), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        with contextlib.redirect_stdout(out):
            result = eval(code, namespace)
            if result is not None:
                await result
    return out.getvalue()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
async def test_every_notebook_runs_offline(path):
    assert await run_notebook(path)


async def test_the_tool_agent_notebook_shows_the_agent_working_on_the_bus():
    output = await run_notebook(next(p for p in NOTEBOOKS if p.stem == "05_tool_agents"))
    assert "analyst → reviewer  The mean is 7.25." in output
    assert "editor → <all>     Published: Reviewed: The mean is 7.25." in output
    assert "[('tool_call', 'python_execute'), ('tool_result', 'python_execute'), ('tool_call', 'terminate')" in output
    assert "('analyst', 'tool:python_execute')" in output
    assert "Observed output of cmd `python_execute` executed:\\n7.25\\n" in output
