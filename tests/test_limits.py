import anyio
import anyio.lowlevel
import pytest
from anyio import wait_all_tasks_blocked
from hypothesis import given
from hypothesis import strategies as st

from metaroles import FunctionLLM, InvalidValueError, LLMRequest
from metaroles.llm.limits import LimitedLLM, next_slot


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
