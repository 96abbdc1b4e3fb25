"""The driver's share of a sharded round's delivery: its own messages, its own roles, and the history.

A sharded round's messages are routed by the shards (``sharding.worker``); the driver routes its own
roles' messages (each shard gets its share with their rank), delivers to the roles pinned to it,
and takes every shard's outbox into the history in the one-process order (``sharding.driver``
decides when: right away, or while the shards run the next round).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from metaroles.bus.environment import Environment, Round
from metaroles.bus.record import Said
from metaroles.core.heap import paused_gc
from metaroles.messages.message import Message
from metaroles.sharding.shardset import Addresses, Entry
from metaroles.sharding.standins import RemoteRole
from metaroles.sharding.worker import DEAD, DRIVER, PINNED, targets

Flagged = tuple[int, Message, int, Said | None]
"""An outbox entry (``sharding.shardset.OutboxEntry``), or the driver's own (``said`` ``None``: its sender is here)."""

_MESSAGE, _FLAG, _SAID = itemgetter(1), itemgetter(2), itemgetter(3)


@dataclass(slots=True)
class Backlog:
    """The rounds whose outboxes the driver's history has not taken in yet, and when it takes them."""

    rounds: list[tuple[list[Flagged], list[Any]]] = field(default_factory=list)
    """Oldest first: the driver's own messages of the round (flagged), and the shards' results (``RoundDone``)."""
    late: bool = False
    """Whether the newest of them has ended: its messages go to its closed record."""
    behind: bool = False
    """Take a round in while the shards run the next one (else as it ends)."""
    lazy: bool = False
    """Nobody reads the history between rounds (no log, checkpoint, record or hook): take the rounds in when
    the run closes, or when one needs it (a dead letter, the driver's roles, a moved address), so a round
    costs the driver what the shards report, not what they publish."""


def to_pinned(env: Environment, message: Message) -> None:
    """Deliver ``message`` to its recipients among the driver's own roles (stand-ins are the shards' part)."""
    env.push(message, [role for role in env.route(message.send_to) if not isinstance(role, RemoteRole)])


def own_messages(
    pending: list[tuple[int, Message]], addresses: Addresses, count: int
) -> tuple[list[Flagged], list[list[tuple[int, Message]]]]:
    """The driver's own messages of the round (``pending``, ranked), flagged, and each shard's share with their rank.

    A shard merges its share with what it holds and what other shards sent it, in the driver's order.
    """
    ranked: list[list[tuple[int, Message]]] = [[] for _ in range(count)]
    own: list[Flagged] = []
    for rank, message in pending:
        shards = targets(message.send_to, addresses)
        flag = 0 if shards else DEAD
        for shard in shards:
            if shard == DRIVER:
                flag = PINNED
            else:
                ranked[shard].append((rank, message))
        own.append((rank, message, flag, None))
    return own, ranked


def take_in(env: Environment, merged: list[Flagged], *, late: bool = False) -> None:
    """Put a round's outbox entries (all sources) into the history in delivery order; dead letters; pinned roles.

    ``late``: the round has ended (taken in behind the next one): its messages go to its closed record.
    """
    with paused_gc():  # a round's worth of records, no cycles: collections would walk the whole history
        merged.sort(key=itemgetter(0))
        messages = list(map(_MESSAGE, merged))  # the round at once, as one process's delivery
        said = list(map(_SAID, merged))
        if late:
            env.drive.add_late(messages, said)
        else:
            env.add_to_history(messages, said=said)
        if not any(map(_FLAG, merged)):
            return
        for _, message, flag, _ in merged:
            if flag == DEAD:
                env.dead_letter(message)
            elif flag == PINNED:
                to_pinned(env, message)


def route_all(env: Environment, this: Round, inboxes: list[list[Entry]], addresses: Addresses) -> None:
    """Deliver the round ``this`` published as the bus does, routing to shards, not to each stand-in.

    A message goes once into the inbox of every shard that has a recipient (the shard's own
    index finds which of its roles); the driver's own roles get theirs here. The cost is per
    address, not per recipient.
    """
    for _, message in this.take_published():
        env.add_to_history([message], said=[this.said_of(message)])
        shards = targets(message.send_to, addresses)
        if not shards:
            env.dead_letter(message)
            continue
        for shard in shards:
            if shard == DRIVER:
                to_pinned(env, message)
            else:
                inboxes[shard].append(message)
