"""The notebooks are committed clean; ``make test`` runs each top to bottom with nbmake (see pyproject's addopts).

Each notebook ends with a cell of assertions on what it showed, so running it is testing it.
"""

import json
from pathlib import Path

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_the_notebooks_are_committed_without_outputs():
    assert len(NOTEBOOKS) >= 6
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        assert all(
            not cell.get("outputs") and cell.get("execution_count") is None
            for cell in cells
            if cell["cell_type"] == "code"
        ), path.name


def test_every_notebook_checks_what_it_shows():
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        last = "".join(cells[-1]["source"])
        assert cells[-1]["cell_type"] == "code" and "assert " in last, f"{path.name} ends without its checks"


def test_nbmake_runs_the_notebooks_in_make_test():
    config = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text(encoding="utf-8")
    assert '"notebooks"' in config and "--nbmake" in config
