"""Werewolf: a moderator runs the phases; players answer with tight schemas.

Each phase is a request from the Moderator (private to the werewolves, the seer or the witch at
night; to every living player by day) and the addressed players' answers one round later. Targets
and votes are an enum of the living players — small models answer these reliably. Speeches are
free text, heard by every player. The rules live in ``environments.werewolf`` (``Game``); the
game ends by them, and each round's state (phase, the living, the latest night or vote with every
ballot) lands in the run directory's ``metrics.jsonl``, the whole history in ``state.json``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, cast

from metaroles.environments.werewolf import Game, GameRole, Phase, RuleError, WerewolfEnv
from pydantic import BaseModel, Field, create_model, field_validator

from metaroles import LLM, Action, ActionResult, ChatRole, Message, Role, RoleName, ScenarioPlan, Team, UserRequirement

MODERATOR = "Moderator"
DEFAULT_PLAYERS = ("Ann", "Ben", "Cat", "Dan", "Eve", "Fay")
DEFAULT_ROLES: tuple[GameRole, ...] = ("werewolf", "werewolf", "seer", "witch", "villager", "villager")
NOBODY = "nobody"

ANSWER_TOKENS = {"Respond": 19}
"""A player's speech in tokens (the embedded model's: 19 on average, 12–16 mostly): ``--estimate``'s.

A vote is structured: its schema shapes it."""


class Config(BaseModel):
    """Options of the game."""

    players: list[RoleName] = Field(default_factory=lambda: list(DEFAULT_PLAYERS), min_length=1, max_length=1000)
    roles: list[GameRole] = Field(default_factory=lambda: list(DEFAULT_ROLES))
    """Dealt to the players after a shuffle with ``deal_seed``."""
    deal_seed: int = 0
    max_days: int = Field(default=6, ge=1, le=10_000)
    """Days before the game is called off (a draw)."""

    @field_validator("players")
    @classmethod
    def _distinct(cls, players: list[str]) -> list[str]:
        twice = sorted({p for p in players if players.count(p) > 1})
        if twice or MODERATOR in players:
            raise ValueError(f"player names must be distinct and not {MODERATOR!r}: {(twice or [MODERATOR])[0]!r}")
        return players


class Request(BaseModel):
    """What the moderator asks of players."""

    kind: Literal["kill", "check", "witch", "speak", "vote"]
    options: list[str]
    """Whom the answer may name."""
    text: str
    victim: str | None = None
    """For the witch: tonight's victim."""
    antidote: bool = False
    poison: bool = False


class Answer(BaseModel):
    """A player's answer to a request."""

    request: str
    """Id of the request message."""
    kind: str
    target: str | None = None
    save: bool = False
    poison: str | None = None
    speech: str = ""


class Respond(Action):
    """Answer the moderator's latest request addressed to this player."""

    def __init__(self, player: Player) -> None:
        """Act for ``player``."""
        super().__init__()
        self.player = player

    async def run(self, history: Sequence[Message]) -> ActionResult:
        """Ask the model with a schema made of the request's options."""
        request_message = self.player.pending_request()
        if request_message is None:
            return None
        request = cast(Request, request_message.instruct_content)
        prompt = f"{self.player.briefing(history)}\n\nThe moderator asks: {request.text}"
        answer = Answer(request=request_message.id, kind=request.kind)
        if request.kind == "speak":
            answer.speech = (await self.aask(prompt + "\nSay it in one or two short sentences."))[:400]
        elif request.kind == "witch":
            choice = await self.aask(prompt, output_model=_witch_model(request))
            answer.save = bool(getattr(choice, "save", False))
            poison = getattr(choice, "poison", NOBODY)
            answer.poison = None if poison == NOBODY else poison
        else:
            choice = await self.aask(prompt, output_model=_choice_model(request.options))
            answer.target = getattr(choice, "target", None)
        send_to = {*self.player.game_players(), MODERATOR} if request.kind == "speak" else {MODERATOR}
        content = answer.speech or answer.model_dump_json(exclude_defaults=True)
        return Message(content, instruct_content=answer, role=ChatRole.ASSISTANT, cause_by=Respond, send_to=send_to)


def _choice_model(options: list[str]) -> type[BaseModel]:
    target: Any = Literal[tuple(options)]
    return create_model("Choice", target=(target, ...))


def _witch_model(request: Request) -> type[BaseModel]:
    fields: dict[str, Any] = {}
    if request.antidote and request.victim:
        fields["save"] = (bool, ...)
    if request.poison:
        fields["poison"] = (Literal[tuple([NOBODY, *request.options])], ...)
    return create_model("WitchChoice", **fields)


class Player(Role):
    """A player: answers only the requests addressed to it; hears announcements and speeches."""

    def __init__(self, *, name: str, secret: GameRole, allies: list[str], table: list[str] | None = None) -> None:
        """Create a player who knows its role (and, for a werewolf, the other werewolves) and the table."""
        self.secret = secret
        self.allies = allies
        self.table = table
        super().__init__(name=name, profile=secret, actions=[Respond(self)], watch=[UserRequirement], send_to=MODERATOR)

    def game_players(self) -> list[str]:
        """Every player at the table (known from the deal: on a shard, the others live elsewhere)."""
        if self.table is not None:
            return list(self.table)
        env = self.rc.env
        return [n for n, r in env.roles.items() if isinstance(r, Player)] if env is not None else []

    def pending_request(self) -> Message | None:
        """The newest request to this player in this turn's news."""
        for message in reversed(self.rc.news):
            if isinstance(message.instruct_content, Request) and self.name in message.send_to:
                return message
        return None

    async def _think(self) -> bool:
        """Act only on a request; announcements and speeches are just remembered."""
        if self.pending_request() is None:
            self._set_state(-1)
            return False
        return await super()._think()

    def briefing(self, history: Sequence[Message]) -> str:
        """Who the player is and the last things it heard."""
        known = f" The other werewolves: {', '.join(self.allies)}." if self.allies else ""
        heard = "\n".join(
            f"{m.sent_from}: {m.content}" for m in history[-8:] if not isinstance(m.instruct_content, Request)
        )
        return f"You are {self.name}, a {self.secret} in a game of werewolf.{known}\nRecently:\n{heard or '(nothing)'}"


class Moderate(Action):
    """Run the game: resolve the answers to the last request, announce, and ask the next one."""

    def __init__(self, moderator: Moderator) -> None:
        """Act for ``moderator``."""
        super().__init__()
        self.moderator = moderator

    async def run(self, history: Sequence[Message]) -> ActionResult:
        """One step of the game."""
        return self.moderator.step()


class Moderator(Role):
    """Holds the game and drives its phases; its state is saved with the run."""

    def __init__(self, game: Game, *, max_days: int) -> None:
        """Moderate ``game``."""
        self.game = game
        self.max_days = max_days
        self.pending: str | None = None
        """Id of the request awaiting answers."""
        self.expected: list[str] = []
        super().__init__(name=MODERATOR, actions=[Moderate(self)], watch=[UserRequirement, Respond])

    def extra_state(self) -> dict[str, Any] | None:
        """The game and the request awaiting answers."""
        return {"game": self.game.model_dump(mode="json"), "pending": self.pending, "expected": self.expected}

    def load_extra_state(self, data: dict[str, Any]) -> None:
        """Restore the game (the environment enforces the restored one)."""
        self.game = Game.model_validate(data["game"])
        self.pending, self.expected = data["pending"], data["expected"]
        if isinstance(self.rc.env, WerewolfEnv):
            self.rc.env.game = self.game

    def answers(self) -> dict[str, Answer]:
        """The answers to the pending request, by player."""
        found = {}
        for message in self.rc.memory.get_by_action(Respond):
            answer = message.instruct_content
            if isinstance(answer, Answer) and answer.request == self.pending:
                found[message.sent_from] = answer
        return found

    def step(self) -> Message | None:
        """Resolve the pending request when every addressee answered; then ask the next one."""
        game = self.game
        if game.phase is Phase.OVER:
            return None
        if self.pending is not None:  # the addressees answered in the round after the request; silence abstains
            self._resolve(self.answers())
        if game.day > self.max_days:
            game.phase = Phase.OVER
        if game.over:
            return self._ending()
        return self._ask()

    def _resolve(self, answers: dict[str, Answer]) -> None:
        game, phase = self.game, self.game.phase
        if phase is Phase.WOLVES:
            game.wolves_choose({p: a.target or "" for p, a in answers.items()})
            game.phase = Phase.SEER
        elif phase is Phase.SEER:
            self._seer(answers)
            game.phase = Phase.WITCH
        elif phase is Phase.WITCH:
            self._night_ends(answers)
        elif phase is Phase.SPEECH:
            game.phase = Phase.VOTE
        elif phase is Phase.VOTE:
            out = game.vote({p: a.target or "" for p, a in answers.items()})
            verdict = f"{out} is voted out" if out else "The vote is tied: nobody is voted out"
            self.publish_message(self._announce(f"Day {game.day - 1}: {verdict}.", game.roles))
            if game.phase is not Phase.OVER:
                game.phase = Phase.WOLVES
        self.pending, self.expected = None, []

    def _seer(self, answers: dict[str, Answer]) -> None:
        for seer, answer in answers.items():
            try:
                role = self.game.seer_checks(seer, answer.target or "")
            except RuleError:
                continue
            self.publish_message(self._private(f"{answer.target} is a {role}.", seer))

    def _night_ends(self, answers: dict[str, Answer]) -> None:
        game = self.game
        answer = next(iter(answers.values()), Answer(request="", kind="witch"))
        try:
            dead = game.witch_acts(save=answer.save and game.antidote, poison=answer.poison if game.poison else None)
        except RuleError:
            dead = game.witch_acts(save=False, poison=None)
        news = f"{', '.join(dead)} died tonight" if dead else "Nobody died tonight"
        morning = self._announce(f"Morning of day {game.day}: {news}. Living: {', '.join(game.alive)}.", game.roles)
        morning.metadata["section"] = f"Day {game.day}"
        self.publish_message(morning)
        if game.phase is not Phase.OVER:
            game.phase = Phase.SPEECH

    def _ask(self) -> Message | None:
        """The request of the current phase, to whom it concerns; phases without a living actor are skipped."""
        game = self.game
        while True:
            request, to = self._request()
            if to:
                break
            self._resolve({})
            if game.phase is Phase.OVER:
                return self._ending()
        message = Message(
            request.text,
            instruct_content=request,
            role=ChatRole.ASSISTANT,
            cause_by=Moderate,
            sent_from=MODERATOR,
            send_to=set(to),
            metadata={"section": f"Night {game.day}"} if game.phase is Phase.WOLVES else None,
        )
        self.pending, self.expected = message.id, to
        return message

    def _request(self) -> tuple[Request, list[str]]:
        game = self.game
        others = game.alive
        if game.phase is Phase.WOLVES:
            prey = [p for p in others if game.roles[p] != "werewolf"]
            return Request(
                kind="kill", options=prey, text=f"Night {game.day}: werewolves, whom do you kill?"
            ), game.living("werewolf")
        if game.phase is Phase.SEER:
            seers = game.living("seer")
            options = [p for p in others if p not in seers]
            return Request(kind="check", options=options, text="Seer, whose role do you check?"), seers
        if game.phase is Phase.WITCH:
            text = f"Witch, {game.victim or 'nobody'} was attacked tonight. Save them? Poison someone?"
            request = Request(
                kind="witch", options=others, text=text, victim=game.victim, antidote=game.antidote, poison=game.poison
            )
            return request, game.living("witch")
        if game.phase is Phase.SPEECH:
            return Request(kind="speak", options=others, text=f"Day {game.day}: say who you suspect, briefly."), list(
                others
            )
        return Request(kind="vote", options=others, text=f"Day {game.day}: vote to eliminate one player."), list(others)

    def _ending(self) -> Message:
        game = self.game
        roles = ", ".join(f"{name} ({role})" for name, role in game.roles.items())
        ending = self._announce(f"The game is over: {game.winner or 'nobody'} won. Roles: {roles}.", game.roles)
        ending.metadata["section"] = "The end"
        return ending

    def _announce(self, text: str, players: dict[str, GameRole]) -> Message:
        return Message(text, role=ChatRole.ASSISTANT, cause_by=Moderate, sent_from=MODERATOR, send_to=set(players))

    def _private(self, text: str, player: str) -> Message:
        return Message(text, role=ChatRole.ASSISTANT, cause_by=Moderate, sent_from=MODERATOR, send_to={player})


def build(config: Config, llm: LLM) -> ScenarioPlan:
    """Deal the roles, seat the players, start the night."""
    roles = list(config.roles)
    random.Random(config.deal_seed).shuffle(roles)
    game = Game.deal(config.players, roles)
    env = WerewolfEnv()
    env.game = game
    team = Team(env=env, llm=llm)
    wolves = game.living("werewolf")
    players = [
        Player(
            name=p,
            secret=game.roles[p],
            allies=[w for w in wolves if w != p] if p in wolves else [],
            table=list(config.players),
        )
        for p in config.players
    ]
    team.hire([Moderator(game, max_days=config.max_days), *players])
    return ScenarioPlan(
        team=team, idea="A new game of werewolf begins.", send_to=MODERATOR, n_round=12 * config.max_days + 4
    )


def shard_by(role: Role, shards: int) -> int | None:
    """On shards, the moderator stays on the driver: the environment's rules read its game."""
    return None if isinstance(role, Moderator) else role.place % shards


def round_metrics(team: Team) -> dict[str, Any]:
    """The phase, the living, the winner and the latest night or vote (every ballot)."""
    moderator = team.env.roles.get(MODERATOR)
    if not isinstance(moderator, Moderator):
        return {}
    game = moderator.game
    return {
        "day": game.day,
        "phase": game.phase.value,
        "alive": list(game.alive),
        "winner": game.winner,
        "latest": game.history[-1] if game.history else None,
    }


def summary(run_dir: Path) -> dict[str, Any]:
    """How the game ended: the winner and the day (a sweep's columns)."""
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    last = json.loads(lines[-1]) if lines else {}
    return {"winner": last.get("winner"), "day": last.get("day"), "alive": len(last.get("alive") or [])}
