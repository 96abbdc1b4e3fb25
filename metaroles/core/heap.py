"""Long runs and CPython's cyclic garbage collector: what survives a round leaves the collector's full passes.

A run keeps nearly everything it makes — the history, the memories — and each full collection
walks all of it again, so without care a round late in a long run pays for every message made
before it (1,000 roles × 1,000 rounds: a quarter more per round at the end, and 20 % more in all).
Within an environment's session (``Environment.run``, ``Team.run``, the CLI), each round ends by
collecting the young generations (garbage made in the round goes) and freezing what is left
(``gc.freeze``): later collections skip it. Leaving the session unfreezes it all, so cyclic garbage
made in one round and dropped in a later one is collected then, never lost.

A process whose heap someone else already froze (a pre-fork server, an outer session), or whose
collector is off, is left as it is.
"""

from __future__ import annotations

import gc

__all__ = ["SettledHeap"]


class SettledHeap:
    """Settles the heap after each round of one session; :meth:`release` when the session ends."""

    __slots__ = ("owned",)

    def __init__(self) -> None:
        """Own the settling if nobody has frozen anything yet and the collector is on."""
        self.owned = gc.isenabled() and gc.get_freeze_count() == 0
        """Whether this session settles (and unfreezes at its end)."""

    def settle(self) -> None:
        """Collect the young generations, then take what survived out of later collections."""
        if self.owned and gc.isenabled():  # the collector paused for a bulk pass: leave the heap as it is
            gc.collect(1)
            gc.freeze()

    def release(self) -> None:
        """Give everything frozen back to the collector (its next full pass finds the session's garbage)."""
        if self.owned:
            self.owned = False
            gc.unfreeze()
