"""Sharded runs on a real local Ray: shard actors, a killed shard, a killed driver — always the one-process run."""

from __future__ import annotations

from pathlib import Path

import pytest

from metaroles import RayBackend, TestLLM
from metaroles.core.exceptions import RunError
from metaroles.runs.config import RunOptions
from metaroles.runs.scenario import resume_scenario, run_scenario
from tests import ray_helpers
from tests.faults.helpers import killed, ok, run_args
from tests.test_sharding import RUN_FILES, SCENARIOS, SEED, run_files, scenario_run

CASES = [
    ("debate", 1, {}),
    ("software_company", 2, {}),
    ("werewolf", 3, {}),
    ("society", 2, {"agents": 2000, "rounds": 9, "llm_agents": 0}),
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
