"""Surgical forks: each intervention changes one thing, as stated, and an intervened branch goes on byte for byte."""

import json
from pathlib import Path

import pytest

from metaroles import FunctionLLM, TestLLM
from metaroles.core.exceptions import ConfigError, UnknownRoleError
from metaroles.project.diff import run_messages
from metaroles.project.rundir import read_manifest
from metaroles.project.scenario import fork_scenario, run_scenario
from metaroles.record.eventlog import read_events
from metaroles.team.options import RunOptions
from metaroles.team.surgery import parse_interventions
from tests.faults.helpers import contents, differences, killed, ok

OPTIONS = {"agents": 12, "rounds": 8, "llm_agents": 4, "graph": "ring"}
FORK = 3
RUN_FILES = {"transcript.md", "events.jsonl", "state.json", "metrics.jsonl", "report.json", "ledger.json"}


@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A society of 12 on a ring (a_i hears a_{i-1} and a_{i+1}), a0..a3 asking the test model."""
    import anyio

    folder = tmp_path_factory.mktemp("surgery") / "parent"
    run = RunOptions(seed=5, checkpoint_every=1)

    async def make() -> None:
        await run_scenario(
            "society", llm=TestLLM(5), options=OPTIONS, out_dir=folder, run=run, manifest={"llm": "test:5"}
        )

    anyio.run(make)
    return folder


def after_fork(run_dir: Path, sender: str) -> list:
    return [m for m in run_messages(run_dir) if m.sender == sender and m.round > FORK]


async def fork(parent: Path, out: Path, *specs: str, llm=None):
    return await fork_scenario(
        parent, from_round=FORK, out_dir=out, llm=llm or TestLLM(5), interventions=parse_interventions(specs)
    )


async def test_a_frozen_role_hears_but_no_longer_acts(parent: Path, tmp_path: Path) -> None:
    _, team = await fork(parent, tmp_path / "b", "freeze:a1")
    assert after_fork(parent, "a1"), "in the parent a1 speaks after the fork round"
    assert after_fork(tmp_path / "b", "a1") == [], "frozen: nothing from a1 after the fork"
    rc = team.env.roles["a1"].rc
    heard = {m.id for m in rc.memory.get()}
    last = max(m.round for m in run_messages(tmp_path / "b"))  # the last round's are still in its buffer
    said_to_it = {m.id for m in after_fork(tmp_path / "b", "a0") + after_fork(tmp_path / "b", "a2") if m.round < last}
    assert said_to_it and said_to_it <= heard, "what its neighbours said after the fork is in its memory"
    assert {m.sent_from for m in rc.msg_buffer.peek_all()} == {"a0", "a2"}
    assert read_manifest(tmp_path / "b")["interventions"] == ["freeze:a1"]


async def test_a_muted_channel_drops_what_one_role_sends_another_and_nothing_else(parent: Path, tmp_path: Path) -> None:
    _, team = await fork(parent, tmp_path / "b", "mute:a2>a3")
    sent = {m.id for m in after_fork(tmp_path / "b", "a2")}
    assert sent
    dropped = [e for e in read_events(tmp_path / "b" / "events.jsonl") if e["kind"] == "dropped"]
    assert {(e["role"], e["message_id"]) for e in dropped} == {("a3", i) for i in sent}, "each drop is recorded"
    rcs = {name: team.env.roles[name].rc for name in ("a1", "a3")}
    held = {name: {m.id for m in [*rc.memory.get(), *rc.msg_buffer.peek_all()]} for name, rc in rcs.items()}
    assert not sent & held["a3"], "a3 never heard a2 after the fork"
    assert sent <= held["a1"], "a2's other neighbour still hears it"


async def test_a_rule_stands_in_for_a_model_backed_role_and_asks_no_model(parent: Path, tmp_path: Path) -> None:
    await fork(parent, tmp_path / "b", "rule:a0=0.9")
    said = after_fork(tmp_path / "b", "a0")
    assert said and {m.content for m in said} == {"0.9"}
    assert {m.action for m in said} == {"Reconsider"}, "under the action it replaces: its neighbours still hear it"
    calls = [e for e in read_events(tmp_path / "b" / "events.jsonl") if e["kind"] == "llm_call" and e["round"] > FORK]
    assert calls and "a0" not in {c["role"] for c in calls}, "the others still ask their model; a0 asks none"


async def test_a_swapped_persona_is_what_the_role_tells_its_model(parent: Path, tmp_path: Path) -> None:
    systems: dict[str, set[str]] = {}
    inner = TestLLM(5)

    async def answer(request):
        systems.setdefault(request.role, set()).update(m["content"] for m in request.messages if m["role"] == "system")
        return await inner.complete(request)

    await fork(parent, tmp_path / "b", "persona:a2=a retired tram driver who distrusts polls", llm=FunctionLLM(answer))
    assert any("a retired tram driver who distrusts polls" in s for s in systems["a2"])
    assert not any("tram driver" in s for s in systems["a3"]), "one role changed, not its neighbours"


async def test_an_edited_message_says_its_new_text_wherever_it_was_held(parent: Path, tmp_path: Path) -> None:
    target = next(m for m in run_messages(parent) if m.sender == "a6" and m.round == FORK)
    assert target.content != "0.0"
    _, team = await fork(parent, tmp_path / "b", f"edit:{target.id}=0.0")
    history = {m.id: m.content for m in run_messages(tmp_path / "b")}
    assert history[target.id] == "0.0"
    for name in ("a5", "a6", "a7"):  # its sender and both listeners
        held = [m.content for m in team.env.roles[name].rc.memory.get() if m.id == target.id]
        assert held == ["0.0"], name
    with pytest.raises(ConfigError, match="no message with that id before the fork point"):
        await fork(parent, tmp_path / "c", "edit:0123=hello")


async def test_an_intervention_on_an_unknown_role_is_refused_before_anything_is_written(
    parent: Path, tmp_path: Path
) -> None:
    with pytest.raises(UnknownRoleError, match="no role named 'zed' in this run"):
        await fork(parent, tmp_path / "b", "mute:a1>zed")
    assert not (tmp_path / "b").exists()
    with pytest.raises(ConfigError, match="write it as freeze:NAME"):
        parse_interventions(["freeze:"])
    with pytest.raises(ConfigError, match="frozen or stood in for twice"):
        parse_interventions(["freeze:a1", "rule:a1=0.5"])


def test_an_intervened_branch_killed_and_resumed_or_forked_again_is_the_same_branch(tmp_path: Path) -> None:
    """Every intervention is made again on resume (killed mid-run) and in a fork of the branch, byte for byte."""
    parent, straight, cut, again = (tmp_path / name for name in ("parent", "straight", "cut", "again"))
    sets = [arg for key, value in OPTIONS.items() for arg in ("--set", f"{key}={value}")]
    ok("run", "society", "--llm", "test", "--seed", "5", *sets, "--checkpoint-every", "1", "--out", str(parent), "-q")
    edited = next(m for m in run_messages(parent) if m.sender == "a6" and m.round == FORK)
    changes = [
        "freeze:a1",
        "mute:a2>a3",
        "rule:a0=0.9",
        "persona:a2=a farmer",
        "model:a3=test:77",
        f"edit:{edited.id}=0.0",
    ]
    branch = ["fork", str(parent), "--from-round", str(FORK), *(f"--intervene={c}" for c in changes), "-q"]
    ok(*branch, "--out", str(straight))
    killed("point=append:events.jsonl:3", *branch, "--out", str(cut))
    assert not (cut / "state.json").exists()
    ok("resume", str(cut), "-q")
    assert differences(straight, cut) == []
    assert json.loads((straight / "manifest.json").read_text())["interventions"] == changes
    ok("fork", str(straight), "--from-round", "6", "--out", str(again), "-q")
    mine = {k: v for k, v in contents(again).items() if k in RUN_FILES}
    assert mine == {k: v for k, v in contents(straight).items() if k in RUN_FILES}, (
        "a fork of the branch keeps its changes"
    )
    assert after_fork(straight, "a1") == [] and {m.content for m in after_fork(straight, "a0")} == {"0.9"}
    assert {m.id: m.content for m in run_messages(cut)}[edited.id] == "0.0", "the edit made again on the re-run fork"
