"""Sharded runs are the one-process run: the shards' code run in this process (``LocalBackend``).

Roles are pickled to their shards and back exactly as on Ray (``test_ray_shards.py`` runs the
same on real Ray actors); here every scenario runs at 1, 2 and 3 shards, and a hypothesis test
routes random messages over random shard maps.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from metaroles.scenarios.society import Agent

from metaroles import Action, ActionResult, DeadLetterWarning, Environment, Message, Role, Team, TestLLM
from metaroles.core.exceptions import InvalidValueError, RunError
from metaroles.project.registry import load_scenario
from metaroles.project.scenario import resume_scenario, run_scenario
from metaroles.record.restore import restore_checkpoint
from metaroles.sharding import transfer
from metaroles.sharding.backends import LocalBackend, LocalShards, placement
from metaroles.sharding.driver import RemoteRole, ShardedRun
from metaroles.sharding.shardset import RunRound
from metaroles.sharding.worker import ShardHost
from metaroles.team.options import RunOptions

SEED = 5
SCENARIOS: dict[str, dict[str, object]] = {
    "debate": {},
    "feed": {"agents": 200, "rounds": 6, "activation": 0.2, "llm_share": 0.2},
    "society": {"agents": 300, "rounds": 6, "llm_agents": 4},
    "software_company": {},
    "werewolf": {},
}
RUN_FILES = ("events.jsonl", "transcript.md", "state.json", "metrics.jsonl", "report.json", "ledger.json")
"""What a run directory holds of the run itself (checkpoints are how it was kept, not what it was)."""


def run_files(run_dir: Path) -> dict[str, bytes]:
    return {name: (run_dir / name).read_bytes() for name in RUN_FILES if (run_dir / name).exists()}


async def scenario_run(name: str, out: Path, backend: Any = None, **options: object) -> Team:
    _, team = await run_scenario(
        name,
        llm=TestLLM(),
        options={**SCENARIOS[name], **options},
        out_dir=out,
        run=RunOptions(seed=SEED, backend=backend),
    )
    return team


@pytest.mark.parametrize("shards", [1, 2, 3])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_a_sharded_run_writes_the_one_process_run_byte_for_byte(name: str, shards: int, tmp_path: Path) -> None:
    await scenario_run(name, tmp_path / "one")
    backend = LocalBackend(shards)
    team = await scenario_run(name, tmp_path / "sharded", backend)
    one, sharded = run_files(tmp_path / "one"), run_files(tmp_path / "sharded")
    assert {"events.jsonl", "transcript.md", "state.json", "report.json"} <= set(one)
    assert sharded == one
    assert (
        backend.last is not None and 0 < backend.last.calls <= shards * team.env.round
    )  # one call per shard per round
    assert not any(isinstance(role, RemoteRole) for role in team.env.roles.values())  # every role came back


async def test_werewolf_keeps_its_moderator_on_the_driver(tmp_path: Path) -> None:
    backend = LocalBackend(2)
    seen: list[dict[str, int | None]] = []
    original = ShardedRun.open

    async def watched(self: ShardedRun) -> None:
        await original(self)
        seen.append(self.shard_map)

    ShardedRun.open = watched  # type: ignore[method-assign]
    try:
        await scenario_run("werewolf", tmp_path / "w", backend)
    finally:
        ShardedRun.open = original  # type: ignore[method-assign]
    assert seen[0]["Moderator"] is None
    assert {place for name, place in seen[0].items() if name != "Moderator"} == {0, 1}


async def cut_on_two_shards(out: Path, *, at_round: int) -> None:
    """The society on two shards, checkpointed every round, stopped by a failure after ``at_round``."""

    def crash(team: Team) -> None:
        if team.env.round == at_round:
            raise RuntimeError("the driver's machine went away")

    with pytest.raises(RuntimeError, match="went away"):
        await run_scenario(
            "society",
            llm=TestLLM(),
            options=SCENARIOS["society"],
            out_dir=out,
            run=RunOptions(seed=SEED, backend=LocalBackend(2), checkpoint_every=1),
            on_round=crash,
        )


async def test_a_run_cut_short_on_two_shards_resumes_on_three_as_if_uninterrupted(tmp_path: Path) -> None:
    await scenario_run("society", tmp_path / "one")
    await cut_on_two_shards(tmp_path / "cut", at_round=4)
    assert not (tmp_path / "cut" / "state.json").exists()  # the roles were on shards: the checkpoint stands
    _, team = await resume_scenario(tmp_path / "cut", llm=TestLLM(), backend=LocalBackend(3))
    assert run_files(tmp_path / "cut") == run_files(tmp_path / "one")
    assert all(isinstance(role, Agent) for role in team.env.roles.values())


def restored_state(checkpoints: Path, round_no: int, out: Path, **options: object) -> bytes:
    """The society's state at ``round_no`` as one process restores it from ``checkpoints``."""
    module = load_scenario("society")
    built = module.build(module.Config(**{**SCENARIOS["society"], **options}), TestLLM())
    restore_checkpoint(checkpoints, built.team.env, through_round=round_no)
    return built.team.env.save(out).read_bytes()


async def test_each_shard_checkpoints_its_own_roles_and_any_round_restores_as_one_process_kept_it(
    tmp_path: Path,
) -> None:
    for name, backend in (("one", None), ("sharded", LocalBackend(2))):
        await run_scenario(
            "society",
            llm=TestLLM(),
            options=SCENARIOS["society"],
            out_dir=tmp_path / name,
            run=RunOptions(seed=SEED, backend=backend, checkpoint_every=1),
        )
    checkpoints = tmp_path / "sharded" / "checkpoints"
    parts = sorted(p.name for p in (checkpoints / "parts").iterdir())
    assert parts == ["0000-0", "0000-1"]
    driver = [json.loads(p.read_text()) for p in sorted(checkpoints.glob("round-*.json"))]  # round 0 (the idea) too
    assert all(record["parts"] == [f"parts/{part}" for part in parts] for record in driver)
    assert all("history_add" in record for record in driver if record["kind"] == "delta")
    for part in parts:
        records = [json.loads(p.read_text()) for p in sorted((checkpoints / "parts" / part).glob("round-*.json"))]
        assert [r["kind"] for r in records] == ["full"] + ["delta"] * (len(records) - 1)  # what changed, not all
        assert all(line.startswith('{"ref":') for line in (checkpoints / "parts" / part / "messages.jsonl").open())
    assert [record["round"] for record in driver] == list(range(len(driver)))
    for round_no in range(len(driver)):  # every round, restored in one process from either run, is the same
        one = restored_state(tmp_path / "one" / "checkpoints", round_no, tmp_path / "a.json")
        assert restored_state(checkpoints, round_no, tmp_path / "b.json") == one


async def test_a_run_cut_short_on_shards_resumes_in_one_process_from_their_parts(tmp_path: Path) -> None:
    await scenario_run("society", tmp_path / "one")
    await cut_on_two_shards(tmp_path / "cut", at_round=3)
    await resume_scenario(tmp_path / "cut", llm=TestLLM())
    assert run_files(tmp_path / "cut") == run_files(tmp_path / "one")


def everyone(roles: list[Role]) -> int:
    return len(roles)


async def test_round_metrics_that_read_every_role_must_name_their_parts(tmp_path: Path) -> None:
    team = await scenario_run("debate", tmp_path / "d")
    assert team.gathered(everyone) == [3]  # one process: one part of all roles

    problems: list[str] = []
    parts: list[list[int]] = []

    def record(t: Team) -> None:
        try:
            t.gathered(everyone)
        except RunError as exc:
            problems.append(str(exc))

    def counted(t: Team) -> None:
        parts.append(t.gathered(everyone))

    for on_record, metric_parts in ((record, []), (counted, [everyone])):
        module = load_scenario("debate")
        plan = module.build(module.Config(), TestLLM())
        plan.team.backend = LocalBackend(2)
        plan.team.on_record, plan.team.metric_parts = on_record, metric_parts
        await plan.team.run(n_round=2, idea=plan.idea)
    assert problems and "metric_parts" in problems[0]
    assert parts and all(part == [2, 1, 0] for part in parts[1:])  # shard 0, shard 1, the driver


async def test_explain_route_during_a_sharded_run_says_where_the_role_decides(tmp_path: Path) -> None:
    seen: list[list[str]] = []

    def explain(team: Team) -> None:
        last = team.env.history.storage[-1]
        seen.append(team.env.explain_route(last, "Bob").reasons)

    module = load_scenario("debate")
    plan = module.build(module.Config(), TestLLM())
    plan.team.backend, plan.team.on_round = LocalBackend(2), explain
    await plan.team.run(n_round=3, idea=plan.idea)
    assert seen[-1][0].startswith("delivered")
    assert any("RemoteRole('Bob', shard=1)" in reason for reasons in seen for reason in reasons)
    assert "delivered" in str(plan.team.env.explain_route(plan.team.env.history.storage[-1], "Bob"))  # back home


def test_shard_by_must_name_a_shard() -> None:
    roles = [Role(name=f"r{i}") for i in range(3)]
    env = Environment()
    env.add_roles(roles)
    with pytest.raises(InvalidValueError, match=r"shard_by\('r0', 2\) returned 7"):
        placement(roles, 2, lambda role, shards: 7)
    assert placement(roles, 2, None) == [0, 1, 0]
    with pytest.raises(InvalidValueError, match="shards=0"):
        LocalBackend(0)


# -- routing over random shard maps ---------------------------------------------------------------------


class Say(Action):
    """Publish the planned messages (``send_to`` as planned) through the role, then answer."""

    def __init__(self, speaker: Role, plan: list[frozenset[str]], moves: set[str] | None) -> None:
        super().__init__()
        self.speaker = speaker
        self.plan = plan
        self.moves = moves

    async def run(self, history: Sequence[Message]) -> ActionResult:
        if self.moves is not None:  # the role changes its addresses mid-round: later messages follow
            self.speaker.set_addresses({self.role_name, *self.moves})
            self.moves = None
        for target in self.plan:
            self.speaker.publish_message(Message(f"from {self.role_name}", send_to=set(target), cause_by=Say))
        return f"{self.role_name} done"


class Speaker(Role):
    def __init__(
        self, name: str, addresses: set[str], plan: list[frozenset[str]], send_to: set[str], moves: set[str] | None
    ) -> None:
        super().__init__(name=name, watch=[Say], send_to=send_to or {"<all>"})
        self.set_actions([Say(self, plan, moves)])
        self.set_addresses({name, *addresses})


NAMES = [f"r{i}" for i in range(6)]
ADDRESSES = ["x", "y", "z"]
TARGETS = st.frozensets(st.sampled_from([*NAMES, *ADDRESSES, "<all>", "nobody"]), min_size=1, max_size=3)


def build(spec: list[Any]) -> Environment:
    env = Environment(seed=1)
    env.add_roles(Speaker(NAMES[i], *role) for i, role in enumerate(spec))
    return env


def snapshot(env: Environment) -> dict[str, Any]:
    roles = [role.state_dict() for role in env._members]
    return {
        "history": [m.id for m in env.history],
        "dead": [m.id for m in env.dead_letters],
        "buffers": {s.name: [m.id for m in s.buffer] for s in roles},
        "memory": {s.name: [m.id for m in s.memory] for s in roles},
        "addresses": {s.name: sorted(s.addresses) for s in roles},
        "routed_by": {r.name: sorted(r.addresses) for r in env._members},  # the driver's index follows moves
    }


ROLE_SPECS = st.lists(
    st.tuples(
        st.sets(st.sampled_from(ADDRESSES), max_size=2),
        st.lists(TARGETS, max_size=2),
        st.sets(st.sampled_from([*NAMES, *ADDRESSES]), max_size=2),
        st.one_of(st.none(), st.sets(st.sampled_from(ADDRESSES), max_size=2)),
    ),
    min_size=1,
    max_size=len(NAMES),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=ROLE_SPECS,
    shards=st.integers(1, 4),
    data=st.data(),
    publishes=st.lists(st.tuples(TARGETS, st.booleans()), min_size=1, max_size=4),
)
def test_cross_shard_routing_delivers_what_one_process_delivers(
    spec: list[Any], shards: int, data: st.DataObject, publishes: list[tuple[frozenset[str], bool]]
) -> None:
    places = data.draw(
        st.lists(st.one_of(st.none(), st.integers(0, shards - 1)), min_size=len(spec), max_size=len(spec))
    )
    piece = data.draw(st.integers(1, 3))  # roles per piece on the way back: several pieces per shard

    async def both() -> tuple[dict[str, Any], dict[str, Any]]:
        one, driver = build(spec), build(spec)
        run = ShardedRun(driver, LocalShards(shards), places)
        run.backlog.behind = data.draw(st.booleans())  # the history taken in while the next round runs, or at once
        run.backlog.lazy = run.backlog.behind and data.draw(st.booleans())  # or when the run closes (or when needed)
        await run.open()
        for env in (one, driver):
            for number, (target, by_hand) in enumerate(publishes):
                with env.id_scope():  # an id made by hand (not the run's) crosses and comes back as any other
                    mine = {"id": f"by-hand-{number}"} if by_hand else {}
                    message = Message(f"news {number}", sent_from="Human", send_to=set(target), **mine)
                env.publish_message(message)
        for _ in range(3):
            await one.run_round()
            await run.run_round()
        await run.close()  # the roles come back, with what the last round delivered to them
        held = driver.history._store
        remembered = [m for role in driver._members for m in (*role.rc.memory.get(), *role.rc.msg_buffer.peek_all())]
        assert all(held[m.id] is m for m in remembered), "memories and buffers hold the history's very messages"
        return snapshot(one), snapshot(driver)

    with warnings.catch_warnings(), pieces_of(piece):
        warnings.simplefilter("ignore", DeadLetterWarning)
        one, sharded = anyio.run(both)
    assert sharded == one


@contextmanager
def pieces_of(size: int) -> Iterator[None]:
    """Shards give their roles back ``size`` at a time (``sharding.transfer.PIECE``) inside the block."""
    before, transfer.PIECE = transfer.PIECE, size
    try:
        yield
    finally:
        transfer.PIECE = before


class Keeper(Role):
    """A role that keeps a board it shares with others, and writes on it when it hears something."""

    def __init__(self, name: str, board: list[str]) -> None:
        super().__init__(name=name)
        self.board = board


async def test_roles_come_back_in_pieces_and_what_they_share_stays_one_object() -> None:
    board: list[str] = []
    team = Team(env=Environment(seed=3), backend=LocalBackend(2))
    team.hire(Keeper(f"k{i}", board) for i in range(9))
    team.run_project("hello", send_to="<all>")
    asked: list[tuple[int, int]] = []
    given: dict[tuple[int, int], bytes] = {}
    release_more = ShardHost.release_more

    def backwards(self: ShardHost, number: int) -> bytes:
        """The shard is asked for its last piece first (an async Ray actor may run calls sent together in any order)."""
        assert self.out is not None
        if (self.number, number) not in given:
            for k in range(self.out.pieces - 1, number - 1, -1):
                asked.append((self.number, k))
                given[self.number, k] = release_more(self, k)
        return given.pop((self.number, number))

    with pieces_of(2), patched(ShardHost, "release_more", backwards):
        await team.run(n_round=2)
    keepers = [role for role in team.env.roles.values() if isinstance(role, Keeper)]
    assert len(keepers) == 9 and not any(isinstance(r, RemoteRole) for r in team.env.roles.values())
    assert asked == [(0, 2), (0, 1), (1, 1)], "5 and 4 roles come back in 3 and 2 pieces of 2: the first is release's"
    by_shard = {n: [k.board for k in keepers[n::2]] for n in (0, 1)}
    for boards in by_shard.values():
        assert all(b is boards[0] for b in boards), "roles of one shard share their board across pieces"
    assert [len(k.rc.memory) for k in keepers] == [1] * 9, "each remembers the idea, from the driver's history"
    assert all(k.rc.memory.get()[0] is team.env.history.get()[0] for k in keepers), "the history's very message"


@contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    before = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, before)


async def test_a_large_sharded_runs_roles_stay_on_their_shards_and_its_run_directory_holds_them(tmp_path: Path) -> None:
    large = {"agents": 1500, "rounds": 6}  # more messages than state.json holds: it names the last checkpoint
    await scenario_run("society", tmp_path / "one", **large)
    team = await scenario_run("society", tmp_path / "sharded", LocalBackend(2), **large)
    assert json.loads((tmp_path / "sharded" / "state.json").read_bytes())["kind"] == "checkpoint_reference"
    assert run_files(tmp_path / "sharded") == run_files(tmp_path / "one")
    assert all(isinstance(role, RemoteRole) for role in team.env.roles.values())  # nothing came back
    rounds = team.env.round
    restored = [
        restored_state(tmp_path / n / "checkpoints", rounds, tmp_path / f"{n}.json", **large)
        for n in ("one", "sharded")
    ]
    assert restored[0] == restored[1]  # the roles' last state, as the shards wrote it
    with pytest.raises(RunError, match="stayed on shards"):
        await team.run(n_round=1)


class OpenedAt(LocalShards):
    """Shards that note, for each round's outbox, the round the driver had reached when it took it in."""

    def __init__(self, count: int, env: Environment) -> None:
        super().__init__(count)
        self.env = env
        self.opened: list[tuple[int, int]] = []
        """``(the outbox's round, the driver's round)`` for each outbox taken in."""

    def send(self, requests: Any, broadcasts: Any) -> Any:
        sent = super().send(requests, broadcasts)
        taken = self.taken

        class Noted:
            async def replies(_: Any) -> Any:
                replies = await sent.replies()
                for request, reply in zip(requests, replies, strict=True):
                    if isinstance(request, RunRound) and reply.result.sealed is not None:
                        reply.result.sealed = partial(taken, reply.result.sealed, request.round)
                return replies

        return Noted()

    def taken(self, sealed: Any, round_no: int) -> Any:
        self.opened.append((round_no, self.env.round))
        return sealed()


class OpenedAtBackend:
    def __init__(self, env: Environment) -> None:
        self.shard_by = None
        self.env = env
        self.last: OpenedAt | None = None

    def shard_set(self) -> OpenedAt:
        self.last = OpenedAt(2, self.env)
        return self.last


def ring_team(backend: Any = None) -> Team:
    team = Team(env=Environment(seed=3), backend=backend)
    team.hire(
        Agent(name=f"a{i}", neighbours=near, opinion=i / 12, epsilon=0.3, llm_backed=False)
        for i, near in enumerate([f"a{(i + 1) % 12}", f"a{(i + 5) % 12}"] for i in range(12))
    )
    return team


@pytest.mark.parametrize("logged", [False, True])
async def test_without_a_reader_the_driver_takes_rounds_in_when_the_run_closes(logged: bool, tmp_path: Path) -> None:
    one = ring_team()
    await one.run(n_round=5, idea="begin")
    team = ring_team()
    team.backend = backend = OpenedAtBackend(team.env)
    await team.run(n_round=5, idea="begin", events=tmp_path / "events.jsonl" if logged else None)
    assert backend.last is not None
    rounds = sorted({round_no for round_no, _ in backend.last.opened})
    assert rounds == list(range(1, 6)), "every round's outbox is taken in, once a shard's"
    if logged:  # the log reads each round: its outboxes come in before the round after it begins
        assert all(at == round_no for round_no, at in backend.last.opened)
    else:  # nobody reads the history between rounds: it is taken in as the run closes
        assert {at for _, at in backend.last.opened} == {5}
    assert [m.id for m in team.env.history] == [m.id for m in one.env.history]
    assert [m.content for m in team.env.history] == [m.content for m in one.env.history]
