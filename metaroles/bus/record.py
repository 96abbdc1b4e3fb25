"""The record of a round: what the bus did while it ran it, filled as it happened, read by every writer.

One :class:`RoundRecord` per round, kept while someone records (an event log, a checkpoint
writer, a shard whose driver logs): the turns' steps (:class:`Steps`: observe, think, act and an
agent's tool calls, in role order), the messages the history gained with their recipients as
delivery found them, the model calls (ledger entries, with usage), and the round's events
(errors, dead letters, drops). The event log, the checkpoint writer, telemetry and the progress
display read this record, and a shard hands its steps to the driver's; none of them routes a
delivered message again or reads the history back.

What is published between two rounds (a team's idea, a hook's message) belongs to the record of
the round that follows, unless a reader asks for the record first (``Bus.round_record``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any, Literal

from pydantic import BaseModel

from metaroles.llm.ledger import LedgerEntry
from metaroles.messages.message import Message

Recipients = tuple[int, ...]
"""A message's recipients as a round record holds them: their places, in place order (never changed once made)."""


Said = tuple[Any, ...]
"""What a message's sender says of it as it publishes it: a value per column of :data:`SAID`."""

SAID = ("caused_by",)
"""The round record's columns that only a message's sender knows, taken where it is (:func:`said_by`): ``caused_by``,
the ids of the news its turn observed. A shard's outbox carries them to the driver, the event log writes each in
its ``published`` columns (after ``send_to``) and its readers put it on the ``publish`` event. A new one is a name
here and its value in :func:`said_by`."""

NOTHING_SAID: Said = ([],)
"""What is said of a message no role here published (or when nobody asked: ``RunRound.said``)."""


def said_by(sender: Any) -> Said:
    """What ``sender``'s turn says of each message it publishes (:data:`SAID`); one tuple shared by them all."""
    return ([message.id for message in sender.rc.news],)


def names_of(recipients: Recipients, name_at: Callable[[int], str]) -> list[str]:
    """The names of the roles at the places ``recipients`` (``name_at``: a bus's ``name_at``)."""
    return [name_at(place) for place in recipients]


class EnvEvent(BaseModel):
    """A notable thing that happened on the bus (failure, dead letter, drop, a message someone injected)."""

    kind: Literal["role_error", "dead_letter", "dropped", "intervention"]
    round: int
    role: str = ""
    message_id: str = ""
    detail: str = ""


class Steps:
    """A round's turn steps, as columns: a turn appends to four lists instead of building a record per step."""

    __slots__ = ("detail", "kind", "remembered", "role")

    def __init__(self) -> None:
        """Start with no steps."""
        self.kind: list[str] = []
        self.role: list[str] = []
        self.detail: list[Any] = []
        self.remembered: list[int] = []

    def add(self, kind: str, role: str, detail: Any, remembered: int = 0) -> None:
        """Append one step."""
        self.kind.append(kind)
        self.role.append(role)
        self.detail.append(detail)
        self.remembered.append(remembered)

    def __len__(self) -> int:
        return len(self.kind)

    def extend(self, steps: Steps) -> None:
        """Append ``steps`` (a shard's, in the driver's record)."""
        self.kind += steps.kind
        self.role += steps.role
        self.detail += steps.detail
        self.remembered += steps.remembered

    def order_by_role(self, place: Callable[[str], int]) -> None:
        """Put the steps in the order of their roles' ``place`` (each role's own steps stay in order)."""
        if len(self.kind) < 2:
            return
        turns = [place(name) for name, _ in groupby(self.role)]  # a turn's steps are one run of its role's name
        if turns == sorted(turns):  # the turns ran in place order (one after another): the steps are in it
            return
        order = sorted(range(len(self.kind)), key=[place(name) for name in self.role].__getitem__)
        self.kind = [self.kind[at] for at in order]
        self.role = [self.role[at] for at in order]
        self.detail = [self.detail[at] for at in order]
        self.remembered = [self.remembered[at] for at in order]

    def map_details(self, kind: str, change: Callable[[Any], Any]) -> None:
        """Replace the detail of every step of ``kind`` with ``change(detail)`` (a shard's, made portable)."""
        detail = self.detail
        for at, each in enumerate(self.kind):
            if each == kind:
                detail[at] = change(detail[at])


@dataclass(slots=True, eq=False, weakref_slot=True)
class RoundRecord:
    """What happened on the bus from the end of the round before to the end of this one (see the module)."""

    steps: Steps | None
    """The turns' steps, while a reader wants them (``None``: not kept)."""
    ledger_from: int
    """The ledger's length when the record began."""
    events_from: int
    """The bus's events when the record began."""
    published: list[Message] = field(default_factory=list)
    """The messages the history gained, in delivery order."""
    recipients: list[Recipients] = field(default_factory=list)
    """Each published message's recipients as delivery found them: their places, in place order (a sharded
    round's as the driver's address book routes them, the one its shards delivered with)."""
    said: list[Said] = field(default_factory=list)
    """What each published message's sender said of it (:data:`SAID`: ``caused_by``, the ids of the news its turn
    observed, ``[]`` if no turn's); the messages of one turn share one tuple."""
    model_calls: list[LedgerEntry] = field(default_factory=list)
    """The model calls, with their usage (taken from the ledger when the record closes)."""
    events: list[EnvEvent] = field(default_factory=list)
    """Role errors, dead letters and drops (taken from the bus's events when the record closes)."""
    round: int = 0
    """The round it ends with (set when it closes)."""
    number: int = 0
    """Which record of the environment it is, from 1: a reader that missed one knows (set when it closes)."""
    started_ns: int = 0
    """When its round began (``time.time_ns``; 0: it holds no round's start, only what came between rounds)."""
    ended_ns: int = 0
    """When it closed (``time.time_ns``)."""
