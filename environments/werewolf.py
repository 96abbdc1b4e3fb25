"""Werewolf: the rules as data (``Game``) and an environment that enforces who may speak.

``Game`` holds hidden roles, the living, the phase, the witch's potions and every night's and
day's outcome, and applies the rules: the werewolves' choice (plurality of valid targets), the
seer's check, the witch's single-use antidote and poison, the day vote (only the living vote,
only for the living, a tie eliminates no one), and the win conditions (no werewolf left: the
villagers win; werewolves as many as the others: the werewolves win). It never calls a model.

``WerewolfEnv`` is an Environment whose game refuses messages from dead players: such a message
is not delivered, and is recorded as a ``dropped`` event with the reason (never silently).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field

from metaroles import DropMessage, Environment, Intervention, Message, Role
from metaroles.core.exceptions import InvalidValueError

GameRole = Literal["werewolf", "villager", "seer", "witch"]


class Phase(StrEnum):
    """Where the game is."""

    WOLVES = "night: werewolves"
    SEER = "night: seer"
    WITCH = "night: witch"
    SPEECH = "day: speeches"
    VOTE = "day: vote"
    OVER = "over"


class RuleError(InvalidValueError):
    """A move the rules forbid (a used potion, a dead player acting)."""


class Game(BaseModel):
    """The state of one game of werewolf and its rules."""

    roles: dict[str, GameRole]
    """Hidden role of each player."""
    alive: list[str]
    phase: Phase = Phase.WOLVES
    day: int = 1
    antidote: bool = True
    """The witch's antidote is unused."""
    poison: bool = True
    """The witch's poison is unused."""
    victim: str | None = None
    """Tonight's werewolf victim, until the witch has decided."""
    history: list[dict[str, Any]] = Field(default_factory=list)
    """What happened, a record per night and per vote (votes included)."""
    winner: Literal["villagers", "werewolves"] | None = None

    @classmethod
    def deal(cls, players: list[str], roles: list[GameRole]) -> Game:
        """A new game: ``roles[i]`` is ``players[i]``'s hidden role."""
        if len(players) != len(roles) or len(set(players)) != len(players):
            raise InvalidValueError(f"{len(players)} distinct players need as many roles; got {len(roles)}")
        if "werewolf" not in roles:
            raise InvalidValueError(f"roles {roles!r} have no werewolf; deal at least one")
        return cls(roles=dict(zip(players, roles, strict=True)), alive=list(players))

    @property
    def over(self) -> bool:
        """Whether the game has ended."""
        return self.phase is Phase.OVER

    def living(self, role: GameRole | None = None) -> list[str]:
        """The living players, of ``role`` if given."""
        return [p for p in self.alive if role is None or self.roles[p] == role]

    def wolves_choose(self, choices: Mapping[str, str]) -> str | None:
        """The werewolves' victim: the most named valid target (ties: the first named); None if none valid."""
        valid = [
            t
            for w, t in choices.items()
            if w in self.living("werewolf") and t in self.alive and self.roles[t] != "werewolf"
        ]
        self.victim = Counter(valid).most_common(1)[0][0] if valid else None
        self.history.append({"day": self.day, "event": "wolves", "choices": dict(choices), "victim": self.victim})
        return self.victim

    def seer_checks(self, seer: str, target: str) -> GameRole:
        """The role of ``target``, told to the living seer.

        Raises:
            RuleError: If the seer is dead or ``target`` is not a living other player.
        """
        if seer not in self.living("seer") or target not in self.alive or target == seer:
            raise RuleError(
                f"seer {seer!r} cannot check {target!r}; living others: {[p for p in self.alive if p != seer]}"
            )
        self.history.append({"day": self.day, "event": "seer", "target": target, "role": self.roles[target]})
        return self.roles[target]

    def witch_acts(self, *, save: bool, poison: str | None) -> list[str]:
        """Apply the witch's choice and the werewolves' kill; return who died tonight.

        Raises:
            RuleError: If a potion is used twice, or the poison names no living player.
        """
        if save and not self.antidote:
            raise RuleError("the witch's antidote is used up; it works once per game")
        if poison is not None and not self.poison:
            raise RuleError("the witch's poison is used up; it works once per game")
        if poison is not None and poison not in self.alive:
            raise RuleError(f"the witch cannot poison {poison!r}; living: {self.alive}")
        dead = []
        if self.victim is not None and not (save and self.antidote):
            dead.append(self.victim)
        if save and self.victim is not None:
            self.antidote = False
        if poison is not None:
            self.poison = False
            if poison not in dead:
                dead.append(poison)
        self._remove(dead)
        self.history.append(
            {
                "day": self.day,
                "event": "night",
                "saved": save and self.victim is not None,
                "poisoned": poison,
                "dead": dead,
            }
        )
        self.victim = None
        return dead

    def vote(self, ballots: Mapping[str, str]) -> str | None:
        """Eliminate the living player with most votes of the living; a tie eliminates no one."""
        counted = {v: t for v, t in ballots.items() if v in self.alive and t in self.alive and t != v}
        tally = Counter(counted.values()).most_common()
        out = tally[0][0] if tally and (len(tally) == 1 or tally[0][1] > tally[1][1]) else None
        self._remove([out] if out else [])
        self.history.append(
            {"day": self.day, "event": "vote", "ballots": dict(ballots), "counted": counted, "out": out}
        )
        self.day += 1
        return out

    def _remove(self, dead: list[str]) -> None:
        self.alive = [p for p in self.alive if p not in dead]
        wolves = len(self.living("werewolf"))
        if wolves == 0:
            self.winner = "villagers"
        elif wolves >= len(self.alive) - wolves:
            self.winner = "werewolves"
        if self.winner is not None:
            self.phase = Phase.OVER


class _DeadStaySilent(Intervention):
    def __init__(self, env: WerewolfEnv) -> None:
        self.env = env

    def on_publish(self, message: Message, *, sender: str) -> Message | type[DropMessage]:
        game = self.env.game
        if game is not None and sender in game.roles and sender not in game.alive:
            return DropMessage
        return message


class WerewolfEnv(Environment):
    """An Environment whose game drops (and records) what dead players say."""

    def __init__(self, **options: Any) -> None:
        """Create the environment; set :attr:`game` before the first round."""
        super().__init__(**options)
        self.game: Game | None = None
        self.interventions.append(_DeadStaySilent(self))

    def players(self) -> list[Role]:
        """The roles that play (those the game deals a role to)."""
        return [r for name, r in self.roles.items() if self.game is not None and name in self.game.roles]
