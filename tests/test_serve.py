"""``metaroles serve``: the embedded model behind a real OpenAI-compatible server on loopback, for real."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anyio
import openai
import pytest

from metaroles.llm.model_files import SMOLLM2, local_model_available
from tests.faults.helpers import differences, killed, ok

pytestmark = pytest.mark.skipif(
    not local_model_available(), reason="needs metaroles[local] and the embedded models (make demo installs them)"
)

SYSTEM = "You are a member of a town council. The council is discussing where to build a new bridge over the river."
SCHEMA = {"type": "object", "properties": {"opinion": {"type": "number"}}, "required": ["opinion"]}


def start(*args: str) -> tuple[subprocess.Popen[str], str]:
    """``metaroles serve`` on a free port: the process, and the base URL its first line gives."""
    command = [sys.executable, "-m", "metaroles", "serve", "--port", "0", "--model-path", SMOLLM2, *args]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert server.stdout is not None
    line = server.stdout.readline()
    assert line.startswith("serving "), server.stderr.read() if server.stderr else line
    return server, line.split(" at ")[1].split()[0]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    server, base = start("--slots", "4", "--max-tokens", "24")
    yield base
    server.terminate()
    assert server.wait(timeout=60) == 0


def metrics(base: str) -> dict[str, float]:
    text = urllib.request.urlopen(base.removesuffix("/v1") + "/metrics").read().decode()
    return {name: float(value) for name, value in (line.split() for line in text.splitlines() if line[0] != "#")}


def post(base: str, body: object) -> tuple[int, dict[str, str], dict]:
    request = urllib.request.Request(
        base + "/chat/completions", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request) as answer:
            return answer.status, dict(answer.headers), json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read())


async def test_concurrent_clients_are_answered_and_the_shared_prefix_comes_from_the_cache(url):
    before = metrics(url)
    answers = {}

    async def ask(client: openai.AsyncOpenAI, i: int) -> None:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Your view, member {i}?"}]
        answers[i] = await client.chat.completions.create(model="any", messages=messages, max_tokens=8, seed=i)

    async with openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0) as client:
        async with anyio.create_task_group() as group:  # more clients than slots: the rest wait their turn
            for i in range(10):
                group.start_soon(ask, client, i)
    assert sorted(answers) == list(range(10))
    assert all(a.choices[0].message.content and 0 < a.usage.completion_tokens <= 8 for a in answers.values())
    cached = [a.usage.prompt_tokens_details.cached_tokens for a in answers.values()]
    assert sum(1 for c in cached if c > 0) >= 6, f"after the first four, a slot holds the system prompt: {cached}"
    after = metrics(url)
    assert after["metaroles_engine_requests_total"] - before["metaroles_engine_requests_total"] == 10
    assert after["metaroles_engine_prompt_tokens_cached_total"] - before[
        "metaroles_engine_prompt_tokens_cached_total"
    ] == sum(cached)
    made = after["metaroles_engine_completion_tokens_total"] - before["metaroles_engine_completion_tokens_total"]
    assert made == sum(a.usage.completion_tokens for a in answers.values())
    assert after["metaroles_engine_requests_running"] == 0 and after["metaroles_engine_slots"] == 4


async def test_schemas_forced_tools_and_streams_are_served(url):
    from metaroles.llm.openai_compat import OpenAICompatibleLLM
    from metaroles.llm.protocol import LLMRequest

    ask = [{"role": "user", "content": "What is your opinion, from 0 to 1?"}]
    tool = {"type": "function", "function": {"name": "vote", "parameters": SCHEMA}}
    async with openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0) as client:
        shaped = await client.chat.completions.create(
            model="any",
            messages=ask,
            response_format={"type": "json_schema", "json_schema": {"name": "o", "schema": SCHEMA}},
            max_tokens=24,
        )
        voted = await client.chat.completions.create(
            model="any", messages=ask, tools=[tool], tool_choice={"type": "function", "function": {"name": "vote"}}
        )
    assert isinstance(json.loads(shaped.choices[0].message.content)["opinion"], int | float)
    call = voted.choices[0].message.tool_calls[0]
    assert voted.choices[0].finish_reason == "tool_calls" and call.function.name == "vote"
    assert "opinion" in json.loads(call.function.arguments)
    pieces: list[str] = []
    streamed = OpenAICompatibleLLM("any", base_url=url, on_token=pieces.append, max_tokens=8)
    answer = await streamed.complete(LLMRequest(messages=ask))
    await streamed.aclose()
    assert answer.text and "".join(pieces) == answer.text and answer.usage.completion_tokens > 0


async def test_a_batch_of_calls_is_answered_by_the_engine_together(url):
    from metaroles.llm.batching import BatchedLLM
    from metaroles.llm.openai_compat import OpenAICompatibleLLM
    from metaroles.llm.protocol import LLMRequest

    before = metrics(url)
    endpoint = OpenAICompatibleLLM("any", base_url=url, max_tokens=24)
    batched, answers = BatchedLLM(endpoint), {}

    async def ask(i: int) -> None:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Your view, member {i}?"}]
        shape = SCHEMA if i % 2 else None
        answers[i] = await batched.complete(LLMRequest(messages=messages, output_schema=shape, seed=i))

    async with anyio.create_task_group() as group:
        for i in range(6):
            group.start_soon(ask, i)
    await endpoint.aclose()
    assert batched.batches == 1 and sorted(answers) == list(range(6))
    assert all(0 < a.usage.completion_tokens <= 24 for a in answers.values())
    assert all("opinion" in json.loads(answers[i].text) for i in (1, 3, 5)), "a line's schema is followed"
    after = metrics(url)
    assert after["metaroles_engine_requests_total"] - before["metaroles_engine_requests_total"] == 6


def test_bad_requests_are_400s_naming_what_is_wrong(url):
    status, _, body = post(url, {"model": "any"})
    assert status == 400 and "'messages'" in body["error"]["message"]
    status, _, body = post(url, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": "many"})
    assert status == 400 and "max_tokens='many'" in body["error"]["message"]
    status, _, body = post(url, {"messages": [{"role": "user", "content": "word " * 3000}]})
    assert status == 400 and "do not fit n_ctx" in body["error"]["message"]
    status, _, body = post(url.removesuffix("/v1"), {"messages": []})
    assert status == 404 and "/v1/chat/completions" in body["error"]["message"]
    assert post(url, {"messages": [{"role": "user", "content": "still here?"}], "max_tokens": 2})[0] == 200


def raw_post(base: str, head: bytes, body: bytes = b"") -> tuple[int, str]:
    """A hand-written request (what no client library sends): the status and the body of the answer."""
    host, port = base.split("//")[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=120) as connection:
        connection.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\n"
            % (host.encode(), port.encode())
            + head
            + b"\r\n"
            + body
        )
        answer = connection.makefile("rb").read().decode()
    return int(answer.split()[1]), answer.split("\r\n\r\n", 1)[1]


def test_what_a_client_cannot_mean_is_a_400_and_nothing_is_read_past_the_limits(url):
    hi = [{"role": "user", "content": "hi"}]
    for body, said in (
        ({"messages": [5]}, "messages[0]=5 must be an object"),
        ({"messages": [{"role": "user", "content": 7}]}, "content=7 must be text"),
        ({"messages": hi, "max_tokens": 0}, "max_tokens=0 must be at least 1"),
        ({"messages": hi, "max_tokens": -5}, "max_tokens=-5 must be at least 1"),
        (
            {
                "messages": hi,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"schema": {"type": "object", "properties": 5}},
                },
            },
            "schema cannot be followed",
        ),
    ):
        status, _, answer = post(url, body)
        assert status == 400 and said in answer["error"]["message"], (body, answer)
    nan = b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'  # Python's json reads NaN
    status, text = raw_post(url, b"Content-Length: %d\r\n" % len(nan), nan)
    assert status == 400 and "temperature=nan must be a finite number" in text, text
    nested = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    status, text = raw_post(url, b"Content-Length: %d\r\n" % len(nested), nested)
    assert status == 400 and "nested too deeply" in text
    status, text = raw_post(url, b"Content-Length: abc\r\n")
    assert status == 400 and "is not a byte count" in text
    status, text = raw_post(url, b"Content-Length: 209715200\r\n")  # 200 MB announced, none sent: never read
    assert status == 413 and "over the limit" in text
    assert post(url, {"messages": hi, "max_tokens": 2})[0] == 200, "and the server goes on"


def test_a_body_that_never_arrives_is_answered_408_at_its_deadline(monkeypatch):
    from metaroles.llm import endpoint, serving
    from metaroles.llm.local import LocalLLM

    monkeypatch.setattr(endpoint, "BODY_SECONDS", 1.0)
    server = serving.ModelServer(LocalLLM(SMOLLM2, batch=1, max_tokens=2))
    with server.running():
        status, text = raw_post(server.url, b"Content-Length: 100\r\n", b'{"messages"')  # 11 of 100 bytes, then nothing
        assert status == 408 and "did not arrive within 1 s" in text
        assert post(server.url, {"messages": [{"role": "user", "content": "hi"}]})[0] == 200


def test_a_full_queue_is_answered_429_with_retry_after():
    from metaroles.llm.local import LocalLLM
    from metaroles.llm.serving import ModelServer

    server = ModelServer(LocalLLM(SMOLLM2, batch=1, max_tokens=2), max_waiting=1)
    with server.running():
        assert server.admit() and server.admit(), "a slot and a place in the queue"
        status, headers, body = post(server.url, {"messages": [{"role": "user", "content": "hi"}]})
        assert status == 429 and headers["retry-after"] == "1" and "queue is full" in body["error"]["message"]
        server.release()
        assert post(server.url, {"messages": [{"role": "user", "content": "hi"}]})[0] == 200
        server.release()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", int(server.url.split(":")[2].split("/")[0])), timeout=5)


def test_sigterm_stops_the_server_and_frees_its_port():
    server, base = start("--slots", "1")
    port = int(base.split(":")[2].split("/")[0])
    assert metrics(base)["metaroles_engine_slots"] == 1
    server.terminate()
    assert server.wait(timeout=60) == 0
    assert server.stderr is not None and server.stderr.read() == ""
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


def test_a_port_in_use_is_one_line_and_exit_2():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "metaroles", "serve", "--port", str(port)], capture_output=True, text=True
        )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().count("\n") == 0 and f"127.0.0.1:{port}" in result.stderr
    assert "--port" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.timeout(900)  # three runs against a model on two busy cores
def test_a_run_against_the_server_killed_and_resumed_is_the_same_as_its_replay(url, tmp_path: Path):
    cassette, run_dir, replayed = tmp_path / "calls.jsonl", tmp_path / "served", tmp_path / "replayed"
    society = ["--set", "agents=8", "--set", "llm_agents=6", "--set", "degree=2", "--seed", "3", "-q"]
    # a busy machine answers slowly: the client waits (a call that times out is retried, and counted twice)
    served = ["--llm", "openai", "--base-url", url, "--model", "smollm2", "--rounds", "3", "--timeout", "600"]
    # killed as round 2's events are appended: its calls are made and on cassette, its checkpoint is not written
    killed(
        "point=append:events.jsonl:3",
        "run",
        "society",
        *served,
        *society,
        "--record",
        str(cassette),
        "--out",
        str(run_dir),
    )
    calls = lambda: len(cassette.read_text().splitlines()) - 1  # noqa: E731  (the first line: the run's seed)
    assert calls() == 12, "rounds 1 and 2 asked"
    ok("resume", str(run_dir), "-q")
    assert calls() == 18, "round 2's calls answered from the cassette, round 3's recorded"
    ok("run", "society", "--replay", str(cassette), "--rounds", "3", *society, "--out", str(replayed))
    assert differences(run_dir, replayed) == []


def test_a_request_addressed_by_another_name_or_from_another_sites_page_is_refused(url):
    port = url.split(":")[2].split("/")[0]
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    rebound = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Host": f"evil.example:{port}"})  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(rebound)
    assert refused.value.code == 421
    foreign = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Origin": "http://evil.example"})  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(foreign)
    assert refused.value.code == 403
    assert post(url, body)[0] == 200, "its own address is answered"
