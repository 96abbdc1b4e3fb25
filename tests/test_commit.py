"""A round's commit as one object: recorders in their order, the checkpoint after their files, on any runtime."""

from __future__ import annotations

from pathlib import Path

import pytest

from metaroles import TestLLM
from metaroles.core.files import append_text
from metaroles.project.scenario import built_team
from metaroles.record.commit import RoundCommit
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
