"""The driver's stand-ins for roles that run on shards, and failures reported from there."""

from __future__ import annotations

from collections.abc import Container

from metaroles.bus.environment import Environment
from metaroles.bus.role import Role
from metaroles.core.exceptions import RunError
from metaroles.messages.message import Message
from metaroles.sharding.shardset import Entry


class _Forward:
    """A stand-in's buffer: what it receives goes to its shard's inbox (once per message and shard)."""

    __slots__ = ("inbox",)

    def __init__(self, inbox: list[Entry]) -> None:
        self.inbox = inbox

    def push(self, message: Message) -> bool:
        inbox = self.inbox
        if not inbox or inbox[-1] is not message:
            inbox.append(message)
        return False  # the shard marks its role ready, not the driver

    def empty(self) -> bool:
        return True


class _RemoteContext:
    __slots__ = ("memory", "msg_buffer", "watch")

    def __init__(self, inbox: list[Entry], watch: frozenset[str]) -> None:
        self.memory = None  # on the shard
        self.msg_buffer = _Forward(inbox)
        self.watch = watch


class RemoteRole:
    """The driver's stand-in for a role that runs on a shard: its name, addresses and place."""

    __slots__ = ("_spoke", "addresses", "name", "place", "profile", "rc", "shard")

    def __init__(self, role: Role, shard: int, inbox: list[Entry], spoke: Container[str]) -> None:
        """Stand in for ``role``, whose deliveries go to ``inbox``; ``spoke``: who published with news last round."""
        self._spoke = spoke
        self.name = role.name
        self.profile = role.profile
        self.addresses = role.addresses
        self.place = role.place
        """The role's place in its Environment (as :attr:`Role.place`)."""
        self.shard = shard
        self.rc = _RemoteContext(inbox, frozenset(role.rc.watch))

    @property
    def is_idle(self) -> bool:
        """Whether the role did not publish with news in the last round (what the driver can tell of a remote role)."""
        return self.name not in self._spoke

    def put_message(self, message: Message) -> None:
        """Deliver ``message`` to this role alone (an intervention decided it per recipient)."""
        self.rc.msg_buffer.inbox.append((message, self.name))

    def __repr__(self) -> str:
        """Say where the role runs."""
        return f"RemoteRole({self.name!r}, shard={self.shard})"


def check_home(env: Environment) -> None:
    """Refuse to run ``env`` while stand-ins hold the places of roles that stayed on (or were lost with) shards.

    Raises:
        RunError: Naming what to do: continue from the run's checkpoints with a new team.
    """
    away = [role.name for role in env.built_roles() if isinstance(role, RemoteRole)]
    if away:
        raise RunError(
            f"{len(away)} roles of this environment (e.g. {away[0]!r}) stayed on shards when its last run ended; "
            "continue from that run's checkpoints with a new team (Team.resume, or metaroles resume RUN_DIR)"
        )


class _RemoteFailure(Exception):
    """A turn that raised on a shard, as the driver reports it (same type name, text and repr)."""

    text = ""
    shown = ""

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return self.shown


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first exception a task group gathered (a group inside a group is opened)."""
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first


def _remote_failure(kind: str, text: str, shown: str) -> Exception:
    failure = type(kind, (_RemoteFailure,), {"text": text, "shown": shown})()
    return failure  # type: ignore[no-any-return]
