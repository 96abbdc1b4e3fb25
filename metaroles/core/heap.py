"""Long runs and CPython's cyclic garbage collector: what survives a round leaves the collector's full passes.

A run keeps nearly everything it makes — the history, the memories — and each full collection
walks all of it again, so without care a round late in a long run pays for every message made
before it (1,000 roles × 1,000 rounds: a quarter more per round at the end, and 20 % more in all).
Within an environment's session (``Environment.run``, ``Team.run``, the CLI), each round ends by
collecting the young generations (garbage made in the round goes) and freezing what is left
(``gc.freeze``): later collections skip it. Leaving the session unfreezes it all, so cyclic garbage
made in one round and dropped in a later one is collected then, never lost.

Within a session the collector's own full passes are rare: everything older than the round is
frozen, so a full pass would only walk the round's survivors, which its end freezes anyway — yet by
CPython's default it ran about once a round in a large society (a tenth of a second per 50,000
agents). They still run once per ``FULL_PASS_EVERY`` young collections of the second generation
(some 700,000 objects kept), so one very long round cannot hoard cyclic garbage; the session gives
the thresholds back when it ends.

A process whose heap someone else already froze (a pre-fork server, an outer session), or whose
collector is off, is left as it is.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["FULL_PASS_EVERY", "SettledHeap", "paused_gc", "rare_full_passes"]

FULL_PASS_EVERY = 100
"""Within a session, collections of the second generation between two automatic full passes (CPython: 10)."""


def rare_full_passes() -> tuple[int, int, int]:
    """Let the collector's automatic full passes come once per :data:`FULL_PASS_EVERY`; return the thresholds before."""
    before = gc.get_threshold()
    young, middle, full = before
    gc.set_threshold(young, middle, max(full, FULL_PASS_EVERY))
    return before


class SettledHeap:
    """Settles the heap after each round of one session; :meth:`release` when the session ends."""

    __slots__ = ("owned", "thresholds")

    def __init__(self) -> None:
        """Own the settling if nobody has frozen anything yet and the collector is on; make full passes rare."""
        self.owned = gc.isenabled() and gc.get_freeze_count() == 0
        """Whether this session settles (and unfreezes at its end)."""
        self.thresholds = rare_full_passes() if self.owned else gc.get_threshold()
        """The collector's thresholds before the session (given back by :meth:`release`)."""

    def settle(self, *, full: bool = False) -> None:
        """Collect the young generations (``full``: all of them), then take what survived out of later collections.

        ``full`` after a bulk change that left old garbage (roles shipped to shards, replaced by
        stand-ins): the pass walks all that is not frozen yet.
        """
        if self.owned and gc.isenabled():  # the collector paused for a bulk pass: leave the heap as it is
            gc.collect(2 if full else 1)
            gc.freeze()

    def keep(self) -> None:
        """Take everything made so far out of later collections, without a pass (a bulk load that lives on).

        Also while the collector is paused for the load itself: before it resumes, and its first young
        pass walks every object the load made.
        """
        if self.owned:
            gc.freeze()

    def release(self) -> None:
        """Give everything frozen back to the collector (its next full pass finds the session's garbage)."""
        if self.owned:
            self.owned = False
            gc.set_threshold(*self.thresholds)
            gc.unfreeze()


@contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic garbage collection inside the block (unpickling a round: many objects, no cycles)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
