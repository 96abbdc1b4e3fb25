"""The heap settled after each round of a session (``core.heap``): frozen within, given back at its end."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator, Sequence

import pytest

from metaroles import Action, Environment, LocalBackend, Message, Role, Team, UserRequirement
from metaroles.core.heap import FULL_PASS_EVERY, SettledHeap
from metaroles.sharding.session import sharded


class Cycle:
    """A reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


class Note(Action):
    """Records, each turn, how many objects are frozen; keeps a cycle for one round, then drops it."""

    def __init__(self, seen: list[int], refs: list[weakref.ref[Cycle]]) -> None:
        super().__init__()
        self.seen, self.refs = seen, refs
        self.kept: Cycle | None = None

    async def run(self, history: Sequence[Message]) -> str:
        self.seen.append(gc.get_freeze_count())
        if self.kept is None and not self.refs:
            self.kept = Cycle()  # survives round 1, so that round's settling freezes it
            self.refs.append(weakref.ref(self.kept))
        else:
            self.kept = None  # (round 3) garbage now, but frozen: collected once the session gives it back
        return "noted"


def pair(seen: list[int], refs: list[weakref.ref[Cycle]]) -> list[Role]:
    """``a`` and ``b`` answering each other, one turn per round: a, b, a, ..."""
    return [
        Role(name=name, actions=[Note(seen, refs)], watch=[UserRequirement, Note], send_to=other)
        for name, other in (("a", "b"), ("b", "a"))
    ]


def noting_env(seen: list[int], refs: list[weakref.ref[Cycle]]) -> Environment:
    env = Environment(seed=0)
    env.add_roles(pair(seen, refs))
    env.publish_message(Message("go", send_to="a"))
    return env


@pytest.fixture
def clean_heap() -> Iterator[None]:
    """Each test starts with nothing frozen and the collector on, and leaves it so."""
    gc.unfreeze()
    enabled = gc.isenabled()
    gc.enable()
    yield
    gc.unfreeze()
    if not enabled:
        gc.disable()


@pytest.mark.usefixtures("clean_heap")
async def test_a_session_freezes_what_survives_each_round_and_gives_it_back() -> None:
    seen: list[int] = []
    refs: list[weakref.ref[Cycle]] = []
    await noting_env(seen, refs).run(3)
    assert seen[0] == 0  # nothing settled before the first round ended
    assert seen[1] > 0 and seen[2] >= seen[1]  # each later round starts on a settled heap
    assert gc.get_freeze_count() == 0  # the session gave it all back
    assert refs[0]() is not None  # the cycle dropped in round 2 was frozen: not yet collected
    gc.collect()
    assert refs[0]() is None  # and is collected now: settling loses nothing


class Looped(Role):
    """A role in a reference cycle with itself: once dropped, only the cyclic collector frees it."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name, watch=[UserRequirement])
        self.loop = [self]


@pytest.mark.usefixtures("clean_heap")
async def test_a_sharded_driver_keeps_none_of_the_roles_it_shipped() -> None:
    env = Environment(seed=0)
    env.add_roles(Looped(f"r{i}") for i in range(4))
    refs = [weakref.ref(role) for role in env.roles.values()]
    gc.collect()  # the roles are old, as a built society's are: a young pass does not reach them
    async with env.session():
        async with sharded(env, LocalBackend(2).shard_set()) as run:
            await run.run_round()  # collected as the shards work their first round, not frozen at its end
            assert all(ref() is None for ref in refs)
            assert gc.get_freeze_count() > 0, "the round's end froze what lives on"


class Thresholds(Action):
    """Records, each turn, the collector's thresholds."""

    def __init__(self, seen: list[tuple[int, int, int]]) -> None:
        super().__init__()
        self.seen = seen

    async def run(self, history: Sequence[Message]) -> str:
        self.seen.append(gc.get_threshold())
        return "noted"


@pytest.mark.usefixtures("clean_heap")
async def test_within_a_session_full_passes_are_rare_and_the_thresholds_come_back() -> None:
    outside = gc.get_threshold()
    seen: list[tuple[int, int, int]] = []
    env = Environment(seed=0)
    env.add_role(Role(name="a", actions=[Thresholds(seen)], watch=[UserRequirement]))
    env.publish_message(Message("go", send_to="a"))
    await env.run(2)
    assert seen == [(outside[0], outside[1], max(outside[2], FULL_PASS_EVERY))]
    assert gc.get_threshold() == outside


@pytest.mark.usefixtures("clean_heap")
async def test_keep_takes_a_bulk_load_out_of_the_passes_even_while_the_collector_is_paused() -> None:
    heap = SettledHeap()
    try:
        gc.disable()  # as a bulk load pauses it (``core.heap.paused_gc``)
        loaded = [Cycle() for _ in range(1000)]
        heap.keep()
        gc.enable()
        assert not any(o is loaded[-1] for o in gc.get_objects())  # frozen: no pass walks them
    finally:
        heap.release()
    assert any(o is loaded[-1] for o in gc.get_objects())  # given back with the session's end


@pytest.mark.usefixtures("clean_heap")
async def test_rounds_outside_a_session_leave_the_heap_alone() -> None:
    seen: list[int] = []
    env = noting_env(seen, [])
    await env.run_round()
    await env.run_round()
    assert seen == [0, 0]


@pytest.mark.usefixtures("clean_heap")
async def test_a_heap_someone_else_froze_stays_frozen() -> None:
    sentinel: list[object] = []
    gc.freeze()
    frozen = gc.get_freeze_count()
    seen: list[int] = []
    await noting_env(seen, []).run(2)
    assert max(seen) <= frozen  # not this session's to settle: nothing more was frozen
    assert not any(o is sentinel for o in gc.get_objects())  # nor to unfreeze: still out of the generations


@pytest.mark.usefixtures("clean_heap")
async def test_with_the_collector_off_nothing_is_frozen() -> None:
    gc.disable()
    seen: list[int] = []
    await noting_env(seen, []).run(2)
    assert seen == [0, 0]
    assert not SettledHeap().owned


@pytest.mark.usefixtures("clean_heap")
async def test_a_team_run_settles_and_gives_back_too() -> None:
    seen: list[int] = []
    team = Team(env=Environment(seed=0))
    team.hire(pair(seen, []))
    await team.run(n_round=3, idea="go", send_to="a")
    assert seen[0] == 0 and seen[1] > 0
    assert gc.get_freeze_count() == 0


@pytest.mark.usefixtures("clean_heap")
async def test_a_sharded_driver_freezes_the_roles_it_keeps_to_come_back_and_walks_no_full_pass() -> None:
    from metaroles import TestLLM
    from metaroles.project.registry import load_scenario

    module = load_scenario("society")
    plan = module.build(module.Config(agents=40, rounds=2, llm_agents=0), TestLLM())
    env, team = plan.team.env, plan.team
    team.run_project(plan.idea)
    full_passes: list[int] = []

    def counted(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            full_passes.append(1)

    async with env.session():
        async with sharded(env, LocalBackend(2).shard_set(), casts=team.casts, keep=True) as run:
            assert len(run.kept) == len(env.members), "every role came from the cast: kept here to come back"
            gc.callbacks.append(counted)
            try:
                await run.run_round()
            finally:
                gc.callbacks.remove(counted)
            assert not full_passes, "nothing shipped was dropped: no full collection to find it"
            assert gc.get_freeze_count() > 0, "the kept roles are out of the collector's passes"
    assert len(env.history) > 1
