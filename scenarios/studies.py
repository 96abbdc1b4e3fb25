"""Classic experiments of behavioural research, put to a population of agents: the studies suite's scenario.

Each study is a between-subjects experiment as it was run with people: every participant is
someone (a persona drawn from ``population_seed``), is put in one condition (participant ``i``
in condition ``i mod k``, so each condition has ``participants`` people), reads that condition's
instructions and gives one structured answer (an option or a number). In ``pd_communication``
the pairs of the ``message`` condition first send each other one message, and decide knowing
what their partner wrote. The Experimenter — a role that asks no model — keeps the record: each
participant's condition and answer, the last line of ``metrics.jsonl``, which the studies suite
tests as the original paper did (``scenarios/suites/studies``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from metaroles.scenarios.economic_games import personas
from pydantic import BaseModel, Field, model_validator

from metaroles import LLM, Action, ActionResult, Message, Role, ScenarioPlan, Team, UserRequirement

EXPERIMENTER = "Experimenter"


class TwoOptions(BaseModel):
    """A choice between option A and option B."""

    choice: Literal["A", "B"]


class ThreeOptions(BaseModel):
    """A choice among options A, B and C."""

    choice: Literal["A", "B", "C"]


class Amount(BaseModel):
    """A number the instructions ask for (bounded by them)."""

    amount: int = Field(ge=0, le=1000)


class Note(BaseModel):
    """A message to one's partner before deciding."""

    text: str = Field(max_length=400)


@dataclass(frozen=True)
class Question:
    """What a condition's participants read, and the answer it takes: ``"A-B"``, ``"A-C"`` or ``"0-N"``."""

    text: str
    answer: str


DISEASE = (
    "Imagine that your country is preparing for the outbreak of an unusual disease, which is expected to kill "
    "600 people. Two alternative programs to combat the disease have been proposed. Assume that the exact "
    "scientific estimates of the consequences of the programs are as follows. "
)
LINES = (
    "In a test of vision, you must say which of three lines is as long as a reference line 10 cm long: "
    "line A is 10 cm, line B is 12 cm, line C is 8 cm. "
)
DILEMMA = (
    "You are paired with another participant. Each of you chooses, without seeing the other's choice, to "
    "cooperate (A) or defect (B). Both cooperate: each gets 3 coins. Both defect: each gets 1 coin. One "
    "defects while the other cooperates: the defector gets 5 coins and the cooperator nothing. "
)
UN = "Consider the countries of Africa that are members of the United Nations. "

STUDIES: dict[str, dict[str, Question]] = {
    "asian_disease": {
        "gain": Question(
            DISEASE
            + "If Program A is adopted, 200 people will be saved. If Program B is adopted, there is a one-third "
            "probability that 600 people will be saved and a two-thirds probability that no people will be saved. "
            "Which program do you favor, A or B?",
            "A-B",
        ),
        "loss": Question(
            DISEASE + "If Program A is adopted, 400 people will die. If Program B is adopted, there is a one-third "
            "probability that nobody will die and a two-thirds probability that 600 people will die. "
            "Which program do you favor, A or B?",
            "A-B",
        ),
    },
    "decoy": {
        "decoy": Question(
            "You are choosing a one-year subscription to The Economist. A: the web edition, $59. B: the print "
            "edition, $125. C: the print and the web editions, $125. Which do you buy: A, B or C?",
            "A-C",
        ),
        "plain": Question(
            "You are choosing a one-year subscription to The Economist. A: the web edition, $59. B: the print and "
            "the web editions, $125. Which do you buy: A or B?",
            "A-B",
        ),
    },
    "certainty": {
        "certain": Question(
            "Choose between two options. A: a 80% chance to win $4,000 (nothing otherwise). B: $3,000 for sure. "
            "Which do you take, A or B?",
            "A-B",
        ),
        "scaled": Question(
            "Choose between two options. A: a 20% chance to win $4,000 (nothing otherwise). B: a 25% chance to win "
            "$3,000 (nothing otherwise). Which do you take, A or B?",
            "A-B",
        ),
    },
    "endowment": {
        "mug": Question(
            "For filling in a questionnaire you were given a coffee mug; it is yours. You may keep it, or trade it "
            "for a large bar of Swiss chocolate. A: keep the mug. B: trade it for the chocolate. A or B?",
            "A-B",
        ),
        "chocolate": Question(
            "For filling in a questionnaire you were given a large bar of Swiss chocolate; it is yours. You may "
            "keep it, or trade it for a coffee mug. A: keep the chocolate. B: trade it for the mug. A or B?",
            "A-B",
        ),
    },
    "conformity": {
        "majority": Question(
            LINES + "Seven other participants answered aloud before you, one after another, and every one of them "
            "said line B. Which line is as long as the reference line: A, B or C?",
            "A-C",
        ),
        "alone": Question(LINES + "Which line is as long as the reference line: A, B or C?", "A-C"),
    },
    "default": {
        "opt_out": Question(
            "You have just moved to a new state. There, everyone is an organ donor unless they choose not to be. "
            "A: stay an organ donor. B: choose not to be an organ donor. A or B?",
            "A-B",
        ),
        "opt_in": Question(
            "You have just moved to a new state. There, nobody is an organ donor unless they choose to be. "
            "A: choose to become an organ donor. B: stay a non-donor. A or B?",
            "A-B",
        ),
    },
    "trust": {
        "sender": Question(
            "You and another participant you will never meet each got $10. You may send any part of your $10 to "
            "them; what you send is tripled on the way. They then decide how much of what they received to send "
            "back to you, if anything. How many dollars (0 to 10) do you send?",
            "0-10",
        ),
    },
    "ultimatum_dictator": {
        "ultimatum": Question(
            "You have 100 coins to split with another participant you will never meet. They may accept your split "
            "or reject it; if they reject it, both of you get nothing. How many coins (0 to 100) do you offer them?",
            "0-100",
        ),
        "dictator": Question(
            "You have 100 coins to split with another participant you will never meet. They must accept whatever "
            "you give them. How many coins (0 to 100) do you give them?",
            "0-100",
        ),
    },
    "pd_communication": {
        "message": Question(DILEMMA + "Which do you choose, A or B?", "A-B"),
        "silent": Question(DILEMMA + "You cannot talk to each other. Which do you choose, A or B?", "A-B"),
    },
    "anchoring": {
        "low": Question(
            UN + "Is the percentage of the United Nations' members that are African countries higher or lower than "
            "10%? Now give your best estimate: what percentage (0 to 100) of its members are African countries?",
            "0-100",
        ),
        "high": Question(
            UN + "Is the percentage of the United Nations' members that are African countries higher or lower than "
            "65%? Now give your best estimate: what percentage (0 to 100) of its members are African countries?",
            "0-100",
        ),
    },
}
"""Each study's conditions, in the order the suite compares them (the first against the second)."""
TALKING = {"pd_communication": "message"}
"""Studies whose participants in one condition send their partner a message before they decide."""


class Config(BaseModel):
    """Options of the studies."""

    study: Literal[
        "asian_disease",
        "decoy",
        "certainty",
        "endowment",
        "conformity",
        "default",
        "trust",
        "ultimatum_dictator",
        "pd_communication",
        "anchoring",
    ] = "asian_disease"
    participants: int = Field(default=50, ge=2, le=100_000)
    """Participants in each condition (pairs of the talking condition: an even number)."""
    population_seed: int = 0
    """Seed of the personas."""

    @model_validator(mode="after")
    def _pairs(self) -> Config:
        if self.study in TALKING and self.participants % 2:
            raise ValueError(
                f"participants={self.participants} cannot be paired for {self.study}'s messages; give an even "
                f"number, e.g. {self.participants + 1}"
            )
        return self


def design(config: Config) -> dict[str, str]:
    """Participant name → its condition: participant ``i`` (from 1) in condition ``(i - 1) mod k``."""
    conditions = list(STUDIES[config.study])
    total = config.participants * len(conditions)
    return {f"Participant {i + 1}": conditions[i % len(conditions)] for i in range(total)}


SYSTEM = "You are taking part in a study of decisions. Answer as the person described at the end would."
"""The same for everyone, and each one's persona last: a condition's prompts share all but their end (the
model's prefix cache, a provider's prompt cache)."""


class Asked(Action):
    """An action of a participant: its persona, the question of its condition."""

    def __init__(self, persona: str, question: Question) -> None:
        """Act as ``persona`` on ``question``."""
        super().__init__()
        self.persona = persona
        self.question = question

    def who(self) -> str:
        """The line that says who answers."""
        return f"You are {self.persona}."


class Answer(Asked):
    """A participant's answer to its condition's question (one structured answer, bounded by it)."""

    async def run(self, history: Sequence[Message]) -> ActionResult:
        """Ask the model; a number past the question's bound is taken as the bound."""
        heard = [
            m.instruct_content.text
            for m in history
            if isinstance(m.instruct_content, Note) and m.sent_from != self.role_name
        ]
        told = f"Before deciding, your partner sent you this message: {heard[0]!r}\n" if heard else ""
        prompt = f"{self.question.text}\n{told}{self.who()}"
        low, _, high = self.question.answer.partition("-")
        if low == "0":
            given = await self.aask(prompt, system_msgs=[SYSTEM], output_model=Amount)
            return Amount(amount=min(given.amount, int(high)))
        model = ThreeOptions if high == "C" else TwoOptions
        return await self.aask(prompt, system_msgs=[SYSTEM], output_model=model)


class Talk(Asked):
    """A participant's one message to its partner before deciding, knowing the decision ahead."""

    async def run(self, history: Sequence[Message]) -> ActionResult:
        """Ask the model for a short message."""
        prompt = (
            f"{self.question.text}\nBefore either of you decides, you may send your partner one short message. "
            f"Write it.\n{self.who()}"
        )
        return await self.aask(prompt, system_msgs=[SYSTEM], output_model=Note)


class Participant(Role):
    """Someone in one condition of a study: (talks to its partner, then) answers, once."""

    def __init__(self, name: str, persona: str, question: Question, partner: str | None) -> None:
        """Seat ``name`` as ``persona``; ``partner``: the one it writes to first, if its condition talks."""
        actions: list[Action] = [Answer(persona, question)]
        if partner is not None:
            actions.insert(0, Talk(persona, question))
        send_to = {EXPERIMENTER, partner} if partner is not None else EXPERIMENTER
        super().__init__(name=name, actions=actions, watch=[UserRequirement, Talk], send_to=send_to)

    async def _think(self) -> bool:
        """Talk first (if it talks), answer once its partner's message is in; then rest."""
        if len(self.actions) == 1:
            if any(m.sent_from == self.name for m in self.rc.memory.get()):
                self._set_state(-1)
                return False
            return await super()._think()
        notes = [m for m in self.rc.memory.get() if isinstance(m.instruct_content, Note)]
        mine = any(m.sent_from == self.name for m in notes)
        answered = any(
            m.sent_from == self.name and not isinstance(m.instruct_content, Note) for m in self.rc.memory.get()
        )
        if answered or (mine and len(notes) < 2):
            self._set_state(-1)
            return False
        self._set_state(1 if mine else 0)
        return True


class Experimenter(Role):
    """Hands out the conditions and keeps the record (its memory): each participant's condition and answer."""

    def __init__(self, study: str, conditions: dict[str, str]) -> None:
        """Run ``study`` with ``conditions`` (participant → condition)."""
        super().__init__(name=EXPERIMENTER, actions=[], watch=[Answer])
        self.study = study
        self.conditions = conditions

    def record(self) -> dict[str, Any]:
        """The study, each participant's condition, and the answers given so far (an option or a number)."""
        answers: dict[str, Any] = {}
        for m in self.rc.memory.get():
            answer = m.instruct_content
            if isinstance(answer, TwoOptions | ThreeOptions):
                answers[m.sent_from] = answer.choice
            elif isinstance(answer, Amount):
                answers[m.sent_from] = answer.amount
        return {"study": self.study, "conditions": self.conditions, "answers": answers}


def build(config: Config, llm: LLM) -> ScenarioPlan:
    """Seat the participants, each in its condition, and start the study."""
    conditions = design(config)
    talking = TALKING.get(config.study)
    names = list(conditions)
    people = personas(len(names), config.population_seed)
    in_pairs = [n for n in names if conditions[n] == talking]
    partner = {
        a: b
        for i in range(0, len(in_pairs), 2)
        for a, b in ((in_pairs[i], in_pairs[i + 1]), (in_pairs[i + 1], in_pairs[i]))
    }
    questions = STUDIES[config.study]
    team = Team(llm=llm)
    team.hire(
        [
            *(Participant(n, people[i], questions[conditions[n]], partner.get(n)) for i, n in enumerate(names)),
            Experimenter(config.study, conditions),
        ]
    )
    return ScenarioPlan(team=team, idea="The study begins.", send_to=set(names), n_round=4 if talking else 3)


def round_metrics(team: Team) -> dict[str, Any]:
    """The experimenter's record so far."""
    experimenter = team.env.roles.get(EXPERIMENTER)
    return experimenter.record() if isinstance(experimenter, Experimenter) else {}
