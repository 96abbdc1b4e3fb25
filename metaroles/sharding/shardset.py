"""What a driver and its shards say to each other: one typed request per shard per call.

A :class:`Request` is one of :class:`RunRound` (run a round), :class:`Checkpoint`, :class:`Measure` and
:class:`Release` (give the roles back), each with the :class:`Delivery` of what reached the shard
since its last call; its reply is typed by it (:data:`Reply`: a round's :class:`RoundDone` holds its
:class:`RoundResult`). :class:`ShardSet` carries them (``sharding.backends.LocalShards`` in this
process, ``sharding.ray.RayShards`` on Ray actors); ``sharding.worker`` answers them on the shard,
``sharding.driver`` asks them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from metaroles.bus.record import Said, Steps
from metaroles.bus.role import Role
from metaroles.core.schema import MESSAGE_ROUTE_TO_ALL
from metaroles.llm.ledger import LedgerEntry
from metaroles.messages.message import Message

Entry = Message | int | tuple[Message, str]
"""What a shard delivers: a message to route, the index of a shared broadcast, or a message for one role."""

Addresses = tuple[dict[str, tuple[int, ...]], tuple[int, ...]]
"""The address map (address → the shards whose roles receive on it) and every shard that hosts a role."""


OutboxEntry = tuple[int, Message, int, Said]
"""What a shard's round published, one message each: ``(rank, message, flag, said)``.

The rank is its sender's place (the delivery order); flags ``DEAD`` (it reaches no role) and ``PINNED`` (it
reaches a role on the driver, ``sharding.worker``); ``said`` what its sender said of it (``bus.record.SAID``:
its ``caused_by``; ``NOTHING_SAID`` unless the driver asked, ``RunRound.said``). A part crossing to another
shard has neither.
"""


class Seen:
    """A message known by its id only: what a remote role's turn observed (its steps, made portable)."""

    __slots__ = ("id",)

    def __init__(self, message_id: str) -> None:
        """Stand for the message ``message_id``."""
        self.id = message_id


@dataclass
class Delivery:
    """What reached a shard since its last round, delivered before its next one (or its states, or its roles)."""

    inbox: list[Entry] = field(default_factory=list)
    """What the driver routed, in order: between rounds, and the whole last round when ``ranked`` is None."""
    ranked: list[tuple[int, Message]] | None = None
    """The last round was routed by the shards: the driver's own messages for this one, ``(rank, message)``.
    ``None``: the driver routed it all (an address changed, or interventions decide): drop what is held."""
    sources: list[int] = field(default_factory=list)
    """The shards whose last outbox has a part for this one, in shard order."""
    crossed: list[Any] = field(default_factory=list)
    """Those parts, as their carrier holds them (:data:`Handle`: pickled columns, or Ray object references)."""
    addresses: Addresses | None = None
    """The address map, when it changed."""

    def __bool__(self) -> bool:
        """Whether there is anything to deliver."""
        return bool(self.inbox or self.ranked or self.sources or self.addresses)


@dataclass
class RoundResult:
    """What a shard returns for a round."""

    outbox: list[OutboxEntry]
    """What its roles published, in delivery order (:data:`OutboxEntry`)."""
    steps: Steps | None = None
    """Its roles' turn steps (``bus.record``), made portable, when the driver's log wants them."""
    ledger: list[LedgerEntry] = field(default_factory=list)
    failures: list[tuple[int, str, str, str]] = field(default_factory=list)
    """``(place, exception type, str, repr)`` of each turn that raised."""
    ready: int = 0
    """Roles with buffered messages after the round (before its deliveries)."""
    held: int = 0
    """Messages kept here for this shard's own roles (delivered before the next round)."""
    crossing: list[int] = field(default_factory=list)
    """How many messages go to each shard's part."""
    readdressed: dict[str, list[str]] = field(default_factory=dict)
    """The new addresses of roles that changed theirs in the round."""
    busy_s: float = 0.0
    """How long the shard worked on the round (delivering and running turns), for diagnostics."""
    flagged: int = 0
    """Entries of the outbox with a flag (dead letters, deliveries to roles on the driver)."""
    sealed: Callable[[], list[OutboxEntry]] | None = None
    """When the outbox travels apart (on Ray): how to get it, once the driver needs it."""

    def open(self) -> RoundResult:
        """Take in the outbox if it travelled apart (``sealed``); this result."""
        if self.sealed is not None:
            self.outbox = self.sealed()
            self.sealed = None
        return self


Handle = object
"""A part of a shard's outbox on its way to another shard, as its carrier holds it: pickled bytes in this
process, a Ray object reference on a cluster. Only the carrier that made it resolves it."""


class RoundDone(NamedTuple):
    """The reply to :class:`RunRound`: the shard's result and, per shard, its part of the outbox.

    A shard's own reply holds each part as ``sharding.crossing`` columns; its carrier hands the driver
    a :data:`Handle` for each instead.
    """

    result: RoundResult
    outgoing: list[Any]
    """Per shard, the part of the outbox for its roles (``None``: nothing for it)."""


class Measured(NamedTuple):
    """The reply to :class:`Measure`: what its function gave of the shard's roles, and its ready roles."""

    value: Any
    ready: int


class Released(NamedTuple):
    """The reply to :class:`Release`: the first piece of the shard's roles, pickled, and how many pieces in all."""

    first: bytes
    pieces: int


@dataclass(slots=True)
class RunRound:
    """Deliver, then run round ``round`` on the shard's ready roles; route what they publish.

    Reply: :class:`RoundDone`.
    """

    delivery: Delivery
    round: int
    steps: bool = False
    """Send the turn steps (the driver's log writes them)."""
    said: bool = False
    """Give each outbox entry what its sender said of it (``bus.record.SAID``; else ``NOTHING_SAID``)."""
    outbox: bool = True
    """Send the outbox with the result; else the shard keeps it until the driver takes it in
    (:meth:`RoundResult.open`), so a round nobody reads costs nothing more."""


@dataclass(slots=True)
class Checkpoint:
    """Deliver, then write the shard's part of round ``round``'s checkpoint into ``folder`` (reply: ready roles)."""

    delivery: Delivery
    folder: str
    round: int


@dataclass(slots=True)
class Measure:
    """Deliver, then ``fn`` of the shard's roles in place order (reply: :class:`Measured`)."""

    delivery: Delivery
    fn: Callable[[Sequence[Role]], Any]


@dataclass(slots=True)
class Release:
    """Deliver, then give the roles back, pickled in pieces of ``piece`` roles (reply: :class:`Released`).

    ``by_state``: the driver kept the roles the shard built from seats; those go back as their state.
    The shard is done after it.
    """

    delivery: Delivery
    piece: int | None = None
    by_state: bool = False


Request = RunRound | Checkpoint | Measure | Release
"""What the driver asks a shard: one request per shard per call, its delivery first."""

Reply = RoundDone | int | Measured | Released
"""What a shard answers, by request: :class:`RoundDone`, its ready roles (to a checkpoint), :class:`Measured`,
:class:`Released`."""


class Sent(Protocol):
    """Requests in flight: the shards work while the driver does its own part of the call."""

    async def replies(self) -> list[Any]:
        """Each shard's reply (:data:`Reply`, by its request), ``None`` where it got no request."""
        ...


class ShardSet(Protocol):
    """The shards of one run and what the driver says to them: a typed request per shard per call.

    :meth:`send` is the one call of a round (and of a checkpoint, a measure, the roles' return);
    :meth:`pieces` brings the rest of the roles a :class:`Release` gives back.
    """

    count: int

    def start(self, *, total: int, concurrency: int, key: str) -> None:
        """Start the shards, empty (on Ray their processes come up while the driver prepares their roles).

        ``total``: roles in the run; ``key`` is the run's id key (``Environment.id_key``): a shard's
        environment draws from it, not from its process.
        """
        ...

    async def load(self, blobs: Iterable[bytes], *, addresses: Addresses) -> list[int]:
        """Give the started shards their roles (one blob each, taken as it comes); return each one's ready roles."""
        ...

    def send(self, requests: Sequence[Request | None], broadcasts: list[Message]) -> Sent:
        """Send each shard its request (``None``: none), all in flight at once; the round's broadcasts travel once."""
        ...

    def pieces(self, counts: list[int]) -> AsyncIterator[tuple[int, bytes]]:
        """The pieces after the first of the roles each shard released (``counts``: its pieces in all).

        ``(shard, piece)``, each shard's in their order; the driver reads one while the shards make the next.
        """
        ...

    async def close(self) -> None:
        """Stop the shards (after a failure: nothing is given back)."""
        ...


def shared_broadcasts(inboxes: list[list[Entry]]) -> tuple[list[list[Entry]], list[Message]]:
    """The entries of ``inboxes`` (emptied) with each broadcast replaced by its index in the list returned beside.

    A broadcast then travels once for all shards, not once per shard.
    """
    broadcasts: list[Message] = []
    shared: dict[int, int] = {}
    out: list[list[Entry]] = []
    for inbox in inboxes:
        entries: list[Entry] = []
        for entry in inbox:
            if type(entry) is Message and MESSAGE_ROUTE_TO_ALL in entry.send_to:
                number = shared.get(id(entry))
                if number is None:
                    number = shared[id(entry)] = len(broadcasts)
                    broadcasts.append(entry)
                entries.append(number)
            else:
                entries.append(entry)
        out.append(entries)
        inbox.clear()
    return out, broadcasts
