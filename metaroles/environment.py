"""The Environment: the message bus that routes messages between roles and runs rounds.

Routing goes through an address index, so its cost grows with the number of recipients, not
with the number of roles. A round runs every role that has buffered messages, concurrently,
on a bounded pool of anyio workers; what they publish is delivered when the round ends, in
role registration order and then publish order, so a seed and an offline model fix the whole
transcript. A message that reaches no role goes to :attr:`Environment.dead_letters` with a
:class:`DeadLetterWarning` (strict mode raises). Interventions see every publish and delivery.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from operator import itemgetter
from pathlib import Path
from typing import Any, Literal
from warnings import warn

import anyio
from pydantic import BaseModel

from metaroles.exceptions import (
    DuplicateRoleError,
    InvalidValueError,
    RoleFailed,
    RunError,
    UndeliverableError,
    UnknownRoleError,
)
from metaroles.files import write_atomic
from metaroles.ledger import CostLedger
from metaroles.memory import Memory
from metaroles.message import Message
from metaroles.role import Role
from metaroles.rounds import WorkerPool, run_roles
from metaroles.schema import MESSAGE_ROUTE_TO_ALL
from metaroles.state import EnvEvent, EnvironmentState, by_reference, resolved, rng_state, set_rng_state


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

    def on_deliver(self, message: Message, *, recipient: Role) -> Message | type[DropMessage]:
        """Called once per recipient, before the message enters its buffer."""
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


class Environment:
    """The message bus.

    Args:
        desc: What this environment is about.
        strict: Raise :class:`UndeliverableError` when a message reaches no role.
        concurrency: How many roles may be mid-turn at once within a round.
        on_role_error: ``"raise"`` re-raises a failing role's error (as :class:`RoleFailed`) once
            its round has ended cleanly; ``"record"`` only records it in :attr:`events`.
        interventions: Hooks that see every publish and delivery.
        ledger: Cost ledger shared by every role's model calls (a resumed run passes its own).
        seed: Seed of :attr:`rng`, the random source scenarios draw from; its state is saved with
            the environment, so a resumed run draws what the uninterrupted one would have.
    """

    def __init__(
        self,
        *,
        desc: str = "",
        strict: bool = False,
        concurrency: int = 32,
        on_role_error: Literal["raise", "record"] = "raise",
        interventions: Iterable[Intervention] = (),
        ledger: CostLedger | None = None,
        seed: int | None = None,
    ) -> None:
        """Create an empty environment; see the class docstring for the arguments."""
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidValueError(f"concurrency={concurrency!r} must be a positive integer")
        if on_role_error not in ("raise", "record"):
            raise InvalidValueError(f"on_role_error={on_role_error!r} must be 'raise' or 'record'")
        self.desc = desc
        self.strict = strict
        self.concurrency = concurrency
        self.on_role_error = on_role_error
        self.interventions: list[Intervention] = list(interventions)
        self.ledger = ledger or CostLedger()
        self.roles: dict[str, Role] = {}
        self.history = Memory()
        self.dead_letters: list[Message] = []
        self.events: list[EnvEvent] = []
        self.round = 0
        self.rng = random.Random(seed)
        self.trace: list[tuple[str, str, Any, int]] | None = None
        """The last round's turn steps as ``(kind, role, detail, remembered)`` — observe (news, and
        how many messages went to memory), think (the action), act (the message) — while an event
        log or a checkpoint writer wants them (``None`` otherwise). Each round starts a new list."""
        self._members: list[Role] = []
        self._index: dict[str, list[Role]] = {}
        self._ready: list[Role] = []
        self._pending: list[tuple[int, Message]] = []
        self._in_round = False
        self._undelivered: list[Message] = []
        self._pool: WorkerPool | None = None
        self._outsider = 0  # delivery rank of what no registered role publishes in a round: after all roles

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
        role.attach(self, len(self._members))
        self.roles[role.name] = role
        self._members.append(role)
        self._outsider = len(self._members)
        self._index_role(role)
        if not role.rc.msg_buffer.empty():
            self.mark_ready(role)

    def add_roles(self, roles: Iterable[Role]) -> None:
        """Register each of ``roles`` in order."""
        for role in roles:
            self.add_role(role)

    def get_role(self, name: str) -> Role:
        """Return the role named ``name``.

        Raises:
            UnknownRoleError: If there is none (the message lists the known names).
        """
        try:
            return self.roles[name]
        except KeyError:
            raise UnknownRoleError(f"no role named {name!r}; known roles: {sorted(self.roles)}") from None

    def _index_role(self, role: Role) -> None:
        for address in role.addresses:
            bucket = self._index.setdefault(address, [])
            bucket.append(role)
            if len(bucket) > 1 and bucket[-2]._env_index > role._env_index:
                bucket.sort(key=_env_index)

    def set_addresses(self, role: Role, addresses: Iterable[str]) -> None:
        """Replace ``role``'s addresses (MetaGPT's ``env.set_addresses``)."""
        role.set_addresses(addresses)

    def get_addresses(self, role: Role) -> frozenset[str]:
        """The addresses ``role`` receives on."""
        return role.addresses

    def reindex(self, role: Role) -> None:
        """Re-read ``role``'s addresses into the index (after ``Role.set_addresses``)."""
        for address, bucket in list(self._index.items()):
            if role in bucket:
                bucket.remove(role)
                if not bucket:
                    del self._index[address]
        self._index_role(role)

    def mark_ready(self, role: Role) -> None:
        """Note that ``role`` has buffered messages, so it runs in the next round."""
        if not role._ready:
            role._ready = True
            self._ready.append(role)

    @property
    def is_idle(self) -> bool:
        """True when no role has anything buffered."""
        return not self._ready

    # -- routing -------------------------------------------------------------------------------

    def _route(self, send_to: frozenset[str]) -> Sequence[Role]:
        if MESSAGE_ROUTE_TO_ALL in send_to:
            return self._members
        if len(send_to) == 1:
            for address in send_to:
                return self._index.get(address, ())
        found: dict[int, Role] = {}
        for address in send_to:
            for role in self._index.get(address, ()):
                found[role._env_index] = role
        return [found[i] for i in sorted(found)]

    def recipients(self, message: Message) -> list[Role]:
        """The roles ``message`` would be delivered to, in registration order."""
        return list(self._route(message.send_to))

    def publish_message(self, message: Message) -> None:
        """Publish ``message``: delivered at the end of the current round, or now between rounds.

        Raises:
            UndeliverableError: In strict mode, between rounds, when it reaches no role (it is
                still kept in :attr:`dead_letters`).
        """
        if not isinstance(message, Message):
            raise InvalidValueError(f"publish_message got {message!r}, which is not a Message")
        if self._in_round:
            sender = self.roles.get(message.sent_from)
            self._pending.append((self._outsider if sender is None else sender._env_index, message))
            return
        self._deliver((message,))
        self._raise_undelivered()

    def _deliver(self, messages: Iterable[Message]) -> None:
        """Route each of ``messages``, in order, into the buffers of its recipients."""
        if self.interventions:
            for message in messages:
                self._deliver_intercepted(message)
            return
        remember, route, ready = self.history.add, self._route, self._ready
        for message in messages:
            remember(message)
            recipients = route(message.send_to)
            if not recipients:
                self._dead_letter(message)
            for role in recipients:
                if role.rc.msg_buffer.push(message) and not role._ready:
                    role._ready = True
                    ready.append(role)

    def _deliver_intercepted(self, message: Message) -> None:
        for hook in self.interventions:
            result = hook.on_publish(message, sender=message.sent_from)
            if result is DropMessage:
                self._record("dropped", message, detail=f"dropped on publish by {type(hook).__name__}")
                return
            message = _checked(result, hook)
        self.history.add(message)
        recipients = self._route(message.send_to)
        if not recipients:
            self._dead_letter(message)
        for role in recipients:
            delivered = self._intercept_delivery(message, role)
            if delivered is not None:
                role.put_message(delivered)

    def _intercept_delivery(self, message: Message, role: Role) -> Message | None:
        for hook in self.interventions:
            result = hook.on_deliver(message, recipient=role)
            if result is DropMessage:
                self._record("dropped", message, role=role.name, detail=f"dropped on delivery by {type(hook).__name__}")
                return None
            message = _checked(result, hook)
        return message

    def _dead_letter(self, message: Message) -> None:
        self.dead_letters.append(message)
        self._undelivered.append(message)
        detail = f"send_to {sorted(message.send_to)} meets no role; known addresses: {sorted(self._index)[:20]}"
        self._record("dead_letter", message, detail=detail)
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

    def _record(
        self,
        kind: Literal["role_error", "dead_letter", "dropped"],
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
        target = self.get_role(role) if isinstance(role, str) else role
        send_to = message.send_to
        if MESSAGE_ROUTE_TO_ALL in send_to:
            delivered, reasons = True, ["delivered: send_to contains '<all>', a broadcast to every role"]
        elif matched := sorted(send_to & target.addresses):
            delivered, reasons = True, [f"delivered: send_to {sorted(send_to)} names the role's address(es) {matched}"]
        else:
            delivered = False
            addresses = sorted(target.addresses)
            reasons = [f"not delivered: send_to {sorted(send_to)} meets none of the role's addresses {addresses}"]
        admitted = False
        if delivered:
            admitted, reason = _admission(message, target)
            reasons.append(reason)
        return RouteExplanation(role=target.name, delivered=delivered, admitted=admitted, reasons=reasons)

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
        workers. Leaving the session stops the workers; no task outlives it.
        """
        if self._pool is not None:
            yield
            return
        error: Exception | None = None
        async with anyio.create_task_group() as tg:
            self._pool = WorkerPool(tg, self.concurrency)
            try:
                yield
            except Exception as exc:  # re-raised as is once the workers are gone, not in a group
                error = exc
            finally:
                self._pool = None
                tg.cancel_scope.cancel()
        if error is not None:
            raise error

    async def run_round(self) -> None:
        """Run every role with buffered messages, then deliver what they published.

        Raises:
            RoleFailed: If a role raised and ``on_role_error`` is ``"raise"`` (after delivery).
            UndeliverableError: In strict mode, when a message reached no role (after delivery).
        """
        if self._in_round:
            raise RunError(f"round {self.round} of this environment is still running; await it before starting another")
        self.round += 1
        if self.trace is not None:
            self.trace = []
        ready = self._take_ready()
        failures: list[tuple[Role, Exception]] = []
        self._in_round = True
        try:
            if len(ready) == 1:
                await self._run_role(ready[0], failures)
            elif ready:
                on_error = partial(self._fail, failures=failures)
                if self._pool is not None:
                    await self._pool.run(ready, on_error=on_error)
                else:
                    await run_roles(ready, concurrency=self.concurrency, on_error=on_error)
        finally:
            self._in_round = False
            self._flush()
        if failures and self.on_role_error == "raise":
            role, exc = failures[0]
            more = f" (and {len(failures) - 1} more; see env.events)" if len(failures) > 1 else ""
            raise RoleFailed(
                f"role {role.name!r} failed in round {self.round}: {exc!r}{more}", role=role.name, round=self.round
            ) from exc
        self._raise_undelivered()

    def _take_ready(self) -> list[Role]:
        ready, self._ready = self._ready, []
        for role in ready:
            role._ready = False
        if len(ready) > 1:
            ready.sort(key=_env_index)
        return ready

    async def _run_role(self, role: Role, failures: list[tuple[Role, Exception]]) -> None:
        try:
            await role.run()
        except Exception as exc:
            self._fail(role, exc, failures=failures)

    def _fail(self, role: Role, exc: Exception, *, failures: list[tuple[Role, Exception]]) -> None:
        failures.append((role, exc))
        self._record("role_error", role=role.name, detail=f"{type(exc).__name__}: {exc}")

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        pending.sort(key=itemgetter(0))
        self._deliver([message for _, message in pending])

    # -- state ---------------------------------------------------------------------------------

    def state_dict(self) -> EnvironmentState:
        """The whole environment as data (call between rounds)."""
        shared = self.history._store
        return EnvironmentState(
            round=self.round,
            roles=[by_reference(role.state_dict(), shared) for role in self._members],
            history=self.history.storage,
            dead_letters=list(self.dead_letters),
            events=list(self.events),
            ledger=list(self.ledger.entries),
            rng=rng_state(self.rng),
        )

    def load_state(self, state: EnvironmentState) -> None:
        """Restore ``state`` into this environment, whose roles must carry the same names.

        Raises:
            UnknownRoleError: If the state names a role that is not registered here.
        """
        missing = [r.name for r in state.roles if r.name not in self.roles]
        if missing:
            raise UnknownRoleError(
                f"the saved state has roles {missing} that this environment lacks; hire them before loading "
                f"(registered: {sorted(self.roles)})"
            )
        self.round = state.round
        self.history = Memory(state.history)
        shared = self.history._store
        self.dead_letters = list(state.dead_letters)
        self.events = list(state.events)
        self.ledger.reset(state.ledger)
        if state.rng is not None:
            set_rng_state(self.rng, state.rng)
        for role_state in state.roles:
            role = self.roles[role_state.name]
            role.load_state(resolved(role_state, shared))
            self.reindex(role)
            if not role.rc.msg_buffer.empty():
                self.mark_ready(role)

    def rebuild_ready(self) -> None:
        """Recompute which roles have buffered messages to observe (after their buffers were restored)."""
        for role in self._ready:
            role._ready = False
        self._ready = []
        for role in self._members:
            if not role.rc.msg_buffer.empty():
                self.mark_ready(role)

    def save(self, path: str | Path) -> Path:
        """Write the state as JSON, atomically (a crash never leaves a half-written file)."""
        return write_atomic(Path(path), self.state_dict().model_dump_json(indent=1))

    def load(self, path: str | Path) -> None:
        """Restore a state written by :meth:`save`."""
        self.load_state(EnvironmentState.model_validate_json(Path(path).read_text(encoding="utf-8")))


def _env_index(role: Role) -> int:
    return role._env_index


def _checked(result: object, hook: Intervention) -> Message:
    if not isinstance(result, Message):
        raise InvalidValueError(
            f"{type(hook).__name__} returned {result!r}; an intervention must return a Message or DropMessage"
        )
    return result


def _admission(message: Message, role: Role) -> tuple[bool, str]:
    if message in role.rc.memory:
        return False, "not news: the role already remembers this message (find_news skips it)"
    if message.cause_by in role.rc.watch:
        return True, f"news: cause_by {message.cause_by!r} is in the role's watch set"
    if role.name in message.send_to:
        return True, f"news: the role's name {role.name!r} is in send_to"
    return False, (
        f"remembered but not news: cause_by {message.cause_by!r} is not in watch {sorted(role.rc.watch)} "
        f"and the name {role.name!r} is not in send_to"
    )
