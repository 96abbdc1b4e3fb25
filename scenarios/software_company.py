"""The software company (MetaGPT's flagship): PM → Architect → Project manager → Engineer → QA.

The product manager writes a PRD, the architect a design, the project manager one task per
module (all three as ``instruct_content`` models and as Markdown in ``workspace/docs/``); the
engineer writes one file per task into ``workspace/src/``; QA writes tests into
``workspace/tests/``, runs them in the sandboxed Python tool and reports (``test_report.json``).
Failures go back to the engineer, at most ``max_fix_loops`` times.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Literal

from metaroles.actions.software import RunTests, TestReport, WriteCode, WriteDesign, WritePRD, WriteTasks, WriteTest
from pydantic import BaseModel, Field, field_validator

from metaroles import LLM, Role, ScenarioPlan, Team, UserRequirement

ANSWER_TOKENS = {"WriteCode": 200, "WriteTest": 135}
"""A module's and a test file's typical length in tokens (the embedded model's: 208 and 134 on average, of at most
768): what ``--estimate`` assumes. The documents (PRD, design, tasks) are structured: their schemas shape them."""


class Config(BaseModel):
    """Options of the company."""

    idea: str = "A command-line tool that counts the words in a text file."
    investment: float | None = Field(default=None, gt=0)
    """Money budget of the run (the test and local models cost nothing)."""
    max_fix_loops: int = Field(default=2, ge=0)
    """How often failed tests go back to the engineer."""
    workspace: str | None = None
    """Where the artifacts go (``metaroles run`` sets the run directory's ``workspace/``)."""
    prompts: str | None = None
    """A folder of prompt files (``write_prd.txt``, ``write_design.txt``, ``write_tasks.txt``,
    ``write_code.txt``, ``write_test.txt``) used instead of the shipped ones it names: a prompt variant."""
    without: list[Literal["Architect", "ProjectManager", "QA"]] = Field(default_factory=list)
    """Roles left out (an ablation): the role before one sends to the role after it, which works from
    what it gets (tasks from the design's modules, or from the PRD); without QA nothing is tested."""

    @field_validator("prompts")
    @classmethod
    def _a_folder(cls, prompts: str | None) -> str | None:
        if prompts is not None and not Path(prompts).is_dir():
            raise ValueError(f"{prompts!r} is not a folder; give one of prompt files like write_code.txt")
        return prompts


class Engineer(Role):
    """Writes the code for the tasks, and again after failing tests (at most ``max_fix_loops`` times)."""

    def __init__(
        self,
        workspace: Path,
        *,
        max_fix_loops: int,
        after: type = WriteTasks,
        tested: bool = True,
        prompts: Path | None = None,
    ) -> None:
        """Create the engineer for ``workspace``: it codes from what ``after`` made, for QA (untested: the human)."""
        super().__init__(
            name="Engineer",
            actions=[WriteCode(workspace, prompts)],
            watch=[after, RunTests],
            send_to="QA" if tested else "Human",
        )
        self.max_fix_loops = max_fix_loops

    async def _think(self) -> bool:
        """Code for new tasks; fix for a failing report within the budget; otherwise rest."""
        for message in self.rc.news:
            report = message.instruct_content
            if not isinstance(report, TestReport) or (report.failed and report.attempt <= self.max_fix_loops):
                return await super()._think()
        self._set_state(-1)
        return False


class QA(Role):
    """Writes the tests once code exists, then runs them; reports to the engineer and the human."""

    def __init__(self, workspace: Path, prompts: Path | None = None) -> None:
        """Create QA for ``workspace`` (with prompt files from ``prompts`` where it has them)."""
        super().__init__(
            name="QA",
            profile="QA engineer",
            actions=[WriteTest(workspace, prompts), RunTests(workspace)],
            watch=[WriteCode],
            send_to={"Engineer", "Human"},
            react_mode="by_order",
        )


def build(config: Config, llm: LLM) -> ScenarioPlan:
    """Hire the company (without the roles ``config.without`` leaves out)."""
    workspace = Path(config.workspace or tempfile.mkdtemp(prefix="software-company-"))
    prompts = Path(config.prompts) if config.prompts else None
    chain = ["ProductManager", *(n for n in ("Architect", "ProjectManager") if n not in config.without), "Engineer"]
    made_by = {"ProductManager": WritePRD, "Architect": WriteDesign, "ProjectManager": WriteTasks}
    team = Team(llm=llm, investment=config.investment)
    for index, name in enumerate(chain[:-1]):  # each watches what the one before made, and sends to the next
        watched = made_by[chain[index - 1]] if index else UserRequirement
        action = made_by[name](workspace, prompts)
        team.hire([Role(name=name, actions=[action], watch=[watched], send_to=chain[index + 1])])
    tested = "QA" not in config.without
    after = made_by[chain[-2]]
    team.hire([Engineer(workspace, max_fix_loops=config.max_fix_loops, after=after, tested=tested, prompts=prompts)])
    team.hire([QA(workspace, prompts)] if tested else [])
    team.hire([Role(name="Human", watch=[])])
    return ScenarioPlan(team=team, idea=config.idea, send_to="ProductManager", n_round=8 + 3 * config.max_fix_loops)
