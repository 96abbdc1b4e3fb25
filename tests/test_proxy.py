"""``metaroles proxy``: another framework's calls recorded through a real server, then replayed with no network."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from metaroles.agents.isolation import bubblewrap, confined_command
from metaroles.llm.model_files import SMOLLM2, local_model_available
from metaroles.llm.proxy import Exchange, ExchangeCassette, ProxyServer, request_key
from metaroles.llm.serving import ModelServer

REPO = Path(__file__).resolve().parents[1]
CHAT = REPO / "tests" / "frameworks" / "pydantic_ai_chat.py"
ASK = [{"role": "user", "content": "Name a colour."}]
needs_model = pytest.mark.skipif(
    not local_model_available(), reason="needs metaroles[local] and the embedded models (make demo installs them)"
)


@pytest.fixture(scope="module")
def upstream() -> Iterator[ModelServer]:
    """The embedded model behind ``metaroles serve``'s server, on loopback."""
    from metaroles.llm.local import LocalLLM

    with ModelServer(LocalLLM(SMOLLM2, batch=2, max_tokens=24)).running() as server:
        yield server


def served(server: ModelServer) -> float:
    """How many requests the upstream has taken."""
    text = urllib.request.urlopen(server.url.removesuffix("/v1") + "/metrics").read().decode()
    return next(float(line.split()[1]) for line in text.splitlines() if line.startswith("metaroles_engine_requests"))


def talk(base_url: str) -> tuple[str, list[str]]:
    """One answer, and one streamed answer's pieces, through ``base_url`` with the openai SDK."""
    client = openai.OpenAI(base_url=base_url, api_key="sk-never-on-cassette", max_retries=0)
    answer = client.chat.completions.create(model="any", messages=ASK, max_tokens=12, temperature=0)
    stream = client.chat.completions.create(model="any", messages=ASK, max_tokens=12, temperature=0, stream=True)
    pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    return answer.choices[0].message.content or "", pieces


@needs_model
def test_the_openai_sdk_is_recorded_through_the_proxy_and_answered_again_with_no_server(
    upstream: ModelServer, tmp_path: Path
) -> None:
    cassette = tmp_path / "calls.jsonl"
    with ProxyServer(ExchangeCassette(cassette, record=True), upstream=upstream.url).running() as proxy:
        live = talk(proxy.url)
    assert live[0] and "".join(live[1]) == live[0], "the stream came through whole"
    kept = [json.loads(line) for line in cassette.read_text().splitlines()]
    assert [e["request"].get("stream", False) for e in kept] == [False, True] and kept[1]["events"]
    assert "sk-never-on-cassette" not in cassette.read_text(), "the client's key is passed on, never kept"

    before, missed = served(upstream), []
    with ProxyServer(ExchangeCassette(cassette, record=False), on_miss=missed.append).running() as proxy:
        assert talk(proxy.url) == live, "the same answer and the same stream, piece by piece"
        with pytest.raises(openai.NotFoundError) as refused:
            openai.OpenAI(base_url=proxy.url, api_key="k", max_retries=0).chat.completions.create(
                model="any", messages=[{"role": "user", "content": "Something never asked."}]
            )
    assert served(upstream) == before, "the replay asked the server nothing"
    assert len(missed) == 1 and "request key" in missed[0] and missed[0].split("key ")[1][:32] in str(refused.value)


def test_one_request_asked_again_gets_its_answers_in_the_order_they_came_then_the_last(tmp_path: Path) -> None:
    cassette = ExchangeCassette(tmp_path / "t.jsonl", record=True)
    key = request_key("POST", "/v1/chat/completions", b'{"a": 1, "b": [2]}')
    assert key == request_key("POST", "/v1/chat/completions", b'{ "b":[2],"a":1 }'), "key order and spacing aside"
    assert key != request_key("POST", "/v1/completions", b'{"a": 1, "b": [2]}')
    for n in (1, 2):
        cassette.keep(Exchange(key, "POST", "/v1/chat/completions", {"a": 1}, 200, "application/json", body=str(n)))
    cassette.close()
    again = ExchangeCassette(tmp_path / "t.jsonl", record=False)
    assert [again.answer(key).body for _ in range(4)] == ["1", "2", "2", "2"]  # type: ignore[union-attr]
    assert again.answer("0" * 32) is None


@needs_model
def test_a_two_agent_pydantic_ai_chat_recorded_then_replayed_in_a_sandbox_with_no_network(
    upstream: ModelServer, tmp_path: Path
) -> None:
    cassette = tmp_path / "chat.jsonl"
    with ProxyServer(ExchangeCassette(cassette, record=True), upstream=upstream.url).running() as proxy:
        recorded = subprocess.run([sys.executable, str(CHAT), proxy.url], capture_output=True, text=True, check=False)
    assert recorded.returncode == 0, recorded.stderr[-3000:]
    said = json.loads(recorded.stdout)["said"]
    assert [who for who, _ in said] == ["host", "guest"] * 3 and all(text for _, text in said)
    assert len(cassette.read_text().splitlines()) == 6, "a call per turn of each agent"

    bwrap = bubblewrap()
    assert bwrap is not None, "bubblewrap is installed by make (need-bwrap)"
    port = int(upstream.url.split(":")[2].split("/")[0])
    socket.create_connection(("127.0.0.1", port), timeout=5).close()  # the server is up, here
    sandbox = lambda *argv: confined_command(  # noqa: E731
        bwrap, [sys.executable, *argv], readable=[REPO, cassette], env={"PYTHONPATH": str(REPO), "HOME": "/tmp"}
    )
    reach = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5)"
    unreachable = subprocess.run(sandbox("-c", reach), capture_output=True, text=True, check=False)
    assert unreachable.returncode != 0 and "ConnectionRefused" in unreachable.stderr, "no network in the sandbox"
    before = served(upstream)
    replayed = subprocess.run(
        sandbox(str(CHAT), "--replay", str(cassette)), capture_output=True, text=True, check=False
    )
    assert replayed.returncode == 0, replayed.stderr[-3000:]
    assert json.loads(replayed.stdout) == {"said": said, "missed": []}, "the same talk, from the cassette alone"
    assert served(upstream) == before


def test_the_command_replays_a_tape_a_stream_included_until_stopped(tmp_path: Path) -> None:
    cassette, path = ExchangeCassette(tmp_path / "t.jsonl", record=True), "/v1/chat/completions"
    body = {"model": "m", "messages": ASK, "stream": True}
    events = [f"data: {json.dumps(chunk(text))}\n\n" for text in ("Bl", "ue")] + ["data: [DONE]\n\n"]
    raw = json.dumps(body).encode()
    cassette.keep(Exchange(request_key("POST", path, raw), "POST", path, body, 200, "text/event-stream", events=events))
    cassette.close()
    server = subprocess.Popen(
        [sys.executable, "-m", "metaroles", "proxy", "--replay", str(tmp_path / "t.jsonl")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("proxy at ") and "1 exchanges" in line, line
        client = openai.OpenAI(base_url=line.split()[2], api_key="k", max_retries=0)
        stream = client.chat.completions.create(model="m", messages=ASK, stream=True)  # type: ignore[arg-type]
        assert [c.choices[0].delta.content for c in stream if c.choices] == ["Bl", "ue"]
    finally:
        server.terminate()
        assert server.wait(timeout=60) == 0


def chunk(text: str) -> dict[str, object]:
    return {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replay", "missing.jsonl"], "no cassette at"),
        (["--record", "t.jsonl"], "--record needs --to URL"),
        (["--replay", "bad.jsonl", "--to", "http://127.0.0.1:9/v1"], "a replay asks no server"),
        (["--record", "t.jsonl", "--to", "ftp://host"], "is not a server's URL"),
        (["--record", "full.jsonl", "--to", "http://127.0.0.1:9/v1"], "holds recorded exchanges already"),
        (["--replay", "bad.jsonl"], "bad.jsonl:2 is not a recorded exchange"),
        ([], "give --record CASSETTE"),
    ],
)
def test_bad_proxy_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "full.jsonl").write_text('{"kept": 1}\n')
    (tmp_path / "bad.jsonl").write_text("\n{not json\n")
    done = subprocess.run(
        [sys.executable, "-m", "metaroles", "proxy", *args], capture_output=True, text=True, cwd=tmp_path, check=False
    )
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "t.jsonl").exists(), "a refused recording makes no cassette"
