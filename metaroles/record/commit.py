"""A round's commit as one object: its recorders in a declared order, then its checkpoint after their files.

A round is recorded in one order, whatever runs it: the history taken in whole (on shards, what is
still where it was published), then each :class:`Recorder` — the event log, the scenario's metrics, any
a user adds — each returning the files it wrote without waiting for the disk, then the checkpoint,
which makes those files durable before its own (the file that claims the round comes last), then what
reports the round done (progress). A runtime runs a :class:`RoundCommit` at once, or while its shards
run the next round (``Runtime.commit``); a new recorder is one class and one entry in ``Team.recorders``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from metaroles.record.eventlog import EventLog

__all__ = ["Called", "Logged", "Recorder", "RoundCommit"]


class Recorder(Protocol):
    """Records the round just taken in; the files it wrote that are not yet durable (the checkpoint syncs them)."""

    def round_done(self) -> Sequence[Path]:
        """Record the round (the history holds it whole); the files written without waiting for the disk."""
        ...


class Logged:
    """The event log as a recorder: the round's line, synced now unless a checkpoint will sync it."""

    def __init__(self, log: EventLog, *, sync: bool) -> None:
        """Append ``log``'s round lines; ``sync``: durable at once (the run keeps no checkpoints)."""
        self.log, self.sync = log, sync

    def round_done(self) -> Sequence[Path]:
        """The round's line; the log's file, to be synced by the checkpoint, unless it was synced now."""
        self.log.round_done(sync=self.sync)
        return [] if self.sync else [self.log.path]


class Called:
    """A function of the round as a recorder (a scenario's metrics: ``Team.on_record``); it writes what it says."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        """Call ``fn`` once per round."""
        self.fn = fn

    def round_done(self) -> Sequence[Path]:
        """Call it; nothing for the checkpoint to sync."""
        self.fn()
        return []


@dataclass
class RoundCommit:
    """One round's commit (see the module): run it once, after the round's turns and deliveries."""

    recorders: Sequence[Recorder] = ()
    checkpoint: Callable[[Sequence[Path]], object] | None = None
    """Writes the round's checkpoint once the files given are durable (or lets the writer take the round in)."""
    take_in: Callable[[], None] | None = None
    """Makes the history whole up to the round (its messages may still be where they were published)."""
    then: Sequence[Callable[[], None]] = field(default_factory=tuple)
    """What reports the round committed (progress), after its checkpoint."""
    _written: list[Path] | None = field(default=None, init=False, repr=False)

    def record(self) -> None:
        """Take the round in and record it, once (a runtime may do it while its shards write their checkpoint parts)."""
        if self._written is None:
            if self.take_in is not None:
                self.take_in()
            self._written = [path for recorder in self.recorders for path in recorder.round_done()]

    def __call__(self) -> None:
        """Take the round in and record it (unless done), checkpoint it, report it: in that order."""
        self.record()
        if self.checkpoint is not None:
            self.checkpoint(self._written or [])
        for report in self.then:
            report()
