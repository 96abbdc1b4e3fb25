"""Incremental checkpoints: every round file reads back to exactly the environment's state."""

import json

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from metaroles import Action, Environment, Intervention, Message, Role, UserRequirement
from metaroles.core.exceptions import ConfigError, InvalidValueError
from metaroles.record.checkpoint import MESSAGES, CheckpointWriter
from metaroles.record.numbering import round_file
from metaroles.record.restore import checkpoint_history, restore_checkpoint
from metaroles.record.rows import numbers_json


class Echo(Action):
    async def run(self, history):
        return f"echo {len(history)}"


class Thoughtful(Role):
    """A role with its own _think: not replayable, so checkpoints carry its state."""

    async def _think(self) -> bool:
        return await super()._think()


class PassThrough(Intervention):
    pass


def ring(n: int, seed: int = 0) -> Environment:
    env = Environment(seed=seed)
    for i in range(n):
        kind = Thoughtful if i == 3 else Role
        env.add_role(kind(name=f"r{i}", actions=[Echo], watch=[UserRequirement, Echo], send_to=f"r{(i + 1) % n}"))
    return env


def restored(folder, roles: int, **kwargs) -> Environment:
    env = ring(roles)
    restore_checkpoint(folder, env, **kwargs)
    return env


def same_state(env: Environment, folder) -> None:
    again = restored(folder, len(env.roles))
    assert again.state_dict().model_dump_json() == env.state_dict().model_dump_json()
    waiting = sorted(r.name for r in env.drive.readiness.ready if not r.rc.msg_buffer.empty())
    assert sorted(r.name for r in again.drive.readiness.ready) == waiting, "the same roles are ready to observe"
    assert checkpoint_history(folder) == env.history.storage


step = st.one_of(
    st.tuples(st.just("round"), st.integers(0, 3)),
    st.tuples(st.just("publish"), st.integers(0, 3)),
    st.tuples(st.just("forget"), st.integers(0, 3)),
    st.tuples(st.just("rewatch"), st.integers(0, 3)),
    st.tuples(st.just("draw"), st.integers(0, 3)),
    st.tuples(st.just("poke"), st.integers(0, 3)),
    st.tuples(st.just("intervene"), st.integers(0, 3)),
    st.tuples(st.just("loop"), st.integers(0, 2)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, min_size=1, max_size=16), every=st.integers(1, 4))
async def test_each_checkpoint_reads_back_to_the_state_it_was_written_from(tmp_path_factory, steps, every):
    folder = tmp_path_factory.mktemp("ckpt")
    env = ring(4)
    writer = CheckpointWriter(folder, every=every)
    for kind, i in steps:
        role = env.get_role(f"r{i}")
        if kind == "round":
            await env.run_round()
        elif kind == "publish":
            env.publish_message(Message(f"hello {i}", send_to=role.name))
        elif kind == "forget":
            role.rc.memory.delete_newest()
        elif kind == "rewatch":
            role._watch([*role.rc.watch, f"x.{i}"])  # watch sets are shared and frozen: a change replaces it
        elif kind == "poke":
            role.rc.msg_buffer.pop()  # touched outside the bus: the checkpoint must notice
            role.rc.news = list(role.rc.news)
        elif kind == "intervene":
            env.interventions[:] = [] if env.interventions else [PassThrough()]
        elif kind == "loop":  # a turn of up to two actions: the role stops (or starts again) being replayable
            role.rc.max_react_loop = 3 - role.rc.max_react_loop
        else:
            env.rng.random()
        env.round += kind != "round"  # one checkpoint per round number
        writer.write(env)
        same_state(env, folder)


async def test_a_delta_holds_only_what_changed(tmp_path):
    env = ring(50)
    writer = CheckpointWriter(tmp_path, every=100)
    env.publish_message(Message("go", send_to="r0"))
    writer.write(env)
    for _ in range(3):
        await env.run_round()
        writer.write(env)
    record = json.loads(round_file(tmp_path, 3).read_text())
    assert record["kind"] == "delta"
    assert list(record["roles"]) == ["r3"], "replay rebuilds the default roles; r3 thinks its own way"
    assert record["roles"]["r3"] == {"buffer": [3], "news": [], "state": -1}, "only what changed for r3"
    assert record["ops"] == [0, 2, 1, 2, 3], "r2 observed, then acted (its answer is row 3)"
    assert record["deliveries"] == [3, 1, 3], "row 3 reached one role: r3"
    assert len((tmp_path / MESSAGES).read_text().splitlines()) == 4, "each message is written once"


async def test_a_role_touched_outside_the_bus_is_replayed_again_from_its_next_round(tmp_path):
    """Its entry is written whole once; the deliveries of the rounds after count towards its renewed expectation."""
    env = ring(4)
    writer = CheckpointWriter(tmp_path, every=100)
    r1 = env.get_role("r1")
    for n in range(4):
        if n:
            await env.run_round()
        if n == 1:
            r1.rc.memory.add(Message("a note"))  # outside the bus: the next delta must carry it
        env.publish_message(Message(f"more {n}", send_to="r1"))
        writer.write(env)
        same_state(env, tmp_path)
    touched = json.loads(round_file(tmp_path, 1).read_text())
    assert "memory" in touched["roles"]["r1"], "r1 is written whole once"
    for round_no in (2, 3):
        record = json.loads(round_file(tmp_path, round_no).read_text())
        assert record["kind"] == "delta" and "r1" not in record["roles"], f"round {round_no}: r1 replays"


async def test_a_torn_delta_falls_back_to_the_round_before(tmp_path):
    env = ring(3)
    writer = CheckpointWriter(tmp_path, every=10)
    env.publish_message(Message("go", send_to="r0"))
    states = []
    for _ in range(4):
        writer.write(env)
        states.append(env.state_dict().model_dump_json())
        await env.run_round()
    round_file(tmp_path, 2).write_text('{"version": 2, "round": 2, "kind": "del')
    again = ring(3)
    with pytest.warns(UserWarning, match="round-0002.json is unreadable"):
        result = restore_checkpoint(tmp_path, again)
    assert result.round == 1, "round 3 builds on the torn round 2, so round 1 is the newest complete state"
    assert again.state_dict().model_dump_json() == states[1]


async def test_a_torn_message_row_is_cut_off_and_the_run_continues(tmp_path):
    env = ring(3)
    writer = CheckpointWriter(tmp_path)
    env.publish_message(Message("go", send_to="r0"))
    writer.write(env)
    await env.run_round()
    writer.write(env)
    with (tmp_path / MESSAGES).open("a") as handle:
        handle.write('{"id": "half')  # a crash while appending the next round's rows
    same_state(env, tmp_path)
    again = ring(3)
    writer = CheckpointWriter(tmp_path, restored=restore_checkpoint(tmp_path, again))
    await again.run_round()
    writer.write(again)
    same_state(again, tmp_path)
    assert all(line.endswith("}") for line in (tmp_path / MESSAGES).read_text().splitlines())


async def test_the_random_source_resumes_where_it_was(tmp_path):
    env = ring(2, seed=7)
    env.rng.random()
    CheckpointWriter(tmp_path).write(env)
    expected = [env.rng.random() for _ in range(3)]
    again = ring(2, seed=99)
    restore_checkpoint(tmp_path, again)
    assert [again.rng.random() for _ in range(3)] == expected


def test_an_empty_folder_has_no_checkpoint(tmp_path):
    with pytest.raises(ConfigError, match="no readable checkpoint"):
        restore_checkpoint(tmp_path, ring(1))


async def test_a_sharded_rounds_driver_file_holds_its_own_roles_whole_when_it_is_a_full_snapshot(tmp_path):

    def team() -> Environment:
        env = Environment(seed=3)
        env.add_role(Role(name="moderator"))
        return env

    env, writer = team(), CheckpointWriter(tmp_path, every=2)
    for round_no, text in enumerate(["one", "two", "three"], start=1):  # full, delta, full
        env.roles["moderator"].rc.memory.add(Message(text, sent_from="Human"))
        env.round = round_no
        writer.write_driver(env, [env.roles["moderator"]], [])
    assert json.loads(round_file(tmp_path, 3).read_text())["kind"] == "full"
    restored = team()
    restore_checkpoint(tmp_path, restored)
    assert [m.content for m in restored.roles["moderator"].rc.memory] == ["one", "two", "three"]


@given(st.lists(st.integers(-1, 2**63 - 1), max_size=40))
def test_numbers_are_written_as_the_json_list_of_their_text(numbers: list[int]) -> None:
    assert numbers_json(numbers) == f"[{','.join(map(str, numbers))}]"
    assert json.loads(numbers_json(numbers)) == numbers


@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["x.Act", "y.Other"]), st.sampled_from(["a", "b", "c"])),
        max_size=12,
    )
)
def test_a_senders_rows_follow_its_actions_and_addresses(said: list[tuple[str, str, str]]) -> None:
    """Rows of one sender share its encoded fields only while its action and addresses stay the same."""
    from metaroles.record.rows import MessageRows

    rows = MessageRows()
    for n, (sender, action, to) in enumerate(said):
        message = Message(f"m{n}", cause_by=action, sent_from=sender, send_to=frozenset({to}) if n % 2 else {to})
        line = json.loads(rows._encode(message))
        fields = (line["cause_by"], line["sent_from"], line["send_to"], line["content"])
        assert fields == (action, sender, [to], f"m{n}")
        assert line == json.loads(MessageRows()._encode(message))


@given(st.lists(st.integers(0, 5), max_size=30), st.sampled_from(["user", "assistant", "system"]))
def test_rows_of_a_list_name_each_message_once_in_the_order_first_seen(picks: list[int], role: str) -> None:
    """Repeats in one list (or across lists) get the row first given; each new message adds one line."""
    from metaroles.record.rows import MessageRows

    messages = [Message(f"m{n}", role=role, sent_from="a", send_to={"b"}) for n in range(6)]
    rows, lines = MessageRows(), []
    half = len(picks) // 2
    listed = [json.loads(rows._rows_of([messages[p] for p in part], lines)) for part in (picks[:half], picks[half:])]
    first_seen = list(dict.fromkeys(picks))
    assert [*listed[0], *listed[1]] == [first_seen.index(p) for p in picks]
    table = [json.loads(line) for line in lines]
    assert [(t["content"], t["role"]) for t in table] == [(f"m{p}", role) for p in first_seen]
    assert all(line.endswith("\n") and line.count("\n") == 1 for line in lines)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(min_size=1, max_size=12), watched=st.lists(st.text(min_size=1, max_size=12), max_size=4))
def test_a_full_snapshot_writes_a_roles_watch_and_addresses_as_json_writes_them(tmp_path, name, watched):
    """The entry's lists are ``json.dumps`` of the sorted names, byte for byte (escapes, separators), read back."""
    try:
        role = Role(name=name, watch=watched)
    except InvalidValueError:  # a name no role may have (control characters, the broadcast address, ...)
        assume(False)
    env = Environment()
    env.add_roles([role])
    folder = tmp_path / name.encode().hex()
    text = CheckpointWriter(folder).write(env).read_text(encoding="utf-8")
    watch, addresses = json.dumps(sorted(role.rc.watch)), json.dumps(sorted(role.addresses))
    assert f'"watch":{watch},"addresses":{addresses}' in text
    entry = json.loads(text)["roles"][name]
    assert (entry["watch"], entry["addresses"]) == (sorted(role.rc.watch), sorted(role.addresses))
