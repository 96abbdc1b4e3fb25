"""One record of what the bus did: deliveries kept as they happen, and a large run's state kept once."""

from __future__ import annotations

import json
import os
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaroles import Environment, Message, Role, TestLLM, UserRequirement
from metaroles.bus.record import Steps
from metaroles.bus.routing import DeadLetterWarning
from metaroles.core import files
from metaroles.core.exceptions import ConfigError
from metaroles.project.diff import run_messages
from metaroles.project.registry import load_scenario
from metaroles.project.scenario import run_scenario
from metaroles.record.final_state import STATE_LIMIT, referenced_checkpoint
from metaroles.record.restore import restore_checkpoint

ADDRESSES = ["a", "b", "c", "d", "<all>"]

steps = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.frozensets(st.sampled_from(ADDRESSES), min_size=1, max_size=3)),
        st.tuples(st.just("readdress"), st.integers(0, 4), st.frozensets(st.sampled_from(ADDRESSES[:4]), max_size=2)),
        st.tuples(st.just("round"), st.just(None)),
        st.tuples(st.just("join"), st.frozensets(st.sampled_from(ADDRESSES[:4]), max_size=2)),
    ),
    max_size=30,
)


def expected_recipients(env: Environment, send_to: frozenset[str]) -> list[str]:
    """Routing by brute force: every role whose addresses meet ``send_to``, in registration order."""
    return [r.name for r in env.roles.values() if "<all>" in send_to or send_to & r.addresses]


@settings(max_examples=150, deadline=None)
@given(steps=steps)
async def test_the_recorded_deliveries_are_the_ones_that_happened(steps):
    env = Environment()
    env.add_roles(Role(name=f"r{i}") for i in range(5))
    env.keep_records()
    records = []
    actual: dict[str, list[str]] = {}  # message id -> who got it in their buffer, when it was delivered
    for n, (kind, arg, *rest) in enumerate(steps):
        if kind == "publish":
            message = Message(content=str(n), sent_from="outside", send_to=arg)
            before = {name: len(r.rc.msg_buffer) for name, r in env.roles.items()}
            with pytest.warns(DeadLetterWarning) if not expected_recipients(env, arg) else nullcontext():
                env.publish_message(message)
            actual[message.id] = [name for name, r in env.roles.items() if len(r.rc.msg_buffer) > before.get(name, 0)]
            assert actual[message.id] == expected_recipients(env, arg), "the cached route follows the address index"
        elif kind == "readdress":
            env.set_addresses(list(env.roles.values())[arg], rest[0] | {f"r{arg}"})
        elif kind == "join":
            role = Role(name=f"r{len(env.roles)}")
            role.set_addresses(arg | {role.name})
            env.add_role(role)
        else:
            await env.run_round()
        if n % 3 == 2 or kind == "round":  # read now and then: a record spans what happened since the last one read
            records.append(env.round_record())
    records.append(env.round_record())
    unique = list({id(record): record for record in records}.values())
    assert [record.number for record in unique] == list(range(1, len(unique) + 1)), "none is skipped or repeated"
    published = [m for record in unique for m in record.published]
    assert [m.id for m in published] == [m.id for m in env.history.storage], "every message, once, in history order"
    places = [rs for record in unique for rs in record.recipients]
    assert all(type(rs) is tuple for rs in places), "the record holds places, not live roles"
    recipients = [[env.members[place].name for place in rs] for rs in places]
    assert recipients == [actual[m.id] for m in published], "each one's recipients as delivery found them"


@given(
    turns=st.lists(st.tuples(st.sampled_from("abcdefg"), st.integers(1, 3)), max_size=25),
    places=st.permutations(range(7)),
)
def test_a_rounds_steps_in_role_order_are_a_stable_sort_by_place(turns: list[tuple[str, int]], places: list[int]):
    recorded = Steps()
    for name, count in turns:  # a turn's steps (a role may take several turns, and turns may come in any order)
        for at in range(count):
            recorded.add(("observe", "think", "act")[at], name, f"{name}{len(recorded)}", at)
    place = dict(zip("abcdefg", places, strict=True))
    columns = (recorded.kind, recorded.role, recorded.detail, recorded.remembered)
    expected = sorted(zip(*columns, strict=True), key=lambda step: place[step[1]])
    recorded.order_by_role(place.__getitem__)
    assert list(zip(recorded.kind, recorded.role, recorded.detail, recorded.remembered, strict=True)) == expected


async def test_a_large_run_refers_to_its_last_checkpoint_for_its_final_state(tmp_path):
    options = {"agents": 1000, "rounds": 10}  # 10,001 messages: just over the limit
    _, team = await run_scenario("society", llm=TestLLM(), options=options, out_dir=tmp_path / "run")
    assert len(team.env.history) > STATE_LIMIT
    state = tmp_path / "run" / "state.json"
    reference = json.loads(state.read_text())
    assert reference["kind"] == "checkpoint_reference" and reference["round"] == team.env.round
    assert state.stat().st_size < 200, "the state is not written a second time"
    checkpoint, round_no = referenced_checkpoint(state)
    assert checkpoint == tmp_path / "run" / "checkpoints" / f"round-{team.env.round:04d}.json"

    assert [m.id for m in run_messages(tmp_path / "run")] == [m.id for m in team.env.history.storage]
    module = load_scenario("society")
    again = module.build(module.Config(**options), TestLLM()).team.env
    with pytest.raises(ConfigError, match="restore_checkpoint"):
        again.load(state)
    restore_checkpoint(checkpoint.parent, again, through_round=round_no)
    assert again.state_dict() == team.env.state_dict(), "the checkpoint holds what state.json would"


async def test_a_reference_to_a_lost_checkpoint_is_refused(tmp_path):
    await run_scenario("society", llm=TestLLM(), options={"agents": 1000, "rounds": 10}, out_dir=tmp_path / "run")
    checkpoint, _ = referenced_checkpoint(tmp_path / "run" / "state.json")
    checkpoint.unlink()
    with pytest.raises(Exception, match="which is missing"):
        run_messages(tmp_path / "run")


async def test_a_small_run_keeps_its_whole_state(tmp_path):
    _, team = await run_scenario(
        "society", llm=TestLLM(), options={"agents": 20, "rounds": 3}, out_dir=tmp_path / "run"
    )
    assert referenced_checkpoint(tmp_path / "run" / "state.json") is None
    saved = json.loads((tmp_path / "run" / "state.json").read_text())
    assert saved["round"] == team.env.round and len(saved["history"]) == len(team.env.history)


@given(st.lists(st.text(max_size=6), max_size=5, unique=True))
def test_message_ids_in_the_log_read_back_as_any_id(ids: list[str]) -> None:
    """Any id (quotes, backslashes, control characters, any script) reads back as it was, in the news too."""
    import tempfile

    from metaroles import Action
    from metaroles.record.eventlog import EventLog, read_events

    env = Environment()
    env.add_role(Role(name="a", actions=[Action], watch=[UserRequirement]))
    messages = [Message("x", id=i, send_to={"a"}) if i else Message("x", send_to={"a"}) for i in ids]
    with tempfile.TemporaryDirectory() as folder:
        log = EventLog(Path(folder) / "events.jsonl", env)
        for message in messages:
            env.publish_message(message)
        log.round_done()
        events = read_events(Path(folder) / "events.jsonl")
    assert [e["message_id"] for e in events if e["kind"] == "publish"] == [m.id for m in messages]
    assert {tuple(e["caused_by"]) for e in events if e["kind"] == "publish"} <= {()}
    assert [e["message_id"] for e in events if e["kind"] == "deliver"] == [m.id for m in messages]


async def test_the_log_follows_a_sender_whose_addresses_change(tmp_path) -> None:
    """A sender's addresses and recipients are remembered between its messages, never after they changed."""
    from metaroles import Action
    from metaroles.record.eventlog import EventLog, read_events

    class Say(Action):
        async def run(self, history):
            return "hi"

    env = Environment()
    speaker = Role(name="A", actions=[Say], watch=[UserRequirement], send_to="B")
    env.add_roles([speaker, Role(name="B"), Role(name="C")])
    log = EventLog(tmp_path / "events.jsonl", env, turns=False)
    expected = []
    for send_to, joins in (("B", None), ("B", None), ("C", None), ("C", "D"), ("<all>", None)):
        if joins:  # D joins and also answers to C: the recipients of the same addresses change
            joined = Role(name=joins)
            env.add_role(joined)
            env.set_addresses(joined, {joins, "C"})
        speaker.send_to = frozenset({send_to})
        env.publish_message(Message("go", cause_by=UserRequirement, send_to={"A"}))
        log.round_done()
        await env.run_round()
        log.round_done()
        expected.append(sorted(r.name for r in env._book.route(speaker.send_to)))
    spoken = [e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "publish" and e["role"] == "A"]
    assert [e["send_to"] for e in spoken] == [["B"], ["B"], ["C"], ["C"], ["<all>"]]
    delivered = {}
    for event in read_events(tmp_path / "events.jsonl"):
        if event["kind"] == "deliver":
            delivered.setdefault(event["message_id"], []).append(event["role"])
    assert [sorted(delivered[e["message_id"]]) for e in spoken] == expected


async def recorded_run(name: str, out_dir: Path, monkeypatch: Any) -> list[str]:
    """Run scenario ``name`` into ``out_dir``; its writes in order: ``append:F``, ``replace:F``, ``fsync:F``.

    An fsync names the file or folder it waits for (a folder: its own name).
    """
    points: list[str] = []
    fsync = os.fsync

    def synced(fd: int) -> None:
        points.append("fsync:" + Path(os.readlink(f"/proc/self/fd/{fd}")).name)
        fsync(fd)

    monkeypatch.setattr(files, "fault_hook", points.append)
    monkeypatch.setattr(os, "fsync", synced)
    options = {"agents": 30, "rounds": 12} if name == "society" else {}
    await run_scenario(name, llm=TestLLM(), options=options, out_dir=out_dir)
    return points


@pytest.mark.parametrize("name", ["debate", "society"])
async def test_a_round_file_replaces_nothing_before_the_events_and_rows_it_claims_are_on_the_disk(
    name: str, tmp_path: Path, monkeypatch: Any
) -> None:
    """The event log and the message table are appended without waiting; the checkpoint syncs them first."""
    points = await recorded_run(name, tmp_path, monkeypatch)
    unsynced: set[str] = set()
    replaced = 0
    for point in points:
        kind, _, file = point.partition(":")
        if kind == "append" and file in ("events.jsonl", "messages.jsonl"):
            unsynced.add(file)
        elif kind == "fsync":
            unsynced.discard(file)
        elif kind == "replace" and file.startswith("round-"):
            assert not unsynced, f"{file} replaced while {sorted(unsynced)} may not be on the disk"
            replaced += 1
    assert replaced >= 2 and not unsynced, "every line appended is synced by the end of the run"


async def test_the_checkpoint_folder_waits_for_the_disk_once_before_the_final_state_names_a_round(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Round files are synced before their rename; their names, once, before anything that names them."""
    run_dir = tmp_path / "run"
    points = await recorded_run("debate", run_dir, monkeypatch)
    rounds = [i for i, p in enumerate(points) if p.startswith("replace:round-")]
    folder_syncs = [i for i, p in enumerate(points) if p == "fsync:checkpoints"]
    assert len(rounds) >= 5 and len(folder_syncs) == 1
    assert rounds[-1] < folder_syncs[0] < points.index("replace:state.json") < points.index("replace:report.json")
    assert points.index("replace:ledger.json") < points.index("replace:report.json"), "report.json last: done"
    # the manifest, the new event log's name, the final state, and the end's three files: once per run, not per round
    assert points.count(f"fsync:{run_dir.name}") == 4
    assert "replace:events.jsonl" not in points, "a new run's log is not rewritten empty when it opens"
    last = json.loads((run_dir / "report.json").read_text())["report"]["rounds"]
    assert points[rounds[-1]] == f"replace:round-{last:04d}.json"


def test_files_synced_together_reach_the_disk_in_order_and_lose_nothing(tmp_path: Path, monkeypatch: Any) -> None:
    """The log and the rows first, then the round file: the writes are all started, the fsyncs keep their order."""
    log, rows, round_file = tmp_path / "events.jsonl", tmp_path / "messages.jsonl", tmp_path / "round.json"
    files.append_text(log, ["a\n", "b\n"])
    files.append_text(rows, "r\n")
    synced: list[str] = []
    fsync, started = os.fsync, []
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), fsync(fd))[1])
    if files._START_WRITEBACK is not None:
        advise = files._START_WRITEBACK
        monkeypatch.setattr(files, "_START_WRITEBACK", lambda fd, *a: (started.append(fd), advise(fd, *a))[1])
    files.write_atomic(round_file, '{"round":1}\n', after=[log, rows], sync_name=False)
    assert [Path(p).name for p in synced[:2]] == ["events.jsonl", "messages.jsonl"] and ".round.json" in synced[2]
    assert len(synced) == 3 and (files._START_WRITEBACK is None or len(started) == 3), "every write started first"
    assert (log.read_text(), rows.read_text(), round_file.read_text()) == ("a\nb\n", "r\n", '{"round":1}\n')
    with pytest.raises(FileNotFoundError):
        files.write_atomic(tmp_path / "round2.json", "{}", after=[tmp_path / "missing.jsonl"])
    assert not (tmp_path / "round2.json").exists() and not list(tmp_path.glob(".*.tmp")), "nothing half-written left"


async def test_the_end_of_a_run_waits_for_the_disk_once_per_step(tmp_path: Path, monkeypatch: Any) -> None:
    """The checkpoint folder is synced with state.json's temp file; transcript, ledger and report share one wait."""
    run_dir = tmp_path / "run"
    points = await recorded_run("debate", run_dir, monkeypatch)
    end = points[points.index("fsync:checkpoints") :]
    state, report = end.index("replace:state.json"), end.index("replace:report.json")
    assert end[1].startswith("fsync:.state.json") and state == 2, "the folder synced before state.json can name a round"
    assert end[state + 1] == f"fsync:{run_dir.name}"
    last_three = end[state + 2 :]
    temps = [p.partition(":")[2] for p in last_three[:3]]
    expected = [".transcript.md", ".ledger.json", ".report.json"]
    assert [t.split(".tmp")[0][:-8] for t in temps] == expected, "their temp files synced first"
    assert last_three[3:] == [
        "replace:transcript.md",
        "replace:ledger.json",
        "replace:report.json",
        f"fsync:{run_dir.name}",
    ], "then renamed in order, report last, and the folder synced once"
    assert report == len(end) - 2


def test_files_replaced_together_are_each_old_or_new_after_a_crash(tmp_path: Path, monkeypatch: Any) -> None:
    """A crash between two renames leaves the earlier files new, the later ones old, and no temp file behind."""
    names = ["transcript.md", "ledger.json", "report.json"]
    for name in names:
        (tmp_path / name).write_text("old")

    def crash(point: str) -> None:
        if point == "replace:ledger.json":
            raise KeyboardInterrupt  # the process stops here, as a kill would stop it

    monkeypatch.setattr(files, "fault_hook", crash)
    with pytest.raises(KeyboardInterrupt):
        files.replace_together([(tmp_path / n, f"new {n}") for n in names])
    assert [(tmp_path / n).read_text() for n in names] == ["new transcript.md", "old", "old"]
    assert not list(tmp_path.glob(".*.tmp"))
    monkeypatch.setattr(files, "fault_hook", None)
    files.replace_together([(tmp_path / n, f"new {n}") for n in names])
    assert [(tmp_path / n).read_text() for n in names] == [f"new {n}" for n in names]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)


@pytest.mark.parametrize("shards", [None, 2])
async def test_each_turn_opens_with_its_model_tokens_in_the_log(shards: int | None, tmp_path: Path) -> None:
    from metaroles.record.eventlog import read_events
    from metaroles.sharding.backends import LocalBackend
    from metaroles.team.options import RunOptions

    backend = None if shards is None else LocalBackend(shards)
    await run_scenario("debate", llm=TestLLM(), options={}, out_dir=tmp_path, run=RunOptions(seed=3, backend=backend))
    events = read_events(tmp_path / "events.jsonl")
    calls: dict[tuple[int, str], list[int]] = {}
    for call in (e for e in events if e["kind"] == "llm_call"):
        spent = calls.setdefault((call["round"], call["role"]), [0, 0])
        spent[0] += call["tokens"]
    opened = {(e["round"], e["role"]): e for e in events if e["kind"] == "observe"}
    assert calls and set(calls) <= set(opened), "a turn that called its model opened with an observe"
    for (round_no, role), observe in opened.items():
        spent = observe["prompt_tokens"] + observe["completion_tokens"]
        assert spent == calls.get((round_no, role), [0])[0], (round_no, role)
    assert any(observe["completion_tokens"] > 0 for observe in opened.values())
