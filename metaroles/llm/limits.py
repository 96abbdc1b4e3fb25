"""Per-provider limits: at most N calls in flight, and an optional rate limit.

One :class:`LimitedLLM` wraps one provider and is shared by every role that uses it, so the
limits hold across the whole run however many roles ask at once.
"""

from __future__ import annotations

from typing import Any

import anyio

from metaroles.core.exceptions import InvalidValueError
from metaroles.llm.protocol import LLM, LLMRequest, LLMResponse


def next_slot(now: float, earliest: float, interval: float) -> tuple[float, float]:
    """Pace calls ``interval`` seconds apart: return (seconds to wait, the next call's earliest start)."""
    start = max(now, earliest)
    return start - now, start + interval


class LimitedLLM:
    """Bound a model's concurrent calls and, optionally, its request rate.

    Args:
        inner: The model.
        max_in_flight: Calls in flight at once.
        requests_per_second: Calls started per second, or ``None`` for no rate limit.
    """

    def __init__(self, inner: LLM, *, max_in_flight: int = 8, requests_per_second: float | None = None) -> None:
        """Wrap ``inner``."""
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise InvalidValueError(f"max_in_flight={max_in_flight!r} must be a positive integer")
        if requests_per_second is not None and requests_per_second <= 0:
            raise InvalidValueError(f"requests_per_second={requests_per_second!r} must be positive, or None")
        self.inner = inner
        self.model = inner.model
        self.max_in_flight = max_in_flight
        self.interval = 0.0 if requests_per_second is None else 1.0 / requests_per_second
        self._limiter: anyio.CapacityLimiter | None = None
        self._earliest = 0.0

    def __getstate__(self) -> dict[str, Any]:
        """Everything but the live limiter (a copy elsewhere, e.g. on a shard, makes its own)."""
        return {**self.__dict__, "_limiter": None, "_earliest": 0.0}

    def shard_share(self, shards: int) -> None:
        """Keep this copy to its share of the limits when ``shards`` copies run at once (one per shard).

        Calls in flight and the request rate across every shard then stay within the limits the
        user set (a shard gets at least one call in flight).
        """
        self.max_in_flight = max(1, self.max_in_flight // shards)
        self.interval *= shards
        self._limiter = None

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Wait for a free slot (and the rate), then ask the inner model."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.max_in_flight)
        async with self._limiter:
            if self.interval:
                wait, self._earliest = next_slot(anyio.current_time(), self._earliest, self.interval)
                if wait > 0:
                    await anyio.sleep(wait)
            return await self.inner.complete(request)

    def __repr__(self) -> str:
        """Show the limits and the inner model."""
        return f"LimitedLLM({self.inner!r}, max_in_flight={self.max_in_flight}, interval={self.interval:g}s)"
