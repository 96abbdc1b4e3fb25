"""Incremental checkpoints: every round file reads back to exactly the environment's state."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaroles import Action, Environment, Message, Role, UserRequirement
from metaroles.checkpoint import MESSAGES, CheckpointWriter, load_checkpoint, round_file
from metaroles.exceptions import ConfigError


class Echo(Action):
    async def run(self, history):
        return f"echo {len(history)}"


def ring(n: int, seed: int = 0) -> Environment:
    env = Environment(seed=seed)
    for i in range(n):
        env.add_role(Role(name=f"r{i}", actions=[Echo], watch=[UserRequirement, Echo], send_to=f"r{(i + 1) % n}"))
    return env


def same_state(env: Environment, restored) -> None:
    assert restored.state.model_dump_json() == env.state_dict().model_dump_json()


step = st.one_of(
    st.tuples(st.just("round"), st.integers(0, 3)),
    st.tuples(st.just("publish"), st.integers(0, 3)),
    st.tuples(st.just("forget"), st.integers(0, 3)),
    st.tuples(st.just("rewatch"), st.integers(0, 3)),
    st.tuples(st.just("draw"), st.integers(0, 3)),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, min_size=1, max_size=12), every=st.integers(1, 4))
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
            role.rc.watch.add(f"x.{i}")
        else:
            env.rng.random()
        env.round += kind != "round"  # one checkpoint per round number
        writer.write(env)
        same_state(env, load_checkpoint(folder))


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
    assert sorted(record["roles"]) == ["r2", "r3"], "only the role that spoke and the one it addressed"
    assert len(record["history_add"]) == 1
    assert len((tmp_path / MESSAGES).read_text().splitlines()) == 4, "each message is written once"


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
    with pytest.warns(UserWarning, match="round-0002.json is unreadable"):
        restored = load_checkpoint(tmp_path)
    assert restored.round == 1, "round 3 builds on the torn round 2, so round 1 is the newest complete state"
    assert restored.state.model_dump_json() == states[1]


async def test_a_torn_message_row_is_cut_off_and_the_run_continues(tmp_path):
    env = ring(3)
    writer = CheckpointWriter(tmp_path)
    env.publish_message(Message("go", send_to="r0"))
    writer.write(env)
    await env.run_round()
    writer.write(env)
    with (tmp_path / MESSAGES).open("a") as handle:
        handle.write('{"id": "half')  # a crash while appending the next round's rows
    restored = load_checkpoint(tmp_path)
    same_state(env, restored)
    again = ring(3)
    again.load_state(restored.state)
    writer = CheckpointWriter(tmp_path, restored=restored)
    await again.run_round()
    writer.write(again)
    same_state(again, load_checkpoint(tmp_path))
    assert all(line.endswith("}") for line in (tmp_path / MESSAGES).read_text().splitlines())


async def test_the_random_source_resumes_where_it_was(tmp_path):
    env = ring(2, seed=7)
    env.rng.random()
    CheckpointWriter(tmp_path).write(env)
    expected = [env.rng.random() for _ in range(3)]
    again = ring(2, seed=99)
    again.load_state(load_checkpoint(tmp_path).state)
    assert [again.rng.random() for _ in range(3)] == expected


def test_an_empty_folder_has_no_checkpoint(tmp_path):
    with pytest.raises(ConfigError, match="no readable checkpoint"):
        load_checkpoint(tmp_path)
