"""Economic games of behavioural research, played by a population of agents: the fidelity suite's scenario.

- ``ultimatum``: ``pairs`` proposers each split ``pie`` coins with a responder, who accepts (both get
  the split) or rejects (both get nothing). One shot.
- ``public_goods``: players in groups of ``group_size`` each get ``endowment`` tokens a round and put
  some into a common pot; the pot is multiplied by ``multiplier`` and shared equally in the group
  (a marginal per-capita return of ``multiplier / group_size``). ``rounds`` rounds, the same groups
  (the "partner" design), each player told after a round what the group gave and what it earned.

Each agent is someone: a persona drawn from ``population_seed`` (an age and an occupation), so a
population is not one voice repeated. Every decision is a structured answer (a number, a yes/no)
that the Experimenter — a role that follows the rules and asks no model — settles. Its record, a
line per round in ``metrics.jsonl``, is what the fidelity suite compares with people.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from metaroles import LLM, Action, ActionResult, Message, Role, ScenarioPlan, Team, UserRequirement

EXPERIMENTER = "Experimenter"
AGES = (19, 22, 25, 29, 34, 38, 43, 47, 52, 58, 63, 70)
OCCUPATIONS = (
    "nurse",
    "student",
    "retired teacher",
    "software developer",
    "shop owner",
    "electrician",
    "accountant",
    "farmer",
    "bus driver",
    "lawyer",
    "cook",
    "unemployed graphic designer",
)


class Config(BaseModel):
    """Options of the games."""

    game: Literal["ultimatum", "public_goods"] = "ultimatum"
    pairs: int = Field(default=20, ge=1, le=10_000)
    """Ultimatum: proposer-responder pairs."""
    pie: int = Field(default=100, ge=2)
    """Ultimatum: coins to split."""
    players: int = Field(default=20, ge=2, le=10_000)
    """Public goods: players (a whole number of groups)."""
    group_size: int = Field(default=4, ge=2)
    endowment: int = Field(default=20, ge=1)
    multiplier: float = Field(default=1.6, gt=0)
    rounds: int = Field(default=10, ge=1, le=1000)
    """Public goods: rounds of contributions."""
    population_seed: int = 0
    """Seed of the personas."""

    @model_validator(mode="after")
    def _whole_groups(self) -> Config:
        if self.game == "public_goods" and self.players % self.group_size:
            raise ValueError(
                f"players={self.players} is not a whole number of groups of {self.group_size}; "
                f"give a multiple, e.g. {self.players - self.players % self.group_size or self.group_size}"
            )
        return self


class Offer(BaseModel):
    """A proposer's split: what the responder gets."""

    offer: int = Field(ge=0, le=1_000_000)


class Reply(BaseModel):
    """A responder's answer."""

    accept: bool


class Contribution(BaseModel):
    """A player's tokens into the pot this round."""

    amount: int = Field(ge=0, le=1_000_000)


def personas(count: int, seed: int) -> list[str]:
    """``count`` personas drawn from ``seed``: "a 34-year-old nurse"."""
    draw = random.Random(seed)
    return [f"a {draw.choice(AGES)}-year-old {draw.choice(OCCUPATIONS)}" for _ in range(count)]


class Decide(Action):
    """Ask the agent's model for its decision (one structured answer), bounded by the game's rules."""

    def __init__(self, persona: str, config: Config) -> None:
        """Decide as ``persona`` in the game ``config`` describes."""
        super().__init__()
        self.persona = persona
        self.config = config

    def system(self) -> str:
        """Who the agent is (the same prefix for everyone in the game but the persona)."""
        return f"You are {self.persona}, taking part in an economics experiment with real money. Decide as you would."


class Propose(Decide):
    """The proposer's offer."""

    async def run(self, history: Sequence[Message]) -> ActionResult:
        """Ask how much of the pie to offer."""
        pie = self.config.pie
        prompt = (
            f"You have {pie} coins to split with another participant you will never meet. You offer them a part; "
            f"if they accept, you keep the rest and they get your offer; if they reject, both of you get nothing. "
            f"How many coins (0 to {pie}) do you offer?"
        )
        offer = await self.aask(prompt, system_msgs=[self.system()], output_model=Offer)
        return Offer(offer=min(offer.offer, pie))


class Respond(Decide):
    """The responder's answer to the offer it got."""

    async def run(self, history: Sequence[Message]) -> ActionResult:
        """Ask whether to accept the offer."""
        offer = next((m.instruct_content for m in reversed(history) if isinstance(m.instruct_content, Offer)), None)
        amount = offer.offer if isinstance(offer, Offer) else 0
        pie = self.config.pie
        prompt = (
            f"Another participant had {pie} coins to split with you. They offer you {amount} coins and would keep "
            f"{pie - amount}. If you accept, that is the split; if you reject, both of you get nothing. Do you accept?"
        )
        return await self.aask(prompt, system_msgs=[self.system()], output_model=Reply)


class Outcome(BaseModel):
    """A settled round of the public goods game: what each player gave."""

    round: int
    given: dict[str, int]


class Contribute(Decide):
    """A player's contribution this round, knowing the rounds before."""

    async def run(self, history: Sequence[Message]) -> ActionResult:
        """Ask how many tokens to put into the pot."""
        c = self.config
        rules = (
            f"You are in a group of {c.group_size}. Each round each of you gets {c.endowment} tokens and chooses how "
            f"many to put into a common pot; the pot is multiplied by {c.multiplier:g} and shared equally by the "
            f"group, whatever each gave. What you keep is yours. There are {c.rounds} rounds."
        )
        told = [self.told(m.instruct_content) for m in history if isinstance(m.instruct_content, Outcome)]
        so_far = "\n".join(told[-3:]) or "This is the first round."
        prompt = f"{rules}\n{so_far}\nRound {len(told) + 1}: how many tokens (0 to {c.endowment}) do you put in?"
        given = await self.aask(prompt, system_msgs=[self.system()], output_model=Contribution)
        return Contribution(amount=min(given.amount, c.endowment))

    def told(self, outcome: Outcome) -> str:
        """What this player learns of a round: what it and its group gave, what it earned."""
        c, me = self.config, self.role_name
        names = sorted(outcome.given, key=_number)
        start = names.index(me) // c.group_size * c.group_size if me in names else 0
        pot = sum(outcome.given[n] for n in names[start : start + c.group_size])
        earned = c.endowment - outcome.given.get(me, 0) + pot * c.multiplier / c.group_size
        gave = outcome.given.get(me, 0)
        return f"Round {outcome.round}: you gave {gave}, your group {pot} in all; you earned {earned:.1f}."


class Player(Role):
    """A player of the public goods game: contributes each round until the last one is settled."""

    def __init__(self, name: str, persona: str, config: Config) -> None:
        """Seat ``name`` as ``persona``."""
        super().__init__(
            name=name, actions=[Contribute(persona, config)], watch=[UserRequirement, Settle], send_to=EXPERIMENTER
        )
        self.rounds = config.rounds

    async def _think(self) -> bool:
        """Rest once the last round is settled."""
        settled = [m.instruct_content for m in self.rc.news if isinstance(m.instruct_content, Outcome)]
        if any(o.round >= self.rounds for o in settled):
            self._set_state(-1)
            return False
        return await super()._think()


def _number(name: str) -> int:
    return int(name.rsplit(" ", 1)[-1])


class Settle(Action):
    """The experimenter settles a round by the rules (it asks no model)."""

    async def run(self, history: Sequence[Message]) -> ActionResult:
        """The public goods game: the round's contributions, to every player; otherwise nothing to say."""
        rounds = [m.instruct_content for m in history if isinstance(m.instruct_content, Outcome)]
        counted = sum(len(o.given) for o in rounds)
        given = [m for m in history if isinstance(m.instruct_content, Contribution)][counted:]
        if not given:
            return None
        amounts = {
            m.sent_from: m.instruct_content.amount for m in given if isinstance(m.instruct_content, Contribution)
        }
        return Outcome(round=len(rounds) + 1, given=dict(sorted(amounts.items(), key=lambda kv: _number(kv[0]))))


class Experimenter(Role):
    """Runs the game: settles each round of decisions and keeps the record (its memory)."""

    def __init__(self, players: list[str]) -> None:
        """Run the game among ``players`` (who are told each round's outcome)."""
        super().__init__(
            name=EXPERIMENTER, actions=[Settle()], watch=[Propose, Respond, Contribute], send_to=set(players)
        )

    def record(self) -> dict[str, Any]:
        """Offers and answers by agent (ultimatum), each round's contributions by player (public goods)."""
        memory = self.rc.memory.get()
        decided = {m.sent_from: m.instruct_content for m in memory}
        return {
            "offers": {n: d.offer for n, d in decided.items() if isinstance(d, Offer)},
            "accepted": {n: d.accept for n, d in decided.items() if isinstance(d, Reply)},
            "rounds": [m.instruct_content.given for m in memory if isinstance(m.instruct_content, Outcome)],
        }


def build(config: Config, llm: LLM) -> ScenarioPlan:
    """Seat the population and hand out the instructions."""
    team = Team(llm=llm)
    if config.game == "ultimatum":
        people = personas(2 * config.pairs, config.population_seed)
        proposers = [f"Proposer {i + 1}" for i in range(config.pairs)]
        responders = [f"Responder {i + 1}" for i in range(config.pairs)]
        roles = [
            Role(name=p, actions=[Propose(people[i], config)], watch=[UserRequirement], send_to={r, EXPERIMENTER})
            for i, (p, r) in enumerate(zip(proposers, responders, strict=True))
        ] + [
            Role(name=r, actions=[Respond(people[config.pairs + i], config)], watch=[Propose], send_to=EXPERIMENTER)
            for i, r in enumerate(responders)
        ]
        team.hire([*roles, Experimenter([*proposers, *responders])])
        return ScenarioPlan(team=team, idea="The experiment begins.", send_to=set(proposers), n_round=4)
    people = personas(config.players, config.population_seed)
    players = [f"Player {i + 1}" for i in range(config.players)]
    team.hire([*(Player(p, people[i], config) for i, p in enumerate(players)), Experimenter(players)])
    return ScenarioPlan(team=team, idea="The experiment begins.", send_to=set(players), n_round=2 * config.rounds + 2)


def round_metrics(team: Team) -> dict[str, Any]:
    """The experimenter's record so far: offers and answers by agent, or each round's contributions."""
    experimenter = team.env.roles.get(EXPERIMENTER)
    return experimenter.record() if isinstance(experimenter, Experimenter) else {}
