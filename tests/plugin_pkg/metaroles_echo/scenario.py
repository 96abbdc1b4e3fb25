"""The echo scenario: one role repeats the idea, louder."""

from pydantic import BaseModel

from metaroles import Action, Environment, Role, ScenarioPlan, Team, UserRequirement


class Config(BaseModel):
    """Options of the echo scenario."""

    times: int = 2


class Echo(Action):
    """Repeat the last message."""

    async def run(self, history):
        return history[-1].content.upper() + "!"


class Echoer(Role):
    """A role that echoes what it is told."""

    def __init__(self, name="Echo"):
        super().__init__(name=name, actions=[Echo], watch=[UserRequirement])


class QuietEnvironment(Environment):
    """An environment that runs one role at a time."""

    def __init__(self, **options):
        super().__init__(concurrency=1, **options)


def build(config, llm):
    """One role that echoes the idea, in the plug-in's environment."""
    team = Team(env=QuietEnvironment(), llm=llm)
    team.hire([Echoer()])
    return ScenarioPlan(team=team, idea="hello plug-in " * config.times, send_to="Echo", n_round=1)
