"""The echo scenario: one role repeats the idea, louder."""

from pydantic import BaseModel

from metaroles import Action, Role, Team, UserRequirement
from metaroles.scenario import ScenarioPlan


class Config(BaseModel):
    """Options of the echo scenario."""

    times: int = 2


class Echo(Action):
    """Repeat the last message."""

    async def run(self, history):
        return history[-1].content.upper() + "!"


def build(config, llm):
    """One role that echoes the idea."""
    team = Team(llm=llm)
    team.hire([Role(name="Echo", actions=[Echo], watch=[UserRequirement])])
    return ScenarioPlan(team=team, idea="hello plug-in " * config.times, send_to="Echo", n_round=1)
