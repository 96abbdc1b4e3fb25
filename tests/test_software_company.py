"""The software company end to end: documents, code, tests that really run, and the fix loop."""

import json

import pytest
from metaroles.actions.software import PRD, Design, TaskList, TestReport, main_guarded, module_file, strip_fences

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
    assert {p.name for p in (workspace / "docs").iterdir()} == {
        "requirement.md",
        "prd.md",
        "design.md",
        "design.json",
        "tasks.md",
    }
    assert (
        workspace / "docs" / "requirement.md"
    ).read_text() == "A command-line tool that counts the words in a text file.\n"
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


@pytest.mark.skipif(
    not local_model_available(), reason="needs metaroles[local] and the embedded models (make demo installs them)"
)
async def test_a_short_run_with_the_embedded_model(tmp_path):
    from metaroles.llm.local import LocalLLM

    llm = LocalLLM("smollm2-135m-instruct-q4_1", max_tokens=160, temperature=0.0)  # the pipeline: the fast model
    _, team = await run_scenario("software_company", llm=llm, options={"max_fix_loops": 0}, out_dir=tmp_path / "run")
    documents = [m.instruct_content for m in team.env.history.storage[1:4]]
    assert [type(d) for d in documents] == [PRD, Design, TaskList], "structured answers validate"
    report = json.loads((tmp_path / "run" / "workspace" / "test_report.json").read_text())
    assert report["attempt"] == 1 and report["passed"] + report["failed"] >= 1


def test_code_that_runs_at_import_moves_under_a_main_guard_and_definitions_stay():
    code = (
        "import re\n# a helper\ndef f(x):\n    return x + 1\n\nPATTERN = re.compile('a')\n"
        "y = f(2)\nprint(y)\nassert f(1) == 3, 'examples a model appends'\n"
    )
    guarded = main_guarded(code)
    assert guarded.startswith("import re\n# a helper\ndef f(x):\n    return x + 1\n\nPATTERN = re.compile('a')\n")
    assert guarded.endswith(
        "if __name__ == \"__main__\":\n    y = f(2)\n    print(y)\n    assert f(1) == 3, 'examples a model appends'\n"
    )
    scope: dict[str, object] = {"__name__": "imported"}
    exec(compile(guarded, "m", "exec"), scope)  # imports without running the examples (their assert fails)
    assert "y" not in scope and callable(scope["f"])
    assert main_guarded("def f():\n    return 1\n") == "def f():\n    return 1\n", "nothing to move: unchanged"
    assert main_guarded("def f(:\n") == "def f(:\n", "code that does not parse is left for its tests to show"


async def test_the_engineer_and_qa_read_the_requirement_and_a_fix_keeps_the_tests_that_failed(tmp_path):
    seen: dict[str, list[str]] = {}

    def answer(request):
        seen.setdefault(request.action, []).append(request.messages[-1]["content"])
        if request.action == "WriteCode":
            return "```python\ndef count_words(text):\n    return 0\n\nprint(count_words('a'))\n```"
        return ANSWERS[request.action]

    await run_scenario(
        "software_company", llm=FunctionLLM(answer), options={"max_fix_loops": 1}, out_dir=tmp_path / "run"
    )
    idea = "A command-line tool that counts the words in a text file."
    assert all(idea in prompt for prompt in seen["WriteCode"] + seen["WriteTest"] + seen["WriteDesign"])
    assert len(seen["WriteCode"]) == 2 and len(seen["WriteTest"]) == 1, "the fix is judged by the same tests"
    assert "The last test run failed" in seen["WriteCode"][1]
    code = (tmp_path / "run" / "workspace" / "src" / "counter.py").read_text()
    assert code.endswith("if __name__ == \"__main__\":\n    print(count_words('a'))\n")
