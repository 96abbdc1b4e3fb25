"""What a driver and its shards say to each other: one batched call per shard per round.

:class:`ShardSet` is the calls (``sharding.backends.LocalShards`` in this process,
``sharding.ray.RayShards`` on Ray actors); a :class:`Delivery` is what reached a shard since its
last call, a :class:`StepResult` what a shard's round gives back (``sharding.worker`` is the shard,
``sharding.driver`` the driver).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from metaroles.bus.record import Steps
from metaroles.bus.role import Role
from metaroles.core.schema import MESSAGE_ROUTE_TO_ALL
from metaroles.llm.ledger import LedgerEntry
from metaroles.messages.message import Message

Entry = Message | int | tuple[Message, str]
"""What a shard delivers: a message to route, the index of a shared broadcast, or a message for one role."""

Addresses = tuple[dict[str, tuple[int, ...]], tuple[int, ...]]
"""The address map (address → the shards whose roles receive on it) and every shard that hosts a role."""


class Seen:
    """A message known by its id only: what a remote role's turn observed (its steps, its stand-in's news)."""

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
    parts: list[Any] = field(default_factory=list)
    """Those parts (pickled ``(rank, message)`` lists, or handles to them that the carrier resolves)."""
    addresses: Addresses | None = None
    """The address map, when it changed."""

    def __bool__(self) -> bool:
        """Whether there is anything to deliver."""
        return bool(self.inbox or self.ranked or self.sources or self.addresses)


@dataclass
class StepResult:
    """What a shard returns for a round."""

    outbox: list[tuple[int, Message, int]]
    """What its roles published, ``(rank, message, flag)`` in delivery order (flags: ``DEAD``, ``PINNED``)."""
    steps: Steps | None = None
    """Its roles' turn steps (``bus.record``), made portable, when the driver's log wants them."""
    ledger: list[LedgerEntry] = field(default_factory=list)
    failures: list[tuple[int, str, str, str]] = field(default_factory=list)
    """``(place, exception type, str, repr)`` of each turn that raised."""
    news: dict[str, list[str]] = field(default_factory=dict)
    """The news ids of each role that published, as the event log writes them (its ``caused_by``)."""
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
    sealed: Callable[[], tuple[list[tuple[int, Message, int]], dict[str, list[str]]]] | None = None
    """When the outbox and news travel apart (on Ray): how to get them, once the driver needs them."""

    def open(self) -> StepResult:
        """Take in the outbox and news if they travelled apart (``sealed``); this result."""
        if self.sealed is not None:
            self.outbox, self.news = self.sealed()
            self.sealed = None
        return self


class Stepped(NamedTuple):
    """A shard's round: its result and, per shard, a handle to its part of the outbox (``None``: nothing for it)."""

    result: StepResult
    parts: list[Any]


class ShardSet(Protocol):
    """The shards of one run and the calls the driver makes to them (each one batched call per shard)."""

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

    async def step(
        self,
        round_no: int,
        deliveries: list[Delivery | None],
        broadcasts: list[Message],
        *,
        steps: bool,
        news: bool,
        outbox: bool = True,
        meanwhile: Callable[[], None],
    ) -> list[Stepped | None]:
        """Run a round on every shard that has something to do (``None`` for the others).

        ``meanwhile()`` runs here once, while the shards work (the driver's side of the round). ``outbox``:
        each shard sends its outbox with its result; else it keeps it until the driver takes it in
        (:meth:`StepResult.open`, in round order), so a round the driver does not read costs the shard nothing more.
        """
        ...

    async def checkpoint(
        self,
        folders: list[str],
        round_no: int,
        deliveries: list[Delivery],
        broadcasts: list[Message],
        *,
        meanwhile: Callable[[], None],
    ) -> list[int]:
        """Each shard writes its part of the round's checkpoint into its folder after its delivery; the ready counts.

        ``meanwhile()`` runs here once, while the shards write.
        """
        ...

    async def measure(
        self,
        fn: Callable[[list[Role]], Any],
        deliveries: list[Delivery],
        broadcasts: list[Message],
        *,
        meanwhile: Callable[[], None],
    ) -> list[tuple[Any, int]]:
        """``fn`` of each shard's roles after its delivery, and its ready roles; ``meanwhile()`` as they work."""
        ...

    def release(
        self, deliveries: list[Delivery], broadcasts: list[Message], *, by_state: bool = False
    ) -> AsyncIterator[tuple[int, bytes]]:
        """Each shard's roles after its delivery, pickled in pieces (``transfer.RolesOut``): ``(shard, piece)``.

        Each shard's pieces come in their order; the driver reads one while the shards make the next.
        The shards are done. ``by_state``: the driver kept the roles the shards built from seats; those
        come back as their state.
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
