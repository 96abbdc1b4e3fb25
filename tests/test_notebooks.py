"""Every notebook runs top to bottom in a real Jupyter kernel (nbclient), offline; outputs are not committed."""

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def execute(path: Path, workdir: Path) -> str:
    """Run the notebook in a fresh kernel; return everything its cells printed."""
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}
    )
    client.execute()
    return "".join(
        output.get("text", "")
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if output.get("name") == "stdout"
    )


def test_the_notebooks_are_committed_without_outputs():
    assert len(NOTEBOOKS) >= 5
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        assert all(
            not cell.get("outputs") and cell.get("execution_count") is None
            for cell in cells
            if cell["cell_type"] == "code"
        ), path.name


EXPECTED = {
    "01_quickstart": ["[Human → writer] Trams in city centres", "writer->>editor: Draft"],
    "02_long_term_memory": ["3 messages persisted", "'When can boats leave?' → 'The harbour opens at dawn.'"],
    "03_werewolf_analysis": ["winner: ", "eliminated: "],
    "04_experiments": ["mean_confidence", "first divergence in round 4"],
    "05_tool_agents": ["analyst → reviewer  The mean is 7.25.", "('analyst', 'tool:python_execute')"],
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_notebook_runs_offline(path, tmp_path):
    printed = execute(path, tmp_path)
    for expected in EXPECTED.get(path.stem, []):
        assert expected in printed, f"{path.name}: {expected!r} not in its output"
