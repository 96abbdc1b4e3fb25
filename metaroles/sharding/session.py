"""Opening a sharded run around a Team's rounds, and closing it whatever happens.

The roles go to their shards when the block starts — built there when a cast made them and nothing
changed them yet (``sharding.cast``), shipped otherwise — and come back (or stay) when it ends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import anyio

from metaroles.bus.environment import Environment
from metaroles.bus.role import Role
from metaroles.sharding.backends import ShardBy, placement
from metaroles.sharding.cast import Cast, seats
from metaroles.sharding.driver import ShardedRun
from metaroles.sharding.shardset import ShardSet

__all__ = ["sharded"]


@asynccontextmanager
async def sharded(
    env: Environment,
    shards: ShardSet,
    shard_by: ShardBy | None = None,
    casts: Sequence[tuple[int, Cast]] = (),
    *,
    behind: bool = False,
    keep: bool = False,
) -> AsyncIterator[ShardedRun]:
    """Run ``env``'s roles on ``shards`` inside the block; they come back into ``env`` when it ends.

    Roles of ``casts`` (``(first place, cast)``) not yet changed are built by their shards, not shipped.
    If the block raises, the roles stay where they were (a shard may be gone): the run's last
    checkpoint is what a resume starts from. ``behind``: see :attr:`~metaroles.sharding.merging.Backlog.behind` (a Team
    takes each round's history in before it reads it). ``keep``: this process keeps the roles shards
    build from seats, which come back as their state (when the roles are to come back).
    """
    kept: dict[int, Role] = {}
    seat = seats(casts, kept if keep else None) if casts and env.round == 0 else None
    run = ShardedRun(env, shards, placement(env.members, shards.count, shard_by), seat)
    run.backlog.behind, run.kept = behind, kept
    try:
        await run.open()  # if it fails, the roles are still here (they move last): close only stops the shards
        yield run
    except BaseException:
        run.broken = True
        with anyio.CancelScope(shield=True):
            await run.close()
        raise
    await run.close()
