"""A sharded round is recorded while the shards run the next one, in the one-process order, and a
failure while recording it loses nothing a checkpoint claimed (``LocalBackend``: the shards' code in
this process; ``test_ray_shards.py`` runs the same scenarios on real Ray actors)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from metaroles import Team, TestLLM
from metaroles.bus.action import UserRequirement
from metaroles.messages.message import Message
from metaroles.project.scenario import resume_scenario, run_scenario
from metaroles.record.eventlog import read_events
from metaroles.sharding.backends import LocalBackend, LocalShards
from metaroles.sharding.shardset import Checkpoint, RunRound
from metaroles.team.options import RunOptions
from tests.test_sharding import SEED, run_files

SOCIETY: dict[str, object] = {"agents": 200, "rounds": 5, "llm_agents": 3}


def recorded(run_dir: Path, round_no: int) -> tuple[bool, bool, bool]:
    """Whether round ``round_no``'s events, its metrics row and its checkpoint are on disk."""
    events = (run_dir / "events.jsonl").read_text()
    metrics = (run_dir / "metrics.jsonl").read_text() if (run_dir / "metrics.jsonl").exists() else ""
    return (
        f'"round":{round_no},"kind":"round",' in events,
        f'{{"round": {round_no},' in metrics,
        (run_dir / "checkpoints" / f"round-{round_no:04d}.json").exists(),
    )


class WatchedShards(LocalShards):
    """In-process shards that note, for each round they run, ``probe(round)`` as it is sent and as its replies are
    awaited (what the driver did meanwhile); in ``written``, the same around the checkpoint after it
    (``probe(round + 1)``)."""

    def __init__(self, count: int, probe: Callable[[int], Any], seen: list[tuple[int, Any, Any]]) -> None:
        super().__init__(count)
        self.probe, self.seen = probe, seen
        self.written: list[tuple[int, Any, Any]] = []
        self.next_round = 1

    def send(self, requests: Any, broadcasts: Any) -> Any:
        asked = next((r for r in requests if r is not None), None)
        if asked is None or isinstance(asked, RunRound):  # (no shard busy: a round all the same)
            round_no, seen = self.next_round if asked is None else asked.round, self.seen
            self.next_round = round_no + 1
        elif isinstance(asked, Checkpoint):
            round_no, seen = self.next_round, self.written
        else:
            return super().send(requests, broadcasts)
        sent, before = super().send(requests, broadcasts), self.probe(round_no)

        class Watched:
            async def replies(_: Any) -> Any:
                seen.append((round_no, before, self.probe(round_no)))
                return await sent.replies()

        return Watched()


class WatchedBackend(LocalBackend):
    """In-process shards watched by ``probe`` (see :class:`WatchedShards`); ``seen`` collects what it saw."""

    def __init__(self, shards: int, probe: Callable[[int], Any]) -> None:
        super().__init__(shards)
        self.probe = probe
        self.seen: list[tuple[int, Any, Any]] = []
        self.shards_made: list[WatchedShards] = []

    def shard_set(self) -> WatchedShards:
        self.shards_made.append(WatchedShards(self.shards, self.probe, self.seen))
        return self.shards_made[-1]


def on_disk(run_dir: Path) -> Callable[[int], tuple[bool, bool, bool]]:
    """A probe: what of the round before is recorded in ``run_dir``."""
    return lambda round_no: recorded(run_dir, round_no - 1)


async def society(out: Path, backend: Any = None, on_progress: Callable[[Team], None] | None = None) -> Team:
    _, team = await run_scenario(
        "society",
        llm=TestLLM(),
        options=SOCIETY,
        out_dir=out,
        run=RunOptions(seed=SEED, backend=backend, checkpoint_every=1),
        on_progress=on_progress,  # only looks (a progress display): on shards it runs behind the next round
    )
    return team


async def test_a_sharded_round_is_logged_while_the_shards_write_their_parts_and_its_file_written_during_the_next(
    tmp_path: Path,
) -> None:
    await society(tmp_path / "one")
    backend = WatchedBackend(2, on_disk(tmp_path / "sharded"))
    team = await society(tmp_path / "sharded", backend)
    rounds = team.env.round
    written = backend.shards_made[0].written
    assert [n for n, _, _ in written] == list(range(1, rounds + 2))  # after the idea, and each round the shards ran
    for round_no, before, after in written:  # round N's events and metrics, recorded while the shards write ...
        assert (before, after) == ((False, False, False), (True, True, False)), round_no - 1
    assert [n for n, _, _ in backend.seen] == list(range(1, rounds + 1))
    for round_no, before, after in backend.seen[1:]:  # round 0 (the idea) is recorded before the shards start
        assert before == (True, True, False), round_no  # ... its checkpoint not yet when they get round N ...
        assert after == (True, True, True), round_no  # ... but before they answered
    assert recorded(tmp_path / "sharded", rounds) == (True, True, True)  # the last round, once the run stopped
    assert run_files(tmp_path / "sharded") == run_files(tmp_path / "one")


async def test_a_failure_while_recording_a_sharded_round_stops_the_run_at_the_checkpoint_before_it(
    tmp_path: Path,
) -> None:
    await society(tmp_path / "one")

    def full_disk_at_round_3(team: Team) -> None:
        def full(team: Team) -> None:
            raise OSError(28, "No space left on device")

        if team.env.round == 2:  # told of round 2 while the shards run round 3: its metrics will not go out
            team.on_record = full

    cut = tmp_path / "cut"
    with pytest.raises(OSError, match="No space left"):
        await society(cut, LocalBackend(2), on_progress=full_disk_at_round_3)
    assert recorded(cut, 2) == (True, True, True)
    assert recorded(cut, 3) == (True, False, False)  # its events went out; its metrics and checkpoint did not
    assert not (cut / "state.json").exists()  # the shards were a round ahead: the checkpoint of round 2 stands
    _, team = await resume_scenario(cut, llm=TestLLM(), backend=LocalBackend(3))
    assert team.env.round > 3
    assert run_files(cut) == run_files(tmp_path / "one")


async def test_rows_noted_past_the_last_checkpoint_are_cut_when_a_sharded_run_resumes(tmp_path: Path) -> None:
    await society(tmp_path / "one")

    def cut_at_round_5(team: Team) -> None:
        if team.env.round == 5:
            raise RuntimeError("the driver's machine went away")

    cut = tmp_path / "cut"
    with pytest.raises(RuntimeError, match="went away"):
        await run_scenario(
            "society",
            llm=TestLLM(),
            options=SOCIETY,
            out_dir=cut,
            run=RunOptions(seed=SEED, backend=LocalBackend(2), checkpoint_every=3),
            on_progress=cut_at_round_5,
        )
    checkpoints = cut / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("round-*.json")) == ["round-0000.json", "round-0003.json"]
    table = (checkpoints / "messages.jsonl").read_text().splitlines()
    claimed = json.loads((checkpoints / "round-0003.json").read_text())["rows"]
    assert len(table) > claimed  # rounds 4 and 5 went into the table while the shards ran on
    await resume_scenario(cut, llm=TestLLM(), backend=LocalBackend(2))
    assert run_files(cut) == run_files(tmp_path / "one")


async def test_a_message_published_between_sharded_rounds_reaches_its_role_as_in_one_process(tmp_path: Path) -> None:
    def interject(team: Team) -> None:  # a human in the loop: after round 1, a word to the pro side
        if team.env.round == 1:
            pro = next(iter(team.env.roles))
            with team.env.id_scope():
                message = Message("Mind the costs.", sent_from="Human", send_to={pro}, cause_by=UserRequirement)
            team.env.publish_message(message)

    for name, backend in (("one", None), ("sharded", LocalBackend(2))):
        await run_scenario(
            "debate",
            llm=TestLLM(),
            options={},
            out_dir=tmp_path / name,
            run=RunOptions(seed=SEED, backend=backend),
            on_round=interject,
        )
    third = [e for e in read_events(tmp_path / "one" / "events.jsonl") if e["kind"] == "publish" and e["round"] == 2]
    assert "Human" in [e["role"] for e in third]  # published between rounds 1 and 2: the third line, round 2's
    assert run_files(tmp_path / "sharded") == run_files(tmp_path / "one")


async def test_with_on_round_set_a_sharded_round_is_recorded_before_the_next_starts(tmp_path: Path) -> None:
    backend = WatchedBackend(2, on_disk(tmp_path / "sharded"))
    _, team = await run_scenario(
        "society",
        llm=TestLLM(),
        options=SOCIETY,
        out_dir=tmp_path / "sharded",
        run=RunOptions(seed=SEED, backend=backend, checkpoint_every=1),
        on_round=lambda team: None,  # it may publish: what it publishes must reach the next round
    )
    assert len(backend.seen) == team.env.round
    assert all(before == (True, True, True) for _, before, _ in backend.seen)


async def history_by_round(name: str, options: dict[str, Any], shards: int) -> tuple[list[list[Message]], Any, Team]:
    """Each round's messages of a one-process run, and the watch of the same run on ``shards`` in-process shards."""
    from metaroles.project.registry import load_scenario

    module = load_scenario(name)
    plans = [module.build(module.Config(**options), TestLLM()) for _ in range(2)]
    ends: list[int] = []
    plans[0].team.on_progress = lambda team: ends.append(len(team.env.history))
    plans[1].team.on_progress = lambda team: None  # someone reads between rounds: the history is kept current
    history = plans[1].team.env.history
    backend = WatchedBackend(shards, lambda round_no: len(history))
    for plan, with_backend in zip(plans, (None, backend), strict=True):
        plan.team.env.reseed(SEED)
        plan.team.metric_parts = list(getattr(module, "METRIC_PARTS", ()))
        plan.team.shard_by = getattr(module, "shard_by", None)
        plan.team.backend = with_backend
        await plan.team.run(plan.n_round, idea=plan.idea)
    history = list(plans[0].team.env.history)
    rounds = [history[start:end] for start, end in zip([0, *ends], ends, strict=False)]
    assert [m.id for m in plans[1].team.env.history] == [m.id for m in history], "the same history in the end"
    return rounds, backend.seen, plans[1].team


async def test_a_rounds_history_is_taken_in_while_the_shards_run_the_next() -> None:
    rounds, seen, _ = await history_by_round("society", {"agents": 200, "rounds": 4}, shards=2)
    ends = [sum(len(r) for r in rounds[: n + 1]) for n in range(len(rounds))]
    assert [s[0] for s in seen] == list(range(1, len(seen) + 1))
    for round_no, before, after in seen:
        assert after == ends[round_no - 1], "the round before is whole once the driver's side of this one starts"
        if round_no >= 2:  # the society never writes to the driver's roles: round N-1 came in while round N ran
            assert before == ends[round_no - 2] < after


async def test_a_round_that_reaches_the_drivers_roles_is_taken_in_before_the_next_starts() -> None:
    rounds, seen, team = await history_by_round("werewolf", {}, shards=2)
    pinned = team.env.roles["Moderator"].addresses
    ends = [sum(len(r) for r in rounds[: n + 1]) for n in range(len(rounds))]
    answered = 0
    for round_no, before, after in seen:
        assert after == ends[round_no - 1]
        if any(m.send_to & pinned for m in rounds[round_no - 1]):
            assert before == after, f"round {round_no - 1} wrote to the moderator: taken in before round {round_no}"
            answered += 1
    assert answered >= 3, "players answer the moderator, round after round"


async def test_the_progress_display_counts_the_remote_roles_that_spoke(tmp_path: Path) -> None:
    """A stand-in is active when its role spoke with news in the last round (the shards' news, as the log reads it)."""
    from metaroles.project.registry import load_scenario

    module = load_scenario("society")
    built = module.build(module.Config(agents=12, rounds=3), TestLLM())
    team = built.team
    team.backend = LocalBackend(2)
    team.shard_by = module.shard_by
    seen: list[tuple[int, int]] = []

    def progress(team: Team) -> None:
        remote = [role for role in team.env.roles.values() if type(role).__name__ == "RemoteRole"]
        seen.append((len(remote), sum(not role.is_idle for role in remote)))

    team.on_progress = progress
    await team.run(n_round=4, idea=built.idea, events=tmp_path / "events.jsonl")
    assert seen[1:] == [(12, 12)] * 4  # every agent spoke in every round, each on a shard


async def test_the_drivers_log_routes_nothing_the_round_record_holds_the_recipients(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The shards routed the rounds: the driver's log routes no message (the round record holds the places
    the driver's history took them in with), and the log is the one-process log."""
    from metaroles.bus.routing import AddressBook
    from metaroles.record.eventlog import EventLog

    logging: list[int] = []
    lines: list[int] = []
    routed: dict[int, int] = {}
    route, round_done = AddressBook.route, EventLog.round_done

    def counted(self: AddressBook, send_to: frozenset[str]) -> Any:
        if logging:
            routed[logging[-1]] = routed.get(logging[-1], 0) + 1
        return route(self, send_to)

    def logged(self: EventLog, **kwargs: Any) -> None:
        logging.append(self.env.round)
        lines.append(self.env.round)
        try:
            round_done(self, **kwargs)
        finally:
            logging.pop()

    monkeypatch.setattr(AddressBook, "route", counted)
    monkeypatch.setattr(EventLog, "round_done", logged)
    society = {"agents": 60, "rounds": 4}
    sharded = tmp_path / "sharded"
    await run_scenario(
        "society", llm=TestLLM(), options=society, out_dir=sharded, run=RunOptions(seed=SEED, backend=LocalBackend(2))
    )
    assert set(range(1, 5)) <= set(lines) and routed == {}, routed  # no round's line routed a message
    single = tmp_path / "single"
    await run_scenario("society", llm=TestLLM(), options=society, out_dir=single, run=RunOptions(seed=SEED))
    assert (sharded / "events.jsonl").read_bytes() == (single / "events.jsonl").read_bytes()
