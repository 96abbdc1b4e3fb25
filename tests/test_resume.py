"""Crash-safe checkpoints: a run SIGKILLed mid-round resumes to the same transcript."""

import subprocess
import sys
import textwrap

import pytest

from metaroles import TestLLM
from metaroles.exceptions import ConfigError
from metaroles.scenario import load_scenario

SEED = 5
CRASHING_RUN = textwrap.dedent(
    """
    import os, signal, sys
    import anyio
    from metaroles import Intervention, TestLLM
    from metaroles.scenario import load_scenario

    folder, kill_round, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    module = load_scenario("debate")
    plan = module.build(module.Config(turns=3), TestLLM(seed))

    class Crash(Intervention):
        def on_publish(self, message, *, sender):
            if plan.team.env.round == kill_round and sender:  # mid-round, while its messages are delivered
                os.kill(os.getpid(), signal.SIGKILL)
            return message

    plan.team.env.interventions.append(Crash())
    anyio.run(lambda: plan.team.run(plan.n_round, idea=plan.idea, checkpoints=folder))
    """
)


def build():
    module = load_scenario("debate")
    return module.build(module.Config(turns=3), TestLLM(SEED))


def transcript(team) -> list[tuple[str, str]]:
    return [(m.sent_from, m.content) for m in team.env.history]


async def straight_run() -> list[tuple[str, str]]:
    plan = build()
    await plan.team.run(plan.n_round, idea=plan.idea)
    return transcript(plan.team)


def crash(folder, kill_round: int) -> None:
    result = subprocess.run(
        [sys.executable, "-c", CRASHING_RUN, str(folder), str(kill_round), str(SEED)], capture_output=True
    )
    assert result.returncode == -9, result.stderr.decode()[-2000:]


@pytest.mark.parametrize("kill_round", [1, 4, 7])
async def test_a_run_killed_mid_round_resumes_to_the_same_transcript(tmp_path, kill_round):
    crash(tmp_path, kill_round)
    saved = sorted(p.name for p in tmp_path.glob("round-*.json"))
    assert saved[-1] == f"round-{kill_round - 1:04d}.json", "the killed round left no checkpoint"
    assert not list(tmp_path.glob(".*.tmp")), "no half-written checkpoint is visible"
    plan = build()
    report = await plan.team.resume(tmp_path, plan.n_round)
    resumed = transcript(plan.team)
    assert resumed == await straight_run()
    assert len({m.id for m in plan.team.env.history}) == len(resumed), "nothing duplicated"
    assert report.stop_reason == "idle"


async def test_a_torn_checkpoint_is_skipped_with_a_warning(tmp_path):
    crash(tmp_path, 5)
    (tmp_path / "round-0004.json").write_text('{"version": 1, "round": 4, "roles": [')
    plan = build()
    with pytest.warns(UserWarning, match="checkpoint round-0004.json is unreadable"):
        await plan.team.resume(tmp_path, plan.n_round)
    assert transcript(plan.team) == await straight_run()


async def test_resume_without_checkpoints_says_so(tmp_path):
    with pytest.raises(ConfigError, match="no readable checkpoint in"):
        await build().team.resume(tmp_path, 3)
