"""``metaroles run --batch``: a round's calls as one batch of OpenAI's Batch API, against this project's own server.

The server is ``metaroles serve``'s (``ModelServer``, with its Batch API: ``llm.batch_jobs``) over the test
model, on loopback in this process; the runs are ``metaroles`` processes, killed for real.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import openai
import pytest

from metaroles.llm.batch_jobs import requests_in
from metaroles.llm.batching import BatchedLLM
from metaroles.llm.offline import TestLLM
from metaroles.llm.openai_compat import OpenAICompatibleLLM
from metaroles.llm.protocol import LLMRequest
from metaroles.llm.serving import ModelServer
from tests.faults.helpers import command, differences, ok


class Gated:
    """The test model behind the server, answering only while its gate is open."""

    model = "test-served"

    def __init__(self) -> None:
        self.inner = TestLLM(0)
        self.open = threading.Event()
        self.open.set()

    async def complete(self, request: LLMRequest) -> Any:
        if not self.open.is_set():
            await anyio.to_thread.run_sync(self.open.wait, abandon_on_cancel=True)
        return await self.inner.complete(request)


@pytest.fixture
def served() -> Iterator[tuple[ModelServer, Gated]]:
    gate = Gated()
    server = ModelServer(gate, slots=64)  # type: ignore[arg-type]
    with server.running():
        yield server, gate
        gate.open.set()  # nothing waits past the test


def society(url: str, *more: str) -> list[str]:
    return ["run", "society", "--llm", "openai", "--base-url", url, "--model", "test-served", "--seed", "4", "-q",
            *more]  # fmt: skip


def told(stderr: str) -> list[str]:
    """What a command said on stderr, beside the line naming its model."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("model: ")]


def created(server: ModelServer) -> list[dict[str, Any]]:
    assert server.jobs is not None
    return server.jobs.batches()["data"]


@pytest.mark.timeout(600)
def test_a_round_of_1000_calls_goes_as_one_batch_and_the_run_is_the_run_asked_call_by_call(served, tmp_path: Path):
    server, _ = served
    sets = ["--set", "agents=1000", "--set", "llm_agents=1000", "--rounds", "1"]
    ok(*society(server.url, *sets, "--batch", "--out", str(tmp_path / "batched")))
    batches = created(server)
    assert [b["request_counts"] for b in batches] == [{"total": 1000, "completed": 1000, "failed": 0}]
    assert batches[0]["status"] == "completed"
    ok(*society(server.url, *sets, "--out", str(tmp_path / "asked")))
    assert len(created(server)) == 1, "asked call by call: no batch"
    assert differences(tmp_path / "batched", tmp_path / "asked") == []
    ledger = json.loads((tmp_path / "batched" / "ledger.json").read_text())
    assert len(ledger) == 1000 and all(entry["completion_tokens"] > 0 for entry in ledger)
    assert not (tmp_path / "batched" / "batches.json").exists(), "nothing pending is kept"


@pytest.mark.timeout(600)
def test_a_run_killed_while_its_batch_is_pending_resumes_from_that_batch_and_is_the_straight_run(
    served, tmp_path: Path
):
    server, gate = served
    args = society(server.url, "--set", "agents=12", "--set", "llm_agents=12", "--rounds", "2", "--batch",
                   "--batch-deadline", "5")  # fmt: skip
    straight, run_dir = tmp_path / "straight", tmp_path / "killed"
    ok(*args, "--out", str(straight))
    assert len(created(server)) == 2, "a batch a round"

    gate.open.clear()  # round 1's batch of the next run stays pending
    assert server.jobs is not None
    asked, retrieve = threading.Event(), server.jobs.batch

    def batch(batch_id: str) -> dict[str, Any]:  # the client asks after its batch once it has kept it
        asked.set()
        return retrieve(batch_id)

    server.jobs.batch = batch  # type: ignore[method-assign]
    process = subprocess.Popen([sys.executable, "-m", "metaroles", *args, "--out", str(run_dir)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    assert asked.wait(timeout=300), process.stderr.read() if process.poll() is not None and process.stderr else ""
    process.kill()
    assert process.wait(timeout=60) == -9
    pending = json.loads((run_dir / "batches.json").read_text())["pending"]
    (pending_id,) = pending
    assert created(server)[0]["id"] == pending_id and created(server)[0]["status"] == "in_progress"

    # resumed while the batch is still pending: it waits for that batch, to the deadline, and stops resumable
    stopped = command("none", "resume", str(run_dir), "-q")
    assert stopped.returncode == 1, stopped.stderr
    said = told(stopped.stderr)
    assert len(said) == 1 and pending_id in said[0] and "resume" in said[0] and "Traceback" not in said[0], said
    assert json.loads((run_dir / "batches.json").read_text())["pending"] == pending
    assert len(created(server)) == 3, "no new batch was asked for"

    gate.open.set()
    ok("resume", str(run_dir), "-q")
    assert len(created(server)) == 4, "round 1 taken from the pending batch; round 2's batch"
    assert not (run_dir / "batches.json").exists()
    assert differences(straight, run_dir) == []


class _NoBatches(BaseHTTPRequestHandler):
    """A server with chat completions only (as many OpenAI-compatible servers are): 404 for the Batch API."""

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        data = json.dumps({"error": {"message": f"no route {self.path}", "type": "not_found_error"}}).encode()
        self.send_response(404)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_a_server_without_the_batch_api_is_named_in_one_line_and_the_run_is_resumable(tmp_path: Path):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _NoBatches)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        result = command("none", *society(url, "--set", "agents=6", "--set", "llm_agents=6", "--rounds", "1",
                                          "--batch", "--out", str(tmp_path / "run")))  # fmt: skip
    finally:
        httpd.shutdown()
    said = told(result.stderr)
    assert result.returncode == 1
    assert len(said) == 1 and "no Batch API" in said[0] and "--batch" in said[0] and url in said[0], said
    assert (tmp_path / "run" / "manifest.json").is_file()


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--llm", "test", "--batch"], "--llm openai"),
        (["--llm", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--batch", "--shards", "2"],
         "--shards"),
        (["--llm", "test", "--batch-deadline", "5"], "add --batch"),
        (["--llm", "openai", "--base-url", "http://127.0.0.1:9/v1,http://127.0.0.1:10/v1", "--model", "m", "--batch"],
         "one --base-url"),
    ],
)  # fmt: skip
def test_a_batch_that_cannot_be_is_refused_in_one_line(extra: list[str], named: str, tmp_path: Path):
    result = command("none", "run", "debate", *extra, "--out", str(tmp_path / "run"))
    said = told(result.stderr)
    assert result.returncode == 2, result.stderr
    assert len(said) == 1 and named in said[0], said
    assert not (tmp_path / "run").exists()


async def test_calls_that_come_together_go_as_one_batch_and_lines_that_are_no_requests_fail_it(served):
    server, _ = served
    endpoint = OpenAICompatibleLLM("test-served", base_url=server.url, max_retries=0)
    llm = BatchedLLM(endpoint)
    answers: dict[int, str] = {}

    async def ask(n: int) -> None:
        request = LLMRequest(messages=[{"role": "user", "content": f"question {n % 7}"}], role=f"r{n}", action="a")
        answers[n] = (await llm.complete(request)).text

    async with anyio.create_task_group() as tg:
        for n in range(40):
            tg.start_soon(ask, n)
    assert llm.batches == 1 and len(answers) == 40
    alone = TestLLM(0)
    for n in (0, 7, 39):  # the server hears the messages only (no role)
        request = LLMRequest(messages=[{"role": "user", "content": f"question {n % 7}"}])
        assert answers[n] == (await alone.complete(request)).text, "each line answered as the call alone"
    await endpoint.aclose()

    line = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
    wrong = b'{"custom_id": "b", "method": "GET", "url": "/v1/x", "body": {}}\n'
    lines, errors = requests_in(line + b"not json\n" + line + wrong)
    assert [line["custom_id"] for line in lines] == ["a"]
    assert [e["line"] for e in errors] == [2, 3, 4] and "used twice" in errors[1]["message"]
    client = openai.OpenAI(base_url=server.url, api_key="x")
    bad = client.files.create(file=("bad.jsonl", b"not json\n"), purpose="batch")
    failed = client.batches.create(input_file_id=bad.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert failed.status == "failed" and failed.errors is not None and failed.errors.data[0].line == 1
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        client.batches.create(input_file_id=bad.id, endpoint="/v1/chat/completions", completion_window="1h")  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch-none")


async def test_a_pending_batch_the_server_no_longer_knows_is_sent_again(served, tmp_path: Path):
    from metaroles.llm.cassette import request_key

    server, _ = served
    request = LLMRequest(messages=[{"role": "user", "content": "still there?"}])
    journal = tmp_path / "batches.json"
    journal.write_text(json.dumps({"pending": {"batch-gone": [f"{request_key(request, 'test-served')}-0"]}}))
    endpoint = OpenAICompatibleLLM("test-served", base_url=server.url, max_retries=0)
    llm = BatchedLLM(endpoint, journal=journal)
    answer = await llm.complete(request)
    await endpoint.aclose()
    assert answer.text == (await TestLLM(0).complete(request)).text
    assert llm.batches == 1 and not journal.exists(), "sent again, and nothing is pending"


async def test_a_task_that_never_waits_does_not_hold_the_batch_back(served):
    server, _ = served
    endpoint = OpenAICompatibleLLM("test-served", base_url=server.url, max_retries=0)
    llm, done, answers = BatchedLLM(endpoint, gather=0.05), anyio.Event(), []

    async def busy() -> None:  # always ready to run: the run is never still
        while not done.is_set():
            await anyio.lowlevel.checkpoint()

    async def ask(n: int) -> None:
        answers.append(await llm.complete(LLMRequest(messages=[{"role": "user", "content": f"q{n}"}])))

    async with anyio.create_task_group() as tg:
        tg.start_soon(busy)
        async with anyio.create_task_group() as asking:
            for n in range(3):
                asking.start_soon(ask, n)
        done.set()
    await endpoint.aclose()
    assert len(answers) == 3 and llm.batches == 1


def test_a_cancelled_batch_keeps_what_was_answered_and_ends(served):
    server, gate = served
    assert server.jobs is not None and server.portal is not None
    client = openai.OpenAI(base_url=server.url, api_key="x")
    line = {"method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "hi"}]}}
    data = "".join(json.dumps({"custom_id": f"c{n}", **line}) + "\n" for n in range(3)).encode()
    gate.open.clear()  # nothing is answered before the cancel
    uploaded = client.files.create(file=("in.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "in_progress" and batch.request_counts.total == 3
    assert client.batches.cancel(batch.id).status == "cancelling"
    ended = server.portal.call(server.jobs.ended, batch.id)
    assert ended["status"] == "cancelled" and ended["output_file_id"] is None and ended["cancelled_at"]
    assert client.batches.list().data[0].id == batch.id
    assert client.files.retrieve(uploaded.id).bytes == len(data) and client.files.content(uploaded.id).read() == data
