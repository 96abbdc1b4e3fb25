"""A three-role debate: two debaters addressed to each other, a judge watching both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from metaroles.actions.debate import JudgeDebate, SpeakAloud
from pydantic import BaseModel, Field, ValidationInfo, field_validator

from metaroles import LLM, EnvironmentState, Role, RoleName, ScenarioPlan, Team, UserRequirement

JUDGE = "Judge"

ANSWER_TOKENS = {"SpeakAloud": 75}
"""A speech's typical length in tokens (the embedded model's: 73 on average, of at most 160): ``--estimate``'s."""


class Config(BaseModel):
    """Options of the debate."""

    topic: str = "Cities should replace cars with trams and bicycles in their centres."
    """The motion."""
    turns: int = Field(default=3, ge=1, le=10_000)
    """Speeches per debater."""
    pro: RoleName = "Alice"
    """Name of the debater for the motion."""
    con: RoleName = "Bob"
    """Name of the debater against it."""

    @field_validator("pro", "con")
    @classmethod
    def _not_another_role(cls, name: str, info: ValidationInfo) -> str:
        if name == JUDGE or (info.field_name == "con" and name == info.data.get("pro")):
            raise ValueError(f"{name!r} is already a role of the debate (the judge, or the other side); pick another")
        return name


class Debater(Role):
    """Speaks to the opponent (and the judge) until it has made ``turns`` speeches."""

    def __init__(self, *, name: str, opponent: str, side: str, turns: int) -> None:
        """Create a debater for ``side`` facing ``opponent``; the pro side opens on the motion."""
        super().__init__(
            name=name,
            profile=f"debater ({side})",
            actions=[SpeakAloud(side=side)],
            watch=[UserRequirement, SpeakAloud] if side == "pro" else [SpeakAloud],
            send_to={opponent, JUDGE},
        )
        self.turns = turns

    async def _think(self) -> bool:
        """Stop speaking after ``turns`` speeches."""
        if len(self.rc.memory.get_by_sender(self.name)) >= self.turns:
            self._set_state(-1)
            return False
        return await super()._think()


class Judge(Role):
    """Listens to every speech; rules once both debaters have spoken ``turns`` times."""

    def __init__(self, *, turns: int) -> None:
        """Create the judge."""
        super().__init__(name=JUDGE, profile="judge", actions=[JudgeDebate], watch=[SpeakAloud])
        self.turns = turns

    async def _think(self) -> bool:
        """Rule only when all speeches are in, and only once."""
        speeches = len(self.rc.memory.get_by_action(SpeakAloud))
        if speeches < 2 * self.turns or self.rc.memory.get_by_action(JudgeDebate):
            self._set_state(-1)
            return False
        return await super()._think()


def build(config: Config, llm: LLM) -> ScenarioPlan:
    """Hire the debaters and the judge; the motion is broadcast, the pro debater opens."""
    team = Team(llm=llm)
    team.hire(
        [
            Debater(name=config.pro, opponent=config.con, side="pro", turns=config.turns),
            Debater(name=config.con, opponent=config.pro, side="con", turns=config.turns),
            Judge(turns=config.turns),
        ]
    )
    return ScenarioPlan(team=team, idea=config.topic, send_to="", n_round=2 * config.turns + 2)


def summary(run_dir: Path) -> dict[str, Any]:
    """The judge's verdict (a sweep's columns): the winning side and the judge's confidence."""
    state = EnvironmentState.model_validate_json((run_dir / "state.json").read_text(encoding="utf-8"))
    verdicts = [m.instruct_content for m in state.history if m.sent_from == JUDGE]
    verdict = verdicts[-1] if verdicts else None
    return {
        "winner": getattr(verdict, "winner", None),
        "confidence": getattr(verdict, "confidence", None),
    }
