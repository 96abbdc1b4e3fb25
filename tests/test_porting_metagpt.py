"""MetaGPT and OpenManus bus-layer code, and tests in their idiom, run with only the imports changed.

Each test is written as MetaGPT's or OpenManus' own tests exercise the same behaviour: pydantic
round trips, ``Field`` class defaults, ``Team.serialize``/``deserialize`` mid-run, class-level
agent configuration. ``tests/ported_tutorial.py`` and ``tests/ported_manus.py`` are MetaGPT's
tutorial team and an OpenManus-style agent with only their import lines changed.
"""

import json
import subprocess
import sys
import warnings

import pytest
from pydantic import BaseModel, Field, SerializeAsAny

from metaroles import (
    Action,
    ActionOutput,
    AIMessage,
    ChatMemory,
    ChatRole,
    CLIResult,
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
    ScriptedLLM,
    SystemMessage,
    Team,
    TestLLM,
    ToolResult,
    UserMessage,
    UserRequirement,
    any_to_name,
    any_to_str,
)
from metaroles.longterm.brain import BrainMemory
from metaroles.longterm.embedding import HashingEmbedding
from metaroles.longterm.storage import MemoryStorage
from tests import ported_manus, ported_tutorial

pytestmark = pytest.mark.filterwarnings("ignore::metaroles.PortingNote")


class ActionOK(Action):
    name: str = "ActionOK"
    i_context: str = ""

    async def run(self, history):
        return "ok"


class ActionRaise(Action):
    name: str = "ActionRaise"


class RoleA(Role):
    name: str = Field(default="RoleA")
    profile: str = Field(default="Role A")
    goal: str = "RoleA's goal"
    constraints: str = "RoleA's constraints"
    code_text: str = ""
    todo_list: list[str] = Field(default_factory=list)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.set_actions([ActionOK])
        self._watch([UserRequirement, ActionRaise])


class RoleB(RoleA):
    name: str = Field(default="RoleB")


# -- declaring a role ------------------------------------------------------------------------------


def test_field_class_defaults_and_declared_fields_build_a_role():
    role = RoleA(desc="a role", code_text="print(1)", recovered=True)
    assert (role.name, role.profile, role.goal, role.desc) == ("RoleA", "Role A", "RoleA's goal", "a role")
    assert role.code_text == "print(1)" and role.recovered
    first, second = RoleA(), RoleA()
    first.todo_list.append("x")
    assert second.todo_list == []  # a default_factory gives each role its own list
    assert role.is_watch(ActionRaise) and role.is_watch(UserRequirement) and not role.is_watch(ActionOK)
    assert role.action_description == "ActionOK"
    with pytest.raises(InvalidValueError, match=r"unknown argument\(s\) \['colour'\]; declare them"):
        RoleA(colour="red")


async def test_think_and_act_are_the_exported_steps():
    role = RoleA(llm=TestLLM())
    role.put_message(None)  # nothing, as MetaGPT's
    assert role.rc.msg_buffer.empty()
    role.put_message(Message("go"))
    todo = await role.think()
    assert isinstance(todo, ActionOK) and role.rc.todo is todo
    output = await role.act()
    assert isinstance(output, ActionOutput) and output.content == "ok"


async def test_run_joins_a_list_of_strings():
    role = RoleA()
    answer = await role.run(["line one", "line two"])
    assert answer is not None and answer.content == "ok"
    assert role.get_memories()[0].content == "line one\nline two"


# -- serialization -------------------------------------------------------------------------------


def test_role_dump_rebuilds_the_role_with_its_memory_and_buffer():
    role = RoleB(code_text="x")
    role.rc.memory.add(Message("remembered"))
    role.put_message(Message("buffered"))
    data = role.model_dump()
    assert {"name", "states", "actions", "memory", "buffer"} <= data.keys()
    again = RoleB(**data)
    assert again.code_text == "x" and isinstance(again.actions[0], ActionOK)
    assert [m.content for m in again.rc.memory.get()] == ["remembered"]
    assert [m.content for m in again.rc.msg_buffer.peek_all()] == ["buffered"]
    rebuilt = Role.model_validate(json.loads(role.model_dump_json()))  # the class the dump names
    assert type(rebuilt) is RoleB and rebuilt.model_dump(mode="json") == role.model_dump(mode="json")


def test_roles_in_a_users_pydantic_model_round_trip_as_their_own_classes():
    class Company(BaseModel):
        roles: list[SerializeAsAny[Role]] = []
        action: SerializeAsAny[Action] | None = None

    company = Company(roles=[RoleA(code_text="a"), RoleB()], action=ActionOK(i_context="ctx"))
    again = Company.model_validate_json(company.model_dump_json())
    assert [type(r) for r in again.roles] == [RoleA, RoleB] and again.roles[0].code_text == "a"
    assert type(again.action) is ActionOK and again.action.i_context == "ctx"


def test_a_dump_naming_a_class_that_is_not_a_role_is_refused():
    with pytest.raises(InvalidValueError, match="not a Role"):
        Role.model_validate({**RoleA().model_dump(), "cls": f"{__name__}.ActionOK"})
    with pytest.raises(InvalidValueError, match="not defined in this process"):
        Role.model_validate({"cls": "nowhere.Ghost"})


def test_memory_dump_rebuilds_it_and_get_by_role_finds_a_ported_profile():
    memory = Memory()
    memory.add_batch([Message("write a snake game", role="Boss", cause_by=UserRequirement), Message("x")])
    again = Memory(**memory.model_dump())
    assert again.count() == 2 and again.storage[0].cause_by == any_to_str(UserRequirement)
    assert [m.content for m in again.get_by_role("Boss")] == ["write a snake game"]
    assert [m.content for m in again.get_by_role("user")] == ["write a snake game", "x"]
    with pytest.raises(InvalidValueError, match="not a Message"):
        memory.add("text")  # type: ignore[arg-type]
    assert memory.count() == 2


def test_environment_dump_rebuilds_roles_history_and_round():
    env = Environment(desc="a company", seed=5)
    env.add_roles([RoleA(), RoleB()])
    assert env.publish_message(Message("test env serialize")) is True
    assert env.get_role("nobody") is None
    data = env.model_dump()
    assert len(data["roles"]) == 2
    again = Environment(**data)
    assert list(again.roles) == ["RoleA", "RoleB"] and type(again.get_role("RoleB")) is RoleB
    assert [m.content for m in again.history] == ["test env serialize"]
    assert again.model_dump(mode="json") == env.model_dump(mode="json")


async def _transcript_after(rounds: int, stg_path=None, *, split: int | None = None) -> list[tuple[str, str, str]]:
    team = Team(llm=TestLLM(seed=2), env=Environment(seed=9))
    team.hire([ported_tutorial.SimpleCoder(), ported_tutorial.SimpleTester(), ported_tutorial.SimpleReviewer()])
    team.run_project("write a function that calculates the product of a list")
    if split is None:
        await team.run(n_round=rounds)
    else:
        await team.run(n_round=split)
        team.serialize(stg_path)
        team = Team.deserialize(stg_path, llm=TestLLM(seed=2))
        await team.run(n_round=rounds - split)
    return [(m.id, m.sent_from, m.content or "") for m in team.env.history]


async def test_a_team_saved_mid_run_continues_to_the_same_transcript(tmp_path):
    whole = await _transcript_after(5)
    assert await _transcript_after(5, tmp_path / "team", split=2) == whole
    assert (tmp_path / "team" / "team.json").is_file()
    senders = [sender for _, sender, _ in whole]
    assert {"Alice", "Bob", "Charlie"} <= set(senders)  # the tester's ported Message(role=profile) is signed by Bob


def test_team_serialize_gives_the_same_bytes_in_another_process(tmp_path):
    script = (
        "import anyio, functools, sys; from tests.test_porting_metagpt import _transcript_after; "
        "anyio.run(functools.partial(_transcript_after, 5, sys.argv[1], split=3))"
    )
    for folder in ("a", "b"):
        subprocess.run([sys.executable, "-c", script, str(tmp_path / folder)], check=True)
    assert (tmp_path / "a" / "team.json").read_bytes() == (tmp_path / "b" / "team.json").read_bytes()


def test_deserialize_without_a_saved_team_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"team\.json does not exist"):
        Team.deserialize(tmp_path)


# -- messages -------------------------------------------------------------------------------------


def test_messages_take_metagpt_forms():
    with pytest.warns(PortingNote, match=r"\['x'\], which are no fields"):
        assert Message(content="a", x="d").content == "a"
    message = Message("a", role="v1")
    message.role = "v2"
    assert message.role.value == "user" and message.metadata["profile"] == "v2"
    with pytest.warns(PortingNote, match="not a dumped message"):
        assert Message.load("{") is None

    class Plain:
        pass

    assert any_to_str(Plain) == f"{__name__}.{Plain.__qualname__}"
    assert (UserMessage("u").role, SystemMessage("s").role, AIMessage("a").role) == ("user", "system", "assistant")
    value = Message.create_instruct_value({"field3": "v3", "field4": ["a", "b"]}, "code")
    assert value.model_dump() == {"field3": "v3", "field4": ["a", "b"]}
    dumped = {"class": "code", "mapping": {"field3": "(<class 'str'>, Ellipsis)"}, "value": {"field3": "v"}}
    assert Message("c", instruct_content=dumped).instruct_content.field3 == "v"  # MetaGPT's dump form reads


async def test_message_queue_dump_may_be_awaited_and_loads_back():
    queue = MessageQueue([Message("one"), Message("two")])
    text = await queue.dump()
    assert text == queue.dump() and isinstance(text, str)
    assert [m.content for m in MessageQueue.load(text).pop_all()] == ["one", "two"]
    priority = PriorityMessageQueue()
    with pytest.raises(InvalidValueError, match=r"priority='high' .* is not a number"):
        priority.push(Message("x", metadata={"priority": "high"}))
    assert priority.empty()


def test_chat_memory_messages_is_the_live_list():
    memory = ChatMemory(max_messages=2)
    memory.messages.append(Message("a"))
    memory.add_messages([Message("b"), Message("c")])
    assert [m.content for m in memory.messages] == ["b", "c"]
    memory.messages = [Message("z")]
    assert [m.content for m in memory.messages] == ["z"]


# -- OpenManus ----------------------------------------------------------------------------------


async def test_an_openmanus_agent_keeps_its_class_level_configuration():
    agent = ported_manus.MathAgent()
    assert (agent.name, agent.max_steps, agent.max_observe) == ("MathAgent", 5, 2000)
    assert agent.system_prompt == ported_manus.SYSTEM_PROMPT
    assert agent.next_step_prompt == ported_manus.NEXT_STEP_PROMPT
    assert sorted(agent.available_tools.tool_map) == ["add_numbers", "python_execute", "terminate"]
    assert ported_manus.MathAgent().available_tools is not agent.available_tools
    script = {
        "MathAgent": {
            "think": [
                {"content": "Add them.", "tool_calls": [{"name": "add_numbers", "arguments": {"a": 2, "b": 3}}]},
                {"content": "It is 5.", "tool_calls": [{"name": "terminate", "arguments": {"status": "success"}}]},
            ]
        }
    }
    agent.llm = ScriptedLLM(script)
    await agent.run("What is 2 + 3?")
    tool_answers = [m.content for m in agent.messages if m.role.value == "tool"]
    assert tool_answers[0].endswith("5") and agent.state.value == "FINISHED"
    requests = agent.llm.requests if hasattr(agent.llm, "requests") else None
    assert requests is None or requests[0].messages[0]["content"] == ported_manus.SYSTEM_PROMPT


async def test_an_agent_without_a_model_says_to_pass_one():
    agent = ported_manus.MathAgent()
    with pytest.raises(Exception, match="pass llm="):
        await agent.run("1 + 1?")


def test_python_execute_needs_no_workdir_and_offers_a_timeout():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tool = PythonExecute(isolation="unsafe-guard")
    assert tool.workdir.is_dir()
    assert "timeout" in tool.to_param()["function"]["parameters"]["properties"]


def test_the_ported_tutorial_module_changed_only_import_lines():
    source = (ported_tutorial.__file__).replace(".pyc", ".py")
    text = open(source, encoding="utf-8").read()
    assert "from metaroles import Action, Message, Role, Team, UserRequirement" in text
    assert "metagpt" not in text.split('"""', 2)[2]


async def test_brain_memory_has_metagpts_helpers():
    brain = BrainMemory()
    assert not brain.is_history_available
    brain.add_talk(Message("hello there"))
    assert brain.exists("hello there") and not brain.exists("hello") and brain.is_history_available
    assert brain.pop_last_talk() == "hello there" and brain.pop_last_talk() is None
    assert (BrainMemory.to_int("12", 0), BrainMemory.to_int("x", 7), BrainMemory.to_int(None, 3)) == (12, 7, 3)
    assert BrainMemory.extract_info("[TALK]: hi") == ("TALK", "hi")
    assert BrainMemory.extract_info("hi") == (None, "hi")
    asked = []

    def answer(request):
        asked.append(request)
        return "FALSE" if "unrelated" in request.messages[-1]["content"] else f"TRUE <{request.action}>"

    llm = FunctionLLM(answer)
    assert await brain.is_related("the cat", "a cat sat", llm) is True
    assert await brain.is_related("the cat", "unrelated", llm) is False
    assert await brain.rewrite("it sat", "the cat", llm) == "TRUE <rewrite>"
    assert "the cat" in asked[-1].messages[-1]["content"] and asked[-1].messages[0]["role"] == "system"
    assert await brain.summarize(llm, max_words=20) == "TRUE <summarize>"
    assert "at most 20 words" in asked[-1].messages[-1]["content"]
    assert "hello there" in asked[-1].messages[-1]["content"]
    assert await brain.get_title(llm, max_words=4) == "TRUE <get_title>"
    assert "at most 4 words" in asked[-1].messages[-1]["content"]


async def test_memory_storage_search_similar_is_a_coroutine_giving_messages(tmp_path):
    storage = MemoryStorage(HashingEmbedding(dim=64), root=tmp_path)
    notes = [Message("the harbour opens at dawn"), Message("the market closes at noon")]
    for note in notes:
        storage.add(note)
    found = await storage.search_similar("when does the harbour open", k=1)
    assert found == [notes[0]] and isinstance(found[0], Message)
    assert [m for m, _ in storage.search_scored("when does the harbour open", k=1)] == found


# -- what MetaGPT's and OpenManus' own tests still tripped on -------------------------------------


class Made(BaseModel):
    a: int


class ActionMakes(Action):
    async def run(self, history):
        return ActionOutput("made", Made(a=1))


class ActionFails(Action):
    async def run(self, history):
        raise RuntimeError("parse error in ActionRaise")


async def test_an_action_returns_metagpts_action_output_and_takes_a_context():
    team = Team(llm=TestLLM())
    team.hire([Role(name="maker", actions=[ActionMakes(context=object())])])
    await team.run(n_round=1, idea="make")
    made = team.env.history.storage[-1]
    assert (made.content, made.instruct_content, made.sent_from) == ("made", Made(a=1), "maker")


async def test_a_role_raising_in_team_run_is_saved_and_recovered_as_metagpts_tests_do(tmp_path):
    team = Team(llm=TestLLM(), env=Environment(seed=1))
    team.hire([Role(name="ok", actions=[ActionOK]), Role(name="fails", actions=[ActionFails], watch=[ActionOK])])
    team.run_project("an idea")
    with pytest.raises(RuntimeError, match="parse error in ActionRaise"):  # MetaGPT's run swallows it: see porting.md
        await team.run(n_round=4)
    team.serialize(tmp_path / "team")  # what MetaGPT's Team.run does itself on an exception
    again = Team.deserialize(tmp_path / "team", llm=TestLLM())
    assert [m.content for m in again.env.history] == [m.content for m in team.env.history] == ["an idea", "ok"]
    assert again.env.round == team.env.round and list(again.env.roles) == ["ok", "fails"]
    assert type(again.env.role("fails").actions[0]) is ActionFails


def test_an_environment_takes_its_history_as_metagpts_memory_dump():
    memory = Memory([Message(f"m{i}") for i in range(25)])
    assert len(Environment(history=memory.model_dump()).history) == 25
    assert len(Environment(history=memory).history) == 25


def test_metagpts_small_helpers_and_forms():
    assert Message("c", instruct_content={"class": "Made", "a": 1}).instruct_content.a == 1
    env = Environment()
    env.add_roles([RoleA(), RoleB(profile="Role B")])
    assert list(env.get_roles()) == ["Role A", "Role B"] and env.get_role("Role B") is env.role("RoleB")
    assert any_to_name(ActionOK) == "ActionOK" and any_to_name("pkg.mod.WriteCode") == "WriteCode"
    result = CLIResult(output="ls")
    assert isinstance(result, ToolResult) and str(result) == "ls" and result
    tool = Message.tool_message("", name="bash", tool_call_id="1").to_dict()
    assert tool == {"role": "tool", "content": "", "name": "bash", "tool_call_id": "1"}
    text = '["' + Message("a").model_dump_json().replace('"', '\\"') + '"]'  # MetaGPT's dump: a list of texts
    assert [m.content for m in MessageQueue.load(text).pop_all()] == ["a"]


async def test_openmanus_agents_messages_add_in_place_and_chat_memory_refuses_bad_bounds():
    agent = ported_manus.MathAgent()
    agent.messages += [Message("one")]
    agent.messages += [Message("two")]
    assert [m.content for m in agent.messages] == ["one", "two"]
    with pytest.raises(ValueError, match="max_messages=0"):
        ChatMemory(max_messages=0)
    with pytest.raises(ValueError, match="n=-1"):
        ChatMemory().get_recent_messages(-1)


def test_a_team_saved_from_a_script_says_to_move_its_classes_into_a_module():
    class Comedian(Role):
        pass

    Comedian.__module__ = "__main__"
    dump = Environment(roles=[Comedian(name="c")]).model_dump()
    dump["roles"][0]["cls"] = "__main__.Comedian"
    with pytest.raises(InvalidValueError, match="move the classes into a module"):
        Environment(**dump)


# -- metaroles.compat.metagpt: MetaGPT's semantics where the native ones differ ------------------------


def test_compat_message_role_is_metagpts_free_string_and_dumps_in_metagpts_form():
    from metaroles.compat import metagpt

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PortingNote)
        msg = metagpt.Message("design", role="Architect", instruct_content=Made(a=1))
    assert msg.role == "Architect" and str(msg) == "Architect: design"
    assert msg.to_dict() == {"role": "user", "content": "design"}, "a model still gets a chat role"
    dumped = msg.model_dump()
    assert dumped["role"] == "Architect" and dumped["instruct_content"]["class"] == "Made"
    assert dumped["instruct_content"]["value"] == {"a": 1} and set(dumped["instruct_content"]["mapping"]) == {"a"}
    again = Message.model_validate(json.loads(json.dumps({**dumped, "role": "user"})))
    assert again.instruct_content.a == 1 and type(again.instruct_content).__name__ == "Made", "read back as the model"
    assert Message("x").role == ChatRole.USER, "the native message keeps its chat role"


def test_compat_environment_loads_a_metagpt_dump_with_its_history_and_writes_metagpts_class_key():
    from metaroles.compat import metagpt

    env = metagpt.Environment(roles=[RoleA()])
    dumped = env.model_dump(mode="json")
    assert all("__module_class_name" in role and "cls" not in role for role in dumped["roles"])
    history = Memory([Message(f"m{i}") for i in range(3)]).model_dump(mode="json")  # MetaGPT's Memory dump
    written = {**dumped, "roles": {r["name"]: r for r in dumped["roles"]}, "history": history,
               "member_addrs": {"Role A": ["Role A"]}, "context": {"kwargs": {}}}  # fmt: skip
    loaded = metagpt.Environment(**json.loads(json.dumps(written)))
    assert [m.content for m in loaded.history] == ["m0", "m1", "m2"] and type(loaded.role("RoleA")) is RoleA


async def test_compat_team_run_swallows_a_roles_exception_serializes_and_recovers_as_metagpts_tests_do(tmp_path):
    from metaroles.compat import metagpt

    team = metagpt.Team(llm=TestLLM(), env=Environment(seed=1), storage=tmp_path / "team")
    team.hire([Role(name="ok", actions=[ActionOK]), Role(name="fails", actions=[ActionFails], watch=[ActionOK])])
    history = await team.run(n_round=4, idea="an idea")  # MetaGPT's run: no exception reaches the caller
    assert [m.content for m in history] == ["an idea", "ok"]
    again = metagpt.Team.deserialize(tmp_path / "team", llm=TestLLM())
    assert [m.content for m in again.env.history] == ["an idea", "ok"] and list(again.env.roles) == ["ok", "fails"]
    assert type(again.env.role("fails").actions[0]) is ActionFails


async def test_the_idioms_a_port_meets_first_team_import_sent_from_self_and_a_list_of_messages():
    from metaroles.compat import metagpt
    from metaroles.team import Team as TeamFromPackage

    assert TeamFromPackage is Team
    seen: list[type] = []

    class Write(metagpt.Action):
        async def run(self, with_messages):
            seen.append(type(with_messages))
            with_messages.append(Message("extra"))  # a list of its own, as MetaGPT gives
            return f"written {len(with_messages)}"

    class Writer(Role):
        async def _act(self) -> Message:
            result = await self.rc.todo.run(self.rc.memory.get())
            return Message(result, sent_from=self, cause_by=Write)

    env = Environment()
    env.add_role(Writer(name="writer", actions=[Write]))
    env.publish_message(Message("go"))
    await env.run(1)
    (said,) = [m for m in env.history if m.sent_from == "writer"]
    assert said.content == "written 2" and seen == [list]
    with pytest.raises(InvalidValueError, match="must be the sending role"):
        Message("x", sent_from=3)
