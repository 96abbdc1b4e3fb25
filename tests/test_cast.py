"""A Cast: roles from one recipe, built in one process, and built again by their shards instead of shipped.

Shards run in this process (``LocalBackend``): every build of the recipe lands in ``BUILT``, so a
test sees who built what — the driver once per role, each shard once per role of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaroles import Action, ActionResult, Cast, Environment, Message, Role, Team, TestLLM
from metaroles.core.exceptions import DuplicateRoleError, InvalidValueError, RunError
from metaroles.sharding.backends import LocalBackend

BUILT: list[int] = []
"""Every ``build(i)`` of :class:`Ring` in this process, in order."""


class Say(Action):
    """Say what the model answers to the news."""

    async def run(self, history: Sequence[Message]) -> ActionResult:
        return await self.aask(f"heard {len(history)}")


class Ring:
    """Member ``i`` of ``count`` speaks to member ``i + 1``; a copy keeps counting where it was pickled."""

    def __init__(self, count: int, *, renumber: bool = False) -> None:
        self.count, self.renumber, self.made = count, renumber, 0

    def __call__(self, i: int) -> Role:
        BUILT.append(i)
        self.made += 1
        name = f"m{self.made if self.renumber else i}"  # renumber: not the same role in another process
        return Role(name=name, actions=[Say()], watch=[Say], send_to={f"m{(i + 1) % self.count}"})


def ring_team(count: int, backend: object = None, **ring: bool) -> Team:
    team = Team(env=Environment(seed=3), llm=TestLLM(), backend=backend)  # type: ignore[arg-type]
    team.hire(Cast(count, Ring(count, **ring)))
    return team


def transcript(team: Team) -> list[tuple[str, str, str, str | None]]:
    return [(m.id, m.sent_from, ",".join(sorted(m.send_to)), m.content) for m in team.env.history]


async def test_a_cast_is_built_in_order_and_runs_like_the_roles_it_makes() -> None:
    BUILT.clear()
    team = ring_team(5)
    assert BUILT == [0, 1, 2, 3, 4]
    assert list(team.env.roles) == ["m0", "m1", "m2", "m3", "m4"]
    plain = Team(env=Environment(seed=3), llm=TestLLM())
    plain.hire(Ring(5)(i) for i in range(5))
    for t in (team, plain):
        await t.run(n_round=4, idea="go", send_to="m0")
    assert transcript(team) == transcript(plain) and len(transcript(team)) == 5


async def test_on_shards_each_shard_builds_its_own_roles_and_the_run_is_the_one_process_run() -> None:
    one = ring_team(6)
    await one.run(n_round=5, idea="go", send_to="m0")
    BUILT.clear()
    sharded = ring_team(6, LocalBackend(2))
    assert BUILT == [0, 1, 2, 3, 4, 5]
    await sharded.run(n_round=5, idea="go", send_to="m0")
    assert sorted(BUILT) == sorted([*range(6), *range(6)])  # once here, once on its shard: never unpickled
    assert transcript(sharded) == transcript(one)
    assert [type(r) for r in sharded.env.roles.values()] == [Role] * 6  # they came back


async def test_roles_changed_after_hiring_travel_as_they_are() -> None:
    def changed(backend: object = None) -> Team:
        team = ring_team(4, backend)
        team.env.roles["m1"].rc.memory.add(Message("remembered", sent_from="m0", cause_by=Say))
        team.env.roles["m2"].set_llm(TestLLM(seed=9))  # a new model travels with the seat
        return team

    one = changed()
    await one.run(n_round=4, idea="go", send_to="m0")
    BUILT.clear()
    sharded = changed(LocalBackend(2))
    await sharded.run(n_round=4, idea="go", send_to="m0")
    assert sorted(BUILT) == [0, 0, 1, 2, 2, 3, 3]  # m1 (index 1) has a memory: shipped, not built again
    assert transcript(sharded) == transcript(one)
    assert [len(r.rc.memory) for r in sharded.env.roles.values()] == [len(r.rc.memory) for r in one.env.roles.values()]


async def test_roles_come_back_holding_the_very_messages_of_the_drivers_history() -> None:
    team = ring_team(4, LocalBackend(2))
    note = Message("remembered", sent_from="m0", cause_by=Say)  # in no history: it travels whole, both ways
    team.env.roles["m1"].rc.memory.add(note)
    await team.run(n_round=4, idea="go", send_to="m0")
    history = team.env.history._store
    for role in team.env.roles.values():
        memory = role.rc.memory
        assert all(memory.by_key(m.id) is m for m in memory), f"{role.name}: its memory's index by id"
        kept = [m for m in memory if m.id != note.id]
        assert kept and all(history[m.id] is m for m in kept), f"{role.name}: the history's own messages"
    (back,) = [m for m in team.env.roles["m1"].rc.memory if m.id == note.id]
    assert back is not note and back.model_dump() == note.model_dump() and note.id not in history


def role_states(team: Team) -> list[dict[str, object]]:
    """Each role's whole state (what a resume restores), plus what the state leaves implicit."""
    return [
        {
            **role.state_dict().model_dump(mode="json"),
            "index": {action: [m.id for m in said] for action, said in role.rc.memory.index.items()},
            "edits": role.rc.memory._edits,
            "remembered": role.rc.remembered,
            "todo": role.rc.todo,
            "scope": None if role.ids is None else (role.ids.round, role.ids.seq, role.ids.prefix),
        }
        for role in team.env.roles.values()
    ]


async def test_roles_built_from_seats_come_back_as_their_state_into_the_drivers_own_roles() -> None:
    one = ring_team(6)
    await one.run(n_round=5, idea="go", send_to="m0")
    sharded = ring_team(6, LocalBackend(2))
    hired = list(sharded.env.roles.values())
    await sharded.run(n_round=5, idea="go", send_to="m0")
    back = list(sharded.env.roles.values())
    assert all(b is h for b, h in zip(back, hired, strict=True))  # not copies: the roles this process built
    assert role_states(sharded) == role_states(one)
    history = sharded.env.history._store
    for role in back:  # the history's own messages, in memory, buffer and news
        assert all(history[m.id] is m for m in [*role.rc.memory, *role.rc.msg_buffer.peek_all(), *role.rc.news])
        assert all(action.ledger is sharded.env.ledger for action in role.actions)
    await sharded.run(n_round=2)  # and they run on, as one process's do
    await one.run(n_round=2)
    assert transcript(sharded) == transcript(one) and role_states(sharded) == role_states(one)


class Counting(Say):
    """Counts its runs on its role (an attribute set anew: no part of the role's state on the bus)."""

    async def run(self, history: Sequence[Message]) -> ActionResult:
        role = self.counted
        role.count += 1  # type: ignore[attr-defined]
        return await super().run(history)


def counting(i: int) -> Role:
    role = Role(name=f"c{i}", actions=[Counting()], watch=[Counting], send_to={f"c{(i + 1) % 4}"})
    role.count = 0  # type: ignore[attr-defined]
    role.actions[0].counted = role  # type: ignore[attr-defined]
    return role


async def test_a_seated_role_whose_attributes_the_run_set_anew_travels_back_whole() -> None:
    def team(backend: object = None) -> Team:
        t = Team(env=Environment(seed=3), llm=TestLLM(), backend=backend)  # type: ignore[arg-type]
        t.hire(Cast(4, counting))
        return t

    one, sharded = team(), team(LocalBackend(2))
    for t in (one, sharded):
        await t.run(n_round=6, idea="go", send_to="c0")
    counts = [r.count for r in one.env.roles.values()]  # type: ignore[attr-defined]
    assert all(counts)  # every role ran at least once
    assert [r.count for r in sharded.env.roles.values()] == counts  # type: ignore[attr-defined]
    assert transcript(sharded) == transcript(one)


async def test_a_cast_that_builds_another_role_elsewhere_stops_the_run_saying_why() -> None:
    team = ring_team(4, LocalBackend(2), renumber=True)
    with pytest.raises(RunError, match=r"build\(\d\) made 'm\d+'.*must make the same role in every process"):
        await team.run(n_round=2, idea="go", send_to="m1")


def test_a_bad_cast_is_refused_naming_the_value() -> None:
    with pytest.raises(InvalidValueError, match="count=-1"):
        Cast(-1, Ring(1))
    with pytest.raises(InvalidValueError, match="build='ring'"):
        Cast(2, "ring")  # type: ignore[arg-type]
    team = Team()
    with pytest.raises(InvalidValueError, match=r"build\(0\) returned 'm0'"):
        team.hire(Cast(1, lambda i: f"m{i}"))  # type: ignore[arg-type,return-value]


# -- a cast with names: roles built when something first reaches them ---------------------------------


def named_team(count: int, backend: object = None, *, names: str | None = "m{}", **ring: bool) -> Team:
    team = Team(env=Environment(seed=3), llm=TestLLM(), backend=backend)  # type: ignore[arg-type]
    team.hire(Cast(count, Ring(count, **ring), names=names))
    return team


async def test_a_cast_with_names_builds_a_role_only_when_reached_and_runs_as_the_eager_cast() -> None:
    BUILT.clear()
    lazy = named_team(6)
    roles = lazy.env.roles
    assert BUILT == [] and len(roles) == 6 and "m5" in roles and "m6" not in roles and "x" not in roles
    assert list(roles) == [f"m{i}" for i in range(6)] and lazy.env.name_at(4) == "m4" and BUILT == []
    eager = named_team(6, names=None)
    BUILT.clear()
    for t in (lazy, eager):
        await t.run(n_round=3, idea="go", send_to="m0")
    assert sorted(BUILT) == [0, 1, 2, 3]  # m0 by the idea, then each by the message that reached it
    assert [role.name for role in lazy.env.built_roles()] == ["m0", "m1", "m2", "m3"]
    assert transcript(lazy) == transcript(eager) and len(transcript(lazy)) == 4
    assert roles["m5"].place == 5 and sorted(BUILT) == [0, 1, 2, 3, 5]  # looked up: built at its place
    assert lazy.env.state_dict().model_dump() == eager.env.state_dict().model_dump()  # the rest built as read
    assert list(roles) == [f"m{i}" for i in range(6)]  # built out of order, named in place order


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("send"), st.integers(0, 7)),
            st.tuples(st.just("look"), st.integers(0, 7)),
            st.tuples(st.just("place"), st.integers(0, 7)),
            st.tuples(st.just("round"), st.just(0)),
            st.tuples(st.just("everyone"), st.just(0)),
        ),
        max_size=12,
    )
)
async def test_whatever_reaches_a_named_cast_in_whatever_order_the_bus_is_the_eager_ones(ops) -> None:
    lazy, eager = named_team(8), named_team(8, names=None)
    for t in (lazy, eager):
        async with t.env.session():
            for kind, i in ops:
                if kind in ("send", "everyone"):
                    to = {f"m{i}"} if kind == "send" else {f"{Role.__module__}.Role"}  # a name; the class: all
                    with t.env.id_scope():
                        message = Message(f"to {sorted(to)}", sent_from="Human", send_to=to)
                    t.env.publish_message(message)
                elif kind == "look":
                    assert t.env.roles[f"m{i}"].name == f"m{i}"
                elif kind == "place":
                    assert t.env.members[i].place == i
                else:
                    await t.env.run_round()
    built = {role.name for role in lazy.env.built_roles()}
    reached = {f"m{i}" for kind, i in ops if kind in ("send", "look", "place")}
    assert built >= reached and (len(built) == 8 or not any(kind == "everyone" for kind, _ in ops))
    assert transcript(lazy) == transcript(eager)
    assert lazy.env.state_dict().model_dump() == eager.env.state_dict().model_dump()


def test_a_named_cast_that_cannot_be_is_refused_naming_the_value() -> None:
    team = Team()
    with pytest.raises(InvalidValueError, match=r"names='m'.*one '\{\}'"):
        team.hire(Cast(2, Ring(2), names="m"))
    with pytest.raises(InvalidValueError, match=r"names='m\{\}\{x\}'"):
        team.hire(Cast(2, Ring(2), names="m{}{x}"))
    team.hire([Role(name="m1")])
    with pytest.raises(DuplicateRoleError, match=r"'m1'.*names='m\{\}'"):
        team.hire(Cast(2, Ring(2), names="m{}"))
    other = named_team(3)
    with pytest.raises(DuplicateRoleError, match="'m2'"):
        other.hire([Role(name="m2")])
    assert len(other.env.roles) == 3 and other.env.roles["m2"].name == "m2"


async def test_a_named_cast_whose_role_is_named_otherwise_stops_the_run_saying_so() -> None:
    team = named_team(3, renumber=True)  # build(i) names its role by how many it made: not m{i}
    with pytest.raises(RunError, match=r"build\(2\) made 'm1'.*names say 'm2'"):
        await team.run(n_round=2, idea="go", send_to="m2")
