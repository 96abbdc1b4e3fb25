"""What a MetaGPT or OpenManus user relies on: prompts from the role, assignments that normalise, the seeds' names."""

import json
import warnings

import pytest
from pydantic import BaseModel

from metaroles import (
    Action,
    AgentStateError,
    ConfigError,
    Environment,
    FunctionLLM,
    InvalidValueError,
    Memory,
    Message,
    MessageQueue,
    PortingNote,
    PriorityMessageQueue,
    PythonExecute,
    Role,
    RunError,
    Terminate,
)
from metaroles.longterm.brain import BrainMemory
from metaroles.longterm.stores import FileStore


class WriteCode(Action):
    instruction = "Write the code."


class Review(Action):
    instruction = "Review the last message."


def recording_llm(seen):
    def answer(request):
        seen.append(request)
        return "fine"

    return FunctionLLM(answer)


# -- 5. profile, goal and constraints reach the model ------------------------------------------------


async def test_profile_goal_and_constraints_become_the_system_message():
    seen = []
    env = Environment(seed=1)
    llm = recording_llm(seen)
    env.add_roles(
        [
            Role(
                name="ann",
                profile="Strict reviewer",
                goal="find bugs",
                constraints="be brief",
                actions=[Review],
                llm=llm,
            ),
            Role(name="bob", profile="Kind reviewer", actions=[Review], llm=llm),
        ]
    )
    env.publish_message(Message("def f(): pass"))
    await env.run(1)
    systems = {r.role: r.messages[0] for r in seen}
    assert systems["ann"] == {
        "role": "system",
        "content": "You are a Strict reviewer, named ann. Your goal is find bugs. The constraint is be brief.",
    }
    assert systems["bob"] == {"role": "system", "content": "You are a Kind reviewer, named bob."}
    assert seen[0].messages != seen[1].messages, "two profiles never send byte-identical requests"


async def test_an_action_overrides_the_system_prompt_and_system_msgs_replace_it():
    seen = []

    class Terse(Action):
        system_prompt = "Answer in one word."

    role = Role(name="r", profile="Poet", actions=[Terse], llm=recording_llm(seen))
    await role.actions[0].aask("hi")
    await role.actions[0].aask("hi", system_msgs=["Be a pirate."])
    assert [r.messages[0]["content"] for r in seen] == ["Answer in one word.", "Be a pirate."]
    plain = Role(name="p", profile="Poet", actions=[Review], llm=recording_llm(seen))
    assert await plain.actions[0]._aask("hi") == "fine", "MetaGPT's _aask is aask"
    assert seen[-1].messages[0]["content"] == "You are a Poet, named p."


# -- 6. assignments normalise or fail loudly ------------------------------------------------------------


async def test_send_to_a_name_routes_to_that_role_not_to_its_letters():
    env = Environment(seed=2)
    env.add_roles([Role(name="Bob"), Role(name="B")])
    message = Message("for Bob", sent_from="me")
    message.send_to = "Bob"
    assert message.send_to == frozenset({"Bob"})
    env.publish_message(message)
    assert [m.id for m in env.get_role("Bob").rc.msg_buffer.peek_all()] == [message.id]
    assert env.get_role("B").rc.msg_buffer.empty()
    with pytest.raises(InvalidValueError, match="send_to=42"):
        message.send_to = 42
    assert message.send_to == frozenset({"Bob"}), "a refused assignment changes nothing"


async def test_cause_by_a_class_stores_its_id_so_watchers_see_it_and_the_state_saves(tmp_path):
    class Watcher(Role):
        pass

    env = Environment(seed=3)
    watcher = Watcher(name="w", watch=[WriteCode])
    env.add_role(watcher)
    message = Message("code", sent_from="dev")
    message.cause_by = WriteCode
    assert message.cause_by == WriteCode.action_id()
    env.publish_message(message)
    await watcher._observe()
    assert [m.id for m in watcher.rc.news] == [message.id]
    env.save(tmp_path / "state.json")  # a class in cause_by made this fail
    assert json.loads((tmp_path / "state.json").read_text())["history"][0]["cause_by"] == WriteCode.action_id()
    with pytest.raises(InvalidValueError, match="cause_by=3"):
        message.cause_by = 3


def test_watch_and_get_by_actions_take_one_action_id_as_one():
    role = Role(name="r", watch="pkg.WriteCode")
    assert role.rc.watch == {"pkg.WriteCode"}
    memory = Memory([Message("a", cause_by="pkg.A"), Message("b", cause_by="pkg.B"), Message("c", cause_by="pkg.A")])
    assert [m.content for m in memory.get_by_actions("pkg.A")] == ["a", "c"]
    assert [m.content for m in memory.get_by_actions(["pkg.B", "pkg.A"])] == ["a", "b", "c"]
    assert memory.get_by_actions(WriteCode) == []
    with pytest.raises(InvalidValueError, match="not an action"):
        memory.get_by_actions(7)


async def test_a_message_a_custom_act_returns_without_a_sender_is_signed_by_the_role():
    class Custom(Role):
        async def _act(self):
            return Message("made by hand", send_to="listener")

    env = Environment(seed=4)
    env.add_roles([Custom(name="maker", actions=[Review]), Role(name="listener", watch=[])])
    env.publish_message(Message("go", send_to="maker"))
    await env.run(1)
    (sent,) = [m for m in env.history.storage if m.content == "made by hand"]
    assert sent.sent_from == "maker"
    assert env.get_role("listener").rc.msg_buffer.peek_all()[0].sent_from == "maker"


# -- 7. the seeds' names ----------------------------------------------------------------------------------


def test_message_role_given_a_profile_keeps_it_as_metadata_with_one_note():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        message = Message("PRD ready", role="Product Manager")
        kept = Message("x", role="Engineer", sent_from="alex")
    assert (message.role.value, message.sent_from, message.metadata) == ("user", "", {"profile": "Product Manager"})
    assert (kept.sent_from, kept.metadata) == ("alex", {"profile": "Engineer"})
    assert [type(w.message) for w in caught] == [PortingNote, PortingNote]
    assert "metadata['profile']" in str(caught[0].message)
    assert Memory([message, kept, Message("y")]).get_by_role("Engineer") == [kept]  # found by the profile
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Message("x", role="assistant")  # a chat role: no note


def test_message_queue_dump_is_text_and_load_takes_it_back():
    queue = MessageQueue([Message("a", sent_from="x"), Message("b", send_to="y")])
    text = queue.dump()
    assert isinstance(text, str) and json.loads(text)[0]["content"] == "a"
    back = MessageQueue.load(text)
    assert [m.content for m in back.pop_all()] == ["a", "b"]
    priority = PriorityMessageQueue()
    priority.push(Message("late"), priority=5)
    priority.push(Message("soon"), priority=1)
    assert [m.content for m in PriorityMessageQueue.load(priority.dump()).pop_all()] == ["soon", "late"]
    with pytest.raises(InvalidValueError, match="not a dumped message queue"):
        MessageQueue.load("[{")


def test_memory_index_answers_an_empty_list_for_an_unknown_action():
    memory = Memory([Message("a", cause_by="pkg.A")])
    assert memory.index["pkg.Nothing"] == []
    assert [m.content for m in memory.index["pkg.A"]] == ["a"]
    assert "pkg.Nothing" not in memory.index and len(memory.index) == 1


def test_environment_get_roles_and_role_names():
    env = Environment()
    env.add_roles([Role(name="a"), Role(name="b")])
    assert env.role_names() == ["a", "b"]
    assert list(env.get_roles()) == ["a", "b"] and env.get_roles()["b"] is env.get_role("b")


async def test_brain_memory_history_text_and_set_history_summary(tmp_path):
    store = FileStore(tmp_path)
    brain = BrainMemory()
    brain.add_talk(Message("hello"))
    brain.add_answer(Message("hi there"))
    assert brain.history_text == "user: hello\nassistant: hi there"
    await brain.set_history_summary("they greeted", store, "k")
    assert (brain.history, brain.historical_summary) == ([], "they greeted")
    assert brain.history_text == "summary: they greeted"
    assert (await BrainMemory.loads(store, "k")).historical_summary == "they greeted"


async def test_terminate_takes_a_free_text_status():
    assert "all three files written" in await Terminate()(status="all three files written")


async def test_python_execute_takes_a_timeout_per_call(tmp_path):
    tool = PythonExecute(workdir=tmp_path, timeout=30)
    result = await tool.execute(code="while True: pass", timeout=0.5)
    assert result.error and "timed out after 0.5s" in result.error
    assert (await tool.execute(code="print(2 + 2)", timeout=10)).output.strip() == "4"
    with pytest.raises(InvalidValueError, match="timeout=600"):
        await tool.execute(code="print(1)", timeout=600)


def test_assistant_message_keeps_no_content_and_to_dict_omits_it():
    message = Message.assistant_message()
    assert message.content is None
    assert message.to_dict() == {"role": "assistant"}
    assert Message.load(message.dump()).content is None
    assert Message.user_message("hi").to_dict() == {"role": "user", "content": "hi"}
    assert str(message) == "assistant: "


def test_our_exceptions_are_the_builtins_the_seeds_raise():
    assert issubclass(InvalidValueError, ValueError) and issubclass(ConfigError, ValueError)
    assert issubclass(AgentStateError, RuntimeError) and issubclass(RunError, RuntimeError)
    with pytest.raises(ValueError, match="send_to"):
        Message("x", send_to=3)


# -- 12. damaged files say which and keep what was there --------------------------------------------------


async def test_a_truncated_brain_memory_file_is_kept_aside_with_a_warning(tmp_path):
    store = FileStore(tmp_path)
    brain = BrainMemory()
    brain.add_talk(Message("remember me"))
    await brain.dumps(store, "chat")
    (path,) = tmp_path.glob("*.json")
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.warns(UserWarning, match="damaged entry for key 'chat'"):
        loaded = await BrainMemory.loads(store, "chat")
    assert loaded.history == []
    aside = path.with_name(path.name + ".damaged")
    assert aside.read_bytes() == whole[: len(whole) // 2], "the damaged bytes are kept, not overwritten"
    loaded.add_talk(Message("new"))
    await loaded.dumps(store, "chat")
    assert aside.exists() and path.exists()


async def test_a_brain_memory_that_does_not_validate_names_its_key(tmp_path):
    store = FileStore(tmp_path)
    await store.set("chat", '{"history": [1, 2]}')
    with pytest.raises(ConfigError, match="key 'chat' is damaged"):
        await BrainMemory.loads(store, "chat")
    assert await store.get("chat") == '{"history": [1, 2]}'


def test_an_output_model_class_is_kept_as_instruct_content_type():
    class Note(BaseModel):
        text: str

    message = Message("n", instruct_content=Note(text="t"))
    message.role = "assistant"
    assert message.role.value == "assistant"
    with pytest.warns(PortingNote, match="'Engineer' is not a chat role"):  # as the constructor takes a profile
        message.role = "Engineer"
    assert (message.role.value, message.sent_from, message.metadata["profile"]) == ("user", "", "Engineer")
    with pytest.raises(InvalidValueError, match="not a chat role"):
        message.role = 3


async def test_a_truncated_state_file_names_itself_and_loads_nothing(tmp_path):
    from metaroles.core.exceptions import RunDirCorrupt

    env = Environment(seed=5)
    env.add_role(Role(name="a"))
    env.publish_message(Message("hi"))
    await env.run(1)
    path = tmp_path / "state.json"
    env.save(path)
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    fresh = Environment()
    fresh.add_role(Role(name="a"))
    with pytest.raises(RunDirCorrupt, match=r"state.json: not a whole saved state \(Invalid JSON"):
        fresh.load(path)
    assert (fresh.round, len(fresh.history)) == (0, 0), "nothing was loaded"
    path.write_bytes(whole)
    fresh.load(path)
    assert fresh.round == 1
