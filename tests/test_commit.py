"""A round's commit as one object: recorders in their order, the checkpoint after their files, on any runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from metaroles import Action, Environment, Message, Role, TestLLM, UserRequirement
from metaroles.bus.delivery import KEPT_RECORDS
from metaroles.core.files import append_text
from metaroles.project.scenario import built_team
from metaroles.record.commit import RoundCommit
from metaroles.record.eventlog import EventLog, read_events
from metaroles.sharding.backends import LocalBackend
from metaroles.team.runtime import Runtime
from metaroles.team.team import Team


class Noted:
    """A recorder of its own: a line per round in a file of its own, left for the checkpoint to make durable."""

    def __init__(self, team: Team, folder: Path) -> None:
        self.team, self.folder = team, folder
        self.path = folder / "noted.txt"
        self.seen: list[tuple[int, bool, bool]] = []

    def round_done(self) -> list[Path]:
        number = self.team.env.round
        logged = f'"round":{number},"kind":"round"' in (self.folder / "events.jsonl").read_text()
        checkpointed = (self.folder / "checkpoints" / f"round-{number:04d}.json").exists()
        self.seen.append((number, logged, checkpointed))
        append_text(self.path, f"{number}\n")
        return [self.path]


@pytest.mark.parametrize("shards", [None, 2])
async def test_a_recorder_is_one_class_and_one_entry_and_runs_each_round_after_the_log_before_the_checkpoint(
    tmp_path: Path, shards: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import metaroles.record.checkpoint as checkpoint

    team = built_team("society", {"agents": 30, "rounds": 8}, TestLLM(), seed=3)
    team.backend = LocalBackend(shards) if shards else None
    team.checkpoint_every = 2  # rounds 1, 3, 5 get no checkpoint file: the next one syncs what they wrote
    noted = Noted(team, tmp_path)
    team.recorders.append(noted)
    synced: list[tuple[str, list[str]]] = []  # which files each checkpoint made durable before its own
    write = checkpoint.write_atomic

    def writing(path, text, *, after=(), **options):  # type: ignore[no-untyped-def]
        if Path(path).parent == tmp_path / "checkpoints":  # the run's round files (not the shards' parts)
            synced.append((Path(path).name, sorted({Path(p).name for p in after} - {"messages.jsonl"})))
        return write(path, text, after=after, **options)

    monkeypatch.setattr(checkpoint, "write_atomic", writing)
    report = await team.run(5, "Should the town build a bridge?", checkpoints=tmp_path / "checkpoints",
                            events=tmp_path / "events.jsonl")  # fmt: skip
    rounds = list(range(report.rounds + 1))  # the idea's round, then each round run
    assert report.rounds == 5 and noted.seen == [(n, True, False) for n in rounds]
    assert noted.path.read_text() == "".join(f"{n}\n" for n in rounds)
    assert synced == [(f"round-{n:04d}.json", ["events.jsonl", "noted.txt"]) for n in (0, 2, 4, 5)]
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("round-*.json")) == [
        f"round-{n:04d}.json"
        for n in (0, 2, 4, 5)  # 5: where the run stopped (its file syncs round 5's line)
    ]


def test_a_runtime_is_six_words_and_a_commit_records_once() -> None:
    members = sorted(name for name in vars(Runtime) if not name.startswith("_"))
    assert members == ["close", "commit", "is_idle", "measure", "run_round", "stranded"]
    calls: list[str] = []

    class Once:
        def round_done(self) -> list[Path]:
            calls.append("recorded")
            return [Path("a")]

    commit = RoundCommit([Once()], checkpoint=lambda files: calls.append(f"checkpoint {files}"),
                         take_in=lambda: calls.append("taken in"), then=[lambda: calls.append("reported")])  # fmt: skip
    commit.record()  # as a runtime may, while its shards write their parts
    commit()
    assert calls == ["taken in", "recorded", f"checkpoint {[Path('a')]}", "reported"]


class Said(Action):
    """What a relay says: the news it heard, passed on."""


def relays(count: int) -> Environment:
    """``count`` roles in a ring, each passing on what it heard to the next (every role speaks every round)."""
    env = Environment(seed=5)
    names = [f"r{i}" for i in range(count)]
    for i, name in enumerate(names):
        watch, to = [Said, UserRequirement], names[(i + 1) % count]
        env.add_role(Role(name=name, actions=[Said], watch=watch, send_to=to, llm=TestLLM()))
    return env


async def test_a_reader_that_waits_many_rounds_misses_none_and_the_log_holds_every_one(tmp_path: Path) -> None:
    """A reader of the round records gets every record however long it waits (the bus keeps them for it); the
    log written once after 3 × KEPT_RECORDS rounds holds every message with the recipients delivery found."""
    env = relays(4)
    log = EventLog(tmp_path / "events.jsonl", env, turns=True)
    watcher = env.record_reader(steps=False)
    env.publish_message(Message("go", send_to={"r0"}))
    rounds = 3 * KEPT_RECORDS
    await env.run(rounds)
    taken = watcher.take()
    assert [record.round for record in taken] == list(range(1, rounds + 1)), "each round's record, in order"
    assert [m.id for record in taken for m in record.published] == [m.id for m in env.history]  # "go" in the first
    log.round_done()
    published = [e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "publish"]
    delivered = [e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "deliver"]
    assert [e["message_id"] for e in published] == [m.id for m in env.history]
    assert len(delivered) == len(env.history), "one recipient each: the ring"
    observed = [e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "observe"]
    assert len(observed) == rounds, "every turn, none lost to a fallback that knows no turns"
    assert watcher.take() == [] and len(env._closed) <= KEPT_RECORDS + 1, "read by every reader: let go"


async def test_a_round_taken_in_behind_the_next_reaches_its_readers_whole_and_only_then() -> None:
    """A round whose messages come into the history later (a sharded driver's, ``RoundWay.behind``) closes held:
    no reader gets it until ``add_late`` completes it; then its record holds its messages with what was said."""
    env = relays(3)
    reader = env.record_reader(steps=False)
    env.publish_message(Message("go", send_to={"r0", "r1", "r2"}))
    assert [len(r.published) for r in reader.take()] == [1]

    class Later:
        number, cut_short_ends, behind = None, True, True

        def __init__(self) -> None:
            self.published: list[Message] = []

        def begin(self) -> None:
            pass

        async def turns(self, this: Any) -> None:
            await this.run_turns()

        def deliver(self, this: Any) -> None:
            self.published = [message for _, message in this.take_published()]

    later = Later()
    await env.run_round(later)
    assert len(later.published) == 3
    assert reader.take() == [], "held: its messages are not in yet"
    env.publish_message(Message("between", send_to={"r0"}))  # what closes after it waits too
    assert reader.take() == []
    said = [([f"news-of-{m.sent_from}"],) for m in later.published]
    env.drive.add_late(later.published, said)
    first, between = reader.take()
    assert (first.round, [m.id for m in first.published]) == (1, [m.id for m in later.published])
    assert first.said == said and first.recipients == [(1,), (2,), (0,)]
    assert [m.content for m in between.published] == ["between"]
