import json
from collections.abc import Iterator

import pytest
from pydantic import BaseModel

from metaroles import LLMRequest, ProviderError, Role
from metaroles.bus.action import Action
from metaroles.llm.openai_compat import OpenAICompatibleLLM
from tests.chat_server import ChatServer, Reply, chunk, completion, start


@pytest.fixture
def server() -> Iterator[ChatServer]:
    state = ChatServer()
    httpd = start(state)
    yield state
    state.release.set()
    httpd.shutdown()
    httpd.server_close()


def llm(server: ChatServer, **kw: object) -> OpenAICompatibleLLM:
    options: dict[str, object] = {"base_url": server.url, "api_key": "k", "backoff": 0.0, "max_retries": 2}
    options.update(kw)
    return OpenAICompatibleLLM("served-model", **options)  # type: ignore[arg-type]


def ask(text: str = "hello", **kw: object) -> LLMRequest:
    return LLMRequest(messages=[{"role": "user", "content": text}], role="r", action="a", **kw)  # type: ignore[arg-type]


async def test_plain_chat_reads_text_and_usage(server):
    server.queue(Reply(body=completion("Hello back")))
    response = await llm(server, temperature=0.3, seed=7).complete(ask(max_tokens=20))
    assert response.text == "Hello back"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (11, 7)
    sent = server.requests[0]
    assert sent["model"] == "served-model" and sent["messages"] == [{"role": "user", "content": "hello"}]
    assert (sent["temperature"], sent["seed"], sent["max_tokens"]) == (0.3, 7, 20)


async def test_tool_calls_and_tool_choice(server):
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    server.queue(
        Reply(body=completion(None, tool_calls=[call])), Reply(body=completion("ok")), Reply(body=completion("ok"))
    )
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    response = await llm(server).complete(ask(tools=tools, tool_choice="add"))
    assert response.text == ""
    assert response.tool_calls is not None and response.tool_calls[0].function.arguments == '{"a": 1, "b": 2}'
    assert server.requests[0]["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert server.requests[0]["tools"] == tools
    await llm(server).complete(ask(tools=tools, tool_choice="required"))
    await llm(server).complete(ask(tools=tools, tool_choice="none"))
    assert [r["tool_choice"] for r in server.requests[1:]] == ["required", "none"]


class Point(BaseModel):
    x: int
    y: int


async def test_json_schema_response_format(server):
    server.queue(Reply(body=completion('{"x": 1, "y": 2}')))
    role = Role(name="r", llm=llm(server))
    action = Action()
    role.set_actions([action])
    point = await action.aask("give a point", output_model=Point)
    assert point == Point(x=1, y=2)
    response_format = server.requests[0]["response_format"]
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["schema"]["required"] == ["x", "y"]


async def test_streaming_calls_back_each_piece(server):
    server.queue(Reply(chunks=[chunk("Hel"), chunk("lo"), chunk(" there", finish="stop"), chunk(usage=True)]))
    pieces: list[str] = []
    response = await llm(server, on_token=pieces.append).complete(ask())
    assert pieces == ["Hel", "lo", " there"]
    assert response.text == "Hello there"
    assert response.usage.total_tokens == 8
    assert server.requests[0]["stream"] is True


async def test_streamed_tool_call_is_assembled(server):
    parts = [
        chunk(tool_call={"index": 0, "id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a"'}}),
        chunk(tool_call={"index": 0, "function": {"arguments": ": 1}"}}, finish="tool_calls"),
    ]
    server.queue(Reply(chunks=parts))

    async def sink(text: str) -> None:
        pass

    response = await llm(server, on_token=sink).complete(ask())
    assert response.tool_calls is not None
    assert (response.tool_calls[0].function.name, response.tool_calls[0].function.arguments) == ("add", '{"a": 1}')


async def test_429_then_success_is_retried(server):
    server.queue(Reply(429, {"error": {"message": "slow down"}}), Reply(body=completion("finally")))
    response = await llm(server).complete(ask())
    assert response.text == "finally"
    assert len(server.requests) == 2


async def test_retry_after_is_honoured_in_seconds_and_milliseconds(server):
    waits: list[float] = []

    async def wait(seconds: float) -> None:
        waits.append(seconds)  # the test records the wait instead of spending it

    server.queue(
        Reply(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "2"}),
        Reply(503, {"error": {"message": "busy"}}, headers={"retry-after-ms": "1500"}),
        Reply(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "3600"}),  # past 60 s: our backoff
        Reply(body=completion("finally")),
    )
    response = await llm(server, sleep=wait, max_retries=3, backoff=0.0).complete(ask())
    assert response.text == "finally" and len(server.requests) == 4
    assert waits == [2.0, 1.5, 0.0]


async def test_500s_past_the_retry_bound_fail_with_a_clear_error(server):
    server.queue(*[Reply(500, {"error": {"message": "boom"}})] * 3)
    with pytest.raises(ProviderError, match=r"'served-model' failed 3 time\(s\) for role 'r', action 'a'"):
        await llm(server, max_retries=2).complete(ask())
    assert len(server.requests) == 3


@pytest.mark.parametrize(
    "reply",
    [
        Reply(body={"id": "x", "object": "chat.completion", "model": "m", "created": 0, "choices": []}),
        Reply(body={**completion("x"), "choices": [{"index": 0, "message": {"role": "assistant", "content": 5}}]}),
        Reply(body={"choices": "nope"}),
        Reply(raw=b'{"choices": [{"message": '),
    ],
    ids=["no_choices", "content_a_number", "choices_a_string", "not_json"],
)
async def test_an_answer_that_is_not_a_chat_completion_is_retried_then_named(server, reply):
    server.queue(reply, Reply(body=completion("whole")))
    assert (await llm(server).complete(ask())).text == "whole" and len(server.requests) == 2
    server.queue(reply, reply, reply)
    with pytest.raises(ProviderError, match=r"failed 3 time\(s\) .*the answer is not a chat completion"):
        await llm(server, max_retries=2).complete(ask())


async def test_a_body_cut_short_under_a_held_connection_is_retried_without_waiting_out_the_call(server):
    server.queue(Reply(body=completion("lost"), truncated=True), Reply(body=completion("whole")))
    answer = await llm(server, timeout=3600, body_timeout=0.2).complete(ask())  # the test's own timeout: 120 s
    assert answer.text == "whole" and len(server.requests) == 2


async def test_a_4xx_is_not_retried(server):
    server.queue(Reply(400, {"error": {"message": "bad schema"}}))
    with pytest.raises(ProviderError, match="refused the request of role 'r'"):
        await llm(server).complete(ask())
    assert len(server.requests) == 1


async def test_a_slow_response_times_out_and_is_retried(server):
    server.queue(Reply(hang=True), Reply(body=completion("second try")))
    response = await llm(server, timeout=0.3).complete(ask())
    assert response.text == "second try"
    with pytest.raises(ProviderError, match="failed 1 time"):
        server.queue(Reply(hang=True))
        await llm(server, timeout=0.3, max_retries=0).complete(ask())


async def test_a_stream_cut_before_its_end_is_an_error_and_is_retried(server):
    whole = [chunk("Hello"), chunk(" there", finish="stop")]
    server.queue(Reply(chunks=[chunk("Hel")], cut=True), Reply(chunks=whole))
    pieces: list[str] = []
    response = await llm(server, on_token=pieces.append).complete(ask())
    assert response.text == "Hello there" and len(server.requests) == 2, "the cut answer was not taken as whole"
    server.queue(Reply(chunks=[chunk("Hel")], cut=True))
    with pytest.raises(ProviderError, match="stopped after 3 characters, before its end"):
        await llm(server, on_token=pieces.append, max_retries=0).complete(ask())


async def test_a_trickling_stream_meets_the_calls_deadline_and_is_retried(server):
    """A byte now and then resets every read timeout; the call's own deadline still ends it."""
    server.queue(Reply(chunks=[chunk("Hel")], trickle=True), Reply(chunks=[chunk("done", finish="stop")]))
    response = await llm(server, on_token=lambda text: None, timeout=0.5).complete(ask())
    assert response.text == "done" and len(server.requests) == 2
    server.queue(Reply(chunks=[chunk("Hel")], trickle=True))
    with pytest.raises(ProviderError, match="failed 1 time"):
        await llm(server, on_token=lambda text: None, timeout=0.5, max_retries=0).complete(ask())


def test_backoff_has_full_jitter_and_grows():
    model = OpenAICompatibleLLM("m", base_url="http://127.0.0.1:9/v1", backoff=1.0)
    delays = [model._delay(4) for _ in range(200)]
    assert 0 <= min(delays) and max(delays) <= 16 and max(delays) > 8
    assert max(model._delay(0) for _ in range(50)) <= 1.0


def test_the_cli_talks_to_the_server_named_by_openai_base_url(server, monkeypatch, capsys):
    from metaroles.cli import main

    def respond(body: dict) -> Reply:
        if "response_format" in body:
            verdict = '{"winner": "con", "reasoning": "Bob answered every point.", "confidence": 0.7}'
            return Reply(body=completion(verdict))
        return Reply(body=completion(f"served reply #{len(server.requests)}"))

    server.responder = respond
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    monkeypatch.setenv("METAROLES_MODEL", "served-model")
    monkeypatch.delenv("METAROLES_LLM", raising=False)
    assert main(["run", "debate", "--set", "turns=1", "--no-save"]) == 0
    out = capsys.readouterr()
    assert "[Alice → Bob, Judge] served reply #1" in out.out
    assert "  - **winner**: con" in out.out, "the verdict reads as fields"
    assert "OpenAICompatibleLLM(model='served-model'" in out.err
    assert {r["model"] for r in server.requests} == {"served-model"} and len(server.requests) == 3


def test_openai_compatible_embeddings_are_normalised_and_checked(server):
    from metaroles.longterm.embedding import OpenAIEmbedding

    def respond(body: dict) -> Reply:
        data = [{"object": "embedding", "index": i, "embedding": [3.0, 4.0, 0.0]} for i, _ in enumerate(body["input"])]
        return Reply(
            body={
                "object": "list",
                "data": data,
                "model": body["model"],
                "usage": {"prompt_tokens": 2, "total_tokens": 2},
            }
        )

    server.responder = respond
    from metaroles.core.exceptions import ConfigError

    embedding = OpenAIEmbedding("embedder", dim=3, base_url=server.url)
    assert embedding.embed(["a", "b"]) == [[0.6, 0.8, 0.0], [0.6, 0.8, 0.0]]
    assert (server.requests[-1]["model"], server.requests[-1]["input"]) == ("embedder", ["a", "b"])

    with pytest.raises(ConfigError, match="returned 3-d vectors, not dim=5"):
        OpenAIEmbedding("embedder", dim=5, base_url=server.url).embed(["x"])


def test_credentials_in_the_base_url_appear_nowhere(server, tmp_path, capsys, monkeypatch):
    """The manifest, stderr, the repr, the events and every other file of the run hold no password."""
    from metaroles.cli import main

    server.responder = lambda body: Reply(body=completion("a served reply"))
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    host = server.url.removeprefix("http://")
    secret_url = f"http://alice:hunter2-secret@{host}"
    run_dir = tmp_path / "run"
    args = ["--llm", "openai", "--base-url", secret_url, "--model", "served-model", "--set", "turns=1"]
    assert main(["run", "debate", *args, "--out", str(run_dir), "-q"]) == 0
    said = capsys.readouterr()
    assert "hunter2-secret" not in said.err + said.out and "alice" not in said.err
    assert "http://***@127.0.0.1" in said.err
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert b"hunter2-secret" not in path.read_bytes(), path
    assert "hunter2-secret" not in repr(OpenAICompatibleLLM("m", base_url=secret_url))
    from metaroles.llm.settings import LLMSettings

    shown = repr(LLMSettings(base_url=secret_url, api_key="sk-abc"))
    assert "hunter2-secret" not in shown and "sk-abc" not in shown


def test_the_manifest_records_the_resolved_server_and_a_fork_goes_back_to_it(server, tmp_path, capsys, monkeypatch):
    """``auto`` resolved to the server is recorded as the server: a fork without the environment still reaches it."""
    from metaroles.cli import main

    server.responder = lambda body: Reply(body=completion("served", model="served-model-2024-07-18"))
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-never-recorded")
    monkeypatch.setenv("METAROLES_MODEL", "served-model")
    monkeypatch.setenv("METAROLES_TEMPERATURE", "0.3")
    run_dir = tmp_path / "run"
    tuning = ["--timeout", "12", "--rate-limit", "50", "--max-in-flight", "2"]
    assert main(["run", "debate", "--set", "turns=1", "--rounds", "2", *tuning, "--out", str(run_dir), "-q"]) == 0
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert (manifest["llm"], manifest["model"], manifest["base_url"]) == ("openai", "served-model", server.url)
    assert (manifest["temperature"], manifest["timeout"], manifest["requests_per_second"]) == (0.3, 12.0, 50.0)
    assert manifest["max_in_flight"] == 2
    assert "sk-never-recorded" not in (run_dir / "manifest.json").read_text()
    assert {r.get("temperature") for r in server.requests} == {0.3}
    served = len(server.requests)
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "METAROLES_MODEL", "METAROLES_TEMPERATURE"):
        monkeypatch.delenv(name)
    capsys.readouterr()
    child = tmp_path / "child"
    assert main(["fork", str(run_dir), "--from-round", "1", "--out", str(child), "-q"]) == 0
    assert len(server.requests) > served, "the fork asked the recorded server, not another model"
    assert {r.get("temperature") for r in server.requests[served:]} == {0.3}
    assert "OpenAICompatibleLLM(model='served-model'" in capsys.readouterr().err


def test_bad_tuning_from_the_environment_is_one_line(monkeypatch, capsys):
    from metaroles.cli import main

    monkeypatch.setenv("METAROLES_TEMPERATURE", "hot")
    assert main(["run", "debate", "--llm", "test", "--no-save", "-q"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(errors) == 1 and "temperature='hot'" in errors[0]
