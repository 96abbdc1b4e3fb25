"""Routing vocabulary: interventions that see every publish and delivery, dead letters, and why a route holds.

The Environment routes; this module says what its hooks look like and explains a route to a
user (:func:`explain_route`): which rule delivered a message to a role, or why not, and whether
the role's observation keeps it as news.
"""

from __future__ import annotations

import bisect
import difflib
import itertools
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from operator import attrgetter
from typing import Protocol, TypeVar, cast
from warnings import warn

from pydantic import BaseModel

from metaroles.bus.population import Population, Roster, unbuilt
from metaroles.bus.role import Role
from metaroles.core.schema import MESSAGE_ROUTE_TO_ALL
from metaroles.messages.memory import news_of
from metaroles.messages.message import Message

T = TypeVar("T")


class UnheardWatchWarning(UserWarning):
    """A role watches an action id that no role's action has, but one close to it (a typo, a short name)."""


class WatchCheck:
    """Watches on a bare name that no action has, when an action's class is named so: noted as roles join.

    ``watch=["WriteDraft"]`` for an action whose id is ``mypkg.actions.WriteDraft`` would leave the
    role idle for ever; :meth:`warn` names the ids it may have meant (an action's id is always
    qualified). Ids that no action's name resembles stay quiet, and so do qualified ones: an
    environment may publish under a ``cause_by`` of its own. A role's watches and actions are read
    once, when it joins, so a run's start costs nothing per role.
    """

    __slots__ = ("_bare", "_produced", "_short", "_told")

    def __init__(self) -> None:
        """Nothing noted yet."""
        self._bare: dict[str, str] = {}
        """Each bare watched name, and the first role that watches it."""
        self._produced: set[str] = set()
        self._short: dict[str, list[str]] = {}
        """An action's class name → the action ids of that name."""
        self._told: set[str] = set()

    def join(self, role: Role) -> None:
        """Note ``role``'s actions and its bare watches."""
        for action in role.actions:
            action_id = action.action_id()
            if action_id not in self._produced:
                self._produced.add(action_id)
                self._short.setdefault(action_id.rpartition(".")[2], []).append(action_id)
        for watched in role.rc.watch:
            if "." not in watched:  # action ids are qualified
                self._bare.setdefault(watched, role.name)

    def warn(self, *, heard: Iterable[str] = ()) -> None:
        """Warn, once per name, of a bare watch no action produces but one resembles.

        ``heard``: ids that count as produced besides the roles' actions (the user's requirement,
        what the history holds).
        """
        produced = self._produced | set(heard)
        for watched, role in self._bare.items():
            if watched in self._told or watched in produced:
                continue
            names = difflib.get_close_matches(watched, list(self._short), n=3, cutoff=0.8)
            close = [action_id for name in names for action_id in self._short[name]]
            if close:
                self._told.add(watched)
                warn(
                    f"role {role!r} watches {watched!r}, which no role's action produces, so it may never "
                    f"act; did you mean {', '.join(repr(c) for c in sorted(close))}? (watch the Action class itself)",
                    UnheardWatchWarning,
                    stacklevel=4,
                )


class DeadLetterWarning(UserWarning):
    """A published message reached no role; it is kept in ``Environment.dead_letters``."""


class DropMessage:
    """Returned by an intervention to drop a message (the drop is recorded as an event)."""


class Intervention:
    """Sees every publish and every delivery; may observe, modify or drop the message.

    Subclass and override either hook. Return the message (the same or a modified one) or
    :class:`DropMessage`.
    """

    def on_publish(self, message: Message, *, sender: str) -> Message | type[DropMessage]:
        """Called once per published message, before routing."""
        return message

    def on_deliver(self, message: Message, *, recipient: Member) -> Message | type[DropMessage]:
        """Called once per recipient, before the message enters its buffer.

        ``recipient`` is a :class:`Role`, or on a sharded run the driver's stand-in for one (:class:`Member`).
        """
        return message


class RouteExplanation(BaseModel):
    """Why a message does (or does not) reach a role and count as its news."""

    role: str
    delivered: bool
    """Whether ``send_to`` meets the role's addresses."""
    admitted: bool
    """Whether, once delivered, the role's observation keeps it as news."""
    reasons: list[str]

    def __str__(self) -> str:
        """One line per rule that decided."""
        return "\n".join(self.reasons)


class Buffer(Protocol):
    """Where a member's deliveries go: a role's MessageQueue, or a stand-in's forward to its shard."""

    def push(self, message: Message) -> bool:
        """Take ``message``; whether it was new here (the member is then ready)."""
        ...

    def empty(self) -> bool:
        """Whether nothing waits to be observed."""
        ...


class MemberContext(Protocol):
    """The part of a member's context the bus reads: its buffer."""

    @property
    def msg_buffer(self) -> Buffer:
        """Where its deliveries go."""
        ...


class Member(Protocol):
    """Whoever holds a place on the bus: a :class:`Role`, or a sharded run's stand-in for one (``sharding``).

    The address book files it under its name and addresses at its place; delivery pushes into its
    buffer and marks its place ready; an intervention may hand it one message (``put_message``).
    """

    @property
    def name(self) -> str:
        """Its unique name (an address too)."""
        ...

    @property
    def addresses(self) -> frozenset[str]:
        """What it receives on."""
        ...

    @property
    def place(self) -> int:
        """Its place: the order of delivery."""
        ...

    @property
    def rc(self) -> MemberContext:
        """Its buffer and its news."""
        ...

    def put_message(self, message: Message) -> None:
        """Deliver ``message`` to it alone."""
        ...


env_index: Callable[[Member], int] = attrgetter("place")
"""A role's place in its Environment (the order of delivery); C-level: a round sorts its ready roles by it."""


def reach(
    send_to: AbstractSet[str],
    index: Mapping[str, Collection[T]],
    everyone: Collection[T],
    merge: Callable[[AbstractSet[str]], Collection[T]],
) -> Collection[T]:
    """Who a message sent to ``send_to`` reaches: the bus's one rule of delivery (roles, shards, explanations use it).

    A broadcast (``<all>`` among its addresses) reaches ``everyone``; any other message whoever ``index``
    files under one of its addresses — the one address's own entries, or ``merge(send_to)`` of several
    (the caller merges its way: roles in place order, remembered; shards as a set).
    """
    if MESSAGE_ROUTE_TO_ALL in send_to:
        return everyone
    if len(send_to) == 1:
        for address in send_to:
            return index.get(address, ())
    return merge(send_to)


class AddressBook:
    """The roles of an Environment in registration order, indexed by address.

    Routing costs what the recipients cost, not what the roles do: one dict lookup per address. A
    set of several addresses (a society's neighbours) is merged once and remembered until a role
    joins or changes its addresses.
    """

    CACHED = 65_536
    """How many address sets :meth:`route` remembers before it starts again (or two per role, if more: a
    society's every agent has its own set of neighbours, and forgetting them each round costs it the round)."""

    def __init__(self) -> None:
        """Create an empty book."""
        self.members: list[Member] = []
        self._index: dict[str, list[Member]] = {}
        self._merged: dict[frozenset[str], list[Member]] = {}
        self._filed: dict[int, frozenset[str]] = {}
        """The addresses each role (by ``id``) is filed under: a re-index touches only its own buckets."""
        self._places: dict[int, tuple[Sequence[Member], tuple[int, ...]]] = {}
        """The places of each list :meth:`route` gave (by ``id``), while the book stays as it is."""
        self.total = 0
        """How many places the whole bus has: the rank of what no role of it publishes (a shard's book holds a part)."""
        self.unbuilt = 0
        """How many places hold a population's role not built yet (``bus.population``)."""
        self.roster: Roster | None = None
        """The names of the populations' places (set by the bus that hires one)."""
        self.build: Callable[[int], Member] = _no_population
        """Builds the role at a population's place and registers it (the bus's)."""

    def add(self, role: Member) -> None:
        """Register ``role`` (already attached at its index) under its addresses."""
        self.members.append(role)
        self.total = max(self.total, len(self.members))
        self._index_role(role)

    def add_population(self, population: Population) -> None:
        """Hold ``population``'s places (each entry is the population itself until its role is built)."""
        self.members.extend(itertools.repeat(cast(Member, population), population.count))
        self.total = max(self.total, len(self.members))
        self.unbuilt += population.count

    def built(self, role: Member) -> None:
        """``role`` was built at its population's place: it holds the place and is filed under its addresses."""
        self.members[role.place] = role
        self.unbuilt -= 1
        self._index_role(role)

    def refill(self, members: Iterable[Member]) -> None:
        """Hold ``members`` instead, in their order (the same list: whoever holds :attr:`members` sees them)."""
        self.members.clear()
        for held in (self._index, self._filed, self._merged, self._places):
            held.clear()
        for role in members:
            self.add(role)

    def _index_role(self, role: Member) -> None:
        self._merged.clear()
        self._places.clear()  # the lists route gave may change in place now
        self._filed[id(role)] = role.addresses
        for address in role.addresses:
            bucket = self._index.setdefault(address, [])
            if bucket and bucket[-1].place > role.place:  # a population's role built late: into its place
                bisect.insort(bucket, role, key=env_index)
            else:
                bucket.append(role)

    def reindex(self, role: Member) -> None:
        """Re-read ``role``'s addresses (after they changed); unchanged, it costs nothing (a restore re-reads each)."""
        filed = self._filed.get(id(role))
        if filed == role.addresses:
            return
        for address in filed or ():
            bucket = self._index.get(address, [])
            if role in bucket:
                bucket.remove(role)
                if not bucket:
                    del self._index[address]
        self._index_role(role)

    def filed(self, role: Member) -> frozenset[str] | None:
        """The addresses ``role`` is indexed under (``None``: not in this book)."""
        return self._filed.get(id(role))

    def addresses(self) -> list[str]:
        """Every address some role receives on, sorted."""
        return sorted(self._index)

    def places(self, roles: Sequence[Member]) -> tuple[int, ...]:
        """The places of ``roles`` (a list :meth:`route` gave), as data: kept by the list while the book stays."""
        known = self._places.get(id(roles))
        if known is not None and known[0] is roles:
            return known[1]
        if len(self._places) >= max(self.CACHED, 2 * len(self.members)):
            self._places.clear()
        places = tuple(role.place for role in roles)
        self._places[id(roles)] = (roles, places)
        return places

    def route(self, send_to: frozenset[str]) -> Sequence[Member]:
        """The roles ``send_to`` reaches (:func:`reach`), in registration order; a population's are built first."""
        if self.unbuilt:
            self._build_reached(send_to)
        return reach(send_to, self._index, self.members, self._merge)  # type: ignore[return-value]

    def _build_reached(self, send_to: AbstractSet[str]) -> None:
        """Build the populations' roles ``send_to`` may reach: the one a name names; all for another address.

        A role a population builds receives on its name and its class's address (a dotted path, as
        no pattern name is), so an address that is neither a population's name nor dotted reaches none.
        """
        roster, members = self.roster, self.members
        assert roster is not None
        for address in send_to:
            place = roster.place_of(address)
            if place is not None:
                if unbuilt(members[place]):
                    self.build(place)
            elif address == MESSAGE_ROUTE_TO_ALL or "." in address:
                for place in range(len(members)):
                    if unbuilt(members[place]):
                        self.build(place)
                return

    def _merge(self, send_to: AbstractSet[str]) -> list[Member]:
        """The roles of several addresses in place order, merged once and remembered."""
        key = send_to if isinstance(send_to, frozenset) else frozenset(send_to)
        merged = self._merged.get(key)
        if merged is None:
            found: dict[int, Member] = {}
            for address in send_to:
                for role in self._index.get(address, ()):
                    found[role.place] = role
            if len(self._merged) >= max(self.CACHED, 2 * len(self.members)):
                self._merged.clear()
            merged = self._merged[key] = [found[i] for i in sorted(found)]
        return merged


def _no_population(place: int) -> Member:
    raise AssertionError(f"place {place} holds a population, but no bus builds its roles")


def explain_route(message: Message, target: Role) -> RouteExplanation:
    """Say which rule delivers ``message`` to ``target`` (or not: :func:`reach` decides) and whether it becomes news."""
    send_to, mine = message.send_to, (target,)
    filed = dict.fromkeys(target.addresses, mine)
    delivered = bool(reach(send_to, filed, mine, lambda several: mine if several & target.addresses else ()))
    if delivered and MESSAGE_ROUTE_TO_ALL in send_to:
        reasons = ["delivered: send_to contains '<all>', a broadcast to every role"]
    elif delivered:
        matched = sorted(send_to & target.addresses)
        reasons = [f"delivered: send_to {sorted(send_to)} names the role's address(es) {matched}"]
    else:
        addresses = sorted(target.addresses)
        reasons = [f"not delivered: send_to {sorted(send_to)} meets none of the role's addresses {addresses}"]
    admitted = False
    if delivered:
        admitted, reason = _admission(message, target)
        reasons.append(reason)
    return RouteExplanation(role=target.name, delivered=delivered, admitted=admitted, reasons=reasons)


def _admission(message: Message, role: Role) -> tuple[bool, str]:
    if getattr(role.rc, "memory", None) is None:  # a sharded run's stand-in: the memory is on the shard
        return False, f"news or not is decided where the role runs ({role!r}); its observation there keeps it or not"
    if message in role.rc.memory:
        return False, "not news: the role already remembers this message (find_news skips it)"
    if not news_of((message,), role.rc.watch, role.name):  # the rule the role's observation applies
        return False, (
            f"remembered but not news: cause_by {message.cause_by!r} is not in watch {sorted(role.rc.watch)} "
            f"and the name {role.name!r} is not in send_to"
        )
    if message.cause_by in role.rc.watch:
        return True, f"news: cause_by {message.cause_by!r} is in the role's watch set"
    return True, f"news: the role's name {role.name!r} is in send_to"
