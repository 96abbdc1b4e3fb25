"""Crash-safe checkpoints: a run SIGKILLed at any point resumes to the same transcript."""

import json
import subprocess
import sys
import textwrap

import anyio
import pytest

from metaroles import TestLLM
from metaroles.core.exceptions import ConfigError
from metaroles.project.registry import load_scenario
from metaroles.record.eventlog import read_events
from metaroles.record.restore import restore_checkpoint

SEED = 5
ROUNDS = 7  # the debate with turns=3: six speeches, then the verdict
CRASHING_RUN = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import anyio
    from metaroles import Intervention, TestLLM
    from metaroles.project.registry import load_scenario

    folder, kill_round, where, seed = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    module = load_scenario("debate")
    plan = module.build(module.Config(turns=3), TestLLM(seed))
    team = plan.team

    class MidRound(Intervention):
        def on_publish(self, message, *, sender):
            if where == "mid" and team.env.round == kill_round and sender:  # while the round's messages are delivered
                os.kill(os.getpid(), signal.SIGKILL)
            return message

    def at_boundary(team):  # the round's log and checkpoint are written; the next round has not started
        if where == "boundary" and team.env.round == kill_round:
            os.kill(os.getpid(), signal.SIGKILL)

    team.env.interventions.append(MidRound())
    team.on_round = at_boundary
    anyio.run(lambda: team.run(plan.n_round, idea=plan.idea, checkpoints=folder / "ck", events=folder / "events.jsonl"))
    """
)


def build():
    module = load_scenario("debate")
    return module.build(module.Config(turns=3), TestLLM(SEED))


def transcript(team) -> list[tuple[str, str]]:
    return [(m.sent_from, m.content) for m in team.env.history]


@pytest.fixture(scope="module")
def straight():
    plan = build()
    anyio.run(lambda: plan.team.run(plan.n_round, idea=plan.idea))
    return transcript(plan.team)


def crash(folder, kill_round: int, where: str) -> None:
    args = [sys.executable, "-c", CRASHING_RUN, str(folder), str(kill_round), where, str(SEED)]
    result = subprocess.run(args, capture_output=True)
    assert result.returncode == -9, result.stderr.decode()[-2000:]


KILLS = [("boundary", k) for k in range(ROUNDS + 1)] + [("mid", k) for k in range(1, ROUNDS + 1)]


@pytest.mark.parametrize(("where", "kill_round"), KILLS, ids=[f"{w}-{k}" for w, k in KILLS])
async def test_a_run_killed_anywhere_resumes_to_the_same_transcript(tmp_path, where, kill_round, straight):
    crash(tmp_path, kill_round, where)
    saved = sorted(p.name for p in (tmp_path / "ck").glob("round-*.json"))
    last = kill_round if where == "boundary" else kill_round - 1
    assert saved[-1] == f"round-{last:04d}.json", "the killed round left no checkpoint"
    assert not list((tmp_path / "ck").glob(".*.tmp")), "no half-written checkpoint is visible"
    plan = build()
    report = await plan.team.resume(tmp_path / "ck", plan.n_round, events=tmp_path / "events.jsonl")
    resumed = transcript(plan.team)
    assert resumed == straight
    assert len({m.id for m in plan.team.env.history}) == len(resumed), "nothing duplicated"
    assert report.stop_reason == "idle"
    events = read_events(tmp_path / "events.jsonl")
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    published = [e["message_id"] for e in events if e["kind"] == "publish"]
    assert published == [m.id for m in plan.team.env.history], "each message logged once, in order"


async def test_a_torn_checkpoint_is_skipped_with_a_warning(tmp_path, straight):
    crash(tmp_path, 5, "mid")
    (tmp_path / "ck" / "round-0004.json").write_text('{"version": 2, "round": 4, "roles": [')
    plan = build()
    with pytest.warns(UserWarning, match="checkpoint round-0004.json is unreadable"):
        await plan.team.resume(tmp_path / "ck", plan.n_round)
    assert transcript(plan.team) == straight


async def test_resume_without_checkpoints_says_so(tmp_path):
    with pytest.raises(ConfigError, match="no readable checkpoint in"):
        await build().team.resume(tmp_path, 3)


async def test_a_fresh_run_refuses_a_folder_that_holds_a_run(tmp_path):
    plan = build()
    await plan.team.run(2, idea=plan.idea, checkpoints=tmp_path)
    with pytest.raises(ConfigError, match="already holds a run; resume it"):
        await build().team.run(2, idea="again", checkpoints=tmp_path)
    assert len(list(tmp_path.glob("round-*.json"))) == 3, "nothing of the first run was touched"


async def test_checkpoints_every_third_round_and_where_the_run_stopped(tmp_path, straight):
    plan = build()
    plan.team.checkpoint_every = 3
    plan.team.log_turns = False
    report = await plan.team.run(plan.n_round, idea=plan.idea, checkpoints=tmp_path, events=tmp_path / "events.jsonl")
    rounds = sorted(int(p.stem[6:]) for p in tmp_path.glob("round-*.json"))
    assert rounds == [0, 3, 6, report.rounds]
    kinds = {e["kind"] for e in read_events(tmp_path / "events.jsonl")}
    assert "publish" in kinds and not kinds & {"observe", "think", "act"}, "turn events were switched off"
    (tmp_path / f"round-{report.rounds:04d}.json").unlink()  # as if killed after round 6's checkpoint
    again = build()
    await again.team.resume(tmp_path, again.n_round, events=tmp_path / "events.jsonl")
    assert transcript(again.team) == straight


async def test_a_delta_over_several_rounds_replays_them_in_order(tmp_path):
    """Every third round checkpointed: each delta replays three rounds' turns and deliveries, interleaved."""
    module = load_scenario("society")
    config = module.Config(agents=12, rounds=9)
    plan = module.build(config, TestLLM())
    plan.team.checkpoint_every, plan.team.log_turns = 3, False
    states = {}
    plan.team.on_round = lambda team: states.__setitem__(team.env.round, team.env.state_dict())
    await plan.team.run(plan.n_round, idea=plan.idea, checkpoints=tmp_path)
    deltas = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("round-*.json"))]
    assert [d["round"] for d in deltas] == [0, 3, 6, 9, 10] and all(d["kind"] == "delta" for d in deltas[1:])
    assert [round_marks(d["ops"]) for d in deltas[1:]] == [2, 2, 2, 0], "a delta marks where each of its rounds ends"
    for round_no in (3, 6, 9, 10):
        again = module.build(config, TestLLM())
        restore_checkpoint(tmp_path, again.team.env, through_round=round_no)
        assert again.team.env.state_dict() == states[round_no], f"round {round_no} is restored as it was"


def round_marks(ops: list[int]) -> int:
    """How many round marks (code 2) a delta's ops hold: observe is 2 numbers, act 3, a mark 2."""
    i = marks = 0
    while i < len(ops):
        marks += ops[i] == 2
        i += 3 if ops[i] == 1 else 2
    return marks
