"""Ids: a pure function of the run and the logical position inside it; unique per process outside a run.

Inside a run, every id (of a message, a tool call, anything that may reach a prompt, a file or a
log) comes from the :class:`IdScope` of whoever is producing it: a role's turn, or the run itself
between rounds. An id is ``key + round + slot + sequence`` in hex, where

- ``key`` derives from the run's seed (:func:`run_key`), so two runs with one seed share ids and
  runs with different seeds do not;
- ``round`` is the round being run (0 before the first);
- ``slot`` is 0 for the run itself and ``1 + index`` for the ``index``-th registered role;
- ``sequence`` counts the ids that producer made in that round.

Nothing in an id depends on the process, the clock, ``PYTHONHASHSEED`` or the order in which
concurrent roles finish, so reruns, resumes and forks give byte-identical run directories.
Code running outside any scope (a script building messages by hand) gets process-unique ids:
64 random bits per process, then a counter.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

KEY_DIGITS = 16
"""Hex digits of a run key; an id has 32 hex digits (more past 2**20 ids per producer and round)."""


def run_key(seed: int | str | None) -> str:
    """The key of a run with ``seed``: derived from the seed, or random when there is none."""
    if seed is None:
        return os.urandom(KEY_DIGITS // 2).hex()
    return hashlib.blake2b(f"metaroles-run:{seed}".encode(), digest_size=KEY_DIGITS // 2).hexdigest()


_FIELD = 1 << 20
"""Slots and sequences fit 20 bits (5 hex digits), rounds 24 bits (6): one 64-bit number per id."""


_SHORT = 256
_SEQUENCE = tuple(f"{seq:05x}" for seq in range(_SHORT))
"""The first sequences' hex digits, formatted once: most producers make a few ids per round."""


class Clock:
    """The round a run is in, shared by its roles' scopes (set once per round, read when an id is made)."""

    __slots__ = ("digits", "round")

    def __init__(self) -> None:
        """Start before the first round."""
        self.round = 0
        self.digits = _round_digits(0)

    def set(self, round_no: int) -> None:
        """Enter round ``round_no``; its hex digits are formatted here, once for every scope."""
        self.round = round_no
        self.digits = _round_digits(round_no)


def _round_digits(round_no: int) -> str:
    return f"{round_no:06x}" if round_no < _FIELD << 4 else ""


class IdScope:
    """The ids one producer (a role, or the run between rounds) makes in a run, round by round.

    Args:
        key: The run's key (:func:`run_key`).
        slot: 0 for the run itself, ``1 + index`` for a role.
        clock: Where the current round is read when an id is made (else :meth:`at` places the scope).
    """

    __slots__ = ("clock", "key", "prefix", "round", "seq", "slot", "slot_digits")

    def __init__(self, key: str, slot: int, clock: Clock | None = None) -> None:
        """Create a scope; a clock or :meth:`at` places it in a round."""
        self.key = key
        self.slot = slot
        self.clock = clock
        self.round = -1
        self.seq = 0
        self.prefix = ""
        self.slot_digits = f"{slot:05x}" if slot < _FIELD else ""

    def at(self, round_no: int) -> IdScope:
        """Place the scope in round ``round_no`` (the sequence restarts when the round changes)."""
        if round_no != self.round:
            self.round = round_no
            self.seq = 0
            self._place(_round_digits(round_no))
        return self

    def _place(self, round_digits: str) -> None:
        fits = round_digits and self.slot_digits
        self.prefix = self.key + round_digits + self.slot_digits if fits else ""

    def next(self) -> str:
        """The next id of this producer in this round: ``key``, then round, slot and sequence in hex."""
        clock = self.clock
        if clock is not None and clock.round != self.round:  # a new round: _place, inlined (once per role and round)
            self.round, self.seq = clock.round, 0
            digits = clock.digits
            self.prefix = self.key + digits + self.slot_digits if digits and self.slot_digits else ""
        seq = self.seq
        self.seq = seq + 1
        if seq < _SHORT and self.prefix:
            return self.prefix + _SEQUENCE[seq]
        if seq < _FIELD and self.prefix:
            return f"{self.prefix}{seq:05x}"
        return f"{self.key}{self.round:06x}{self.slot:05x}{seq:05x}"  # past the fields: longer, still unique


SCOPE: ContextVar[IdScope | None] = ContextVar("metaroles_id_scope", default=None)
"""The scope ids come from in this context (``None`` outside a run); the bus sets it per turn."""


@contextmanager
def id_scope(scope: IdScope) -> Iterator[IdScope]:
    """Make ids inside the block (in this task and the tasks it starts) come from ``scope``."""
    token = SCOPE.set(scope)
    try:
        yield scope
    finally:
        SCOPE.reset(token)


class _ProcessIds:
    """Ids outside any run: 64 random bits per process, then a counter; a forked child draws anew."""

    __slots__ = ("counter", "prefix")

    def __init__(self) -> None:
        self.prefix = ""
        self.counter = itertools.count()

    def reseed(self) -> None:
        if not self.prefix and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self.reseed)
        self.prefix = os.urandom(8).hex()
        self.counter = itertools.count()

    def next(self) -> str:
        if not self.prefix:
            self.reseed()
        return f"{self.prefix}{next(self.counter):016x}"


_PROCESS = _ProcessIds()


def new_id() -> str:
    """A fresh id: from the current :class:`IdScope` inside a run, else unique in this process.

    Either way it is 32 hex digits, and ids of one producer sort in creation order.
    """
    scope = SCOPE.get()
    if scope is not None:
        return scope.next()
    return _PROCESS.next()
