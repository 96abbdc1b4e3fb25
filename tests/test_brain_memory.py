"""BrainMemory with a file store and a real redis-server on 127.0.0.1."""

import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from metaroles import ChatRole, Message, ScriptedLLM
from metaroles.longterm.brain import BrainMemory
from metaroles.longterm.stores import FileStore, RedisStore

pytest.importorskip("redis", reason="needs metaroles[redis]")

KEY = BrainMemory.to_redis_key("assistant", "alice", "chat-1")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RedisServer:
    port: int
    workdir: Path
    process: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        exe = shutil.which("redis-server")
        assert exe, "redis-server is missing: `make test` installs it (apt-get install -y redis-server)"
        args = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen([*args, "--dir", str(self.workdir)], stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        for line in self.process.stdout:  # wait on the server's own word, not on a timer
            if "Ready to accept connections" in line:
                return
        raise AssertionError(f"redis-server exited with {self.process.wait()}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(free_port(), tmp_path)
    server.start()
    yield server
    server.stop()


def talk() -> BrainMemory:
    memory = BrainMemory()
    memory.add_talk(Message("What is the capital of France?"))
    memory.add_answer(Message("Paris."))
    memory.add_knowledge(Message("The user lives in Lyon."))
    return memory


async def test_redis_dumps_and_loads_with_a_ttl(redis_server, tmp_path):
    store = RedisStore(redis_server.url, fallback=FileStore(tmp_path / "files"))
    memory = talk()
    assert await memory.dumps(store, KEY, ttl=600)
    assert not await memory.dumps(store, KEY), "nothing changed since: nothing written"
    loaded = await BrainMemory.loads(store, KEY)
    assert [(m.role, m.content) for m in loaded.history] == [
        (ChatRole.USER, "What is the capital of France?"),
        (ChatRole.ASSISTANT, "Paris."),
    ]
    assert loaded.get_knowledge() == "The user lives in Lyon." and not loaded.is_dirty
    assert 0 < await store._client.ttl(KEY) <= 600
    assert not (tmp_path / "files").exists(), "the fallback is untouched while Redis answers"
    await store.aclose()


async def test_redis_down_falls_back_to_files_and_the_newer_copy_wins_when_it_returns(redis_server, tmp_path):
    store = RedisStore(redis_server.url, fallback=FileStore(tmp_path / "files"), timeout=0.5)
    first = talk()
    await first.dumps(store, KEY)
    redis_server.stop()

    offline = first
    offline.add_talk(Message("And of Italy?"))
    with pytest.warns(UserWarning, match="unreachable .* kept 'assistant:alice:chat-1' in the file store"):
        await offline.dumps(store, KEY)
    with pytest.warns(UserWarning, match="read 'assistant:alice:chat-1' from the file store"):
        during = await BrainMemory.loads(store, KEY)
    assert during.last_talk == "And of Italy?" and len(during.history) == 3

    redis_server.start()
    await store._client.connection_pool.disconnect()
    after = await BrainMemory.loads(store, KEY)
    assert len(after.history) == 3, "the newer file copy wins over Redis's older one"
    raw = await store._client.get(KEY)
    assert raw is not None and b"And of Italy?" in raw, "and is written back to Redis"
    await store.aclose()


async def test_file_store_is_the_default_kind_of_store_and_writes_atomically(tmp_path):
    store = FileStore(tmp_path / "brain")
    await talk().dumps(store, KEY, ttl=None)
    assert (await BrainMemory.loads(store, KEY)).get_knowledge() == "The user lives in Lyon."
    assert [p.name for p in (tmp_path / "brain").iterdir()] == ["assistant%3Aalice%3Achat-1.json"]
    await store.set("expired", "x", ttl=-1)
    assert await store.get("expired") is None
    assert (await BrainMemory.loads(store, "missing")).history == []


def test_add_talk_does_not_mutate_the_callers_message():
    message = Message("hello", role="assistant")
    memory = BrainMemory()
    memory.add_talk(message)
    assert message.role is ChatRole.ASSISTANT and memory.history[0].role is ChatRole.USER
    assert memory.is_dirty and memory.last_history_id == message.id


async def test_compress_history_summarises_past_the_bound_with_a_scripted_model():
    llm = ScriptedLLM({"BrainMemory": {"summarise": ["Alice asked about capitals; Paris and Rome were named."]}})
    memory = BrainMemory()
    for i in range(5):
        memory.add_talk(Message(f"question {i}"))
        memory.add_answer(Message(f"answer {i}"))
    assert not await memory.compress_history(llm, max_messages=10)
    memory.add_talk(Message("one more"))
    assert await memory.compress_history(llm, max_messages=10)
    assert memory.historical_summary == "Alice asked about capitals; Paris and Rome were named."
    assert memory.history == [] and memory.is_dirty
    assert "user: question 0" in llm.calls[0].request.messages[0]["content"]


async def test_a_summary_that_grows_too_long_is_summarised_again():
    long_summary = "detail " * 400
    llm = ScriptedLLM({"BrainMemory": {"summarise": [long_summary, "short again"]}})
    memory = BrainMemory(historical_summary="earlier things")
    for i in range(12):
        memory.add_talk(Message(f"q{i}"))
    assert await memory.compress_history(llm, max_messages=10, max_summary_tokens=100)
    assert memory.historical_summary == "short again"
    assert len(llm.calls) == 2 and "summary: detail" in llm.calls[1].request.messages[0]["content"]
    assert "summary: earlier things" in llm.calls[0].request.messages[0]["content"]


async def test_a_roles_brain_memory_is_saved_with_the_run_and_comes_back():
    from metaroles import Environment, EnvironmentState, Role

    env = Environment()
    env.add_role(Role(name="assistant", brain_memory=talk()))
    text = env.state_dict().model_dump_json()
    resumed = Environment()
    role = Role(name="assistant")
    resumed.add_role(role)
    resumed.load_state(EnvironmentState.model_validate_json(text))
    assert role.brain_memory is not None
    assert role.brain_memory.last_talk == "What is the capital of France?"
    assert role.brain_memory.get_knowledge() == "The user lives in Lyon."
