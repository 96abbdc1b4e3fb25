import time

import anyio
import anyio.lowlevel
import pytest
from anyio import wait_all_tasks_blocked
from hypothesis import example, given
from hypothesis import strategies as st

from metaroles import FunctionLLM, InvalidValueError, LLMRequest, TestLLM
from metaroles.llm.limits import LimitedLLM, TokenPace, next_slot
from metaroles.llm.openai_compat import OpenAICompatibleLLM
from metaroles.llm.settings import LLMSettings
from tests.limited_server import LimitedServer


def ask(n: int) -> LLMRequest:
    return LLMRequest(messages=[{"role": "user", "content": str(n)}])


async def test_no_more_than_max_in_flight_calls_at_once():
    in_flight, most, release = 0, 0, anyio.Event()

    async def slow(request: LLMRequest) -> str:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await release.wait()
        in_flight -= 1
        return "ok"

    llm = LimitedLLM(FunctionLLM(slow), max_in_flight=3)
    async with anyio.create_task_group() as tg:
        for n in range(10):
            tg.start_soon(llm.complete, ask(n))
        await wait_all_tasks_blocked()
        assert in_flight == 3
        release.set()
    assert most == 3


def test_rate_pacing_spaces_calls_evenly():
    wait, earliest = next_slot(now=10.0, earliest=0.0, interval=0.5)
    assert (wait, earliest) == (0.0, 10.5)
    wait, earliest = next_slot(now=10.1, earliest=earliest, interval=0.5)
    assert (wait, earliest) == (pytest.approx(0.4), 11.0)
    wait, earliest = next_slot(now=20.0, earliest=earliest, interval=0.5)
    assert (wait, earliest) == (0.0, 20.5), "an idle model does not bank calls"


def test_bad_limits_are_clear_errors():
    with pytest.raises(InvalidValueError, match="max_in_flight=0"):
        LimitedLLM(FunctionLLM(lambda r: ""), max_in_flight=0)
    with pytest.raises(InvalidValueError, match="requests_per_second=-1"):
        LimitedLLM(FunctionLLM(lambda r: ""), requests_per_second=-1)


def test_an_adaptive_limit_grows_while_the_servers_pace_grows_then_holds_and_backs_off():
    from metaroles.llm.limits import AdaptiveLimit

    def engine(in_flight: int) -> float:
        """Seconds per token of a server with 16 slots: the same up to 16 calls, then they queue."""
        return 1.0 if in_flight <= 16 else in_flight / 16

    limit = AdaptiveLimit(ceiling=100)

    def window() -> int:
        for _ in range(limit.allowed):
            limit.observe(10 * engine(limit.allowed), tokens=9, in_flight=limit.allowed)
        return limit.allowed

    steps = [limit.allowed, *(window() for _ in range(5))]
    assert steps == [4, 8, 16, 32, 64, 64], "doubled to past its slots, then once more (a call queued for each), held"
    assert not limit.growing
    limit.backoff(2.0, now=100.0)
    assert (limit.allowed, limit.paused_until, limit.backoffs) == (32, 102.0, 1)
    limit.backoff(1.0, now=100.5)
    limit.backoff(1.0, now=100.5)
    assert (limit.allowed, limit.paused_until) == (8, 102.0), "a shorter wait does not cut the pause short"
    assert [window() for _ in range(10)] == [9, 10, 11, 12, 13, 14, 15, 16, 17, 17], "back by ones to its slots"


@given(
    st.integers(1, 64),
    st.lists(st.one_of(st.tuples(st.floats(0.001, 100), st.integers(0, 500)), st.floats(0, 30)), max_size=300),
)
def test_an_adaptive_limit_stays_between_one_and_its_ceiling(ceiling, events):
    from metaroles.llm.limits import AdaptiveLimit

    limit = AdaptiveLimit(ceiling=ceiling)
    for event in events:
        if isinstance(event, tuple):
            limit.observe(*event, in_flight=limit.allowed)
        else:
            limit.backoff(event, now=0.0)
        assert 1 <= limit.allowed <= ceiling


async def test_refusals_for_load_lower_the_limit_hold_new_calls_and_lose_or_repeat_nothing():
    import threading

    from metaroles.llm.openai_compat import OpenAICompatibleLLM
    from tests.chat_server import ChatServer, Reply, completion, start

    lock, answered, refusals = threading.Lock(), [], [Reply(429, headers={"retry-after": "2"})] * 3
    refusals.append(Reply(503, {"error": "busy"}, headers={"retry-after": "1"}))

    def respond(body: dict) -> Reply:
        with lock:
            if refusals:
                return refusals.pop()
            answered.append(body["messages"][-1]["content"])
            return Reply(200, completion(body["messages"][-1]["content"]))

    state = ChatServer(responder=respond)
    httpd = start(state)
    client_waits: list[float] = []
    limiter_waits: list[float] = []

    async def waited(into: list[float], seconds: float) -> None:
        into.append(seconds)
        await anyio.lowlevel.checkpoint()

    try:
        served = OpenAICompatibleLLM(
            "m", base_url=state.url, max_retries=5, sleep=lambda s: waited(client_waits, s), timeout=30
        )
        llm = LimitedLLM(served, max_in_flight=16, adaptive=True, sleep=lambda s: waited(limiter_waits, s))
        results: dict[int, str] = {}

        async def one(n: int) -> None:
            results[n] = (await llm.complete(ask(n))).text

        async with anyio.create_task_group() as group:
            for n in range(20):
                group.start_soon(one, n)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert results == {n: str(n) for n in range(20)}, "every call answered with its own answer"
    assert sorted(answered, key=int) == [str(n) for n in range(20)], "and the server answered each once"
    assert sorted(client_waits) == [1.0, 2.0, 2.0, 2.0], "each refused call waited what the server asked"
    assert llm.adaptive is not None and llm.adaptive.backoffs == 4 and not llm.adaptive.growing
    assert limiter_waits and all(0 < wait <= 2.0 for wait in limiter_waits), "new calls held while the server asked"


@given(
    calls=st.lists(st.tuples(st.floats(0, 3), st.integers(1, 900), st.integers(0, 900)), max_size=40),
    limit=st.integers(500, 3000),
)
@example(calls=[(0.3195301079644005, 1, 0), (0.0, 500, 0)], limit=500)  # a wait a rounding short of the window
def test_a_call_starts_only_when_the_window_has_room_for_it_and_waits_no_longer_than_it_must(calls, limit):
    pace, now = TokenPace(limit, window=1.0), 0.0
    for gap, asked, used in calls:
        now += gap
        wait = pace.wait(now, asked)
        if wait > 0:
            assert pace.room(now) < min(asked, limit), "it waits only when the window is full"
            just_before = pace.room(now + wait - 1e-6)  # (room forgets what left the window: ask in time order)
            assert pace.room(now + wait) >= min(asked, limit) > just_before, "and no longer"
        now += wait
        entry = pace.spend(now, asked)
        assert pace.room(now) >= min(asked, limit) - asked, "counted in full when it starts"
        pace.settle(entry, used, now + gap / 10)  # answered a little later
        assert entry[1] >= asked, "never counted as less than it asked for"


def test_a_servers_headers_tighten_the_pace_and_a_refusal_holds_it():
    pace = TokenPace(10_000)
    pace.told(0.0, limit=2_000, remaining=1_500)  # another client spent 500 already
    assert pace.per_minute == 2_000 and pace.room(0.0) == 1_500
    assert pace.wait(1.0, 1_500) == 0 and pace.wait(1.0, 1_600) == pytest.approx(59.0)
    pace.pause(2.0, 5.0)
    assert pace.wait(3.0, 1) == pytest.approx(4.0)


def test_a_tokens_per_minute_limit_holds_against_a_server_with_no_refusal_and_nearly_all_of_it_used():
    """No call refused, and of the time this process had the CPU, at least 90 % of the limit used.

    A busy machine takes the CPU from the client now and then (its calls start late, through no fault
    of the pace): a heartbeat measures how late it wakes, and that time is not counted as the pace's.
    """
    window = 1.0  # the server's "minute", and the pace's

    async def load(paced: bool, calls: int) -> tuple[int, float]:
        server = LimitedServer(6_000, window, headers=paced)  # without its headers, nothing tells the client
        late: list[tuple[float, float]] = []  # (when the heartbeat woke, how late)
        done = anyio.Event()

        async def heartbeat() -> None:
            while not done.is_set():
                asleep = anyio.current_time()
                await anyio.sleep(0.005)
                late.append((time.monotonic(), max(0.0, anyio.current_time() - asleep - 0.005)))

        try:
            inner = OpenAICompatibleLLM("m", base_url=server.url, max_tokens=200, max_retries=50, backoff=0.02)
            llm = LimitedLLM(inner, max_in_flight=8, tokens_per_minute=6_000 if paced else None, token_window=window,
                             adaptive=True)  # fmt: skip
            async with anyio.create_task_group() as beating:
                beating.start_soon(heartbeat)
                async with anyio.create_task_group() as group:
                    for i in range(calls):
                        asked = LLMRequest(messages=[{"role": "user", "content": f"question {i} " + "x" * 400}])
                        group.start_soon(llm.complete, asked)
                done.set()
            first, last = server.admitted[0][0], server.admitted[-1][0]
            admitted = sum(
                n for at, n in server.admitted if first + window <= at < last
            )  # whole windows after the first
            stolen = sum(lag for at, lag in late if first + window <= at < last)
            return len(server.refused), admitted / (6_000 * (last - first - window - stolen) / window)
        finally:
            server.stop()

    refused, used = anyio.run(load, True, 70)
    assert refused == 0 and used >= 0.9, (refused, used)
    unpaced, _ = anyio.run(load, False, 40)
    assert unpaced > 0, "the server does refuse a client that does not pace its tokens"


def test_calls_move_to_the_fast_endpoints_and_one_nothing_answers_at_is_left_out_with_a_warning():
    from metaroles.llm.limits import BalancedLLM
    from metaroles.llm.providers import llm_from_settings
    from metaroles.llm.settings import LLMSettings
    from tests.test_mcp import _free_port

    servers = [LimitedServer(10**9, 60.0), LimitedServer(10**9, 60.0, slow=0.25), LimitedServer(10**9, 60.0)]
    dead = f"http://127.0.0.1:{_free_port()}/v1"
    try:
        urls = ",".join([servers[0].url, servers[1].url, dead, servers[2].url])
        llm = llm_from_settings(LLMSettings(llm="openai", model="m", base_url=urls, max_retries=0))
        assert isinstance(llm, BalancedLLM) and llm.names[2] == dead

        async def caller(number: int) -> None:  # each asks again once answered, as roles do
            for i in range(15):
                await llm.complete(LLMRequest(messages=[{"role": "user", "content": f"caller {number}, q{i}"}]))

        async def ask() -> None:
            async with anyio.create_task_group() as group:
                for number in range(8):
                    group.start_soon(caller, number)

        with pytest.warns(UserWarning, match=rf"endpoint {dead} does not answer; the others take its calls") as said:
            anyio.run(ask)
        assert len(said) == 1, "said once"
    finally:
        for server in servers:
            server.stop()
    fast, slow, gone, other = llm.calls
    assert gone == 0 and fast + slow + other == 120, "every call answered, none lost to the dead endpoint"
    assert slow * 4 < min(fast, other), f"the slow endpoint took {slow} of {llm.calls}"


def test_a_servers_requests_per_minute_headers_alone_pace_the_calls_to_no_refusal():
    window = 1.0

    async def load() -> LimitedServer:
        server = LimitedServer(12, window, per="requests")
        try:
            inner = OpenAICompatibleLLM("m", base_url=server.url, max_tokens=20, max_retries=50, backoff=0.02)
            llm = LimitedLLM(inner, max_in_flight=1, token_window=window)  # no limit set: the headers say it
            for i in range(40):
                await llm.complete(LLMRequest(messages=[{"role": "user", "content": f"question {i}"}]))
            assert llm.requests is not None and llm.requests.per_minute == 12 and llm.tokens is None
            return server
        finally:
            server.stop()

    server = anyio.run(load)
    assert server.refused == [] and len(server.admitted) == 40
    first = server.admitted[0][0]
    for at, _ in server.admitted:  # never more than 12 in any window
        assert sum(1 for other, _ in server.admitted if at - window < other <= at) <= 12
    assert server.admitted[-1][0] - first >= 2 * window, "40 calls at 12 a window take three windows"


def test_a_requests_per_minute_setting_paces_without_a_server_saying_so():
    assert LimitedLLM(TestLLM(), requests_per_minute=30).requests.per_minute == 30
    with pytest.raises(InvalidValueError, match="requests_per_minute=0 must be positive"):
        LimitedLLM(TestLLM(), requests_per_minute=0)
    settings = LLMSettings.from_env({"METAROLES_REQUESTS_PER_MINUTE": "90"}, llm="test")
    assert settings.requests_per_minute == 90


def test_calls_move_off_an_endpoint_that_refuses_for_load_or_is_too_slow_and_the_run_goes_on():
    from metaroles.llm.limits import BalancedLLM
    from metaroles.llm.providers import llm_from_settings
    from metaroles.llm.settings import LLMSettings

    refusing = LimitedServer(1, 60.0)  # every call is past its limit: 429, come back in a minute
    slow = LimitedServer(10**9, 60.0, slow=6.0)  # answers long after the client's deadline
    healthy = LimitedServer(10**9, 60.0)
    try:
        urls = ",".join([refusing.url, slow.url, healthy.url])
        llm = llm_from_settings(LLMSettings(llm="openai", model="m", base_url=urls, timeout=2.0))
        assert isinstance(llm, BalancedLLM)

        async def ask() -> None:
            async with anyio.create_task_group() as group:
                for number in range(4):
                    for i in range(5):
                        group.start_soon(
                            llm.complete, LLMRequest(messages=[{"role": "user", "content": f"{number}.{i}"}])
                        )

        anyio.run(ask)
    finally:
        for server in (refusing, slow, healthy):
            server.stop()
    assert llm.calls == [0, 0, 20], "every call answered by the endpoint that answers"
    assert refusing.refused, "the refusing endpoint was tried, and left to rest"


def test_a_tokens_per_minute_below_one_call_says_so_at_once(tmp_path, capsys):
    from metaroles.cli import main

    server = LimitedServer(10**9, 60.0)
    try:
        code = main(["run", "debate", "--llm", "openai", "--base-url", server.url, "--model", "m",
                     "--tokens-per-minute", "1", "--out", str(tmp_path / "run"), "-q"])  # fmt: skip
    finally:
        server.stop()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert code == 2 and len(lines) == 1 and "tokens_per_minute=1 is less than one call" in lines[0], lines
    assert not server.admitted
