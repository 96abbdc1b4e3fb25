"""The software company's actions: PRD, design, tasks, code, tests, and running the tests.

Structured outputs (PRD, design, task list, test report) are pydantic models that become the
messages' ``instruct_content``; code and tests are files written into a workspace; the tests run
in the sandboxed :class:`~metaroles.agents.sandbox.PythonExecute`.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import re
import textwrap
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, Field

from metaroles import Action, Message
from metaroles.agents.sandbox import PythonExecute
from metaroles.core import confined
from metaroles.core.files import write_atomic
from metaroles.core.prompts import load_prompt, render_prompt


class PRD(BaseModel):
    """A product requirement document."""

    goal: str = Field(min_length=1, max_length=120)
    user_stories: list[str] = Field(min_length=1, max_length=2)
    requirements: list[str] = Field(min_length=1, max_length=3)


class ModuleSpec(BaseModel):
    """One module of the design."""

    name: str = Field(min_length=1, max_length=30)
    purpose: str = Field(min_length=1, max_length=100)


class Design(BaseModel):
    """The architect's design: its modules and interfaces (MetaGPT's "data structures and interfaces")."""

    modules: list[ModuleSpec] = Field(min_length=1, max_length=2)
    interfaces: list[str] = Field(default_factory=list, max_length=4)
    """Each a Python signature, e.g. ``def count_words(text: str) -> int``, named as the requirement names it."""


class Task(BaseModel):
    """One engineering task: a module to write."""

    module: str = Field(min_length=1, max_length=30)
    description: str = Field(min_length=1, max_length=100)


class TaskList(BaseModel):
    """The project manager's tasks."""

    tasks: list[Task] = Field(min_length=1, max_length=2)


class TestReport(BaseModel):
    """What running the tests gave."""

    __test__ = False  # a report, not a pytest test class

    passed: int
    failed: int
    errors: list[str]
    attempt: int


def module_file(name: str, index: int) -> str:
    """A safe file name for a module the model named."""
    slug = re.sub(r"[^a-z0-9_]", "_", name.lower().removesuffix(".py")).strip("_")
    return f"{slug if slug and slug[0].isalpha() else f'module_{index}'}.py"


_FENCE = re.compile(
    r"^[ \t]*```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:^[ \t]*```[ \t]*$|\Z)", re.DOTALL | re.MULTILINE | re.I
)


def strip_fences(text: str) -> str:
    """The code of a model's answer: inside its Markdown fence (even one left open), without the talk around it."""
    match = _FENCE.search(text)
    return (match.group(1) if match else text).strip() + "\n"


_KEPT = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def main_guarded(code: str) -> str:
    """``code`` with what it runs at import (example calls, prints, asserts) moved under ``if __name__ == "__main__":``.

    A module is imported by the tests: the examples a model appends (``print(f(3))``, ``assert
    f(1) == 2``, ``input()``) would run, fail or wait there. Definitions, imports and assignments of
    values stay; an assignment calling what the module defines (or ``input``/``print``) moves. Code
    that does not parse is left as it is (its tests say why).
    """
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    lines = code.splitlines(keepends=True)
    kept: list[str] = []
    moved: list[str] = []
    start = 0
    for node in tree.body:
        end = node.end_lineno or node.lineno
        segment = "".join(lines[start:end])
        start = end
        (kept if _stays(node, defined) else moved).append(segment)
    if not moved:
        return code
    kept.append("".join(lines[start:]))
    body = textwrap.indent("".join(moved).strip("\n") + "\n", "    ")
    return "".join(kept).rstrip("\n") + '\n\n\nif __name__ == "__main__":\n' + body


def _stays(node: ast.stmt, defined: set[str]) -> bool:
    """Whether a top-level statement belongs to the module's import (a definition), not to a run of it."""
    if isinstance(node, _KEPT):
        return True
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):  # a docstring
        return True
    if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test):  # guarded already
        return True
    if isinstance(node, ast.Assign | ast.AnnAssign):
        calls = {c.func.id for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
        return not calls & (defined | {"input", "print"})
    return False


def latest(history: Sequence[Message], model: type[BaseModel]) -> BaseModel | None:
    """The newest structured output of type ``model`` in ``history``."""
    for message in reversed(history):
        if isinstance(message.instruct_content, model):
            return message.instruct_content
    return None


def markdown(title: str, model: BaseModel) -> str:
    """A structured output as a Markdown document: a section per field, an entry of a list as a subsection."""
    lines = [f"# {title}", ""]
    for field, value in model.model_dump().items():
        lines += [f"## {field.replace('_', ' ').capitalize()}", ""]
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict) and item:
                (_, head), *rest = item.items()
                lines += [f"### {head}", ""]
                lines += [f"**{key.replace('_', ' ').capitalize()}**: {text}" for key, text in rest] + [""]
            else:
                lines.append(f"- {item}")
        if lines[-1]:
            lines.append("")
    return "\n".join(lines)


class _Workspace(Action):
    """An action that writes into the company's workspace."""

    def __init__(self, workspace: Path, prompts: Path | None = None) -> None:
        """Write into ``workspace``; ``prompts``: a folder whose prompt files replace the shipped ones."""
        super().__init__()
        self.workspace = workspace
        self.prompts = prompts

    def template(self, name: str) -> str:
        """Prompt file ``name``: from the ``prompts`` folder when it holds one (a variant), else the shipped one."""
        if self.prompts is not None and (self.prompts / name).is_file():
            return (self.prompts / name).read_text(encoding="utf-8")
        return load_prompt("metaroles.actions.prompts", name)

    def write(self, relative: str, text: str) -> None:
        """Write a file in the workspace: a kill leaves the old file or the new one, and no link is followed.

        The tests' sandboxed code runs in the workspace and may have swapped a folder for a link.
        """
        write_atomic(self.workspace / relative, text, beneath=self.workspace)

    def requirement(self) -> str:
        """The user's requirement as the product manager kept it (empty before there is one)."""
        return self.document(REQUIREMENT)

    def document(self, relative: str) -> str:
        """A document of the workspace (``docs/design.md``), read following no link; empty when there is none."""
        try:
            return confined.read_bytes(self.workspace, relative).decode("utf-8", errors="replace").strip()
        except FileNotFoundError:
            return ""

    def design(self) -> Design:
        """The architect's design as it was written (an empty one when there is none, or it does not read)."""
        try:
            return Design.model_validate_json(self.document(DESIGN))
        except ValueError:
            return Design.model_construct(modules=[], interfaces=[])

    def sources(self, folder: str, pattern: str) -> list[tuple[str, str]]:
        """The regular files ``folder/pattern`` of the workspace, as (stem, text), read following no link."""
        found = []
        for relative, regular in confined.entries(self.workspace, folder):
            if regular and "/" not in relative and fnmatch.fnmatchcase(relative, pattern):
                data = confined.read_bytes(self.workspace, f"{folder}/{relative}")
                found.append((PurePosixPath(relative).stem, data.decode("utf-8", errors="replace")))
        return found


REQUIREMENT = "docs/requirement.md"
"""The user's requirement, word for word (MetaGPT's ``docs/requirement.txt``): what the engineer and QA read."""

DESIGN = "docs/design.json"
"""The design as data (MetaGPT keeps its documents as JSON too): the engineer reads its interfaces."""

CODE_TOKENS = 768
"""The longest answer a file of code or tests may be (a model's default bound cuts code mid-string)."""


class WritePRD(_Workspace):
    """Turn the idea into a PRD (docs/prd.md), keeping the idea itself (docs/requirement.md)."""

    async def run(self, history: Sequence[Message]) -> PRD:
        """Ask for the PRD."""
        idea = history[-1].content or ""
        self.write(REQUIREMENT, idea.strip() + "\n")
        prompt = render_prompt(self.template("write_prd.txt"), idea=idea)
        prd = await self.aask(prompt, output_model=PRD)
        self.write("docs/prd.md", markdown("Product requirements", prd))
        return prd


class WriteDesign(_Workspace):
    """Turn the PRD into a design (docs/design.md)."""

    async def run(self, history: Sequence[Message]) -> Design:
        """Ask for the design."""
        prd = latest(history, PRD)
        prompt = render_prompt(
            self.template("write_design.txt"), prd=prd.model_dump_json() if prd else "", requirement=self.requirement()
        )
        design = await self.aask(prompt, output_model=Design)
        self.write("docs/design.md", markdown("Design", design))
        self.write(DESIGN, design.model_dump_json(indent=1))
        return design


class WriteTasks(_Workspace):
    """Turn the design into one task per module (docs/tasks.md)."""

    async def run(self, history: Sequence[Message]) -> TaskList:
        """Ask for the tasks."""
        design = latest(history, Design) or latest(history, PRD)  # without an architect: from the PRD
        context = design.model_dump_json() if design else ""
        tasks = await self.aask(
            render_prompt(self.template("write_tasks.txt"), design=context),
            output_model=TaskList,
        )
        self.write("docs/tasks.md", markdown("Tasks", tasks))
        return tasks


class WriteCode(_Workspace):
    """Write one file per task (src/), taking the last test report's errors into account."""

    async def run(self, history: Sequence[Message]) -> str:
        """Write every module; return the list of files."""
        tasks = latest(history, TaskList) or _tasks_from(history)
        report = latest(history, TestReport)
        feedback = (
            f"The last test run failed with: {'; '.join(report.errors)[:600]}" if isinstance(report, TestReport) else ""
        )
        attempt = 1 + sum(isinstance(m.instruct_content, TestReport) for m in history)
        interfaces = _agreeing(self.design().interfaces, self.requirement())
        written = []
        for index, task in enumerate(tasks.tasks if isinstance(tasks, TaskList) else []):
            path = module_file(task.module, index)
            template = self.template("write_code.txt")
            prompt = render_prompt(
                template,
                path=path,
                task=task.description,
                feedback=feedback,
                requirement=self.requirement(),
                interfaces=interfaces,
            )
            code = main_guarded(strip_fences(await self.aask(prompt, max_tokens=CODE_TOKENS)))
            self.write(f"src/{path}", code)
            self.write(f"attempts/{attempt}/src/{path}", code)  # every attempt kept; src/ holds the latest
            written.append(path)
        return "wrote " + ", ".join(f"src/{p}" for p in written)


def _agreeing(interfaces: list[str], requirement: str) -> str:
    """The design's interfaces whose names the requirement uses, as a line for the engineer (a rename is dropped).

    A small model's design often renames what the user named (``is_leap`` becomes ``year_leap``):
    the requirement wins over a design that disagrees with it.
    """
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", requirement))
    agreeing = [
        i for i in interfaces if (m := re.search(r"(?:def|class)?\s*([A-Za-z_]\w*)", i)) and m.group(1) in words
    ]
    return f"Its interfaces: {'; '.join(agreeing)}" if agreeing else ""


def _tasks_from(history: Sequence[Message]) -> TaskList | None:
    """Tasks when no project manager made them: a module of the design each, else one from the PRD."""
    design, prd = latest(history, Design), latest(history, PRD)
    if isinstance(design, Design):
        return TaskList(tasks=[Task(module=m.name, description=m.purpose) for m in design.modules])
    if isinstance(prd, PRD):
        return TaskList(tasks=[Task(module="main", description="; ".join([prd.goal, *prd.requirements])[:100])])
    return None


class WriteTest(_Workspace):
    """Write a test file per module (tests/), once: a fix is judged by the tests that failed it."""

    async def run(self, history: Sequence[Message]) -> str:
        """Write the tests for every module in src/ that has none yet."""
        written = []
        tested = {stem.removeprefix("test_") for stem, _ in self.sources("tests", "test_*.py")}
        for stem, code in self.sources("src", "*.py"):
            if stem in tested:
                continue
            template = self.template("write_test.txt")
            prompt = render_prompt(template, module=stem, code=code[:1500], requirement=self.requirement())
            self.write(f"tests/test_{stem}.py", strip_fences(await self.aask(prompt, max_tokens=CODE_TOKENS)))
            written.append(f"tests/test_{stem}.py")
        return "wrote " + ", ".join(written) if written else "kept the tests"


_RUNNER = r"""
import glob, json, os, sys, traceback
sys.path.insert(0, os.path.join(os.getcwd(), "src"))
passed, failed, errors = 0, 0, []
for path in sorted(glob.glob("tests/test_*.py")):
    scope = {"__name__": "tests"}
    try:
        exec(compile(open(path).read(), path, "exec"), scope)
    except BaseException as exc:
        failed += 1
        errors.append(f"{path}: {type(exc).__name__}: {exc}")
        continue
    for name, test in sorted(scope.items()):
        if name.startswith("test_") and callable(test):
            try:
                test()
                passed += 1
            except BaseException as exc:
                failed += 1
                errors.append(f"{path}::{name}: {type(exc).__name__}: {exc}")
print(json.dumps({"passed": passed, "failed": failed, "errors": errors[:10]}))
"""


class RunTests(_Workspace):
    """Run the tests in the sandbox; report (test_report.json) and, if they failed, tell the engineer."""

    async def run(self, history: Sequence[Message]) -> TestReport:
        """Run every ``test_*`` function of tests/ against src/."""
        attempt = 1 + sum(isinstance(m.instruct_content, TestReport) for m in history)
        result = await PythonExecute(workdir=self.workspace, timeout=20)(code=_RUNNER)
        try:
            data = json.loads(str(result.output).strip().splitlines()[-1])
        except (ValueError, IndexError):
            data = {"passed": 0, "failed": 1, "errors": [str(result.error or result.output)[:500]]}
        report = TestReport(attempt=attempt, **data)
        self.write("test_report.json", report.model_dump_json(indent=1))
        self.write(f"attempts/{attempt}/test_report.json", report.model_dump_json(indent=1))
        return report
