from collections.abc import Sequence

import pytest

from metaroles import (
    Action,
    Environment,
    FunctionLLM,
    InvalidValueError,
    LLMRequest,
    Message,
    Role,
    RoleReactMode,
    ScriptedLLM,
    TestLLM,
    UserRequirement,
)


class Draft(Action):
    async def run(self, history: Sequence[Message]) -> str:
        return f"draft of {history[-1].content}"


class Polish(Action):
    async def run(self, history: Sequence[Message]) -> str:
        return f"polished {history[-1].content}"


class Publish(Action):
    async def run(self, history: Sequence[Message]) -> str:
        return "published"


class Writer(Role):
    name = "writer"
    profile = "Writer"

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.set_actions([Draft])
        self._watch([UserRequirement])


def test_class_attributes_give_defaults():
    w = Writer()
    assert (w.name, w.profile) == ("writer", "Writer")
    assert Writer(name="w2").name == "w2"
    assert Role().name == "Role"
    assert w.addresses == {"writer", "tests.test_role.Writer"}
    assert w.rc.watch == {UserRequirement.action_id()}
    assert w.states == ["0. Draft"]


async def test_standalone_run_observes_reacts_and_returns():
    w = Writer()
    assert w.is_idle
    response = await w.run("an essay")
    assert response is not None and response.content == "draft of an essay"
    assert response.sent_from == "writer" and response.cause_by == Draft.action_id()
    assert [m.content for m in w.get_memories()] == ["an essay", "draft of an essay"]
    assert await w.run() is None, "nothing new: the role stays idle"


async def test_watch_filters_news_but_everything_is_remembered():
    w = Writer()
    ignored = Message("from polish", cause_by=Polish)
    w.put_message(ignored)
    assert not w.is_idle
    assert await w.run() is None
    assert w.rc.news == []
    assert ignored in w.rc.memory
    addressed = Message("for you", cause_by=Polish, send_to="writer")
    response = await w.run(addressed)
    assert response is not None and response.content == "draft of for you"


async def test_custom_think_and_act():
    class Counter(Role):
        def __init__(self) -> None:
            super().__init__(name="counter", actions=[Draft])
            self.acted = 0

        async def _think(self) -> bool:
            if len(self.rc.news) < 2:
                self._set_state(-1)
                return False
            return await super()._think()

        async def _act(self) -> Message | None:
            self.acted += 1
            return Message(f"saw {len(self.rc.news)}", sent_from=self.name, cause_by=Draft)

    c = Counter()
    assert await c.run("one") is None
    c.put_message(Message("two"))
    c.put_message(Message("three"))
    response = await c.run()
    assert response is not None and response.content == "saw 2" and c.acted == 1


async def test_by_order_runs_every_action_in_order():
    role = Role(name="pipeline", actions=[Draft, Polish, Publish], react_mode="by_order")
    response = await role.run("idea")
    assert response is not None and response.content == "published"
    contents = [m.content for m in role.get_memories()]
    assert contents == ["idea", "draft of idea", "polished draft of idea", "published"]
    assert role.rc.state == -1 and role.rc.todo is None


async def test_react_lets_the_model_pick_and_is_bounded_by_max_react_loop():
    picks = iter([1, 0, -1])

    def choose(request: LLMRequest) -> str:
        assert request.output_schema is not None
        assert request.output_schema["properties"]["state"]["enum"] == [-1, 0, 1, 2]
        return f'{{"state": {next(picks)}}}'

    role = Role(name="r", actions=[Draft, Polish, Publish], llm=FunctionLLM(choose), max_react_loop=5)
    response = await role.run("idea")
    assert response is not None and response.content == "draft of polished idea"
    assert len(role.get_memories()) == 3

    bounded = Role(name="b", actions=[Draft, Polish, Publish], llm=FunctionLLM(lambda r: '{"state": 0}'))
    await bounded.run("idea")
    assert [m.content for m in bounded.get_memories()] == ["idea", "draft of idea"], "max_react_loop=1"


async def test_react_out_of_range_choice_is_rejected_and_retried():
    llm = ScriptedLLM({"r": {"<choose_action>": ['{"state": 7}', '{"state": 2}']}})
    role = Role(name="r", actions=[Draft, Polish, Publish], llm=llm)
    response = await role.run("idea")
    assert response is not None and response.content == "published"


async def test_plan_and_act_runs_the_planned_steps_through_working_memory():
    llm = ScriptedLLM({"p": {"<plan>": ['{"steps": ["Polish", "Draft"]}']}})
    role = Role(name="p", actions=[Draft, Polish, Publish], llm=llm, react_mode=RoleReactMode.PLAN_AND_ACT)
    response = await role.run("x")
    assert response is not None and response.content == "draft of polished x"
    assert [m.content for m in role.rc.working_memory.get()] == ["polished x", "draft of polished x"]


async def test_plan_and_act_with_test_llm_plans_valid_steps():
    role = Role(name="p", actions=[Draft, Polish, Publish], llm=TestLLM(5), react_mode="plan_and_act")
    response = await role.run("x")
    assert response is not None
    assert 1 <= len(role.rc.working_memory) <= 3


def test_bad_role_arguments_are_clear_errors():
    with pytest.raises(InvalidValueError, match="react_mode='sometimes' is not a react mode"):
        Role(name="x", react_mode="sometimes")
    with pytest.raises(InvalidValueError, match="max_react_loop=0 must be a positive integer"):
        Role(name="x", max_react_loop=0)
    with pytest.raises(InvalidValueError, match="set_actions got 'Draft'"):
        Role(name="x", actions=["Draft"])  # type: ignore[list-item]
    with pytest.raises(InvalidValueError, match=r"send_to=3 \(int\) is not an address"):
        Role(name="x", send_to=3)


async def test_action_returning_garbage_is_a_clear_error():
    class Bad(Action):
        async def run(self, history: Sequence[Message]) -> str:
            return 42  # type: ignore[return-value]

    with pytest.raises(InvalidValueError, match=r"Bad.run returned 42 \(int\); return a str"):
        await Role(name="x", actions=[Bad]).run("go")


async def test_set_addresses_reindexes_in_the_environment():
    env = Environment()
    role = Writer()
    env.add_role(role)
    role.set_addresses({"writer", "desk"})
    env.publish_message(Message("to the desk", send_to="desk"))
    assert role.rc.msg_buffer.count() == 1
    assert env.recipients(Message("x", send_to="tests.test_role.Writer")) == []


class Relay(Action):
    async def run(self, history: Sequence[Message]) -> str:
        return f"{self.role_name} relays {history[-1].content}"


class HookedRole(Role):
    """Overrides a turn hook (calling super), so its turns take the general path."""

    async def _think(self) -> bool:
        return await super()._think()


async def run_ring(role_cls: type[Role]) -> tuple[list[tuple[str, str, list[str]]], list[list[str]]]:
    env = Environment()
    names = [f"n{i}" for i in range(5)]
    for i, name in enumerate(names):
        env.add_role(role_cls(name=name, actions=[Relay], watch=[UserRequirement, Relay], send_to=names[(i + 1) % 5]))
    env.add_role(role_cls(name="mute", watch=[Relay]))
    env.publish_message(Message("start", send_to={"n0", "mute"}))
    await env.run(4)
    transcript = [(m.sent_from, m.content, sorted(m.send_to)) for m in env.history]
    memories = [[m.content for m in role.get_memories()] for role in env.roles.values()]
    return transcript, memories


async def test_a_default_turn_and_one_through_overridden_hooks_say_the_same():
    assert Role._default_turn and Writer._default_turn, "Writer only sets actions in __init__"
    assert not HookedRole._default_turn
    plain, hooked = await run_ring(Role), await run_ring(HookedRole)
    assert plain == hooked
    transcript, _ = plain
    assert [t[0] for t in transcript] == ["", "n0", "n1", "n2", "n3"]


def test_a_new_model_reaches_the_actions_that_inherited_the_old_one():
    own = TestLLM(1)
    role = Role(name="r", actions=[Draft, Polish(llm=own)])
    first, second = TestLLM(2), TestLLM(3)
    role.set_llm(first)
    role.set_llm(second)
    assert role.actions[0].llm is second, "inherited: follows the role"
    assert role.actions[1].llm is own, "its own model stays"


async def test_assigning_send_to_normalises_it_and_bad_values_change_nothing():
    """``role.send_to = "B"`` means ``{"B"}`` as in the constructor; a value that is no address is refused."""
    env = Environment()
    speaker = Role(name="A", actions=[Draft], send_to="B")
    env.add_roles([speaker, Role(name="B"), Role(name="C")])
    speaker.send_to = "C"
    assert speaker.send_to == frozenset({"C"})
    with pytest.raises(InvalidValueError, match="send_to=3"):
        speaker.send_to = 3
    assert speaker.send_to == frozenset({"C"})
    speaker.send_to = None
    assert speaker.send_to == frozenset({"<all>"})
    speaker.send_to = ["B"]
    env.publish_message(Message("go", send_to={"A"}))
    await env.run(1)
    said = [m for m in env.history if m.sent_from == "A"]
    assert len(said) == 1 and said[0].send_to == frozenset({"B"})
    assert [m.id for m in env.roles["B"].rc.msg_buffer.peek_all()] == [said[0].id]
