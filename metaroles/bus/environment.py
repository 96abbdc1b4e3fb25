"""The Environment: the message bus that routes messages between roles and runs rounds.

Routing goes through an address index, so its cost grows with the number of recipients, not
with the number of roles. A round runs every role that has buffered messages, concurrently,
on a bounded pool of anyio workers; what they publish is delivered when the round ends, in
the publishing role's registration order and then publish order, so a seed and an offline model fix the whole
transcript. A message that reaches no role goes to :attr:`Environment.dead_letters` with a
:class:`DeadLetterWarning` (strict mode raises). Interventions see every publish and delivery.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, asynccontextmanager
from operator import itemgetter
from pathlib import Path
from typing import Any, Literal, Protocol, cast

import anyio
from pydantic import ValidationError

from metaroles.bus.action import UserRequirement
from metaroles.bus.delivery import Bus
from metaroles.bus.record import Said
from metaroles.bus.role import Role
from metaroles.bus.rounds import TurnObserver, WorkerPool, run_roles, take_turn
from metaroles.bus.routing import Intervention, env_index
from metaroles.bus.state import STATE_REFERENCE, EnvironmentState, by_reference, resolved, rng_state, set_rng_state
from metaroles.core.exceptions import (
    ConfigError,
    InvalidValueError,
    RoleFailed,
    RunDirCorrupt,
    RunError,
    UnknownRoleError,
    raised_at,
    raised_in,
)
from metaroles.core.files import write_atomic
from metaroles.core.heap import SettledHeap
from metaroles.core.ids import Clock, IdScope, id_scope, run_key
from metaroles.core.surface import CLASS_KEYS, Dumped
from metaroles.llm.ledger import CostLedger
from metaroles.messages.memory import Memory
from metaroles.messages.message import Message


class Round:
    """One round while it runs (:meth:`Environment.run_round`), and what its :class:`RoundWay` does with it.

    Its number, its ready roles, the ledger before it and its failures; the turns here
    (:meth:`run_turns`), and what the round published (:meth:`take_published`, :meth:`deliver_published`;
    :meth:`add_published` for what was published elsewhere).
    """

    __slots__ = ("_deliver", "_pending", "_run", "_said", "failures", "number", "ready", "spent")

    def __init__(
        self,
        number: int,
        ready: list[Role],
        spent: tuple[int, float, int],
        *,
        run: Callable[[Round], Coroutine[Any, Any, None]],
        pending: list[tuple[int, Message]],
        deliver: Callable[[Sequence[Message], Sequence[Said | None] | None], None],
    ) -> None:
        """Round ``number``: ``run`` runs its turns, ``deliver`` delivers, ``pending`` is the bus's published list."""
        self.number = number
        self.ready = ready
        """The roles that take a turn, in place order."""
        self.spent = spent
        """The ledger before the round (``CostLedger.mark``)."""
        self.failures: list[tuple[Role, Exception]] = []
        """The roles whose turn raised, with what (in role order once the round is ordered)."""
        self._run, self._pending, self._deliver = run, pending, deliver
        self._said: dict[int, Said] = {}
        """What was said of messages published elsewhere (by ``id``), as their shards' outboxes carried it."""

    def fail(self, role: Role, exc: Exception) -> None:
        """Note that ``role``'s turn raised ``exc``."""
        self.failures.append((role, exc))

    def run_turns(self) -> Coroutine[Any, Any, None]:
        """Run one turn of each of the round's ready roles in this process, concurrently; failures are noted."""
        return self._run(self)

    def take_published(self) -> list[tuple[int, Message]]:
        """What was published during the round, in delivery order, as ``(rank, message)``; the caller delivers it.

        The rank is the publishing turn's role's place (see ``Bus.publish_message``).
        """
        pending = sorted(self._pending, key=itemgetter(0))
        self._pending.clear()
        return pending

    def add_published(self, published: Iterable[tuple[int, Message, Said]]) -> None:
        """Add messages published elsewhere this round (a shard's) to its delivery: ``(rank, message, said)``."""
        pending, said = self._pending, self._said
        for rank, message, what in published:
            pending.append((rank, message))
            said[id(message)] = what

    def said_of(self, message: Message) -> Said | None:
        """What was said of a message published elsewhere (:meth:`add_published`); ``None``: published here."""
        return self._said.get(id(message))

    def deliver_published(self) -> None:
        """Deliver what was published during the round: the history, then the recipients' buffers."""
        messages = [message for _, message in self.take_published()]
        said = self._said
        self._deliver(messages, [said.get(id(message)) for message in messages] if said else None)


class RoundWay(Protocol):
    """What differs between drivers of a round: where its turns run and how its messages are delivered.

    :meth:`Environment.run_round` is the one round loop — begin, turns, order, deliver, end — and
    asks its way for the parts that differ. The bus's own (the default): this process's ready roles
    and the bus's delivery. A sharded run's driver (``sharding.driver``) sends its shards their round
    first and runs its own roles while they work; a shard (``sharding.worker``) is told its round's
    number and routes what its roles published to the shards of their recipients.
    """

    @property
    def number(self) -> int | None:
        """The round to run (a shard is told); ``None``: the environment's next."""

    @property
    def cut_short_ends(self) -> bool:
        """Whether a round whose turns did not finish (cancelled; a shard lost) is still ordered, delivered, ended.

        In one process, yes (the run can go on from it); across shards, no (the run stops at its last checkpoint).
        """

    @property
    def behind(self) -> bool:
        """Whether, once delivered, the round's messages are still to be taken into the history.

        A sharded driver takes them in while the shards run the next round; the round's record is held
        until then (``BusDrive.add_late``).
        """

    def begin(self) -> None:
        """Before the round begins (a sharded driver: send the shards their round; record the last meanwhile)."""

    async def turns(self, this: Round) -> None:
        """Run the round's turns (:meth:`Round.run_turns` for this process's ready roles, and any elsewhere)."""

    def deliver(self, this: Round) -> None:
        """Deliver what the round published (the bus's: :meth:`Round.deliver_published`)."""


class _Here:
    """The bus's own way through a round: this process's ready roles, and its delivery."""

    __slots__ = ("env",)
    number = None
    cut_short_ends = True
    behind = False

    def __init__(self, env: Environment) -> None:
        self.env = env

    def begin(self) -> None:
        pass

    def turns(self, this: Round) -> Coroutine[Any, Any, None]:
        return this.run_turns()

    def deliver(self, this: Round) -> None:
        this.deliver_published()


class Environment(Bus, Dumped):
    """The message bus that runs rounds: a :class:`Bus` plus concurrency, a seed, the run's ids and saved state.

    Args:
        desc: What this environment is about.
        strict: Raise :class:`UndeliverableError` when a message reaches no role.
        concurrency: How many roles may be mid-turn at once within a round.
        on_role_error: ``"raise"`` re-raises a failing role's error (as :class:`RoleFailed`) once
            its round has ended cleanly; ``"record"`` only records it in :attr:`events`.
        interventions: Hooks that see every publish and delivery.
        ledger: Cost ledger shared by every role's model calls (a resumed run passes its own).
        seed: Seed of :attr:`rng`, the random source scenarios draw from, and of the ids the run
            makes (see ``core.ids``). Both are saved with the environment, so a resumed run draws
            what the uninterrupted one would have; without a seed both are random.
    """

    def __init__(
        self,
        *,
        desc: str = "",
        strict: bool = False,
        concurrency: int = 32,
        on_role_error: Literal["raise", "record"] = "raise",
        interventions: Iterable[Intervention] = (),
        ledger: CostLedger | list[Any] | None = None,
        seed: int | None = None,
        roles: Iterable[Role | dict[str, Any]] | Mapping[str, Role | dict[str, Any]] = (),
        **saved: Any,
    ) -> None:
        """Create an environment; see the class docstring for the arguments.

        ``roles`` and ``saved`` are what :meth:`model_dump` wrote (MetaGPT's ``Environment(**data)``):
        the roles (dumps, or roles; a name → role mapping too) join, then the saved state is loaded.
        """
        if isinstance(ledger, list):  # a dump's: the ledger's entries
            saved["ledger"], ledger = ledger, None
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidValueError(f"concurrency={concurrency!r} must be a positive integer")
        if on_role_error not in ("raise", "record"):
            raise InvalidValueError(f"on_role_error={on_role_error!r} must be 'raise' or 'record'")
        super().__init__(strict=strict, interventions=interventions, ledger=ledger)
        self.desc = desc
        self.concurrency = concurrency
        self.on_role_error = on_role_error
        self.rng = random.Random(seed)
        self.id_key = run_key(seed)
        """Where the run's ids come from (a function of the seed); saved with the state."""
        self._ids = IdScope(self.id_key, 0)
        self._clock = Clock()
        self._pool: WorkerPool | None = None
        self._heap: SettledHeap | None = None
        """Within a session, what settles the heap after each round (``core.heap``)."""
        self.observer: TurnObserver | None = None
        """Sees each round and turn while it runs (OpenTelemetry: ``telemetry.tracing.traced``); off when ``None``."""
        self._from_dump(roles, saved)

    def _from_dump(self, roles: Iterable[Role | dict[str, Any]] | Mapping[str, Any], saved: dict[str, Any]) -> None:
        """Hire ``roles`` (dumps rebuilt as the class each names) and load the state ``saved`` holds."""
        entries = list(roles.values() if isinstance(roles, Mapping) else roles)
        unknown = sorted(set(saved) - set(EnvironmentState.model_fields) - set(CLASS_KEYS))
        if unknown:
            raise InvalidValueError(
                f"Environment got unknown argument(s) {unknown}; it takes its own and what model_dump wrote"
            )
        self.add_roles(Role.model_validate(entry) for entry in entries)
        if saved.keys() - set(CLASS_KEYS):  # the roles' dumps hold their own state; this, the whole run's
            states = [entry for entry in entries if isinstance(entry, Mapping)]
            self.load_state(EnvironmentState.model_validate({**saved, "roles": states}))

    def model_dump(self, *, mode: str = "python", **_: Any) -> dict[str, Any]:
        """The environment as data (MetaGPT's pydantic dump): :meth:`state_dict`'s, each role whole.

        ``Environment(**dump)`` or ``Environment.model_validate(dump)`` rebuild it: the roles (the
        classes their dumps name) with their memories and buffers, the history, round, ledger and seed.
        """
        state = self.state_dict().model_dump(mode=mode)
        roles = [role.model_dump(mode=mode) for role in self.members]
        settings = {"desc": self.desc, "strict": self.strict, "concurrency": self.concurrency}
        return {**settings, "on_role_error": self.on_role_error, **state, "roles": roles}

    # -- the run's ids ----------------------------------------------------------------------

    def reseed(self, seed: int | None) -> None:
        """Seed :attr:`rng` and the run's ids anew (a scenario's ``--seed``); call before the run starts."""
        self.rng.seed(seed)
        self.set_id_key(run_key(seed))

    def set_id_key(self, key: str) -> None:
        """Make the run's ids from ``key`` (a shard takes its run's; a resumed run its saved one)."""
        self.id_key = key
        self._ids = IdScope(key, 0)
        for role in self.built_roles():  # one a population builds later takes its ids then (role_ids)
            role.ids = IdScope(key, role.place + 1, self._clock)

    @property
    def clock(self) -> Clock:
        """The round the ids of the roles' turns are made in (their scopes read it)."""
        return self._clock

    def id_scope(self) -> AbstractContextManager[IdScope]:
        """Make the ids created inside the block the run's own, at the current round (e.g. a Team's idea)."""
        return id_scope(self._ids.at(self.round))

    def role_ids(self, index: int) -> IdScope:
        """Where the ``index``-th role's ids come from: the run's key, its slot, the environment's clock."""
        return IdScope(self.id_key, index + 1, self._clock)

    # -- rounds --------------------------------------------------------------------------------

    async def run(self, k: int = 1) -> None:
        """Run ``k`` rounds (in one session: worker tasks are kept between them)."""
        async with self.session():
            for _ in range(k):
                await self.run_round()

    @asynccontextmanager
    async def session(self) -> AsyncIterator[None]:
        """Keep worker tasks alive across the rounds run inside (``run`` and ``Team.run`` open one).

        Without a session each round starts its own tasks; within one, rounds wake parked
        workers. Leaving the session stops the workers; no task outlives it. Each round of a
        session ends by settling the heap (``core.heap``): what survived it leaves the garbage
        collector's full passes until the session ends, so late rounds of a long run cost what
        early ones do.
        """
        if self._pool is not None:
            yield
            return
        heard = {m.cause_by for m in self.history.get(100)} | {UserRequirement.action_id()}
        self.watches.warn(heard=heard)  # a watch no action produces: a role idle for ever
        error: Exception | None = None
        async with anyio.create_task_group() as tg:
            self._pool, self._heap = WorkerPool(tg, self.concurrency), SettledHeap()
            try:
                yield
            except Exception as exc:  # re-raised as is once the workers are gone, not in a group
                error = exc
            finally:
                self._heap.release()
                self._pool = self._heap = None
                tg.cancel_scope.cancel()
        if error is not None:
            raise error

    async def run_round(self, way: RoundWay | None = None) -> None:
        """Run every role with buffered messages, then deliver what they published.

        The one round loop, whatever drives it: :meth:`_begin_round`, the turns, :meth:`_close_turns`,
        :meth:`_order_round`, the delivery, :meth:`_end_round`, :meth:`_raise_round_errors`. ``way``
        (:class:`RoundWay`) brings where the turns run and how delivery goes when that is not this
        process alone (a sharded run's driver and its shards, ``sharding``).

        Raises:
            RoleFailed: If a role raised and ``on_role_error`` is ``"raise"`` (after delivery).
            UndeliverableError: In strict mode, when a message reached no role (after delivery).
        """
        going: RoundWay = way or _Here(self)
        going.begin()
        this = self._begin_round(going.number)
        ran = False
        try:
            await going.turns(this)
            ran = True
        finally:
            self._close_turns()
            if ran or going.cut_short_ends:
                self._order_round(this)
                going.deliver(this)
                self._end_round(this, held=going.behind)
        self._raise_round_errors(this)

    def _begin_round(self, number: int | None = None) -> Round:
        """Start the next round (a shard: round ``number``): its clock, its record, the observer; take the ready roles.

        From now until :meth:`_close_turns`, what is published waits for the round's delivery.

        Raises:
            RunError: If a round is already running.
        """
        if self._in_round:
            raise RunError(f"round {self.round} of this environment is still running; await it before starting another")
        self.round = self.round + 1 if number is None else number
        self._clock.set(self.round)
        if self.record is not None:
            self.record.started_ns = time.time_ns()
        if self.observer is not None:
            self.observer.round_begin(self)
        ready = cast("list[Role]", self._readiness.take_all())  # a stand-in is never ready here: it forwards
        if len(ready) > 1:
            ready.sort(key=env_index)
        mark, pending = self.ledger.mark(), self._pending
        this = Round(self.round, ready, mark, run=self._run_turns, pending=pending, deliver=self._deliver)
        self._in_round = True
        return this

    async def _run_turns(self, this: Round) -> None:
        """Run one turn of each of the round's ready roles, concurrently (in the session's pool, if any).

        A role that raises is noted in ``this.failures``; the others go on.
        """
        ready = this.ready
        if len(ready) == 1:
            try:
                await take_turn(ready[0], self.round, self.observer)
            except Exception as exc:
                this.fail(ready[0], exc)
        elif ready:
            if self._pool is not None:
                self._pool.observer = self.observer
                await self._pool.run(ready, self.round, on_error=this.fail)
            else:
                await run_roles(
                    ready, self.round, concurrency=self.concurrency, on_error=this.fail, observer=self.observer
                )

    def _close_turns(self) -> None:
        """The round's turns are over: a message published from now on is delivered at once."""
        self._in_round = False

    def _order_round(self, this: Round) -> None:
        """Put the round's turn steps, failures and model calls in role order, whichever finished first.

        Concurrent turns append, fail and call their models in an order the scheduler picks; the
        record (steps, events, ledger) must not depend on it, in one process or on many shards.
        Each failure becomes a ``role_error`` event.
        """
        if self.steps is not None:
            roles, last = self.roles, len(self._members)
            self.steps.order_by_role(lambda name: roles[name].place if name in roles else last)
        failures = this.failures
        failures.sort(key=lambda failure: failure[0].place)
        for role, exc in failures:
            frames = "".join(f"\n  at {frame}" for frame in raised_at(exc))  # by module: the same in any checkout
            self._add_event("role_error", role=role.name, detail=f"{type(exc).__name__}: {exc}{frames}")
        entries, spent = self.ledger.entries, this.spent
        if len(entries) > spent[0]:
            roles, last = self.roles, len(self._members)
            entries[spent[0] :] = sorted(  # a call in no role's name (an archetype's): after the roles', by its name
                entries[spent[0] :], key=lambda e: (roles[e.role].place, "") if e.role in roles else (last, e.role)
            )
            self.ledger.recount(spent)

    def _end_round(self, this: Round, *, held: bool = False) -> None:
        """The round is over and delivered: close its record (``held``: ``RoundWay.behind``); observer; heap."""
        self._close_record(held=held)
        if self.observer is not None:
            self.observer.round_end(self, this.failures)
        self.settle_heap()

    def _raise_round_errors(self, this: Round) -> None:
        """Raise the round's first failure (``on_role_error="raise"``), then, in strict mode, what reached no role.

        Raises:
            RoleFailed: If a role raised and ``on_role_error`` is ``"raise"``.
            UndeliverableError: In strict mode, when a message reached no role.
        """
        self._raise_failures(this.failures)
        self._raise_undelivered()

    def settle_heap(self, *, full: bool = False) -> None:
        """Within a session, take what survived the round out of the collector's full passes (``core.heap``).

        ``full``: collect every generation first (after a bulk change that left old garbage).
        """
        if self._heap is not None:
            self._heap.settle(full=full)

    def keep_heap(self) -> None:
        """Within a session, take all that exists now out of the collector's passes without one (``core.heap``).

        For a bulk of objects made at once that live on (roles brought back from shards): else the
        collector's next young pass walks every one of them.
        """
        if self._heap is not None:
            self._heap.keep()

    def _raise_failures(self, failures: list[tuple[Role, Exception]]) -> None:
        """Raise the first failure of the round (in role order) when ``on_role_error`` is ``"raise"``."""
        if failures and self.on_role_error == "raise":
            role, exc = failures[0]
            more = f" (and {len(failures) - 1} more; see env.events)" if len(failures) > 1 else ""
            where = raised_in(exc)
            raise RoleFailed(
                f"role {role.name!r} failed in round {self.round}: {exc!r}{where}{more}",
                role=role.name,
                round=self.round,
            ) from exc

    # -- state ---------------------------------------------------------------------------------

    def state_dict(self) -> EnvironmentState:
        """The whole environment as data (call between rounds)."""
        shared = self.history.keyed
        return EnvironmentState(
            round=self.round,
            roles=[by_reference(role.state_dict(), shared) for role in self.members],
            history=list(self.history.storage),
            dead_letters=list(self.dead_letters),
            events=list(self.events),
            ledger=list(self.ledger.entries),
            rng=rng_state(self.rng),
            id_key=self.id_key,
        )

    def load_state(self, state: EnvironmentState) -> None:
        """Restore ``state`` into this environment, whose roles must carry the same names.

        Nothing is changed unless the whole state can be loaded.

        Raises:
            UnknownRoleError: If the state names a role that is not registered here.
            InvalidValueError: If its random-source state is not one.
        """
        missing = [r.name for r in state.roles if r.name not in self.roles]
        if missing:
            raise UnknownRoleError(
                f"the saved state has roles {missing} that this environment lacks; hire them before loading "
                f"(registered: {sorted(self.roles)})"
            )
        if state.rng is not None:
            try:
                set_rng_state(random.Random(), state.rng)
            except (TypeError, ValueError) as exc:
                raise InvalidValueError(
                    f"the saved state's rng is not a random-source state ({exc}); nothing was loaded"
                ) from None
        self.round = state.round
        self.history = Memory(state.history)
        shared = self.history.keyed
        self.dead_letters = list(state.dead_letters)
        self.events = list(state.events)
        self.ledger.reset(state.ledger)
        if state.rng is not None:
            set_rng_state(self.rng, state.rng)
        if state.id_key is not None:
            self.set_id_key(state.id_key)
        for role_state in state.roles:
            role = self.roles[role_state.name]
            role.load_state(resolved(role_state, shared))
            self.reindex(role)
            if not role.rc.msg_buffer.empty():
                self.mark_ready(role)

    def save(self, path: str | Path, *, after: Sequence[Path] = ()) -> Path:
        """Write the state as JSON, atomically (a crash never leaves a half-written file).

        The JSON goes from pydantic-core to the file as bytes: a large society's state is hundreds
        of megabytes, and a text copy of it (then its encoding) would double the run's peak memory.
        ``after``: files or folders that must be on the disk first, synced with it (see ``write_atomic``).
        """
        state = self.state_dict()
        return write_atomic(Path(path), state.__pydantic_serializer__.to_json(state, indent=1), after=after)

    def load(self, path: str | Path) -> None:
        """Restore a state written by :meth:`save`.

        Raises:
            RunDirCorrupt: If the file is cut short or is not a saved state (naming it and where); nothing is loaded.
        """
        raw = Path(path).read_bytes()
        if STATE_REFERENCE.encode() in raw[:64]:
            raise ConfigError(
                f"{path} refers to the run's last checkpoint instead of holding the state (a large run saves it "
                "once); restore from there: "
                "metaroles.record.restore.restore_checkpoint(run_dir / 'checkpoints', env)"
            )
        try:
            state = EnvironmentState.model_validate_json(raw)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error["loc"])
            raise RunDirCorrupt(
                f"{path}: not a whole saved state ({error['msg']}{' at ' + where if where else ''}); nothing was "
                "loaded. If it came from a run directory, `metaroles resume` restores from its checkpoints instead"
            ) from None
        self.load_state(state)
