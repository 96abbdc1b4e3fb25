"""Per-provider limits: at most N calls in flight, and an optional rate limit.

One :class:`LimitedLLM` wraps one provider and is shared by every role that uses it, so the
limits hold across the whole run however many roles ask at once.

With ``adaptive=True`` (what ``--llm openai`` runs) the number in flight is learnt from the server,
up to ``max_in_flight`` (:class:`AdaptiveLimit`): it starts at 4 and doubles with every window of
answers in which the server's pace (calls held over seconds per answered token) grew; when it
stops growing (a batching engine's slots are full) it doubles once more, so that a call waits at
the server for each one it runs, and holds. After a refusal it grows back by one while the pace
still grows. A 429 or 503 halves it and holds every new call until the server's ``Retry-After`` has
passed: the model tells its limiter through its ``on_backoff`` hook.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from metaroles.core.exceptions import ConfigError, EndpointBusy, EndpointUnreachable, InvalidValueError
from metaroles.llm.protocol import LLM, LLMRequest, LLMResponse


def next_slot(now: float, earliest: float, interval: float) -> tuple[float, float]:
    """Pace calls ``interval`` seconds apart: return (seconds to wait, the next call's earliest start)."""
    start = max(now, earliest)
    return start - now, start + interval


@dataclass
class AdaptiveLimit:
    """Calls in flight a server takes well, learnt from how fast its answers come (see the module).

    A window of answers (as many as are allowed in flight) gives the server's pace: the calls it
    held at once over the seconds it took per answered token. A batching engine's pace grows with
    what it is given until its slots are full; past that, more calls only queue and wait longer.
    So the limit grows (doubling at first, then by one) while each window's pace beats the best
    by 5 %, and holds when it does not. When the doubling stops, the limit doubles once more: a
    call waits at the server for each one it runs, so a slot that frees takes the next at once
    instead of idling for the client's round trip (measured: holding at the slots' count gave 0.89
    of the engine's throughput, twice that 1.0). A refusal for load (429/503) halves it.

    Args:
        ceiling: The most ever allowed.
        limit: Where it starts.
    """

    ceiling: int
    limit: float = 4.0
    gain: float = 1.05
    """A window must beat the best pace by this factor for the limit to grow."""
    growing: bool = True
    """Slow start: double per window until the pace stops growing."""
    best: float = 0.0
    """The best pace seen: calls in flight per second per answered token."""
    paused_until: float = 0.0
    """No call starts before this (anyio clock): the server asked to wait."""
    backoffs: int = 0
    window: list[tuple[int, float]] = field(default_factory=list)
    """The window's answers: calls in flight when each started, its seconds per answered token."""

    def __post_init__(self) -> None:
        """Start within the ceiling."""
        self.limit = float(min(self.limit, self.ceiling))

    @property
    def allowed(self) -> int:
        """Calls that may be in flight now."""
        return max(1, min(self.ceiling, int(self.limit)))

    def observe(self, seconds: float, tokens: int, in_flight: int) -> None:
        """An answer of ``tokens`` came ``seconds`` after it was sent beside ``in_flight`` calls (itself included)."""
        self.window.append((in_flight, seconds / (1 + tokens)))
        if len(self.window) < self.allowed:
            return
        held = sum(n for n, _ in self.window) / len(self.window)
        per_token = sum(t for _, t in self.window) / len(self.window)
        pace = held / per_token if per_token > 0 else math.inf
        self.window.clear()
        if pace > self.best * self.gain:
            self.best = pace
            self.limit = min(float(self.ceiling), self.limit * 2 if self.growing else self.limit + 1)
        elif self.growing:  # the engine's slots are full: keep a call queued for each it runs (no idle slot)
            self.growing = False
            self.limit = min(float(self.ceiling), self.limit * 2)

    def backoff(self, seconds: float, now: float) -> None:
        """The server refused a call (429/503) and asked to wait ``seconds``: halve the limit, hold new calls."""
        self.backoffs += 1
        self.growing, self.best = False, 0.0  # its pace is learnt again, and the limit grows back by ones
        self.limit = max(1.0, self.limit / 2)
        self.paused_until = max(self.paused_until, now + seconds)
        self.window.clear()


MINUTE = 60.0


def tokens_asked(request: LLMRequest, answer_default: int = 256) -> int:
    """What a call will count against a tokens-per-minute limit, before it is made.

    The prompt at about four characters a token, and the answer's ``max_tokens`` (else
    ``answer_default``): providers charge that much when they admit a call.
    """
    characters = sum(len(str(m.get("content") or "")) for m in request.messages)
    return characters // 4 + 1 + (request.max_tokens or answer_default)


@dataclass
class TokenPace:
    """Tokens per minute, spent in a sliding minute: a call starts only when the last minute leaves room for it.

    A call's tokens are counted when it starts (:meth:`spend`, what it asked for) and set right when
    it is answered (:meth:`settle`, what it used), so an answer shorter than its ``max_tokens``
    gives the rest back. A server that says its own limit and what remains of it (``x-ratelimit-*``
    headers: :meth:`told`) is believed where it is stricter; a refusal for load holds every call
    until the server's ``Retry-After`` has passed (:meth:`pause`).
    """

    per_minute: float
    window: float = MINUTE
    """Seconds the limit is counted over (providers count a minute; some, ten seconds)."""
    spent: list[list[float]] = field(default_factory=list)
    """The last minute's calls: [when it started (answered, once settled), its tokens, 1 while unanswered]."""
    paused_until: float = 0.0

    def room(self, now: float) -> float:
        """Tokens the last minute leaves for a call starting at ``now``.

        A call still unanswered stays counted however long ago it started: the server admitted it
        some time after, unknown until its answer (a loaded machine's requests arrive late).
        """
        while self.spent and not self.spent[0][2] and self.spent[0][0] + self.window <= now:
            self.spent.pop(0)  # as wait() computes it: no rounding between
        return self.per_minute - sum(tokens for when, tokens, open_ in self.spent if open_ or when + self.window > now)

    def wait(self, now: float, tokens: float) -> float:
        """Seconds until a call of ``tokens`` may start (0: now); one above the limit waits for an empty minute.

        When only calls still unanswered would make the room, it looks again after a twentieth of the window.
        """
        if now < self.paused_until:
            return self.paused_until - now
        need, room = min(tokens, self.per_minute), self.room(now)
        if room >= need:
            return 0.0
        for started, spent, open_ in self.spent:  # the oldest leave the minute first
            if open_ or started + self.window <= now:
                continue  # unanswered: not leaving yet; or already left (room counts it out)
            room += spent
            if room >= need:
                return _until(now, started + self.window)
        return self.window / 20 if any(open_ for _, _, open_ in self.spent) else self.window

    def spend(self, now: float, tokens: float, *, answered: bool = False) -> list[float]:
        """Count a call of ``tokens`` starting at ``now``; the entry :meth:`settle` corrects (``answered``: no call)."""
        entry = [now, float(tokens), 0.0 if answered else 1.0]
        self.spent.append(entry)
        return entry

    def settle(self, entry: list[float], used: float, now: float) -> None:
        """The call of ``entry`` was answered at ``now`` having used ``used`` tokens.

        Its tokens are counted from ``now``: the server admitted it somewhere between its start and
        its answer, and counts it from then. Never fewer than it asked for: providers charge a
        call's ``max_tokens`` when they admit it.
        """
        entry[0], entry[1], entry[2] = now, max(entry[1], float(used)), 0.0
        self.spent.sort(key=lambda spent: spent[0])  # the minute is walked oldest first

    def pause(self, now: float, seconds: float) -> None:
        """The server refused for load: nothing starts for ``seconds``."""
        self.paused_until = max(self.paused_until, now + seconds)

    def told(self, now: float, limit: float | None, remaining: float | None) -> None:
        """What the server says of its limit and of what remains of it this minute (``x-ratelimit-*``)."""
        if limit is not None and 0 < limit < self.per_minute:
            self.per_minute = limit
        if remaining is not None:
            unseen = self.room(now) - remaining  # the server counts more than we did (another client, its tokenizer)
            if unseen > 0:
                self.spend(now, unseen, answered=True)


class LimitedLLM:
    """Bound a model's concurrent calls and, optionally, its request rate.

    Args:
        inner: The model.
        max_in_flight: Calls in flight at once.
        requests_per_second: Calls started per second, or ``None`` for no rate limit.
        tokens_per_minute: Tokens (prompt and answer) per minute at most (:class:`TokenPace`; a
            server's ``x-ratelimit-*-tokens`` headers tighten it, or set it when not given), or ``None``.
        requests_per_minute: Calls per minute at most, over a sliding minute (a server's
            ``x-ratelimit-*-requests`` headers tighten it, or set it when not given), or ``None``.
        token_window: Seconds those limits are counted over (a minute, unless the provider says otherwise).
        adaptive: Learn the calls in flight from the server's answers, up to ``max_in_flight``.
        sleep: How to wait (``anyio.sleep``).
    """

    def __init__(
        self,
        inner: LLM,
        *,
        max_in_flight: int = 8,
        requests_per_second: float | None = None,
        tokens_per_minute: float | None = None,
        requests_per_minute: float | None = None,
        token_window: float = MINUTE,
        adaptive: bool = False,
        sleep: Callable[[float], Awaitable[object]] = anyio.sleep,
    ) -> None:
        """Wrap ``inner`` (an adaptive limit is told of the inner model's back-offs through its ``on_backoff``)."""
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise InvalidValueError(f"max_in_flight={max_in_flight!r} must be a positive integer")
        limits = ("requests_per_second", requests_per_second), ("tokens_per_minute", tokens_per_minute)
        for name, value in (*limits, ("requests_per_minute", requests_per_minute)):
            if value is not None and not value > 0:
                raise InvalidValueError(f"{name}={value!r} must be positive, or None")
        self.inner = inner
        self.model = inner.model
        self.max_in_flight = max_in_flight
        self.interval = 0.0 if requests_per_second is None else 1.0 / requests_per_second
        self.adaptive = AdaptiveLimit(max_in_flight) if adaptive else None
        self.tokens_per_minute = tokens_per_minute
        self.tokens = TokenPace(tokens_per_minute, token_window) if tokens_per_minute else None
        self.requests_per_minute = requests_per_minute
        self.window = token_window
        self.requests = self._pace(requests_per_minute)
        """Calls per minute (each counts 1), as set or as the server says."""
        self._sleep = sleep
        self._limiter: anyio.CapacityLimiter | None = None
        self._earliest = 0.0
        self._listen()

    def _listen(self) -> None:
        if hasattr(self.inner, "on_backoff"):
            self.inner.on_backoff = self.backoff
        if hasattr(self.inner, "on_limits"):  # a server's word sets a pace too
            self.inner.on_limits = self.told

    def __getstate__(self) -> dict[str, Any]:
        """Everything but the live limiter and what it learnt (a copy elsewhere, e.g. on a shard, learns its own)."""
        fresh = None if self.adaptive is None else AdaptiveLimit(self.max_in_flight)
        paces = {"tokens": self._pace(self.tokens_per_minute), "requests": self._pace(self.requests_per_minute)}
        return {**self.__dict__, "_limiter": None, "_earliest": 0.0, "adaptive": fresh, **paces}

    def _pace(self, per_minute: float | None) -> TokenPace | None:
        return None if per_minute is None else TokenPace(per_minute, self.window)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Take the state and listen to the inner model again."""
        self.__dict__.update(state)
        self._listen()

    def backoff(self, seconds: float) -> None:
        """The inner model was refused for load and waits ``seconds``: fewer in flight, and every new call waits too."""
        if self.adaptive is not None:
            self.adaptive.backoff(seconds, anyio.current_time())
            self._resize()
        for pace in (self.tokens, self.requests):
            if pace is not None:
                pace.pause(anyio.current_time(), seconds)

    def told(self, limit: float | None, remaining: float | None, kind: str = "tokens") -> None:
        """The server's word on its limit of ``kind`` (tokens or requests) per minute and what remains of it.

        Its ``x-ratelimit-*`` headers: a pace the user did not set starts from the limit the server gives.
        """
        pace = self.tokens if kind == "tokens" else self.requests
        if pace is None and limit:
            pace = TokenPace(limit, self.window)
            if kind == "tokens":
                self.tokens = pace
            else:
                self.requests = pace
        if pace is not None:
            pace.told(anyio.current_time(), limit, remaining)

    def _resize(self) -> None:
        if self._limiter is not None and self.adaptive is not None:
            self._limiter.total_tokens = self.adaptive.allowed

    def shard_share(self, shards: int) -> None:
        """Keep this copy to its share of the limits when ``shards`` copies run at once (one per shard).

        Calls in flight and the request rate across every shard then stay within the limits the
        user set (a shard gets at least one call in flight).
        """
        self.max_in_flight = max(1, self.max_in_flight // shards)
        self.interval *= shards
        self.tokens = None if self.tokens is None else TokenPace(self.tokens.per_minute / shards, self.tokens.window)
        self.requests = None if self.requests is None else TokenPace(self.requests.per_minute / shards, self.window)
        self._limiter = None
        self.adaptive = None if self.adaptive is None else AdaptiveLimit(self.max_in_flight)

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Wait for a free slot (and the rate, and a server's asked pause), then ask the inner model."""
        if self._limiter is None:
            allowed = self.max_in_flight if self.adaptive is None else self.adaptive.allowed
            self._limiter = anyio.CapacityLimiter(allowed)
        async with self._limiter:
            await self._wait_turn()
            called = await self._wait_room(self.requests, 1)
            counted = await self._wait_room(self.tokens, tokens_asked(request, self._answer_tokens()))
            used = 0
            try:
                if self.adaptive is None:
                    response = await self.inner.complete(request)
                else:
                    response = await self._observed(request)
                used = response.usage.total_tokens
            finally:  # a call that failed is settled too, as it asked: an unanswered one would hold the pace
                now = anyio.current_time()
                if counted is not None and self.tokens is not None:
                    self.tokens.settle(counted, used, now)
                if called is not None and self.requests is not None:
                    self.requests.settle(called, 1, now)
            return response

    async def _observed(self, request: LLMRequest) -> LLMResponse:
        assert self.adaptive is not None and self._limiter is not None
        start, backoffs, beside = anyio.current_time(), self.adaptive.backoffs, self._limiter.borrowed_tokens
        response = await self.inner.complete(request)
        if self.adaptive.backoffs == backoffs:  # a call that waited out a 429 says nothing of the pace
            self.adaptive.observe(anyio.current_time() - start, response.usage.completion_tokens, beside)
            self._resize()
        return response

    def _answer_tokens(self) -> int:
        return getattr(self.inner, "max_tokens", None) or 256

    async def _wait_room(self, pace: TokenPace | None, asked: int) -> list[float] | None:
        """Wait until ``pace``'s last minute leaves room for ``asked``; count it (``None``: no such limit)."""
        if pace is None:
            return None
        if pace is self.tokens and self.tokens_per_minute is not None and asked > self.tokens_per_minute:
            raise ConfigError(
                f"tokens_per_minute={self.tokens_per_minute:g} is less than one call: this one asks for {asked} "
                f"tokens (prompt and max_tokens), so none could ever start; give at least {asked}"
            )
        while (wait := pace.wait(anyio.current_time(), asked)) > 0:
            await self._sleep(wait)
        return pace.spend(anyio.current_time(), asked)

    async def _wait_turn(self) -> None:
        now = anyio.current_time()
        wait = 0.0 if self.adaptive is None else self.adaptive.paused_until - now
        if self.interval:
            pace, self._earliest = next_slot(now + max(wait, 0.0), self._earliest, self.interval)
            wait = max(wait, 0.0) + pace
        if wait > 0:
            await self._sleep(wait)

    def __repr__(self) -> str:
        """Show the limits and the inner model."""
        adaptive = "" if self.adaptive is None else f", adaptive (now {self.adaptive.allowed})"
        tokens = "" if self.tokens is None else f", tokens_per_minute={self.tokens.per_minute:g}"
        return (
            f"LimitedLLM({self.inner!r}, max_in_flight={self.max_in_flight}{adaptive}, "
            f"interval={self.interval:g}s{tokens})"
        )


REST_SECONDS = 2.0
"""How long a busy endpoint that named no ``Retry-After`` is left alone (doubling while it stays busy, to 60 s)."""


class BalancedLLM:
    """One model served at several endpoints: each call goes to the one that should answer it soonest.

    Each endpoint (a :class:`LimitedLLM` with its own limits) is scored by its calls in flight,
    plus the one to send, times how long its answers have been taking (a moving mean): a slow
    endpoint gets fewer calls, a fast one more, and one not yet heard from is tried first. An
    endpoint nothing answers at (:class:`~metaroles.core.exceptions.EndpointUnreachable`) is left
    out, with a warning naming it, and the call goes to another. One that refuses for load or does
    not answer in time (:class:`~metaroles.core.exceptions.EndpointBusy`: a 429, a 5xx, a timeout)
    rests for the ``Retry-After`` it gave (else :data:`REST_SECONDS`, doubling while it stays busy)
    and the call goes to another that answers; when every endpoint rests, the call waits for the
    first back. ``calls`` counts each one's answers.

    Args:
        endpoints: The model at each endpoint.
        names: Their URLs, as warnings and the manifest give them.
        attempts: Busy answers one call may meet before its error is raised (default: 4 per endpoint).

    Raises:
        InvalidValueError: Without endpoints.
    """

    def __init__(
        self, endpoints: Sequence[LLM], *, names: Sequence[str] | None = None, attempts: int | None = None
    ) -> None:
        if not endpoints:
            raise InvalidValueError("BalancedLLM needs at least one endpoint")
        self.endpoints = list(endpoints)
        self.names = list(names) if names is not None else [str(i) for i in range(len(self.endpoints))]
        self.model = self.endpoints[0].model
        self.attempts = attempts or 4 * len(self.endpoints)
        self.calls = [0] * len(self.endpoints)
        self._busy: list[list[float]] = [[] for _ in self.endpoints]
        """When each call in flight to each endpoint started."""
        self._seconds = [0.0] * len(self.endpoints)
        self._down: set[int] = set()
        self._resting = [0.0] * len(self.endpoints)
        """Until when each endpoint is left alone (it refused for load)."""
        self._strikes = [0] * len(self.endpoints)

    def _pick(self, now: float) -> int | None:
        """The live endpoint with the least (calls in flight + 1) × how long it takes, or has been taking, to answer.

        ``None`` when every endpoint still up is resting.
        """
        live = [i for i in range(len(self.endpoints)) if i not in self._down and self._resting[i] <= now]

        def wait(i: int) -> tuple[float, int, int]:
            waited = now - min(self._busy[i]) if self._busy[i] else 0.0  # an endpoint yet to answer is no faster
            return (len(self._busy[i]) + 1) * max(self._seconds[i], waited), len(self._busy[i]), i

        return min(live, key=wait) if live else None

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Ask the endpoint that should answer soonest; one nothing answers at is left out, a busy one rests.

        Raises:
            EndpointUnreachable: When no endpoint is left.
            EndpointBusy: When the call met :attr:`attempts` busy answers.
        """
        busy = 0
        while True:
            start = anyio.current_time()
            chosen = self._pick(start)
            if chosen is None:  # every endpoint up rests: wait for the first back
                await anyio.sleep(
                    min(self._resting[i] for i in range(len(self.endpoints)) if i not in self._down) - start
                )
                continue
            self._busy[chosen].append(start)
            try:
                response = await self.endpoints[chosen].complete(request)
            except EndpointUnreachable as exc:
                self._leave_out(chosen, exc)
                continue
            except EndpointBusy as exc:
                busy += 1
                self._rest(chosen, exc)
                if busy >= self.attempts:
                    raise
                continue
            finally:
                self._busy[chosen].remove(start)
            took = anyio.current_time() - start
            self._seconds[chosen] = took if not self.calls[chosen] else 0.8 * self._seconds[chosen] + 0.2 * took
            self.calls[chosen] += 1
            self._strikes[chosen] = 0
            return response

    def _leave_out(self, chosen: int, exc: EndpointUnreachable) -> None:
        if chosen not in self._down:  # once, whatever else was in flight to it
            warnings.warn(f"endpoint {self.names[chosen]} does not answer; the others take its calls", stacklevel=3)
        self._down.add(chosen)
        if len(self._down) == len(self.endpoints):
            raise EndpointUnreachable(f"no endpoint of {self.model!r} answers; the last: {exc}") from exc

    def _rest(self, chosen: int, exc: EndpointBusy) -> None:
        self._strikes[chosen] += 1
        rest = exc.retry_after if exc.retry_after is not None else REST_SECONDS * 2 ** (self._strikes[chosen] - 1)
        self._resting[chosen] = max(self._resting[chosen], anyio.current_time() + min(rest, 60.0))

    def shard_share(self, shards: int) -> None:
        """Each endpoint keeps to its share of its limits (see :meth:`LimitedLLM.shard_share`)."""
        for endpoint in self.endpoints:
            if isinstance(endpoint, LimitedLLM):
                endpoint.shard_share(shards)

    def __repr__(self) -> str:
        """The endpoints."""
        return f"BalancedLLM({', '.join(self.names)})"


def _until(now: float, then: float) -> float:
    """Seconds from ``now`` to ``then``, so that ``now`` plus them is not short of ``then`` by a rounding."""
    wait = then - now
    while now + wait < then:
        wait = math.nextafter(wait, math.inf)
    return wait
