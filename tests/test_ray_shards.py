"""Sharded runs on a real local Ray: shard actors, a killed shard, a killed driver — always the one-process run."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from metaroles import Cast, Environment, RayBackend, Role, Team, TestLLM, UserRequirement
from metaroles.core.exceptions import RunError
from metaroles.core.heap import FULL_PASS_EVERY
from metaroles.llm.cassette import CassetteLLM
from metaroles.llm.limits import LimitedLLM
from metaroles.llm.openai_compat import OpenAICompatibleLLM
from metaroles.project.registry import load_scenario
from metaroles.project.scenario import resume_scenario, run_scenario
from metaroles.team.options import RunOptions
from tests import ray_helpers
from tests.chat_server import ChatServer, Reply, completion, start
from tests.faults.helpers import killed, ok, run_args
from tests.test_sharding import RUN_FILES, SCENARIOS, SEED, run_files, scenario_run

CASES = [
    ("debate", 1, {}),
    ("software_company", 2, {}),
    ("werewolf", 3, {}),
    ("society", 2, {"agents": 2000, "rounds": 9, "llm_agents": 0}),
    ("feed", 2, {"agents": 2000, "rounds": 6, "activation": 0.05, "llm_share": 0.1, "recommender": "similar"}),
]


@pytest.mark.parametrize(("name", "shards", "options"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
async def test_a_run_on_ray_shards_is_the_one_process_run(
    name: str, shards: int, options: dict[str, object], ray_address: str, tmp_path: Path
) -> None:
    await scenario_run(name, tmp_path / "one", **options)
    backend = RayBackend(shards, address=ray_address)
    team = await scenario_run(name, tmp_path / "ray", backend, **options)
    assert run_files(tmp_path / "ray") == run_files(tmp_path / "one")
    assert backend.last is not None and backend.last.calls <= shards * team.env.round
    assert backend.last.actors == []  # the run's actors are gone


async def test_a_shard_process_runs_its_rounds_with_rare_full_collections(ray_address: str) -> None:
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(ray_helpers)
    team = Team(env=Environment(seed=0), backend=RayBackend(2, address=ray_address))
    team.hire(Role(name=f"r{i}", actions=[ray_helpers.Thresholds], watch=[UserRequirement]) for i in range(2))
    await team.run(n_round=1, idea="say")
    said = [json.loads(m.content or "") for m in team.env.history if m.sent_from != "Human"]
    assert len(said) == 2 and all(s["pid"] != os.getpid() for s in said)  # both turns ran on shards
    assert all(s["thresholds"][2] >= FULL_PASS_EVERY for s in said)  # each step freezes: no pass per round


async def test_shards_that_fail_to_take_their_roles_are_stopped_and_the_roles_stay_here(ray_address: str) -> None:
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(ray_helpers)
    backend = RayBackend(2, address=ray_address)
    team = Team(env=Environment(seed=0), llm=TestLLM(), backend=backend)
    team.hire(Cast(4, ray_helpers.Renumbered()))
    with pytest.raises(RunError, match=r"build\(\d\) made 'n\d+'.*must make the same role in every process"):
        await team.run(n_round=1, idea="go")
    assert backend.last is not None and backend.last.actors == []  # started before the roles were ready: stopped
    assert [type(role) for role in team.env.roles.values()] == [Role] * 4  # never swapped for stand-ins


async def test_a_shard_killed_mid_round_stops_the_run_and_resume_finishes_it(ray_address: str, tmp_path: Path) -> None:
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(ray_helpers)
    await scenario_run("debate", tmp_path / "one")
    with pytest.raises(RunError, match="a shard failed in round"):
        await run_scenario(
            "debate",
            llm=ray_helpers.KillerLLM("Bob", 2),  # Bob lives on shard 1; his second turn kills it mid-round
            options=SCENARIOS["debate"],
            out_dir=tmp_path / "cut",
            run=RunOptions(seed=SEED, backend=RayBackend(2, address=ray_address)),
        )
    assert not (tmp_path / "cut" / "state.json").exists()
    checkpoints = sorted(p.name for p in (tmp_path / "cut" / "checkpoints").glob("round-*.json"))
    assert checkpoints and checkpoints[-1] < "round-0008.json"
    await resume_scenario(tmp_path / "cut", llm=TestLLM(), backend=RayBackend(2, address=ray_address))
    assert run_files(tmp_path / "cut") == run_files(tmp_path / "one")


def test_a_killed_driver_resumes_on_another_shard_count_from_the_command_line(ray_address: str, tmp_path: Path) -> None:
    ok(*run_args("society", tmp_path / "one"))
    ray = ["--backend", "ray", "--ray-address", ray_address]
    killed("point=append:events.jsonl:4", *run_args("society", tmp_path / "cut", *ray, "--shards", "2"))
    assert not (tmp_path / "cut" / "state.json").exists()
    ok("resume", str(tmp_path / "cut"), "-q", *ray, "--shards", "3")
    assert set(RUN_FILES) <= set(run_files(tmp_path / "one"))
    assert run_files(tmp_path / "cut") == run_files(tmp_path / "one")


async def test_roles_on_shards_call_one_openai_compatible_server_within_the_limits(
    ray_address: str, tmp_path: Path
) -> None:
    state = ChatServer()

    def respond(body: dict[str, Any]) -> Reply:  # an answer that depends only on the request
        digest = hashlib.sha256(json.dumps(body["messages"], sort_keys=True).encode()).digest()
        return Reply(200, completion(json.dumps({"opinion": digest[0] / 255})))

    state.responder = respond
    httpd = start(state)
    try:
        served = OpenAICompatibleLLM("served-model", base_url=state.url, api_key="k", backoff=0.0)
        dirs = {}
        for name, backend in (("one", None), ("ray", RayBackend(2, address=ray_address))):
            limited = LimitedLLM(served, max_in_flight=4)
            _, team = await run_scenario(
                "society",
                llm=limited,
                options={"agents": 30, "rounds": 3, "llm_agents": 6},
                out_dir=tmp_path / name,
                run=RunOptions(seed=SEED, backend=backend),
            )
            dirs[name] = run_files(tmp_path / name)
            assert team.env.ledger.total_tokens > 0
        assert len(state.requests) == 2 * 6 * 4  # 6 model-backed agents, 4 rounds, both runs
        assert dirs["ray"] == dirs["one"]
    finally:
        state.release.set()
        httpd.shutdown()
        httpd.server_close()


def test_a_limited_model_keeps_to_its_share_on_each_shard() -> None:
    limited = LimitedLLM(TestLLM(), max_in_flight=8, requests_per_second=10)
    copy = pickle.loads(pickle.dumps(limited))
    copy.shard_share(4)
    assert (copy.max_in_flight, round(copy.interval, 3)) == (2, 0.4)  # 4 shards x 2 in flight, 4 x 2.5 rps
    assert (limited.max_in_flight, limited.interval) == (8, 0.1)
    served = OpenAICompatibleLLM("m", base_url="http://127.0.0.1:9/v1", api_key="k", timeout=5.0)
    again = pickle.loads(pickle.dumps(served))
    assert (again.model, again.timeout, str(again._client.base_url)) == ("m", 5.0, "http://127.0.0.1:9/v1/")


async def test_a_cassette_records_on_shards_what_one_process_records_and_replays_on_any_of_them(
    ray_address: str, tmp_path: Path
) -> None:
    async def debate(out: Path, llm: Any, backend: Any = None) -> None:
        options = RunOptions(seed=SEED, backend=backend)
        await run_scenario("debate", llm=llm, options=SCENARIOS["debate"], out_dir=out, run=options)

    def recorded(path: Path) -> list[dict[str, Any]]:
        return sorted((json.loads(line) for line in path.read_text().splitlines()), key=lambda e: json.dumps(e))

    await debate(tmp_path / "one", CassetteLLM(tmp_path / "one.jsonl", mode="record", inner=TestLLM()))
    on_shards = CassetteLLM(tmp_path / "ray.jsonl", mode="record", inner=TestLLM())
    await debate(tmp_path / "ray", on_shards, RayBackend(2, address=ray_address))  # the debaters on different shards
    assert run_files(tmp_path / "ray") == run_files(tmp_path / "one")
    calls = recorded(tmp_path / "ray.jsonl")
    assert {"Alice", "Bob"} <= {e["role"] for e in calls} and calls == recorded(tmp_path / "one.jsonl")
    await debate(
        tmp_path / "replayed", CassetteLLM(tmp_path / "ray.jsonl", mode="replay"), RayBackend(3, address=ray_address)
    )
    await debate(tmp_path / "replayed-one", CassetteLLM(tmp_path / "ray.jsonl", mode="replay"))
    assert run_files(tmp_path / "replayed") == run_files(tmp_path / "replayed-one") == run_files(tmp_path / "one")


PEER_REVIEW = """
from pydantic import BaseModel, Field

from metaroles import Action, Role, ScenarioPlan, Team


class Config(BaseModel):
    reviewers: int = 6


class Review(BaseModel):
    verdict: str
    score: int = Field(ge=1, le=5)


class WriteReview(Action):
    instruction = "Review the paper."
    output_model = Review


class Tally(Action):
    async def run(self, history):
        return f"scores {sorted(m.instruct_content.score for m in history if isinstance(m.instruct_content, Review))}"


def build(config, llm):
    team = Team(llm=llm)
    names = [f"r{i}" for i in range(config.reviewers)]
    team.hire(Role(name=n, actions=[WriteReview], send_to="editor") for n in names)
    team.hire([Role(name="editor", actions=[Tally], watch=[WriteReview])])
    return ScenarioPlan(team=team, idea="A paper.", send_to=set(names), n_round=3)
"""


async def test_a_scenario_from_a_file_runs_on_ray_shards_as_in_one_process(ray_address: str, tmp_path: Path) -> None:
    """No worker can import a scenario file's module: its roles, actions and models travel by value."""
    path = tmp_path / "peer_review.py"
    path.write_text(PEER_REVIEW)
    for out, backend in ((tmp_path / "one", None), (tmp_path / "ray", RayBackend(2, address=ray_address))):
        await run_scenario(
            str(path), llm=TestLLM(4), options={}, out_dir=out, run=RunOptions(seed=SEED, backend=backend)
        )
    assert run_files(tmp_path / "ray") == run_files(tmp_path / "one")
    assert "scores [" in (tmp_path / "ray" / "transcript.md").read_text()


async def test_a_failure_while_recording_a_round_on_ray_shards_stops_at_the_checkpoint_before_it(
    ray_address: str, tmp_path: Path
) -> None:
    options = {"agents": 300, "rounds": 5, "llm_agents": 0}
    await scenario_run("society", tmp_path / "one", **options)

    def full_disk_at_round_3(team: Any) -> None:
        def full(team: Any) -> None:
            raise OSError(28, "No space left on device")

        if team.env.round == 2:  # told of round 2 while the shards run round 3: round 3's metrics fail
            team.on_record = full

    cut = tmp_path / "cut"
    with pytest.raises(OSError, match="No space left"):
        await run_scenario(
            "society",
            llm=TestLLM(),
            options={**SCENARIOS["society"], **options},
            out_dir=cut,
            run=RunOptions(seed=SEED, backend=RayBackend(2, address=ray_address), checkpoint_every=1),
            on_progress=full_disk_at_round_3,
        )
    assert (cut / "checkpoints" / "round-0002.json").exists()
    assert not (cut / "checkpoints" / "round-0003.json").exists()
    assert not (cut / "state.json").exists()
    await resume_scenario(cut, llm=TestLLM(), backend=RayBackend(3, address=ray_address))
    assert run_files(cut) == run_files(tmp_path / "one")


KILLED_DRIVER = """
import os, signal
from metaroles.sharding import ray_reaper
from metaroles.sharding.ray import ensure_ray
ensure_ray(num_cpus=1, object_store_memory=80 * 1024 * 1024)
print(ray_reaper.raylet_of_this_process(), ray_reaper._held[-1][1], flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _cluster_processes(raylet: int) -> list[int]:
    """Processes that carry this raylet's pid in their environment (its workers and agents), or are it."""
    marker = f"RAY_RAYLET_PID={raylet}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_a_killed_driver_takes_the_local_cluster_it_started_with_it_agents_and_all() -> None:
    import select
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", KILLED_DRIVER], capture_output=True, text=True, check=False)
    assert done.returncode == -9, done.stderr[-2000:]
    raylet, reaper = map(int, done.stdout.split())
    try:
        exited = os.pidfd_open(reaper)  # readable once the reaper has exited (its work done)
    except ProcessLookupError:
        exited = None
    if exited is not None:
        assert select.select([exited], [], [], 60)[0], "the reaper did not end within a minute"
        os.close(exited)
    assert _cluster_processes(raylet) == [], "Ray's processes outlived the driver that started them"


async def test_a_run_nobody_records_leaves_its_outboxes_on_the_shards_until_it_closes(ray_address: str) -> None:
    module = load_scenario("society")

    def built() -> Any:
        plan = module.build(module.Config(agents=400, rounds=5, llm_agents=0), TestLLM())
        plan.team.shard_by = module.shard_by
        plan.team.env.reseed(SEED)
        return plan

    one, two = built(), built()
    await one.team.run(n_round=6, idea=one.idea)
    backend = RayBackend(2, address=ray_address)
    two.team.backend = backend
    await two.team.run(n_round=6, idea=two.idea)
    said = [(m.id, m.sent_from, m.content, sorted(m.send_to)) for m in two.team.env.history]
    assert said == [(m.id, m.sent_from, m.content, sorted(m.send_to)) for m in one.team.env.history]
    assert backend.last is not None
    rounds = two.team.env.round
    assert backend.last.calls <= 2 * rounds + 2  # a step per shard and round, and one fetch of what each kept


def test_more_shards_than_a_cluster_has_cpus_are_refused_at_once_naming_the_numbers(ray_address: str) -> None:
    """The session's cluster has 4 CPUs: five shards of one CPU each would leave the fifth waiting for ever."""
    from metaroles.sharding.ray import ShardsUnavailable

    with pytest.raises(
        ShardsUnavailable, match=r"5 shards of num_cpus=1 need 5 CPUs and the Ray cluster has 4.*4 shard"
    ):
        RayBackend(5, address=ray_address).connect()
    assert RayBackend(2, num_cpus=2, address=ray_address).connect().is_initialized()


MORE_SHARDS_THAN_CORES = """
import os, sys
os.cpu_count = lambda: 1  # a one-core machine: a local cluster of one CPU would hold only one shard of three
from metaroles.cli import main
sys.exit(main(["run", "debate", "--llm", "test", "--seed", "7", "--shards", "3", "--out", sys.argv[1]]))
"""


def test_a_local_cluster_this_run_starts_has_a_cpu_for_each_shard_so_more_shards_than_cores_run(tmp_path: Path) -> None:
    """``--shards 3`` on a one-core machine once waited for ever; the shards now take turns and the run is the same."""
    import subprocess
    import sys

    script = [sys.executable, "-c", MORE_SHARDS_THAN_CORES, str(tmp_path / "three")]
    done = subprocess.run(script, capture_output=True, text=True, timeout=300, check=False)  # a hang fails, not waits
    assert done.returncode == 0, done.stderr[-2000:]
    one = [sys.executable, "-m", "metaroles", *"run debate --llm test --seed 7 --out".split(), str(tmp_path / "one")]
    assert subprocess.run(one, capture_output=True, text=True, timeout=300, check=False).returncode == 0
    assert run_files(tmp_path / "three") == run_files(tmp_path / "one")
