"""How a role asks its model what to do: pick the next action (react) or plan the actions (plan_and_act).

Both are structured calls: the answer is validated against a model of the allowed choices, and
retried with the error fed back. The prompts are ``bus/prompts/react_state.txt`` and ``plan.txt``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, Field, create_model

from metaroles.bus.action import complete_structured
from metaroles.core.prompts import load_prompt, render_prompt
from metaroles.llm.ledger import CostLedger
from metaroles.llm.protocol import LLM, LLMRequest
from metaroles.messages.memory import Memory

CHOOSE_STEP = "<choose_action>"
"""The ``action`` of the model call in which a react-mode role picks its next action."""
PLAN_STEP = "<plan>"
"""The ``action`` of the model call in which a plan_and_act role plans its steps."""


@dataclass(frozen=True)
class Step:
    """Who asks, with which model and ledger, and the role's prompt variables."""

    llm: LLM | None
    ledger: CostLedger | None
    role: str
    variables: dict[str, str]

    async def ask(self, action: str, template: str, schema_model: type[BaseModel], **variables: str) -> Any:
        """A validated answer of ``schema_model`` to prompt ``template`` (retried twice on invalid output)."""
        prompt = render_prompt(load_prompt("metaroles.bus.prompts", template), **self.variables, **variables)
        request = LLMRequest(messages=[{"role": "user", "content": prompt}], role=self.role, action=action)
        return await complete_structured(self.llm, request, schema_model, ledger=self.ledger, retries=2)


def prompt_vars(name: str, profile: str, goal: str, constraints: str, memory: Memory) -> dict[str, str]:
    """The variables every role prompt may use: who the role is, and its last 20 remembered messages."""
    history = "\n".join(str(m) for m in memory.get(20)) or "(nothing yet)"
    return {"name": name, "profile": profile, "goal": goal, "constraints": constraints, "history": history}


async def choose_state(step: Step, states: list[str], *, previous: int) -> int:
    """The stage (index of an action, or -1 for none) the model picks among ``states``."""
    choice = await step.ask(
        CHOOSE_STEP,
        "react_state.txt",
        _choice_model(len(states)),
        states="\n".join(states),
        previous_state=str(previous),
    )
    return int(choice.state)


async def plan_steps(step: Step, names: list[str]) -> list[int]:
    """The indexes of the actions the model plans to take, in order."""
    plan = await step.ask(PLAN_STEP, "plan.txt", _plan_model(names), actions="\n".join(names))
    return [names.index(name) for name in plan.steps]


def _choice_model(count: int) -> type[BaseModel]:
    choices: Any = cast(Any, Literal)[tuple(range(-1, count))]
    model: type[BaseModel] = create_model("NextState", state=(choices, ...))
    return model


def _plan_model(names: list[str]) -> type[BaseModel]:
    step: Any = cast(Any, Literal)[tuple(names)]
    steps: Any = Annotated[list[step], Field(min_length=1)]
    model: type[BaseModel] = create_model("Plan", steps=(steps, ...))
    return model


def role_prefix(profile: str, name: str, goal: str, constraints: str) -> str:
    """A role's system prompt from its profile, name, goal and constraints (MetaGPT's ``_get_prefix``).

    Empty for a role that declares none of them (a role's profile defaults to its name).
    """
    if profile == name and not goal and not constraints:
        return ""
    return render_prompt(
        _prefix_template(),
        profile=profile,
        name=name,
        goal=f" Your goal is {goal}." if goal else "",
        constraints=f" The constraint is {constraints}." if constraints else "",
    ).strip()


@cache
def _prefix_template() -> str:
    return load_prompt("metaroles.bus.prompts", "role_prefix.txt")
