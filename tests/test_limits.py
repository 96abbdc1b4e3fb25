import anyio
import pytest
from anyio import wait_all_tasks_blocked

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
