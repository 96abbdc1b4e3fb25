import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import BaseModel

from metaroles import (
    Action,
    AgentState,
    ChatRole,
    Function,
    InvalidValueError,
    Message,
    PortingNote,
    Role,
    ToolCall,
    ToolChoice,
    UserRequirement,
    any_to_str,
)
from metaroles.core.schema import USER_REQUIREMENT


class WriteCode(Action):
    pass


class Plan(BaseModel):
    steps: list[str]
    done: bool = False


class Coder(Role):
    pass


def test_message_defaults_follow_metagpt():
    msg = Message("hi")
    assert msg.content == "hi"
    assert len(msg.id) == 32 and int(msg.id, 16) >= 0
    assert msg.role is ChatRole.USER
    assert msg.cause_by == USER_REQUIREMENT == UserRequirement.action_id()
    assert msg.send_to == frozenset({"<all>"})
    assert msg.sent_from == ""
    assert msg.metadata == {}
    assert msg.tool_calls is None and msg.tool_call_id is None and msg.name is None and msg.base64_image is None


def test_ids_are_unique():
    assert len({Message("x").id for _ in range(1000)}) == 1000


@pytest.mark.parametrize("cause_by", [WriteCode, WriteCode(), "tests.test_schema.WriteCode"])
def test_cause_by_normalises_class_instance_and_string(cause_by):
    assert Message("x", cause_by=cause_by).cause_by == "tests.test_schema.WriteCode"
    assert any_to_str(cause_by) == "tests.test_schema.WriteCode"


def test_cause_by_rejects_non_action_object_naming_it():
    with pytest.raises(InvalidValueError, match=r"cause_by=42 is not an Action"):
        Message("x", cause_by=42)
    assert Message("x", cause_by=int).cause_by == "builtins.int"  # MetaGPT's any_to_str names any class


def test_send_to_accepts_names_sets_and_roles():
    assert Message("x", send_to="bob").send_to == {"bob"}
    assert Message("x", send_to=["a", "b", "a"]).send_to == {"a", "b"}
    assert Message("x", send_to=Coder).send_to == {"tests.test_schema.Coder"}
    assert Message("x", send_to=Coder(name="ann")).send_to == {"ann"}
    assert Message("x", send_to={"<all>"}).send_to == {"<all>"}


@pytest.mark.parametrize("bad", [42, {"a": 1}, b"bob", [1], 3.5, object()])
def test_send_to_of_wrong_type_is_a_clear_error(bad):
    with pytest.raises(InvalidValueError, match=r"send_to=.* is not an address; pass a role name"):
        Message("x", send_to=bad)


@given(
    names=st.lists(st.sampled_from(["a", "b", "<all>", "", "r1"]), max_size=4),
    kind=st.sampled_from([set, frozenset, list, tuple]),
)
def test_send_to_collections_take_the_fast_path_to_the_same_result(names, kind):
    # a collection of plain names is taken as it is; anything else goes through the general checks
    if not names:
        with pytest.raises(InvalidValueError, match="send_to is empty"):
            Message("x", send_to=kind(names))
    elif "" in names:
        with pytest.raises(InvalidValueError, match="empty address"):
            Message("x", send_to=kind(names))
    else:
        assert Message("x", send_to=kind(names)).send_to == frozenset(names)
        assert Message("x", send_to=kind([*names, Coder])).send_to == {*names, "tests.test_schema.Coder"}


def test_empty_send_to_is_an_error():
    with pytest.raises(InvalidValueError, match="send_to is empty"):
        Message("x", send_to=[])


def test_unknown_chat_role_names_the_value_and_the_choices():
    with pytest.raises(InvalidValueError, match=r"role=3 is not a chat role; use one of .*'assistant'"):
        Message("x", role=3)
    with pytest.warns(PortingNote, match="'wizard' is not a chat role"):  # MetaGPT's profile: kept as metadata
        assert Message("x", role="wizard").metadata == {"profile": "wizard"}
    assert Message("x", role="tool").role is ChatRole.TOOL


def test_equality_and_hash_go_by_id():
    a = Message("same")
    b = Message("same")
    assert a != b
    twin = Message("different content", id=a.id)
    assert a == twin and hash(a) == hash(twin)
    assert len({a, b, twin}) == 2


def test_factories_set_chat_roles_and_fields():
    assert Message.user_message("u").role is ChatRole.USER
    assert Message.system_message("s").role is ChatRole.SYSTEM
    assert Message.assistant_message("a").role is ChatRole.ASSISTANT
    tool = Message.tool_message("42", name="calc", tool_call_id="call_1")
    assert (tool.role, tool.name, tool.tool_call_id) == (ChatRole.TOOL, "calc", "call_1")
    raw = [ToolCall(id="call_1", function=Function(name="calc", arguments='{"x": 1}'))]
    msg = Message.from_tool_calls(raw, content="thinking")
    assert msg.role is ChatRole.ASSISTANT
    assert msg.tool_calls == raw


def test_add_builds_lists():
    a, b, c = Message("a"), Message("b"), Message("c")
    assert a + b == [a, b]
    assert a + [b, c] == [a, b, c]  # noqa: RUF005 - the operator under test
    assert [a, b] + c == [a, b, c]  # noqa: RUF005 - the operator under test
    assert sum([b, c], [a]) == [a, b, c]
    with pytest.raises(TypeError, match="cannot add int to Message"):
        a + 1


def test_to_dict_omits_none_fields():
    assert Message("hi").to_dict() == {"role": "user", "content": "hi"}
    call = ToolCall(id="c", function=Function(name="f", arguments="{}"))
    d = Message.from_tool_calls([call]).to_dict()
    assert d == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }
    assert Message.tool_message("r", name="f", tool_call_id="c").to_dict() == {
        "role": "tool",
        "content": "r",
        "name": "f",
        "tool_call_id": "c",
    }


def test_instruct_content_round_trips_through_json_with_its_type():
    msg = Message("plan", instruct_content=Plan(steps=["a", "b"], done=True), cause_by=WriteCode, send_to={"b", "a"})
    text = msg.dump()
    back = Message.load(text)
    assert type(back.instruct_content) is Plan
    assert back.instruct_content == Plan(steps=["a", "b"], done=True)
    assert back.model_dump() == msg.model_dump()
    assert back.dump() == text  # stable


def test_instruct_content_of_an_unimportable_class_keeps_its_data():
    def make():
        class Local(BaseModel):
            x: int

        return Local(x=3)

    back = Message.load(Message("x", instruct_content=make()).dump())
    assert back.instruct_content is not None
    assert back.instruct_content.model_dump() == {"x": 3}


def test_instruct_content_must_be_a_model():
    with pytest.raises(InvalidValueError, match="instruct_content='text' is not a pydantic model"):
        Message("x", instruct_content="text")


def test_serialisation_is_stable_and_sorted():
    msg = Message("x", send_to={"zed", "amy", "bob"}, metadata={"k": [1, 2]})
    data = json.loads(msg.dump())
    assert data["send_to"] == ["amy", "bob", "zed"]
    assert msg.dump() == Message.load(msg.dump()).dump()


def test_enums_carry_the_seed_values():
    assert [c.value for c in ChatRole] == ["system", "user", "assistant", "tool"]
    assert [c.value for c in ToolChoice] == ["none", "auto", "required"]
    assert [s.value for s in AgentState] == ["IDLE", "RUNNING", "FINISHED", "ERROR"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"content": 5}, r"content=5 must be a string"),
        ({"id": ""}, r"id='' must be a non-empty string"),
        ({"sent_from": 3}, r"sent_from=3 must be the sending role \(or its name\)"),
        ({"metadata": [1]}, r"metadata=\[1\] must be a dict"),
        ({"tool_calls": "call"}, r"tool_calls='call' must be a list of ToolCall"),
        ({"name": 1}, r"name=1 must be a string or None"),
    ],
)
def test_every_field_is_validated(kwargs, match):
    with pytest.raises(InvalidValueError, match=match):
        Message(**kwargs)


def test_unknown_fields_are_ignored_with_a_note_and_refused_when_validating():
    with pytest.warns(PortingNote, match=r"\['colour'\], which are no fields"):  # as MetaGPT's Message ignores them
        message = Message("x", colour="red")
    assert message.content == "x" and not hasattr(message, "colour")
    with pytest.raises(InvalidValueError, match=r"Message has no field\(s\) \['colour'\]"):
        Message.model_validate({"content": "x", "colour": "red"})


def test_tool_calls_accept_dicts():
    msg = Message(tool_calls=[{"id": "c1", "function": {"name": "f", "arguments": "{}"}}], role="assistant")
    assert msg.tool_calls == [ToolCall(id="c1", function=Function(name="f", arguments="{}"))]


def test_model_copy_applies_updates_and_keeps_the_original():
    msg = Message("x", metadata={"k": 1})
    copy = msg.model_copy(update={"sent_from": "alice"})
    copy.metadata["k"] = 2
    assert (copy.sent_from, copy.id, msg.sent_from, msg.metadata) == ("alice", msg.id, "", {"k": 1})
    with pytest.raises(InvalidValueError, match="no field 'colour'"):
        msg.model_copy(update={"colour": "red"})


class Envelope(BaseModel):
    messages: list[Message]
    first: Message | None = None


def test_messages_live_inside_pydantic_models():
    inner = Message("hi", instruct_content=Plan(steps=["x"]), send_to={"b"})
    env = Envelope(messages=[inner], first=inner)
    text = env.model_dump_json()
    back = Envelope.model_validate_json(text)
    assert back.messages[0].model_dump() == inner.model_dump()
    assert isinstance(back.messages[0].instruct_content, Plan)
    assert back.model_dump_json() == text
    assert Envelope.model_validate({"messages": [inner.model_dump()]}).messages == [inner]
    assert "messages" in Envelope.model_json_schema()["properties"]


def test_messages_pickle():
    import pickle

    msg = Message("x", instruct_content=Plan(steps=["a"]), send_to="b")
    back = pickle.loads(pickle.dumps(msg))
    assert back.model_dump() == msg.model_dump()


@given(
    content=st.text(max_size=30),
    structured=st.booleans(),
    role=st.sampled_from(list(ChatRole)),
    cause=st.sampled_from([WriteCode, "pkg.Other", "metaroles.bus.action.UserRequirement"]),
    sender=st.text(max_size=8),
    to=st.frozensets(st.sampled_from(["a", "b", "<all>", "pkg.Role"]), min_size=1, max_size=3),
)
def test_trusted_construction_matches_validated_construction(content, structured, role, cause, sender, to):
    """The bus's fast path builds the very message the validated constructor builds from the same values."""
    plan = Plan(steps=[content]) if structured else None
    cause_id = cause if isinstance(cause, str) else cause.action_id()
    trusted = Message.trusted(content, plan, role, cause_id, sender, to)
    checked = Message(
        content,
        id=trusted.id,
        instruct_content=plan,
        role=role.value,
        cause_by=cause,
        sent_from=sender,
        send_to=sorted(to),
    )
    assert trusted.same_fields(checked)
    assert trusted.model_dump() == checked.model_dump()
    assert Message.model_validate_json(trusted.model_dump_json()).same_fields(trusted)


@example(  # an integer past 64 bits, which orjson reads as a float: it comes back the integer it was
    content=None,
    role=ChatRole.SYSTEM,
    sender="",
    to=frozenset({"0"}),
    chat=[None, None, None],
    metadata={"": -(2**63) - 1, "big": 2**64},
    structured=False,
    calls=None,
)
@given(
    content=st.one_of(st.none(), st.text(max_size=30)),
    role=st.sampled_from(list(ChatRole)),
    sender=st.text(max_size=8),
    to=st.frozensets(st.text(min_size=1, max_size=6), min_size=1, max_size=4),
    chat=st.lists(st.one_of(st.none(), st.text(max_size=8)), min_size=3, max_size=3),
    metadata=st.one_of(st.none(), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2)),
    structured=st.booleans(),
    calls=st.sampled_from([None, [], [ToolCall(id="c1", function=Function(name="search", arguments="{}"))]]),
)
def test_a_messages_json_is_json_dumps_of_its_fields(content, role, sender, to, chat, metadata, structured, calls):
    """``dump``'s direct text for plain messages is exactly what ``json.dumps`` writes of ``model_dump``."""
    tool_call_id, name, image = chat
    message = Message(
        content,
        role=role,
        sent_from=sender,
        send_to=set(to),
        metadata=metadata,
        tool_call_id=tool_call_id,
        name=name,
        base64_image=image,
        instruct_content=Plan(steps=[sender]) if structured else None,
        tool_calls=calls,
    )
    text = message.dump()
    assert text == json.dumps(message.model_dump(mode="json"), ensure_ascii=False)
    assert json.loads(text) == message.model_dump(mode="json")
    assert Message.load(text).same_fields(message)


def _child_id(queue) -> None:  # runs in a forked child
    from metaroles.core.ids import new_id

    queue.put(new_id())


def test_forked_processes_draw_new_id_prefixes():
    import multiprocessing

    from metaroles.core.ids import new_id

    parent = new_id()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_id, args=(queue,))
    child.start()
    child_id = queue.get(timeout=30)
    child.join(timeout=30)
    assert child_id[:16] != parent[:16], "a forked child must not reuse the parent's id prefix"
    assert len(child_id) == len(parent) == 32
