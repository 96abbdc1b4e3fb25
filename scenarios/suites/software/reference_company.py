"""The scripted reference company: a script for ``--llm scripted:`` that answers every task correctly.

It calibrates the suite's table: run through the company and scored like any model, it must score
executability 4 and pass every acceptance test, so what a real model scores is the model's, not the
pipeline's. Each task's code is its hidden ``reference.py``, given when the engineer's prompt holds
the task's requirement (a ``when`` answer); the documents are plain and the same for every task.
Regenerate ``reference_company.json`` after changing a task: ``python reference_company.py``.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
SCRIPT = HERE / "reference_company.json"


def script() -> dict[str, Any]:
    """The script: documents for every task, and per task its reference code and a QA test that imports it."""
    code = []
    for folder in sorted((HERE / "tasks").iterdir()):
        idea = tomllib.loads((folder / "task.toml").read_text(encoding="utf-8"))["options"]["idea"]
        reference = (folder / "reference.py").read_text(encoding="utf-8")
        code.append({"when": idea, "answer": f"```python\n{reference.split(chr(10), 2)[2]}```"})
    prd = {"goal": "Ship what the requirement asks", "user_stories": ["As a user I call it"], "requirements": ["it"]}
    return {
        "ProductManager": {"WritePRD": [prd]},
        "Architect": {"WriteDesign": [{"modules": [{"name": "program", "purpose": "all of it"}], "interfaces": []}]},
        "ProjectManager": {"WriteTasks": [{"tasks": [{"module": "program", "description": "the requirement"}]}]},
        "Engineer": {"WriteCode": code},
        "QA": {"WriteTest": ["from program import *\n\n\ndef test_it_loads():\n    assert True\n"]},
    }


if __name__ == "__main__":
    SCRIPT.write_text(json.dumps(script(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
