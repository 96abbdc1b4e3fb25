from collections.abc import Sequence

import anyio
import pytest
from anyio import wait_all_tasks_blocked
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from metaroles import (
    Action,
    DeadLetterWarning,
    DropMessage,
    DuplicateRoleError,
    Environment,
    EnvironmentState,
    Intervention,
    InvalidValueError,
    Message,
    Role,
    RoleFailed,
    UndeliverableError,
    UnknownRoleError,
)


class Say(Action):
    async def run(self, history: Sequence[Message]) -> str:
        return f"{self.role_name} heard {history[-1].content}"


class Other(Action):
    pass


class Listener(Role):
    pass


def make_env(**kw: object) -> tuple[Environment, Role, Role, Listener]:
    env = Environment(**kw)  # type: ignore[arg-type]
    a = Role(name="a", actions=[Say])
    b = Role(name="b", actions=[Say], watch=[])
    c = Listener(name="c", watch=[])
    env.add_roles([a, b, c])
    return env, a, b, c


def test_routing_by_name_class_address_and_broadcast():
    env, a, b, c = make_env()
    assert env.recipients(Message("x", send_to="b")) == [b]
    assert env.recipients(Message("x", send_to=Listener)) == [c]
    assert env.recipients(Message("x", send_to={"c", "a"})) == [a, c], "registration order"
    assert env.recipients(Message("x")) == [a, b, c]
    env.publish_message(Message("hi", send_to="b"))
    assert b.rc.msg_buffer.count() == 1 and a.rc.msg_buffer.empty() and c.rc.msg_buffer.empty()


async def test_watch_filters_what_becomes_news():
    env, a, b, c = make_env()
    env.publish_message(Message("broadcast"))
    await env.run_round()
    assert [m.content for m in a.rc.news] == ["broadcast"], "a watches UserRequirement"
    assert b.rc.news == [] and c.rc.news == [], "b and c watch nothing"
    assert [m.content for m in c.get_memories()] == ["broadcast", "a heard broadcast"][:1]
    await env.run_round()
    assert [m.content for m in c.get_memories()] == ["broadcast", "a heard broadcast"], "stored, not news"
    env.publish_message(Message("named", send_to="b", cause_by=Other))
    await env.run_round()
    assert [m.content for m in b.rc.news] == ["named"], "a name in send_to admits any cause_by"


def test_message_to_nobody_lands_in_dead_letters_with_a_warning():
    env, *_ = make_env()
    msg = Message("lost", send_to="nobody", sent_from="a")
    with pytest.warns(DeadLetterWarning, match=r"reached no role: send_to \['nobody'\] meets no role"):
        env.publish_message(msg)
    assert env.dead_letters == [msg]
    assert env.events[-1].kind == "dead_letter" and env.events[-1].message_id == msg.id
    assert msg in env.history


def test_strict_mode_raises_but_keeps_the_message():
    env, *_ = make_env(strict=True)
    msg = Message("lost", send_to="nobody")
    with pytest.warns(DeadLetterWarning), pytest.raises(UndeliverableError, match=r"send_to=\['nobody'\] reached no"):
        env.publish_message(msg)
    assert env.dead_letters == [msg]


async def test_strict_mode_raises_after_the_round_delivers_everything_else():
    env = Environment(strict=True)
    lost_sender = Role(name="s", actions=[Say], send_to="ghost")
    good_sender = Role(name="t", actions=[Say], send_to="s")
    env.add_roles([lost_sender, good_sender])
    env.publish_message(Message("go"))
    with pytest.warns(DeadLetterWarning), pytest.raises(UndeliverableError):
        await env.run_round()
    assert [m.content for m in env.dead_letters] == ["s heard go"]
    assert [m.content for m in lost_sender.rc.msg_buffer.peek_all()] == ["t heard go"]


async def test_explain_route_says_why():
    env, a, b, c = make_env()
    broadcast = Message("x")
    assert str(env.explain_route(broadcast, "a")) == (
        "delivered: send_to contains '<all>', a broadcast to every role\n"
        "news: cause_by 'metaroles.bus.action.UserRequirement' is in the role's watch set"
    )
    why = env.explain_route(broadcast, c)
    assert why.delivered and not why.admitted
    assert "is not in watch []" in why.reasons[1]
    addressed = Message("x", send_to="b", cause_by=Other)
    assert env.explain_route(addressed, b).reasons[1] == "news: the role's name 'b' is in send_to"
    missed = env.explain_route(addressed, a)
    assert not missed.delivered and "meets none of the role's addresses ['a', 'metaroles.bus.role.Role']" in str(missed)
    by_class = env.explain_route(Message("x", send_to=Listener), c)
    assert by_class.delivered and "tests.test_environment.Listener" in by_class.reasons[0]
    env.publish_message(broadcast)
    await a._observe()
    assert "already remembers" in str(env.explain_route(broadcast, a))
    with pytest.raises(UnknownRoleError, match=r"no role named 'zed'; known roles: \['a', 'b', 'c'\]"):
        env.explain_route(broadcast, "zed")


def test_a_role_name_used_twice_is_an_error_and_loses_nothing():
    env, a, *_ = make_env()
    with pytest.raises(DuplicateRoleError, match="a role named 'a' is already in this environment"):
        env.add_role(Role(name="a"))
    assert env.roles["a"] is a and len(env.roles) == 3


def test_bad_environment_arguments():
    with pytest.raises(InvalidValueError, match="concurrency=0"):
        Environment(concurrency=0)
    with pytest.raises(InvalidValueError, match="on_role_error='ignore'"):
        Environment(on_role_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="publish_message got 'text'"):
        Environment().publish_message("text")  # type: ignore[arg-type]


class Gate(Action):
    """Finishes only when its release event is set, so tests fix completion order."""

    def __init__(self, wait_for: anyio.Event | None, release: anyio.Event | None) -> None:
        super().__init__()
        self.wait_for = wait_for
        self.release = release

    async def run(self, history: Sequence[Message]) -> str:
        if self.wait_for is not None:
            await self.wait_for.wait()
        if self.release is not None:
            self.release.set()
        return f"{self.role_name} done"


async def test_delivery_order_is_registration_order_whatever_the_completion_order():
    first_done, second_done = anyio.Event(), anyio.Event()
    env = Environment()
    r0 = Role(name="r0", actions=[Gate(second_done, None)])
    r1 = Role(name="r1", actions=[Gate(first_done, second_done)])
    r2 = Role(name="r2", actions=[Gate(None, first_done)])
    sink = Role(name="sink", watch=[])
    env.add_roles([r0, r1, r2, sink])
    env.publish_message(Message("go"))
    with anyio.fail_after(5):
        await env.run_round()
    delivered = [m.content for m in sink.rc.msg_buffer.peek_all()]
    assert delivered == ["r0 done", "r1 done", "r2 done"]


class Boom(Action):
    async def run(self, history: Sequence[Message]) -> str:
        raise ValueError("boom")


async def test_a_failing_role_ends_the_round_cleanly_and_leaves_no_task():
    released = anyio.Event()
    env = Environment()
    slow = Role(name="slow", actions=[Gate(released, None)])
    bad = Role(name="bad", actions=[Boom])
    fast = Role(name="fast", actions=[Gate(None, released)])
    env.add_roles([slow, bad, fast])
    env.publish_message(Message("go"))
    tasks_before = len(anyio.get_running_tasks())
    with (
        anyio.fail_after(5),
        pytest.raises(RoleFailed, match=r"role 'bad' failed in round 1: ValueError\('boom'\)") as info,
    ):
        await env.run_round()
    assert isinstance(info.value.__cause__, ValueError)
    assert len(anyio.get_running_tasks()) == tasks_before
    assert [e.kind for e in env.events] == ["role_error"] and env.events[0].role == "bad"
    assert {m.sent_from for m in env.history} == {"", "slow", "fast"}, "others' work was delivered"


async def test_role_errors_can_be_recorded_instead_of_raised():
    env = Environment(on_role_error="record")
    env.add_roles([Role(name="bad", actions=[Boom]), Role(name="ok", actions=[Say])])
    env.publish_message(Message("go"))
    await env.run_round()
    assert env.events[0].detail.startswith("ValueError: boom\n  at ")  # then where it was raised, by module
    assert env.events[0].detail.endswith(" in run")
    assert any(m.sent_from == "ok" for m in env.history)


class Handshake(Action):
    """Signals its own event, then waits for the other's: deadlocks unless run concurrently."""

    def __init__(self, mine: anyio.Event, theirs: anyio.Event) -> None:
        super().__init__()
        self.mine, self.theirs = mine, theirs

    async def run(self, history: Sequence[Message]) -> str:
        self.mine.set()
        await self.theirs.wait()
        return f"{self.role_name} done"


async def test_roles_in_a_round_run_concurrently():
    ping, pong = anyio.Event(), anyio.Event()
    env = Environment()
    env.add_roles([Role(name="x", actions=[Handshake(ping, pong)]), Role(name="y", actions=[Handshake(pong, ping)])])
    env.publish_message(Message("go"))
    with anyio.fail_after(5):
        await env.run_round()
    assert {m.content for m in env.history} >= {"x done", "y done"}


class Tap(Intervention):
    def __init__(self) -> None:
        self.published: list[str] = []
        self.delivered: list[tuple[str, str]] = []

    def on_publish(self, message: Message, *, sender: str) -> Message | type[DropMessage]:
        self.published.append(message.content)
        if message.content == "secret":
            return DropMessage
        if message.content == "rewrite me":
            return message.model_copy(update={"content": "rewritten"})
        return message

    def on_deliver(self, message: Message, *, recipient: Role) -> Message | type[DropMessage]:
        self.delivered.append((message.content, recipient.name))
        return DropMessage if recipient.name == "b" else message


def test_interventions_observe_modify_and_drop():
    tap = Tap()
    env = Environment(interventions=[tap])
    a, b = Role(name="a"), Role(name="b")
    env.add_roles([a, b])
    env.publish_message(Message("hello"))
    env.publish_message(Message("secret"))
    env.publish_message(Message("rewrite me"))
    assert tap.published == ["hello", "secret", "rewrite me"]
    assert tap.delivered == [("hello", "a"), ("hello", "b"), ("rewritten", "a"), ("rewritten", "b")]
    assert [m.content for m in a.rc.msg_buffer.peek_all()] == ["hello", "rewritten"]
    assert b.rc.msg_buffer.empty()
    assert [(e.kind, e.role, e.detail) for e in env.events] == [
        ("dropped", "b", "dropped on delivery by Tap"),
        ("dropped", "", "dropped on publish by Tap"),
        ("dropped", "b", "dropped on delivery by Tap"),
    ]


class Findings(BaseModel):
    items: list[str]


async def test_environment_state_round_trips_through_json_with_buffers_intact():
    env, a, _b, c = make_env()
    env.publish_message(Message("first"))
    await env.run_round()
    env.publish_message(Message("buffered", send_to="c", instruct_content=Findings(items=["x", "y"])))
    assert c.rc.msg_buffer.count() >= 1
    text = env.state_dict().model_dump_json()

    env2, a2, _b2, c2 = make_env()
    env2.load_state(EnvironmentState.model_validate_json(text))
    assert env2.round == env.round
    assert [m.model_dump() for m in c2.rc.msg_buffer.peek_all()] == [m.model_dump() for m in c.rc.msg_buffer.peek_all()]
    restored = c2.rc.msg_buffer.peek_all()[-1].instruct_content
    assert isinstance(restored, Findings) and restored.items == ["x", "y"]
    assert a2.get_memories() == a.get_memories()
    assert env2.history.storage == env.history.storage
    assert env2.state_dict().model_dump_json() == text, "a second round trip changes nothing"
    assert not env2.is_idle, "buffered roles run in the next round"
    await env2.run_round()
    assert c2.rc.msg_buffer.empty()


def test_save_and_load_files(tmp_path):
    env, *_ = make_env()
    env.publish_message(Message("kept", send_to="b"))
    path = env.save(tmp_path / "run" / "state.json")
    env2, _, b2, _ = make_env()
    env2.load(path)
    assert [m.content for m in b2.rc.msg_buffer.peek_all()] == ["kept"]
    other = Environment()
    other.add_role(Role(name="a"))
    with pytest.raises(UnknownRoleError, match=r"has roles \['b', 'c'\] that this environment lacks"):
        other.load(path)


names = st.sampled_from(["r0", "r1", "r2", "r3", "nobody", "tests.test_environment.Listener", "<all>"])


@settings(max_examples=60, deadline=None)
@given(send_tos=st.lists(st.frozensets(names, min_size=1), min_size=1, max_size=8))
def test_routing_delivers_exactly_to_roles_whose_addresses_meet_send_to(send_tos: list[frozenset[str]]) -> None:
    import warnings

    env = Environment()
    roles = [Role(name="r0"), Listener(name="r1"), Role(name="r2"), Listener(name="r3")]
    env.add_roles(roles)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeadLetterWarning)
        messages = [Message(str(i), send_to=s) for i, s in enumerate(send_tos)]
        for msg in messages:
            env.publish_message(msg)
    for role in roles:
        expected = [m for m in messages if "<all>" in m.send_to or m.send_to & role.addresses]
        assert role.rc.msg_buffer.peek_all() == expected
    dead = [m for m in messages if not any("<all>" in m.send_to or m.send_to & r.addresses for r in roles)]
    assert env.dead_letters == dead
    assert env.history.storage == messages


def test_a_role_belongs_to_one_environment():
    role = Role(name="solo")
    Environment().add_role(role)
    other = Environment()
    with pytest.raises(InvalidValueError, match="role 'solo' already belongs to another Environment"):
        other.add_role(role)
    assert other.roles == {}


def test_env_set_and_get_addresses():
    env, a, *_ = make_env()
    env.set_addresses(a, ["a", "alpha"])
    assert env.get_addresses(a) == {"a", "alpha"}
    assert env.recipients(Message("x", send_to="alpha")) == [a]


async def test_overlapping_rounds_are_refused():
    from metaroles import RunError

    release = anyio.Event()
    env = Environment()
    env.add_role(Role(name="slow", actions=[Gate(release, None)]))
    env.publish_message(Message("go"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(env.run_round)
        await wait_all_tasks_blocked()
        with pytest.raises(RunError, match="round 1 of this environment is still running"):
            await env.run_round()
        release.set()
    assert env.round == 1
    assert [m.content for m in env.history][-1] == "slow done"


class Tracker:
    def __init__(self) -> None:
        self.in_flight = 0
        self.most = 0
        self.release = anyio.Event()


class Wait(Action):
    def __init__(self, tracker: Tracker) -> None:
        super().__init__()
        self.tracker = tracker

    async def run(self, history: Sequence[Message]) -> str:
        t = self.tracker
        t.in_flight += 1
        t.most = max(t.most, t.in_flight)
        await t.release.wait()
        t.in_flight -= 1
        return "done"


@pytest.mark.parametrize(("concurrency", "expected"), [(1, 1), (3, 3), (32, 5)])
async def test_concurrency_is_bounded_and_reached(concurrency, expected):
    tracker = Tracker()
    env = Environment(concurrency=concurrency)
    env.add_roles(Role(name=f"w{i}", actions=[Wait(tracker)]) for i in range(5))
    env.publish_message(Message("go"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(env.run_round)
        await wait_all_tasks_blocked()
        assert tracker.in_flight == expected
        tracker.release.set()
    assert tracker.most == expected
    assert sum(m.content == "done" for m in env.history) == 5


async def test_a_session_keeps_workers_across_rounds_and_leaves_no_task():
    tasks_before = len(anyio.get_running_tasks())
    env = Environment(concurrency=3)
    trackers = [Tracker(), Tracker()]
    roles = [Role(name=f"w{i}", actions=[Wait(trackers[0])]) for i in range(5)]
    env.add_roles(roles)
    started: list[int] = []
    async with env.session():
        for round_no, tracker in enumerate(trackers):
            for role in roles:
                role.actions[0].tracker = tracker  # type: ignore[attr-defined]
            env.publish_message(Message(f"round {round_no}"))
            async with anyio.create_task_group() as tg:
                tg.start_soon(env.run_round)
                await wait_all_tasks_blocked()
                assert tracker.in_flight == 3, "bounded by concurrency, and reached"
                tracker.release.set()
            assert env._pool is not None
            started.append(env._pool.started)
    assert started == [2, 2], "the second round woke the same two workers instead of starting new ones"
    assert sum(m.content == "done" for m in env.history) == 10
    assert len(anyio.get_running_tasks()) == tasks_before


async def test_a_saved_state_holds_each_history_message_once(tmp_path):
    env, a, _, _ = make_env()
    env.publish_message(Message("hello", send_to={"a", "b"}))
    await env.run(2)
    a.rc.memory.add(Message("a private note"))  # not in the history: saved whole
    saved = EnvironmentState.model_validate_json(env.save(tmp_path / "state.json").read_text())
    memory = next(r for r in saved.roles if r.name == "a").memory
    assert all(isinstance(m, str) for m in memory[:-1]) and isinstance(memory[-1], Message)
    again, *_ = make_env()
    again.load(tmp_path / "state.json")
    assert again.state_dict().model_dump_json() == env.state_dict().model_dump_json()
    assert again.roles["a"].rc.memory.storage[0] is again.history.storage[0], "one object, shared"
    with pytest.raises(InvalidValueError, match=r"load it with Environment\.load_state"):
        Role(name="a").load_state(next(r for r in saved.roles if r.name == "a"))


def test_routing_remembers_each_roles_own_set_of_recipients_even_past_its_usual_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A society's every agent sends to its own neighbours: routing must not forget those sets each round."""
    from metaroles.bus.routing import AddressBook

    monkeypatch.setattr(AddressBook, "CACHED", 4)  # the usual bound, scaled down
    env = Environment()
    roles = [Role(name=f"a{i}") for i in range(10)]
    for role in roles:
        env.add_role(role)
    sets = [frozenset({f"a{i}", f"a{(i + 1) % 10}"}) for i in range(10)]
    first = [env._book.route(s) for s in sets]
    assert [[r.name for r in got] for got in first] == [
        sorted({f"a{i}", f"a{(i + 1) % 10}"}, key=lambda n: int(n[1:])) for i in range(10)
    ]
    again = [env._book.route(s) for s in sets]
    assert all(a is b for a, b in zip(first, again, strict=True))  # remembered, not merged again


@settings(max_examples=200, deadline=None)
@given(
    addresses=st.lists(st.sets(st.sampled_from(["a", "b", "c", "d", "team"]), max_size=3), min_size=1, max_size=8),
    send_to=st.sets(st.sampled_from(["a", "b", "c", "d", "team", "<all>", "nobody"]), min_size=1, max_size=3),
    shards=st.integers(min_value=1, max_value=3),
)
def test_roles_shards_and_explanations_follow_one_rule_of_who_a_message_reaches(addresses, send_to, shards):
    from metaroles.sharding.worker import targets

    env = Environment()
    roles = [Role(name=f"r{i}") for i in range(len(addresses))]
    env.add_roles(roles)
    for role, extra in zip(roles, addresses, strict=True):
        role.set_addresses({role.name, *extra})
    message = Message("hello", send_to=send_to)
    routed = [role.name for role in env.route(message.send_to)]
    explained = [role.name for role in roles if env.explain_route(message, role).delivered]
    expected = [r.name for r in roles if "<all>" in send_to or send_to & r.addresses]  # the rule, as the docs say
    assert routed == explained == expected
    shard_of = {role.name: i % shards for i, role in enumerate(roles)}
    where: dict[str, set[int]] = {}
    for role in roles:
        for address in role.addresses:
            where.setdefault(address, set()).add(shard_of[role.name])
    index = ({a: tuple(sorted(s)) for a, s in where.items()}, tuple(range(shards)))
    assert set(targets(message.send_to, index)) == (
        set(range(shards)) if "<all>" in send_to else {shard_of[n] for n in routed}
    )
