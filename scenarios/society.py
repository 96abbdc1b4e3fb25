"""A society: N agents on a social graph exchanging opinions with their neighbours.

Each agent holds an opinion in [0, 1] and, every round, tells its neighbours (addressed messages)
what it now thinks. A rule-based agent follows the Hegselmann-Krause bounded-confidence model: its
new opinion is the mean of its own and of the neighbours' opinions it just heard that lie within
``epsilon`` of it. An LLM-backed agent asks its model for the new opinion with a tight schema.
Both kinds mix on one graph (``llm_agents`` of them are LLM-backed). The graph is a
Watts-Strogatz small world by default (``ring`` for a plain cycle). Per-round metrics — mean,
variance, clusters — land in the run directory's ``metrics.jsonl``.

This is the scale scenario: ``metaroles run society --set agents=10000 --rounds 100``.
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from metaroles import LLM, Action, ActionResult, Cast, Message, Role, ScenarioPlan, Team, UserRequirement
from metaroles.agents.archetypes import Archetypes

RUN_DEFAULTS = {"checkpoint_every": 10, "log_turns": False}
"""Large societies log publishes and deliveries only, and checkpoint every 10 rounds."""


class Config(BaseModel):
    """Options of the society."""

    agents: int = Field(default=100, ge=2, le=10_000_000)
    """How many agents."""
    rounds: int = Field(default=30, ge=1)
    """Rounds of opinion exchange (after the one in which everyone states an opinion)."""
    graph: Literal["small_world", "ring"] = "small_world"
    """The social graph: Watts-Strogatz small world, or a plain cycle."""
    degree: int = Field(default=6, ge=2)
    """Neighbours per agent in the small world (even)."""
    rewire: float = Field(default=0.1, ge=0, le=1)
    """Rewiring probability of the small world."""
    epsilon: float = Field(default=0.25, gt=0, le=1)
    """Confidence bound: opinions farther than this are ignored."""
    llm_agents: int = Field(default=0, ge=0)
    """How many agents (the first ones) ask their model instead of following the rule."""
    opinions: list[float] | None = None
    """Initial opinions (default: uniform random from the graph seed)."""
    graph_seed: int = 0
    """Seed of the graph and of the initial opinions."""
    cluster_gap: float = Field(default=0.01, gt=0)
    """Opinions closer than this, in sorted order, belong to one cluster."""
    archetypes: int = Field(default=0, ge=0, le=1000)
    """Archetype mode for the model-backed agents: this many bands of opinion, the model asked once a round per
    band for how far its agents move toward what they heard, each agent drawing its own; 0: each asks alone."""
    archetype_form: Literal["chances", "examples"] = "chances"
    """What a band's call answers: a mean and spread of the move (``chances``), or eight moves members would
    make (``examples``), an agent drawing one (``metaroles.agents.archetypes``)."""
    calls_per_round: int = Field(default=0, ge=0, le=1000)
    """Archetype mode by a budget: the model asked at most this many times a round (one per band: ``archetypes``
    = this); 0: ``archetypes`` says."""

    @model_serializer(mode="wrap")
    def _archetypes_when_on(self, dump: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Archetype mode's option only when it is on: a society without it is recorded as before it existed."""
        data: dict[str, Any] = dump(self)
        if not self.archetypes:
            data.pop("archetypes", None)
        if not self.calls_per_round:
            data.pop("calls_per_round", None)
        if data.get("archetype_form") == "chances":  # the first form: runs made before the choice are as they were
            data.pop("archetype_form")
        return data

    @field_validator("degree")
    @classmethod
    def _even_and_fewer(cls, degree: int, info: ValidationInfo) -> int:
        agents = info.data.get("agents", 2)
        if info.data.get("graph") == "small_world" and (degree % 2 or (degree >= agents and degree > 2)):
            raise ValueError(f"the small world's degree must be even and below the {agents} agents, e.g. 6")
        return degree

    @field_validator("calls_per_round")
    @classmethod
    def _a_band_per_call(cls, budget: int, info: ValidationInfo) -> int:
        bands = info.data.get("archetypes", 0)
        if budget and bands not in (0, budget):
            raise ValueError(f"{budget} calls make {budget} bands, not archetypes={bands}: give one of the two")
        return budget

    @model_validator(mode="after")
    def _archetypes_by_budget(self) -> Config:
        """``calls_per_round``: a band per call the budget allows."""
        if self.calls_per_round:
            self.archetypes = self.calls_per_round
        return self

    @model_validator(mode="after")
    def _default_degree_fits(self) -> Config:
        """A society too small for the default degree gets the largest that fits (recorded so, and rebuilt so)."""
        if "degree" not in self.model_fields_set:
            self.degree = max(2, min(self.degree, self.agents - 1) // 2 * 2)
        return self

    @field_validator("llm_agents")
    @classmethod
    def _at_most_the_agents(cls, count: int, info: ValidationInfo) -> int:
        if count > info.data.get("agents", count):
            raise ValueError(f"{count} agents that ask their model, of {info.data['agents']}: at most all of them")
        return count

    @field_validator("opinions")
    @classmethod
    def _one_per_agent(cls, opinions: list[float] | None, info: ValidationInfo) -> list[float] | None:
        agents = info.data.get("agents")
        if opinions is not None and len(opinions) != agents:
            raise ValueError(f"opinions has {len(opinions)} values for {agents} agents; give one per agent")
        if opinions is not None and not all(0 <= o <= 1 for o in opinions):
            raise ValueError("opinions must each lie between 0 and 1")
        return opinions


class OpinionUpdate(BaseModel):
    """An LLM-backed agent's answer."""

    opinion: float = Field(ge=0, le=1)
    """The agent's new opinion, between 0 and 1."""


def hegselmann_krause(own: float, heard: Sequence[float], epsilon: float) -> float:
    """The mean of ``own`` and of the ``heard`` opinions within ``epsilon`` of it."""
    close = [o for o in heard if abs(o - own) <= epsilon]
    return sum(close, own) / (len(close) + 1)  # summed from own, in order: sum([own, *close]) to the bit


def opinion_of(message: Message) -> float | None:
    """The opinion a message carries; ``None`` for a failed answer (a model's that never validated).

    A failed answer is data, not a crash: the agent keeps its last opinion, its neighbours skip it,
    and the round's metrics count it (``failed_answers``).
    """
    instructed = message.instruct_content
    if instructed is not None and isinstance(instructed, OpinionUpdate):
        return instructed.opinion
    if message.cause_by != SHARE and "error" in message.metadata:  # the rule never fails
        return None
    try:
        return float(message.content or "")
    except ValueError:
        return None


class Share(Action):
    """Update the opinion from the news, by the rule, and say it."""

    def __init__(self, agent: Agent) -> None:
        """Act for ``agent``."""
        super().__init__()
        self.agent = agent

    async def run(self, history: Sequence[Message]) -> ActionResult:
        """Apply the bounded-confidence rule to what the neighbours just said."""
        agent = self.agent
        return f"{hegselmann_krause(agent.opinion, agent.heard(), agent.epsilon):.6f}"


SHARE = Share.action_id()
_REQUIREMENT = UserRequirement.action_id()

SOCIETY = (
    "You are one member of a society that is discussing a question together. Every opinion is a number "
    "on a scale from 0 (fully against) to 1 (fully for). Each round you hear the opinions of your "
    "neighbours, and you may move your own opinion toward theirs, away from them, or keep it. "
    'Answer with JSON only: {"opinion": a number from 0 to 1}.'
)
"""What every LLM-backed agent is told first, byte for byte the same: an engine's prefix cache serves it."""


class Reconsider(Share):
    """Ask the model for the new opinion (a tight schema: one number in [0, 1])."""

    async def run(self, history: Sequence[Message]) -> ActionResult:
        """Tell the model its opinion and what the neighbours said; take its answer."""
        agent = self.agent
        heard = ", ".join(f"{o:.3f}" for o in agent.heard()) or "nothing yet"
        prompt = f"Your opinion is {agent.opinion:.3f}. Your neighbours said: {heard}. What is your opinion now?"
        return await self.aask(prompt, system_msgs=[SOCIETY], output_model=OpinionUpdate)


class Shift(BaseModel):
    """How far an agent moves from its opinion toward the mean of what its neighbours said."""

    toward: float = Field(ge=0, le=1)
    """0: it keeps its opinion; 1: it takes the mean it heard."""


ARCHETYPE = (
    "You speak for a group of members of a society discussing a question together, people whose opinions are "
    "alike. Every opinion is a number from 0 (fully against) to 1 (fully for). Each round every member hears "
    "its neighbours' opinions and may move its own toward theirs."
)
"""What every archetype's call is told first, byte for byte the same."""


class Bands:
    """The prompt of an opinion band's call in a round (an :class:`Archetypes`'s ``describe``), of ``bands`` bands."""

    def __init__(self, bands: int) -> None:
        """Describe ``bands`` bands of opinion, each as wide."""
        self.bands = bands

    def __call__(self, key: Any, round: int) -> str:
        """Band ``key``'s prompt in ``round``."""
        low = int(key) / self.bands
        return (
            f"The group: members whose opinion lies between {low:.2f} and {low + 1 / self.bands:.2f}. It is round "
            f"{round}. How far does a member of the group move toward what its neighbours said?"
        )


class ReconsiderByArchetype(Reconsider):
    """Draw how far to move toward what the neighbours said from the agent's band's distribution."""

    async def run(self, history: Sequence[Message]) -> ActionResult:
        """The agent's new opinion: its own moved toward the mean it heard by its draw."""
        agent = self.agent
        heard, own = agent.heard(), agent.opinion
        news = ",".join(m.id for m in agent.rc.news)
        archetypes = agent.archetypes
        assert archetypes is not None
        band = min(agent.bands - 1, int(own * agent.bands))
        round = int(getattr(agent.rc.env, "round", 0))  # the bus's round: its band's call is this round's
        shift = await archetypes.choose(self, band, round, random.Random(f"archetype:{agent.name}:{news}"))
        mean = statistics.fmean(heard) if heard else own
        return OpinionUpdate(opinion=round_to(own + shift.toward * (mean - own)))


def round_to(opinion: float) -> float:
    """An opinion as an answer says it: six digits, within [0, 1]."""
    return round(min(1.0, max(0.0, opinion)), 6)


class Agent(Role):
    """A member of the society: watches its neighbours' opinions and tells them its own.

    Its opinion is what it last said (its initial one before that): all its state is on the bus,
    so checkpoints replay it like any default role.
    """

    readings = ("opinion",)

    def __init__(
        self,
        *,
        name: str,
        neighbours: list[str],
        opinion: float,
        epsilon: float,
        llm_backed: bool,
        cluster_gap: float = 0.01,
        block: tuple[int, int] = (0, 1),
        archetypes: Archetypes[Shift] | None = None,
        bands: int = 0,
    ) -> None:
        """Create the agent with its neighbours and initial opinion (``block``: its number among how many).

        ``archetypes``: a model-backed agent asks through them, in ``bands`` bands of opinion.
        """
        self.archetypes, self.bands = archetypes, bands
        self.initial = opinion
        self._read = _Read(None, 0, 0, opinion)
        """What :attr:`opinion` last read (changed in place: an attribute set anew would make a shard send the
        agent back whole, ``sharding.transfer.fingerprint``)."""
        self.block = block
        self.epsilon = epsilon
        self.cluster_gap = cluster_gap
        kind = (ReconsiderByArchetype if archetypes is not None else Reconsider) if llm_backed else Share
        action = kind(self)
        by_archetype = [ReconsiderByArchetype] if archetypes is not None else []  # what neighbours may say
        super().__init__(
            name=name,
            actions=[action],
            watch=[UserRequirement, Share, Reconsider, *by_archetype],
            send_to=set(neighbours),
        )

    @property
    def opinion(self) -> float:
        """What the agent last said, else its initial opinion.

        Read from its memory, and followed: only what it remembered since the last read is read again
        (a memory that lost a message, or another memory, is read whole).
        """
        memory, read = self.rc.memory, self._read
        count, upto, opinion = len(memory), read.upto, read.opinion
        if read.memory is memory and read.edits == memory.edits:
            if count == upto:
                return opinion
        else:  # read whole (by its messages, not by action: a memory never read by action keeps no index)
            upto, opinion = 0, self.initial
        name, action = self.name, self.actions[0].cause_by
        for message in reversed(memory.get(count - upto)):  # its own answer is among the newest
            if message.sent_from == name and message.cause_by == action:
                said = opinion_of(message)
                if said is not None:  # a failed answer keeps the last opinion
                    opinion = said
                    break
        read.memory, read.edits, read.upto, read.opinion = memory, memory.edits, count, opinion
        return opinion

    def failed_answers(self) -> int:
        """How many of this agent's answers failed (a model's structured answer that never validated)."""
        if not isinstance(self.actions[0], Reconsider):
            return 0  # the rule never fails
        said = self.rc.memory.get_by_action(self.actions[0].cause_by)
        return sum(1 for m in said if m.sent_from == self.name and "error" in m.metadata)

    def heard(self) -> list[float]:
        """The opinions in this turn's news."""
        return [o for m in self.rc.news if m.cause_by != _REQUIREMENT and (o := opinion_of(m)) is not None]


@dataclass(slots=True)
class _Read:
    """What an agent's :attr:`Agent.opinion` last read: its memory, that memory's removals and length, the opinion."""

    memory: object
    edits: int
    upto: int
    opinion: float


def social_graph(config: Config) -> Any:
    """The networkx graph of the society."""
    import networkx as nx  # the graph extra; only this scenario needs it

    if config.graph == "ring":
        return nx.cycle_graph(config.agents)
    degree = min(config.degree, config.agents - 1) // 2 * 2
    return nx.connected_watts_strogatz_graph(config.agents, max(degree, 2), config.rewire, seed=config.graph_seed)


class Agents:
    """The society's agents, the ``i``-th built from the graph alone (a :class:`Cast`: shards build their own).

    The neighbours are kept flat (one array of numbers), so each shard gets a few megabytes, not the graph.
    """

    def __init__(self, config: Config, opinions: Sequence[float], neighbours: list[list[int]]) -> None:
        """Build agents by ``config`` with these initial ``opinions`` and, per agent, its sorted ``neighbours``."""
        self.config = config
        self.opinions = array("d", opinions)
        self.flat = array("q", (j for near in neighbours for j in near))
        self.starts = array("q", itertools.accumulate((len(near) for near in neighbours), initial=0))
        bands = config.archetypes
        form = config.archetype_form
        self.archetypes = Archetypes(Shift, describe=Bands(bands), system=ARCHETYPE, form=form) if bands else None

    def __call__(self, i: int) -> Agent:
        """The ``i``-th agent."""
        config = self.config
        return Agent(
            name=f"a{i}",
            neighbours=[f"a{j}" for j in self.flat[self.starts[i] : self.starts[i + 1]]],
            opinion=self.opinions[i],
            epsilon=config.epsilon,
            llm_backed=i < config.llm_agents,
            cluster_gap=config.cluster_gap,
            block=(i, config.agents),
            archetypes=self.archetypes,
            bands=config.archetypes,
        )


def build(config: Config, llm: LLM) -> ScenarioPlan:
    """Place the agents on the graph; a broadcast asks everyone to state an opinion."""
    graph = social_graph(config)
    rng = random.Random(config.graph_seed)
    opinions = config.opinions or [rng.random() for _ in range(config.agents)]
    neighbours = [sorted(graph.neighbors(i)) for i in range(config.agents)]
    graph.clear()  # networkx's graph is in a reference cycle with its views: its dicts go now, not at a full pass
    team = Team(llm=llm)
    team.hire(Cast(config.agents, Agents(config, opinions, neighbours)))
    return ScenarioPlan(team=team, idea="State your opinion.", send_to="", n_round=config.rounds + 1)


def shard_by(role: Role, shards: int) -> int | None:
    """Neighbours together: on shards, consecutive agents share one (on the graph most neighbours are near).

    Most opinions then reach their listeners on their own shard; only the rewired edges and the
    blocks' ends cross.
    """
    if isinstance(role, Agent):
        number, agents = role.block
        return number * shards // agents
    return role.place % shards


def opinions(roles: Sequence[Role]) -> dict[str, Any]:
    """The opinions of the agents among ``roles`` and their cluster gap (a part of :func:`round_metrics`)."""
    agents = [role for role in roles if isinstance(role, Agent)]
    return {
        "opinions": [agent.opinion for agent in agents],
        "gap": agents[0].cluster_gap if agents else None,
        "failed": sum(agent.failed_answers() for agent in agents),
    }


METRIC_PARTS = (opinions,)
"""On shards, each computes its agents' opinions; :func:`round_metrics` combines the parts."""


def round_metrics(team: Team) -> dict[str, Any]:
    """Mean and variance of the opinions, and the clusters they form."""
    parts = team.gathered(opinions)
    opinions_now = sorted(o for part in parts for o in part["opinions"])
    gap = next(part["gap"] for part in parts if part["gap"] is not None)
    clusters = 1 + sum(b - a > gap for a, b in itertools.pairwise(opinions_now))
    return {
        "mean": round(statistics.fmean(opinions_now), 6),
        "variance": round(statistics.pvariance(opinions_now), 6),
        "clusters": clusters,
        "min": round(opinions_now[0], 6),
        "max": round(opinions_now[-1], 6),
        "failed_answers": sum(part.get("failed", 0) for part in parts),
    }


def summary(run_dir: Path) -> dict[str, Any]:
    """Where the opinions ended: the last round's mean, variance and clusters (a sweep's columns)."""
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    last = json.loads(lines[-1]) if lines else {}
    return {key: last.get(key) for key in ("mean", "variance", "clusters")}
