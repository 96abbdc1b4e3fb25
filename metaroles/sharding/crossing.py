"""A round's outbox as it crosses from a shard to the driver: columns of fields, each set of recipients once.

The driver needs every message a shard's roles publish (for the history and the log). Pickled as
objects, each message carries its own set of recipients — a society agent writes to the same
neighbours round after round — and pickling and unpickling those sets was most of what crossing
cost. An :class:`OutboxWriter` (on the shard) turns an outbox into columns and numbers each set of
recipients the first time it sends it; the driver's :class:`OutboxReader` for that shard keeps the
sets by number and rebuilds the messages (values that were valid when they left). A message with
more than the routing fields (a structured answer, tool calls, metadata), or of a subclass of
``Message``, travels whole. Batches are read in the order they were written (checked).
"""

from __future__ import annotations

from typing import Any

from metaroles.core.exceptions import RunError
from metaroles.messages.fields import ROLE_VALUES
from metaroles.messages.message import Message, plain_messages, unpickled
from metaroles.record.replayable import plain
from metaroles.sharding.shardset import OutboxEntry

Outbox = list[OutboxEntry]
"""``(rank, message, flag, said)`` in delivery order (``sharding.shardset.OutboxEntry``)."""

_NO_EXTRAS = (None, None, None, None, None)
"""What a message with only the routing fields has past them (metadata, tool calls, ...: ``Message.__reduce__``)."""


class OutboxWriter:
    """A shard's side: its outboxes as columns, each set of recipients numbered and sent once."""

    def __init__(self) -> None:
        """Start with no set sent."""
        self._sets: dict[frozenset[str], int] = {}
        self._batches = 0

    def columns(self, outbox: Outbox) -> tuple[Any, ...]:
        """``outbox`` as columns (what :meth:`OutboxReader.outbox` rebuilds it from)."""
        sets, new = self._sets, []
        ranks: list[int] = []
        flags: list[int] = []
        tos: list[int] = []
        ids, contents, roles, causes, senders = [], [], [], [], []
        whole: dict[int, Message] = {}
        said: list[int] = []
        told: dict[int, int] = {}  # what each sender said once (its messages share it), by id
        distinct: list[Any] = []
        for rank, message, flag, what in outbox:
            ranks.append(rank)
            flags.append(flag)
            number = told.get(id(what))
            if number is None:
                number = told[id(what)] = len(distinct)
                distinct.append(what)
            said.append(number)
            if type(message) is not Message or not plain(message):
                whole[len(tos)] = message
                tos.append(-1)
                continue
            number = sets.get(message.send_to)
            if number is None:
                number = sets[message.send_to] = len(sets)
                new.append(message.send_to)
            tos.append(number)
            ids.append(message.id)
            contents.append(message.content)
            roles.append(ROLE_VALUES[message.role])
            causes.append(message.cause_by)
            senders.append(message.sent_from)
        self._batches += 1
        columns = (self._batches, new, ranks, flags, tos, ids, contents, roles, causes, senders, whole)
        return (*columns, said, distinct)


class OutboxReader:
    """The driver's side for one shard: the sets of recipients it sent, by number; its outboxes rebuilt.

    A sender's name and an action's id arrive as new strings in every batch: the reader keeps one of
    each, so the messages it rebuilds share them (a society's agent speaks every round).
    """

    def __init__(self) -> None:
        """Know no set yet."""
        self._sets: list[frozenset[str]] = []
        self._names: dict[str, str] = {}
        self._batches = 0

    def outbox(self, columns: tuple[Any, ...]) -> Outbox:
        """The outbox :meth:`OutboxWriter.columns` wrote.

        Raises:
            RunError: If a batch is read out of order (its sets of recipients would be misnumbered).
        """
        batch, new, ranks, flags, tos, ids, contents, roles, causes, senders, whole, said, distinct = columns
        if batch != self._batches + 1:
            raise RunError(f"outbox {batch} of a shard arrived after {self._batches}: the batches are read in order")
        self._batches = batch
        sets, names = self._sets, self._names
        sets.extend(frozenset(set(addresses)) for addresses in new)  # unpickled ones are built item by item: larger
        causes, senders = list(map(names.setdefault, causes, causes)), list(map(names.setdefault, senders, senders))
        if not whole:  # routing fields alone (the usual case): built a column at a time
            recipients = list(map(sets.__getitem__, tos))
            messages = plain_messages(Message, (ids, contents, roles, causes, senders, recipients))
            return list(zip(ranks, messages, flags, map(distinct.__getitem__, said), strict=True))
        fields = iter(zip(ids, contents, roles, causes, senders, strict=True))
        out: Outbox = []
        for position, (rank, flag, to, number) in enumerate(zip(ranks, flags, tos, said, strict=True)):
            if to < 0:
                out.append((rank, whole[position], flag, distinct[number]))
                continue
            id_, content, role, cause_by, sent_from = next(fields)
            message = unpickled(Message, id_, content, None, role, cause_by, sent_from, sets[to], *_NO_EXTRAS)
            out.append((rank, message, flag, distinct[number]))
        return out
