"""LongtermMemory on a role: watched messages persist, come back on resume, similar news is dropped."""

import logging
from collections.abc import Sequence

import pytest

from metaroles import Action, Environment, EnvironmentState, Message, Role
from metaroles.longterm.embedding import HashingEmbedding
from metaroles.longterm.memory import LongtermMemory

pytest.importorskip("llama_index.vector_stores.faiss", reason="needs metaroles[memory]")
from metaroles.longterm.storage import MemoryStorage


class Note(Action):
    async def run(self, history: Sequence[Message]) -> str:
        return f"noted: {history[-1].content}"


class Other(Action):
    pass


def archivist(tmp_path, **kw: object) -> Role:
    storage = MemoryStorage(HashingEmbedding(), root=tmp_path / "ltm")
    return Role(name="archivist", actions=[Note], long_term=storage, **kw)  # type: ignore[arg-type]


async def test_only_watched_messages_go_to_long_term_storage(tmp_path):
    role = archivist(tmp_path)
    assert isinstance(role.rc.memory, LongtermMemory)
    await role.run("the harbour opens at dawn")
    role.put_message(Message("unwatched chatter", cause_by=Other))
    await role.run()
    storage = role.rc.memory.memory_storage
    assert [m.content for m in storage.messages.values()] == ["the harbour opens at dawn"]
    assert len(role.rc.memory) == 3, "short-term memory keeps everything, as before"
    assert storage.search_scored("when does the harbour open", k=1)[0][0].content == "the harbour opens at dawn"


async def test_watch_changes_reach_the_long_term_memory(tmp_path):
    role = archivist(tmp_path)
    role._watch([Other])
    role.put_message(Message("now watched", cause_by=Other))
    await role.run()
    assert [m.content for m in role.rc.memory.memory_storage.messages.values()] == ["now watched"]


async def test_news_too_similar_to_what_is_known_is_dropped_and_logged(tmp_path, caplog):
    role = archivist(tmp_path, similarity_threshold=0.95)
    await role.run("the bridge is closed for repairs")
    caplog.set_level(logging.INFO, logger="metaroles.longterm.memory")
    again = Message("The bridge is closed for repairs!")
    assert await role.run(again) is None, "a near-duplicate is not news"
    assert again in role.rc.memory, "but it is remembered"
    assert "dropped news" in caplog.text
    fresh = await role.run("the ferry leaves at noon")
    assert fresh is not None and fresh.content == "noted: the ferry leaves at noon"


async def test_long_term_memory_is_saved_with_the_run_and_comes_back_on_resume(tmp_path):
    env = Environment()
    env.add_role(archivist(tmp_path))
    env.publish_message(Message("the lighthouse keeper is called Mara"))
    await env.run(2)
    text = env.state_dict().model_dump_json()
    assert (tmp_path / "ltm" / "archivist" / "messages.jsonl").exists()

    resumed = Environment()
    role = archivist(tmp_path)
    resumed.add_role(role)
    resumed.load_state(EnvironmentState.model_validate_json(text))
    storage = role.rc.memory.memory_storage
    assert (
        storage.search_scored("who keeps the lighthouse", k=1)[0][0].content == "the lighthouse keeper is called Mara"
    )
    assert role.get_memories()[0].content == "the lighthouse keeper is called Mara"


def test_recover_memory_fills_short_term_memory(tmp_path):
    storage = MemoryStorage(HashingEmbedding(), root=tmp_path)
    storage.role_id = "r"
    storage.add(Message("kept"))
    storage.persist()
    memory = LongtermMemory(MemoryStorage(HashingEmbedding(), root=tmp_path))
    assert [m.content for m in memory.recover_memory("r")] == ["kept"]
    assert memory.msg_from_recovery and [m.content for m in memory.get()] == ["kept"]
    memory.clear()
    assert len(memory) == 0 and memory.memory_storage.messages == {}
