"""The Bus: roles registered by name and address, and delivery of what they publish.

A message published between rounds is delivered at once; one published during a round waits
until the round ends, then goes out in role registration order and publish order. Routing goes
through an address index, so its cost grows with the recipients, not with the roles. A message
that reaches no role goes to :attr:`Bus.dead_letters` with a :class:`DeadLetterWarning` (strict
mode raises). Interventions see every publish and delivery. The :class:`Environment` adds rounds.
"""

from __future__ import annotations

import difflib
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from typing import Literal, cast
from warnings import warn
from weakref import WeakSet

from metaroles.bus.population import Placed, Population, Roster, unbuilt
from metaroles.bus.record import NOTHING_SAID, EnvEvent, RoundRecord, Said, Steps, said_by
from metaroles.bus.role import Role
from metaroles.bus.routing import (
    AddressBook,
    DeadLetterWarning,
    DropMessage,
    Intervention,
    Member,
    RouteExplanation,
    WatchCheck,
    explain_route,
)
from metaroles.core.exceptions import (
    DuplicateRoleError,
    InvalidValueError,
    RunError,
    UndeliverableError,
    UnknownRoleError,
)
from metaroles.core.ids import SCOPE, IdScope
from metaroles.core.surface import class_path
from metaroles.llm.ledger import CostLedger
from metaroles.messages.memory import Memory
from metaroles.messages.message import Message

KEPT_RECORDS = 8
"""How many closed round records the bus keeps at least (its readers, :class:`RecordReader`, may keep more)."""


class Bus:
    """Roles and the delivery of their messages, without rounds (the :class:`Environment` runs those).

    Args:
        strict: Raise :class:`UndeliverableError` when a message reaches no role.
        interventions: Hooks that see every publish and delivery.
        ledger: Cost ledger shared by every role's model calls (a resumed run passes its own).
    """

    def __init__(
        self, *, strict: bool = False, interventions: Iterable[Intervention] = (), ledger: CostLedger | None = None
    ) -> None:
        """Create an empty bus; see the class docstring for the arguments."""
        self.strict = strict
        self.interventions: list[Intervention] = list(interventions)
        self.ledger = ledger or CostLedger()
        self.record: RoundRecord | None = None
        """The record being filled (``bus.record``): this round's, once a reader keeps records (``None``: none does)."""
        self.steps: Steps | None = None
        """The open record's turn steps, where a turn appends (``None``: not kept)."""
        self.recorded: RoundRecord | None = None
        """The last record closed: the round that just ended (see :meth:`round_record`)."""
        self._records = 0
        self._closed: deque[RoundRecord] = deque()
        self._readers: WeakSet[RecordReader] = WeakSet()
        self._held: deque[RoundRecord] = deque()
        """Closed records whose round's messages are still being taken in (a sharded round behind the next)."""
        self.history = Memory()
        self.dead_letters: list[Message] = []
        self.events: list[EnvEvent] = []
        self.round = 0
        self._book = AddressBook()
        self._members = self._book.members
        self.roles: MutableMapping[str, Role] = {}
        """Name → role, in place order: a dict, or while a population's roles are not all built a
        :class:`~metaroles.bus.population.Roster` that builds one when it is looked up (:meth:`add_cast`)."""
        self._book.build = self._build
        self.watches = WatchCheck()
        """The roles' bare watches and actions, noted as they join (the session warns of a watch none produces)."""
        self._readiness = Readiness()
        self._pending: list[tuple[int, Message]] = []
        """What the running round published, as ``(rank, message)``: one list for the bus's life (rounds empty it)."""
        self._in_round = False
        self._undelivered: list[Message] = []
        self._drive = BusDrive(self, self._book, self._readiness, self._held)

    def role_ids(self, index: int) -> IdScope | None:
        """Where the ``index``-th role's ids come from (an Environment's run scope; none on a bare bus)."""
        return None

    # -- membership ----------------------------------------------------------------------------

    def add_role(self, role: Role) -> None:
        """Register ``role``; its addresses join the index.

        Raises:
            DuplicateRoleError: If a role of that name is already registered.
        """
        if not isinstance(role, Role):
            raise InvalidValueError(f"add_role got {role!r}, which is not a Role")
        if role.name in self.roles:
            raise DuplicateRoleError(
                f"a role named {role.name!r} is already in this environment; give each role a unique name="
            )
        role.attach(self, len(self._members), ids=self.role_ids(len(self._members)))
        self._readiness.flags.append(0)
        self.roles[role.name] = role
        self._book.add(role)
        self.watches.join(role)
        if not role.rc.msg_buffer.empty():
            self.mark_ready(role)

    def add_cast(self, count: int, build: Callable[[int], Role], names: str) -> None:
        """Hold ``count`` places for roles built when first touched: the ``i``-th is ``build(i)``, named by ``names``.

        Reaching a place builds its role (a message to its name, ``roles[name]``, ``members[place]``):
        the same role, at the same place with the same ids, as ``add_role(build(i))`` in order would
        have made (``bus.population``). The role must be named so and receive on its name and its class.

        Raises:
            DuplicateRoleError: If a role already here has one of those names.
            InvalidValueError: If ``names`` is not a pattern with one ``{}``.
        """
        population = Population(len(self._members), count, build, names)
        roster = self.roles if isinstance(self.roles, Roster) else Roster(self._members, self._build, dict(self.roles))
        taken = next((name for name in roster.built if population.index(name) is not None), None)
        if taken is not None:
            raise DuplicateRoleError(
                f"a role named {taken!r} is already in this environment, and names={names!r} names one of the cast "
                "so too; give the cast another pattern"
            )
        roster.populations.append(population)
        self.roles = self._book.roster = roster
        self._readiness.flags.extend(bytes(count))
        self._book.add_population(population)

    def _build(self, place: int) -> Role:
        """Build the role at a population's ``place`` (see :meth:`add_cast`) and register it there.

        Raises:
            RunError: If the cast built something else than a role of that name on its name and class.
        """
        population = cast(Population, self._members[place])
        index = place - population.start
        role = population.build(index)
        name = population.name(index)
        if not isinstance(role, Role) or role.name != name or role.addresses != {name, class_path(type(role))}:
            got = f"{role.name!r} on {sorted(role.addresses)}" if isinstance(role, Role) else repr(role)
            raise RunError(
                f"Cast build({index}) made {got}, but the cast's names say {name!r} on its name and class; a cast "
                "with names= must build its i-th role so named, receiving on those only (or hire it without names=)"
            )
        role.attach(self, place, ids=self.role_ids(place))
        self.roles[name] = role
        population.unbuilt -= 1
        self._book.built(role)
        self.watches.join(role)
        if not self._book.unbuilt:  # all built: the names in place order again, a dict
            self.roles = {member.name: cast(Role, member) for member in self._members}
        if not role.rc.msg_buffer.empty():
            self.mark_ready(role)
        return role

    def add_roles(self, roles: Iterable[Role]) -> None:
        """Register each of ``roles`` in order."""
        for role in roles:
            self.add_role(role)

    def get_role(self, name: str) -> Role | None:
        """Return the role named ``name`` (else the first whose profile it is, as MetaGPT keys roles), or ``None``.

        :meth:`role` raises instead.
        """
        found: Role | None = self.roles.get(name)
        if found is None:
            found = next((role for role in self.roles.values() if role.profile == name), None)
        return found

    def role(self, name: str) -> Role:
        """Return the role named ``name``.

        Raises:
            UnknownRoleError: If there is none (the message lists the known names).
        """
        try:
            return self.roles[name]
        except KeyError:
            raise UnknownRoleError(f"no role named {name!r}; known roles: {sorted(self.roles)}") from None

    def get_roles(self) -> dict[str, Role]:
        """Profile → role, in hiring order, as MetaGPT's ``env.get_roles()`` keys them (:attr:`roles` is by name).

        Two roles of one profile keep the first, as ``dict`` would; a role's profile defaults to its name.
        """
        roles: dict[str, Role] = {}
        for role in self.roles.values():
            roles.setdefault(role.profile, role)
        return roles

    def role_names(self) -> list[str]:
        """The roles' names, in hiring order (MetaGPT's ``env.role_names()``)."""
        return list(self.roles)

    def set_addresses(self, role: Role, addresses: Iterable[str]) -> None:
        """Replace ``role``'s addresses (MetaGPT's ``env.set_addresses``)."""
        role.set_addresses(addresses)

    def get_addresses(self, role: Role) -> frozenset[str]:
        """The addresses ``role`` receives on."""
        return role.addresses

    def reindex(self, role: Role) -> None:
        """Re-read ``role``'s addresses into the index (after ``Role.set_addresses``)."""
        self._book.reindex(role)

    def mark_ready(self, role: Role) -> None:
        """Note that ``role`` has buffered messages, so it runs in the next round."""
        self._readiness.mark(role)

    @property
    def members(self) -> Sequence[Role]:
        """The roles in place order: the order of delivery. Not to be changed.

        While a sharded run holds roles on its shards, their places hold the driver's stand-ins
        (:class:`~metaroles.bus.routing.Member`: name, addresses, place, buffer), typed as the roles
        they stand for: a user's code between runs meets the roles themselves. While a population's
        roles are not all built (:meth:`add_cast`), a view that builds each as it is reached.
        """
        if self._book.unbuilt:
            return Placed(self._members, self._build)
        return cast("list[Role]", self._members)

    def name_at(self, place: int) -> str:
        """The name of the role at ``place``, built or not."""
        member = self._members[place]
        if unbuilt(member):
            population = cast(Population, member)
            return population.name(place - population.start)
        return member.name

    def built_roles(self) -> Iterator[Role]:
        """The roles that exist, in place order: every one but a population's not reached yet (see :meth:`add_cast`)."""
        if not self._book.unbuilt:
            return iter(cast("list[Role]", self._members))
        return (cast(Role, member) for member in self._members if not unbuilt(member))

    @property
    def ready_count(self) -> int:
        """How many roles have buffered messages (they run in the next round)."""
        return len(self._readiness.ready)

    @property
    def drive(self) -> BusDrive:
        """What a runtime drives this bus with besides the user's API (:class:`BusDrive`); not for roles."""
        return self._drive

    def route(self, send_to: frozenset[str]) -> Sequence[Role]:
        """The roles a message sent to ``send_to`` reaches, in place order (the index's own list: not to be changed).

        As :attr:`members`: a stand-in's place gives the stand-in.
        """
        return cast("Sequence[Role]", self._book.route(send_to))

    def push(self, message: Message, recipients: Iterable[Member]) -> None:
        """Put ``message`` into the buffer of each of ``recipients`` and mark those it was new to ready."""
        self.push_all((message,), (recipients,))

    def push_all(self, messages: Iterable[Message], recipients: Iterable[Iterable[Member]]) -> None:
        """:meth:`push` each of ``messages`` to its recipients (``recipients``, in step): a round's delivery."""
        readiness = self._readiness
        ready, is_ready = readiness.ready, readiness.flags
        for message, roles in zip(messages, recipients, strict=True):
            for role in roles:
                if role.rc.msg_buffer.push(message) and not is_ready[role.place]:
                    is_ready[role.place] = 1
                    ready.append(role)

    @property
    def is_idle(self) -> bool:
        """True when no role has anything buffered."""
        return not self._readiness.ready

    # -- routing -------------------------------------------------------------------------------

    def recipients(self, message: Message) -> list[Role]:
        """The roles ``message`` would be delivered to, in registration order."""
        return list(self.route(message.send_to))

    def places(self, message: Message) -> tuple[int, ...]:
        """The places of the roles ``message`` would be delivered to, in place order (as a round record holds them)."""
        return self._book.places(self._book.route(message.send_to))

    # -- the round's record --------------------------------------------------------------------

    def keep_records(self, *, steps: bool = True) -> None:
        """Fill a :class:`RoundRecord` from now on (``steps``: with the turns' steps); never switches off."""
        if self.record is None:
            self.record = RoundRecord(None, len(self.ledger.entries), len(self.events))
        if steps and self.record.steps is None:
            self.record.steps = self.steps = Steps()

    def round_record(self) -> RoundRecord:
        """The record of the round that just ended; what happened since then, if anything did, closes as its own.

        Raises:
            RunError: If no record is kept (:meth:`keep_records`).
        """
        record = self.record
        if record is None:
            raise RunError("this environment keeps no round records; call keep_records() before the rounds to record")
        if self.recorded is None or record.published or record.steps or self._grew(record):
            self._close_record()
        assert self.recorded is not None
        return self.recorded

    def record_reader(self, *, steps: bool = True, from_start: bool = False) -> RecordReader:
        """Keep round records (:meth:`keep_records`) and read each one closed from now on, in order, none missed.

        What is open now, if anything, closes first and is not read; ``from_start``: it is, with the
        records kept before (a checkpoint writer's first note), unless some are gone (then none:
        :attr:`RecordReader.missed`).
        """
        self.keep_records(steps=steps)
        reader = RecordReader(self, 0 if from_start else self.round_record().number)
        if from_start and self._closed and self._closed[0].number > 1:
            reader.missed, reader.read = True, self.round_record().number
        self._readers.add(reader)
        return reader

    def records_after(self, reader: RecordReader) -> list[RoundRecord]:
        """The records closed after ``reader``'s last, oldest first, up to the first held one (see RecordReader)."""
        last = self.round_record().number
        until = self._held[0].number - 1 if self._held else last
        taken = [record for record in self._closed if reader.read < record.number <= until]
        reader.read = max(reader.read, until)
        oldest = min(each.read for each in self._readers)
        closed = self._closed
        while len(closed) > KEPT_RECORDS and closed[0].number <= oldest:  # every reader has read it
            closed.popleft()
        return taken

    def _grew(self, record: RoundRecord) -> bool:
        return len(self.ledger.entries) > record.ledger_from or len(self.events) > record.events_from

    def _close_record(self, *, held: bool = False) -> None:
        """Close the open record (the round's: called as the round ends) and open the next one.

        ``held``: the round's messages are still to be taken in (``BusDrive.add_late`` completes it):
        no reader gets it, nor what closes after it, until then.
        """
        record = self.record
        if record is None:
            return
        record.model_calls = self.ledger.entries[record.ledger_from :]
        record.events = self.events[record.events_from :]
        self._records += 1
        record.round, record.number, record.ended_ns = self.round, self._records, time.time_ns()
        self.recorded = record
        self._closed.append(record)
        if held:
            self._held.append(record)
        elif not self._readers:  # nobody reads them: the last few, for whoever asks (round_record)
            while len(self._closed) > KEPT_RECORDS:
                self._closed.popleft()
        steps = None if record.steps is None else Steps()
        self.record, self.steps = RoundRecord(steps, len(self.ledger.entries), len(self.events)), steps

    def add_to_history(
        self,
        messages: Sequence[Message],
        recipients: Sequence[Sequence[Member]] | None = None,
        said: Sequence[Said | None] | None = None,
    ) -> None:
        """Put ``messages`` into the history and the round's record (``recipients``: as delivery found them).

        ``None``: delivered elsewhere with this address book (a sharded round's shards routed them):
        the record's recipients are the ones it routes to now, so no reader of the record routes again.
        ``said``: what each message's sender said of it on its shard (``bus.record.SAID``; ``None``: it is here).
        """
        self._drive.into_history(messages, recipients, self.record, said)

    def publish_message(self, message: Message) -> bool:
        """Publish ``message``: delivered at the end of the current round, or now between rounds; ``True``.

        Returns ``True`` as MetaGPT's does (a message that reaches no role is a dead letter, not a failure).

        Raises:
            UndeliverableError: In strict mode, between rounds, when it reaches no role (it is
                still kept in :attr:`dead_letters`).
        """
        if not isinstance(message, Message):
            raise InvalidValueError(f"publish_message got {message!r}, which is not a Message")
        if self._in_round:
            scope = SCOPE.get()  # a turn's message goes out with its role: see _rank
            rank = scope.slot - 1 if scope is not None and scope.slot > 0 else self._rank(message)
            self._pending.append((rank, message))
            return True
        self._deliver((message,))
        self._raise_undelivered()
        return True

    def inject(self, message: Message, name: str) -> None:
        """Publish ``message`` between rounds as the intervention ``name``: an ``intervention`` event records it.

        Raises:
            RunError: During a round (inject at a round barrier: a run's control does).
        """
        if self._in_round:
            raise RunError(f"intervention {name!r} came during round {self.round}; inject between rounds")
        self._add_event("intervention", message, detail=name)
        self.publish_message(message)

    @property
    def in_round(self) -> bool:
        """Whether a round's turns are running (what is published then waits for the round's delivery)."""
        return self._in_round

    def _rank(self, message: Message) -> int:
        """Where a message published during a round goes out: with the role whose turn published it.

        The turn is known by its id scope (a role's scope has slot = place + 1), so the order never
        depends on ``sent_from`` naming someone else, on which turn finished first, or on which
        shard the role runs; outside any turn, by ``sent_from``, else after every role. The turn's case
        is taken in :meth:`publish_message` (every turn's message takes it); this gives the others.
        """
        sender = self.roles.get(message.sent_from)
        return self._book.total if sender is None else sender.place

    def _deliver(self, messages: Sequence[Message], said: Sequence[Said | None] | None = None) -> None:
        """Route each of ``messages``, in order, into the buffers of its recipients (``said``: see add_to_history)."""
        if self.interventions:
            for at, message in enumerate(messages):
                self._deliver_intercepted(message, None if said is None else said[at])
            return
        route = self._book.route
        recipients = [route(message.send_to) for message in messages]
        self.add_to_history(messages, recipients, said)  # one call for the round's messages, not one per message
        if not all(recipients):
            for message, roles in zip(messages, recipients, strict=True):
                if not roles:
                    self.dead_letter(message)
        self.push_all(messages, recipients)

    def _deliver_intercepted(self, message: Message, said: Said | None = None) -> None:
        for hook in self.interventions:
            result = hook.on_publish(message, sender=message.sent_from)
            if result is DropMessage:
                self._add_event("dropped", message, detail=f"dropped on publish by {type(hook).__name__}")
                return
            message = _checked(result, hook)
        recipients = self._book.route(message.send_to)
        self.add_to_history([message], [recipients], [said])
        if not recipients:
            self.dead_letter(message)
        for role in recipients:
            delivered = self._intercept_delivery(message, role)
            if delivered is not None:
                role.put_message(delivered)

    def _intercept_delivery(self, message: Message, role: Member) -> Message | None:
        for hook in self.interventions:
            result = hook.on_deliver(message, recipient=role)
            if result is DropMessage:
                self._add_event(
                    "dropped", message, role=role.name, detail=f"dropped on delivery by {type(hook).__name__}"
                )
                return None
            message = _checked(result, hook)
        return message

    def dead_letter(self, message: Message) -> None:
        """Keep ``message``, which reached no role, in :attr:`dead_letters` (an event, a warning; strict: an error)."""
        self.dead_letters.append(message)
        self._undelivered.append(message)
        detail = f"send_to {sorted(message.send_to)} meets no role{_nearest(message.send_to, self.roles)}"
        detail += f"; known addresses: {self._book.addresses()[:20]}"
        self._add_event("dead_letter", message, detail=detail)
        warn(
            f"message {message.id} from {message.sent_from or '?'!r} reached no role: {detail}",
            DeadLetterWarning,
            stacklevel=3,
        )

    def _raise_undelivered(self) -> None:
        undelivered, self._undelivered = self._undelivered, []
        if self.strict and undelivered:
            first = undelivered[0]
            raise UndeliverableError(
                f"message {first.id} from {first.sent_from or '?'!r} with send_to={sorted(first.send_to)} reached no "
                f"role ({len(undelivered)} undeliverable in all; kept in env.dead_letters); address a registered "
                f"role, or use '<all>'"
            )

    def _add_event(
        self,
        kind: Literal["role_error", "dead_letter", "dropped", "intervention"],
        message: Message | None = None,
        *,
        role: str = "",
        detail: str = "",
    ) -> None:
        self.events.append(
            EnvEvent(kind=kind, round=self.round, role=role, message_id=message.id if message else "", detail=detail)
        )

    def explain_route(self, message: Message, role: Role | str) -> RouteExplanation:
        """Say which rule delivers ``message`` to ``role`` (or not) and whether it becomes news."""
        return explain_route(message, self.role(role) if isinstance(role, str) else role)


class Readiness:
    """Which roles have buffered messages, so take a turn in the next round: the bus's to know, not the roles'."""

    __slots__ = ("flags", "ready")

    def __init__(self) -> None:
        """No role ready."""
        self.ready: list[Member] = []
        """The ready roles, in the order they became ready."""
        self.flags = bytearray()
        """By place, whether the role there is in :attr:`ready`."""

    def mark(self, role: Member) -> None:
        """``role`` is ready (once, however often it is marked)."""
        if not self.flags[role.place]:
            self.flags[role.place] = 1
            self.ready.append(role)

    def take_all(self) -> list[Member]:
        """The ready roles, in the order they became ready; none is ready any more."""
        ready, self.ready = self.ready, []
        flags = self.flags
        if len(ready) > len(flags) >> 3:  # many: a fresh array costs less than a store per role
            self.flags = bytearray(len(flags))
        else:
            for role in ready:
                flags[role.place] = 0
        return ready


class RecordReader:
    """One reader of a bus's round records (:meth:`Bus.record_reader`: the event log, a checkpoint writer, tracing).

    :meth:`take` gives each record closed since the last take, in order; the bus keeps a record until
    every reader has taken it, so none is missed however long a reader waits. A record whose round's
    messages are still being taken in (a sharded round behind the next) waits, and those after it too.
    """

    __slots__ = ("__weakref__", "_bus", "missed", "read")

    def __init__(self, bus: Bus, read: int) -> None:
        """Read ``bus``'s records after the ``read``-th."""
        self._bus = bus
        self.read = read
        """The number of the last record taken."""
        self.missed = False
        """Whether records closed before it began were wanted (``from_start``) but gone: it reads what closes next."""

    def take(self) -> list[RoundRecord]:
        """The records closed since the last take, oldest first (what is open closes as its own: ``round_record``)."""
        return self._bus.records_after(self)


class BusDrive:
    """What a runtime drives a bus with besides the user's API (``Bus.drive``); a role or a scenario never needs it.

    Not to be confused with ``team.control.RunControl``, which steers a run at its barriers (pause, step, inject).

    A sharded run (``sharding``) puts stand-ins where the roles it ships to shards were, and the
    roles back when they return; a shard hosts its part of the roles at their places; a driver takes
    a round into the history behind the next one; a restore recomputes which roles are ready. What
    a runtime does during a round it does through the round it is handed (``bus.environment.Round``).
    """

    __slots__ = ("book", "bus", "held", "readiness")

    def __init__(self, bus: Bus, book: AddressBook, readiness: Readiness, held: deque[RoundRecord]) -> None:
        """What drives ``bus``: its address book and readiness, shared."""
        self.bus, self.book, self.readiness = bus, book, readiness
        self.held = held
        """The bus's records held until their rounds are taken in (``add_late`` completes the oldest)."""

    def swap_roles(self, stand_ins: Mapping[int, Member]) -> None:
        """Put ``stand_ins`` (by place) where roles were, keeping every place; the address index is rebuilt.

        A sharded run puts the driver's stand-ins for the roles it ships to shards, and the roles
        back when they return (``sharding.driver``); a stand-in carries ``name``, ``addresses`` and
        ``place`` like the role it stands for.
        """
        list(self.bus.members)  # a population's roles built: each place holds its role or its stand-in
        members, readiness = list(self.book.members), self.readiness
        for index, stand_in in stand_ins.items():
            members[index] = stand_in
            readiness.flags[index] = 0  # ready here once marked (rebuild_ready, a delivery), whatever it was elsewhere
        readiness.ready = [role for role in readiness.ready if role.place not in stand_ins]
        self.book.refill(members)
        self.bus.roles = {member.name: cast(Role, member) for member in members}  # as Bus.members says

    def adopt_roles(self, roles: Iterable[Role], *, total: int) -> None:
        """Host ``roles`` that keep their places (``place``) in a bus of ``total`` roles (a shard's part).

        They are routed to and run here; what is published during a round by anyone else ranks
        after all ``total`` roles, as on the whole bus.
        """
        flags = self.readiness.flags
        if len(flags) < total:
            flags.extend(bytes(total - len(flags)))
        for role in sorted(roles, key=lambda r: r.place):
            self.bus.roles[role.name] = role
            self.book.add(role)
            if not role.rc.msg_buffer.empty():  # ready here if its buffer holds news, whatever it was elsewhere
                self.readiness.mark(role)
        self.book.total = total

    def rebuild_ready(self) -> None:
        """Recompute which roles have buffered messages to observe (after their buffers were restored)."""
        readiness = self.readiness
        readiness.take_all()
        for role in self.bus.built_roles():  # one not built yet holds nothing
            if not role.rc.msg_buffer.empty():
                readiness.mark(role)

    def add_late(self, messages: Sequence[Message], said: Sequence[Said | None]) -> None:
        """Put a round's ``messages`` into the history and its record, held until now; readers get it from now.

        A round taken in behind the next one (``Environment.run_round`` with a way that is ``behind``),
        delivered elsewhere with this address book: as ``Bus.add_to_history`` with no recipients.
        """
        held = self.held
        self.into_history(messages, None, held.popleft() if held else None, said)

    def into_history(
        self,
        messages: Sequence[Message],
        recipients: Sequence[Sequence[Member]] | None,
        record: RoundRecord | None,
        said: Sequence[Said | None] | None = None,
    ) -> None:
        """Put ``messages`` into the history and ``record``, each with what its sender said of it.

        ``recipients``: as delivery found them; ``None``: the ones this address book routes to now.
        ``said``: as each message's shard's outbox carried it; ``None`` (all, or one): its sender is here
        (``bus.record.said_by``).
        """
        bus = self.bus
        new = bus.history.remember_new(messages)
        if record is None:
            return
        book = self.book
        if len(new) < len(messages):  # the history had some already: the record keeps what it gained
            kept = set(map(id, new))
            if recipients is not None:
                recipients = [to for message, to in zip(messages, recipients, strict=True) if id(message) in kept]
            if said is not None:
                said = [given for message, given in zip(messages, said, strict=True) if id(message) in kept]
        if recipients is None:
            route = book.route
            recipients = [route(message.send_to) for message in new]
        record.said += _said(new, said, bus.roles)
        record.published += new
        record.recipients += map(book.places, recipients)


def _said(messages: Sequence[Message], given: Sequence[Said | None] | None, roles: Mapping[str, Role]) -> list[Said]:
    """What each message's sender said of it: ``given``, else its sender here says (a fan-out costs it once)."""
    senders = dict[str, Said]()
    if given is None:  # every sender is here (one process)
        for sender in {message.sent_from: None for message in messages}:
            senders[sender] = said_by(roles[sender]) if sender in roles else NOTHING_SAID
        return [senders[message.sent_from] for message in messages]
    out = []
    for message, known in zip(messages, given, strict=True):
        if known is None:
            sender = message.sent_from
            if sender not in senders:
                senders[sender] = said_by(roles[sender]) if sender in roles else NOTHING_SAID
            known = senders[sender]
        out.append(known)
    return out


def _checked(result: object, hook: Intervention) -> Message:
    if not isinstance(result, Message):
        raise InvalidValueError(
            f"{type(hook).__name__} returned {result!r}; an intervention must return a Message or DropMessage"
        )
    return result


def _nearest(addresses: Iterable[str], roles: Mapping[str, object]) -> str:
    """``; did you mean 'Reviewer1'?`` for an address that resembles a role's name (empty if none does)."""
    for address in sorted(addresses):
        close = difflib.get_close_matches(address, list(roles), n=1, cutoff=0.75)
        if close:
            return f"; did you mean {close[0]!r}?"
    return ""
