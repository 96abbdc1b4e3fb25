"""Surgical forks: interventions that change one thing in a branch of a run, recorded as such.

``metaroles fork`` and ``metaroles branch`` take ``--intervene SPEC`` (any number), each one change:

- ``freeze:NAME`` — NAME still hears (its news enters its memory) but no longer acts.
- ``mute:A>B`` — what A sends is no longer delivered to B (each drop is a ``dropped`` event).
- ``model:NAME=SPEC`` — NAME asks another model (a provider spec: ``test:3``, ``local``, ``scripted:FILE``).
- ``persona:NAME=TEXT`` — NAME is TEXT: "You are TEXT." leads the system prompt of each of its model's
  requests, whichever action asks (actions that write their own system prompt too).
- ``rule:NAME=TEXT`` — a scripted stand-in: each of NAME's actions answers TEXT, asking no model.
- ``edit:ID=TEXT`` — the message ID, published before the fork point, says TEXT (wherever it is held).

The branch's manifest lists them; a resume or a fork of the branch applies them again
(:func:`operate` on the rebuilt team; an edit is in the branch's checkpoints already), so an
intervened branch goes on byte for byte as it went.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from metaroles.bus.action import Action, ActionResult
from metaroles.bus.environment import Environment
from metaroles.bus.role import Role
from metaroles.bus.routing import DropMessage, Intervention, Member
from metaroles.core.exceptions import ConfigError, UnknownRoleError
from metaroles.core.schema import ChatRole
from metaroles.llm.protocol import LLM, LLMRequest, LLMResponse
from metaroles.messages.message import Message

KINDS = ("freeze", "mute", "model", "persona", "rule", "edit")
"""What an intervention may change (see the module)."""

_FORMS = {
    "freeze": "freeze:NAME",
    "mute": "mute:SENDER>RECIPIENT",
    "model": "model:NAME=SPEC",
    "persona": "persona:NAME=TEXT",
    "rule": "rule:NAME=TEXT",
    "edit": "edit:MESSAGE_ID=TEXT",
}


@dataclass(frozen=True)
class Surgery:
    """One intervention: its kind, what it changes (a role, ``A>B``, a message id) and the new value."""

    kind: str
    target: str
    value: str = ""

    @property
    def spec(self) -> str:
        """The intervention as written (``kind:target[=value]``): what a manifest records."""
        tail = f"={self.value}" if self.kind in ("model", "persona", "rule", "edit") else ""
        return f"{self.kind}:{self.target}{tail}"

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles it names (none for an edit)."""
        if self.kind == "edit":
            return ()
        return tuple(self.target.split(">", 1)) if self.kind == "mute" else (self.target,)


def parse_intervention(spec: str) -> Surgery:
    """Read one ``--intervene`` spec.

    Raises:
        ConfigError: If it is not one of the forms the module lists.
    """
    kind, colon, rest = str(spec).partition(":")
    if not colon or kind not in KINDS:
        forms = ", ".join(_FORMS.values())
        raise ConfigError(f"--intervene {spec!r}: not an intervention; use one of {forms}")
    target, _, value = rest.partition("=") if kind != "freeze" else (rest, "", "")
    if kind == "mute":
        sender, arrow, recipient = target.partition(">")
        ok = bool(arrow and sender and recipient)
    else:
        ok = bool(target) and (kind == "freeze" or "=" in rest)
    if not ok or (kind in ("model", "persona") and not value):
        raise ConfigError(f"--intervene {spec!r}: write it as {_FORMS[kind]}")
    return Surgery(kind, target, value)


def parse_interventions(specs: Iterable[str]) -> list[Surgery]:
    """Read every spec (see :func:`parse_intervention`); a role frozen or stood in for twice is refused.

    Raises:
        ConfigError: On a spec that does not parse, or two interventions on one role's turn.
    """
    surgeries = [parse_intervention(spec) for spec in specs]
    turns = [s.target for s in surgeries if s.kind in ("freeze", "rule")]
    twice = sorted({name for name in turns if turns.count(name) > 1})
    if twice:
        raise ConfigError(f"--intervene: {twice[0]!r} is frozen or stood in for twice; give it one of them")
    return surgeries


def check_roles(surgeries: Sequence[Surgery], roles: Iterable[str]) -> None:
    """Refuse an intervention that names no role of the run.

    Raises:
        UnknownRoleError: Naming the role and the run's roles.
    """
    known = set(roles)
    for surgery in surgeries:
        for name in surgery.roles:
            if name not in known:
                shown = sorted(known)
                listed = ", ".join(shown[:12]) + (f", … ({len(shown)} in all)" if len(shown) > 12 else "")
                raise UnknownRoleError(
                    f"--intervene {surgery.spec!r}: no role named {name!r} in this run; roles: {listed}"
                )


class StandIn(Action):
    """A scripted stand-in for one of a role's actions: it answers ``said``, under the action's id, without a model."""

    said: str = ""
    """What it answers, every time."""
    stands_for: str = ""
    """The id of the action it replaces (its messages' ``cause_by``, so roles that watch it hear it)."""
    send_to: list[str] = []  # noqa: RUF012 - a declared field (an action's dump), never mutated
    """Where its role publishes."""
    _declared: ClassVar[list[str]]

    async def run(self, history: Sequence[Message]) -> ActionResult:
        """``said``, as the replaced action's message."""
        sender, to = self.role_name, frozenset(self.send_to)
        return Message.trusted(self.said, None, ChatRole.ASSISTANT, self.stands_for, sender, to)


class Muted(Intervention):
    """Drops what ``sender`` sends to ``recipient`` (every other delivery goes through)."""

    def __init__(self, sender: str, recipient: str) -> None:
        """Mute the channel from ``sender`` to ``recipient``."""
        self.sender, self.recipient = sender, recipient

    def on_deliver(self, message: Message, *, recipient: Member) -> Message | type[DropMessage]:
        """Drop the message if it goes from the muted sender to the muted recipient."""
        if message.sent_from == self.sender and recipient.name == self.recipient:
            return DropMessage
        return message


def operate(env: Environment, surgeries: Sequence[Surgery]) -> None:
    """Make the changes a branch's roles and channels carry (freeze, mute, persona, rule) on a built team.

    A model change is the role's model (given before this, with the others'); an edit is made once, at
    the fork (:func:`edit_history`). Call before the run is restored or started: restoring leaves these alone.

    Raises:
        UnknownRoleError: If an intervention names no role of the run.
    """
    check_roles(surgeries, env.roles)
    for surgery in surgeries:
        if surgery.kind == "freeze":
            env.roles[surgery.target].frozen = True
        elif surgery.kind == "mute":
            sender, recipient = surgery.roles
            env.interventions.append(Muted(sender, recipient))
        elif surgery.kind == "persona":
            role = env.roles[surgery.target]
            if role.llm is not None:  # a role that asks no model has no persona to change
                role.set_llm(Persona(role.llm, surgery.value))
        elif surgery.kind == "rule":
            _stand_in(env.roles[surgery.target], surgery.value)


class Persona:
    """A role's model, told who the role is: "You are PERSONA." leads the system prompt of each request."""

    def __init__(self, inner: LLM, persona: str) -> None:
        """Wrap ``inner`` (the role's model)."""
        self.inner, self.persona = inner, persona
        self.model = inner.model

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Ask ``inner`` with the persona first in the system prompt."""
        told = f"You are {self.persona}."
        messages = list(request.messages)
        if messages and messages[0].get("role") == "system":
            messages[0] = {**messages[0], "content": f"{told}\n\n{messages[0].get('content') or ''}"}
        else:
            messages.insert(0, {"role": "system", "content": told})
        return await self.inner.complete(request.model_copy(update={"messages": messages}))


def _stand_in(role: Role, said: str) -> None:
    """Replace each of ``role``'s actions by a stand-in that answers ``said`` in its place."""
    to = sorted(role.send_to)
    role.set_actions([StandIn(name=a.name, said=said, stands_for=a.cause_by, send_to=to) for a in role.actions])


def edit_history(env: Environment, surgeries: Sequence[Surgery]) -> None:
    """Make the ``edit`` interventions on a restored environment: each message says its new text everywhere.

    The environment's saved state holds each message once (roles refer to it by id), so the edited
    state, loaded back, gives every memory and buffer that held the message the new text.

    Raises:
        ConfigError: If an edit names a message the history before the fork point does not hold.
    """
    edits = {s.target: s.value for s in surgeries if s.kind == "edit"}
    if not edits:
        return
    state = env.state_dict()
    found: set[str] = set()
    for i, message in enumerate(state.history):
        if message.id in edits:
            state.history[i] = message.model_copy(update={"content": edits[message.id]})
            found.add(message.id)
    missing = sorted(set(edits) - found)
    if missing:
        raise ConfigError(
            f"--intervene edit:{missing[0]}=…: no message with that id before the fork point; "
            "`metaroles show RUN` lists the messages with their ids"
        )
    env.load_state(state)


def model_swaps(surgeries: Sequence[Surgery]) -> dict[str, str]:
    """The ``model:`` interventions as the options that give a role its own model (``role.NAME.llm``)."""
    return {f"role.{s.target}.llm": s.value for s in surgeries if s.kind == "model"}


def recorded(surgeries: Sequence[Surgery]) -> list[str]:
    """The specs a manifest keeps."""
    return [s.spec for s in surgeries]


def from_record(specs: Any) -> list[Surgery]:
    """The interventions a manifest lists (none if it lists none).

    Raises:
        ConfigError: If the list is not one of specs (a damaged or hand-made manifest).
    """
    if specs is None:
        return []
    if not isinstance(specs, list) or not all(isinstance(s, str) for s in specs):
        raise ConfigError(f"the manifest's interventions {specs!r} are not a list of specs like 'freeze:NAME'")
    return parse_interventions(specs)
