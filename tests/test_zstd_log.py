"""A compressed event log (``--zstd``): the plain log's very lines, a frame per round, read by every reader."""

import json
import sys
from functools import partial

import anyio
import pandas as pd
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from metaroles import LocalBackend, TestLLM
from metaroles.cli import app, main
from metaroles.core.exceptions import ConfigError, RunDirCorrupt
from metaroles.project.diff import diff_runs
from metaroles.project.rundir import EVENTS, EVENTS_ZST, events_file, read_manifest
from metaroles.project.scenario import fork_scenario, resume_scenario, run_scenario
from metaroles.record.eventlog import publish_rounds, read_events
from metaroles.team.options import RunOptions

OPTIONS = {"turns": 3}
SEED = 4
SAME = ("transcript.md", "state.json", "report.json", "ledger.json")


async def debate(out_dir, *, zstd, backend=None, on_round=None):
    run = RunOptions(seed=SEED, zstd=zstd, backend=backend)
    await run_scenario("debate", llm=TestLLM(SEED), options=OPTIONS, out_dir=out_dir, run=run, on_round=on_round)
    return out_dir


def frames(path) -> list[bytes]:
    """Each zstd frame of ``path``, decompressed; fails on anything but whole frames."""
    data, out = path.read_bytes(), []
    while data:
        frame = zstandard.ZstdDecompressor().decompressobj()
        out.append(frame.decompress(data))
        assert frame.eof, "every frame is whole"
        data = frame.unused_data
    return out


def without_latency(events):
    return [{k: v for k, v in e.items() if k != "latency_s"} for e in events]


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return anyio.run(partial(debate, tmp_path_factory.mktemp("plain") / "run", zstd=False))


@pytest.mark.parametrize("shards", [None, 2], ids=["one-process", "two-shards"])
async def test_a_compressed_log_holds_the_plain_logs_lines_a_frame_per_round(plain, tmp_path, shards):
    run_dir = await debate(tmp_path / "z", zstd=True, backend=shards and LocalBackend(shards))
    assert not (run_dir / EVENTS).exists() and read_manifest(run_dir)["events"] == EVENTS_ZST
    assert events_file(run_dir) == run_dir / EVENTS_ZST
    parts = frames(run_dir / EVENTS_ZST)
    assert b"".join(parts) == (plain / EVENTS).read_bytes(), "decompressed, the very bytes of the plain log"
    rounds = [
        json.loads(line)["round"] for line in (plain / EVENTS).read_text().splitlines() if '"kind":"round"' in line
    ]
    assert len(parts) == len(rounds), "a frame per round (a new log is not written empty when it opens)"
    assert all(part.count(b"\n") == 1 and b'"kind":"round",' in part for part in parts), "a frame: a whole round"
    for name in SAME:
        assert (run_dir / name).read_bytes() == (plain / name).read_bytes(), name
    assert without_latency(read_events(run_dir / EVENTS_ZST)) == without_latency(read_events(plain / EVENTS))
    assert publish_rounds(run_dir / EVENTS_ZST) == publish_rounds(plain / EVENTS)
    table = pd.read_json(run_dir / EVENTS_ZST, lines=True)  # pandas reads it as it is (by its suffix)
    assert table.equals(pd.read_json(plain / EVENTS, lines=True)) and len(table) == len(rounds) > 5  # a row a round


async def test_a_run_torn_mid_append_resumes_to_the_uninterrupted_files(plain, tmp_path):
    class Stop(Exception):
        pass

    def stop_after_4(team):
        if team.env.round == 4:
            raise Stop

    run_dir = tmp_path / "z"
    with pytest.raises(Stop):
        await debate(run_dir, zstd=True, on_round=stop_after_4)
    whole_round = zstandard.ZstdCompressor().compress(b'{"seq":999,"round":5,"kind":"round_start"}\n' * 50)
    with (run_dir / EVENTS_ZST).open("ab") as log:
        log.write(whole_round[: len(whole_round) // 2])  # killed mid-append in round 5
    assert max(e["round"] for e in read_events(run_dir / EVENTS_ZST)) == 4, "the torn frame is left out"
    await resume_scenario(run_dir, llm=TestLLM(SEED))
    assert b"".join(frames(run_dir / EVENTS_ZST)) == (plain / EVENTS).read_bytes()
    for name in SAME:
        assert (run_dir / name).read_bytes() == (plain / name).read_bytes(), name


async def test_a_fork_of_a_compressed_run_keeps_it_compressed_and_replays_it(tmp_path):
    parent = await debate(tmp_path / "parent", zstd=True)
    child = tmp_path / "child"
    await fork_scenario(parent, from_round=3, out_dir=child, llm=TestLLM(SEED))
    assert read_manifest(child)["events"] == EVENTS_ZST and not (child / EVENTS).exists()
    assert diff_runs(parent, child).first_divergence_round is None
    assert b"".join(frames(child / EVENTS_ZST)) == b"".join(frames(parent / EVENTS_ZST))


def test_the_cli_reads_a_compressed_run_as_a_plain_one(plain, tmp_path):
    runner = CliRunner()
    run_dir = tmp_path / "z"
    args = ["run", "debate", "--llm", f"test:{SEED}", "--seed", str(SEED), "--set", "turns=3"]
    made = runner.invoke(app, [*args, "-q", "--zstd", "--out", str(run_dir)])
    assert made.exit_code == 0, made.output
    assert (run_dir / EVENTS_ZST).is_file() and not (run_dir / EVENTS).exists()
    shown = runner.invoke(app, ["show", str(run_dir)])
    assert shown.exit_code == 0 and "[round 1]" in shown.output
    graphs = [runner.invoke(app, ["graph", str(d), "--format", "mermaid"]).output for d in (run_dir, plain)]
    assert graphs[0] == graphs[1] and "Alice->>Bob" in graphs[0]
    compared = runner.invoke(app, ["diff", str(plain), str(run_dir)])
    assert compared.exit_code == 0 and "identical" in compared.output


async def test_damaged_compressed_data_is_named_and_the_cli_says_so_in_one_line(tmp_path):
    run_dir = await debate(tmp_path / "z", zstd=True)
    data = bytearray((run_dir / EVENTS_ZST).read_bytes())
    data[len(data) // 2 : len(data) // 2 + 8] = b"\xff" * 8
    (run_dir / EVENTS_ZST).write_bytes(bytes(data))
    with pytest.raises(RunDirCorrupt, match=r"events\.jsonl\.zst: the compressed data is damaged"):
        read_events(run_dir / EVENTS_ZST)
    result = CliRunner().invoke(app, ["graph", str(run_dir), "--format", "mermaid"])
    assert result.exit_code == 2
    assert "events.jsonl.zst" in result.output and "Traceback" not in result.output


async def test_without_the_extra_a_compressed_run_says_how_to_install_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "zstandard", None)  # as if not installed: importing it fails
    with pytest.raises(ConfigError, match=r"pip install 'metaroles\[zstd\]'"):
        await debate(tmp_path / "z", zstd=True)
    assert not (tmp_path / "z").exists(), "refused before the run directory is made"
    assert main(["run", "debate", "--llm", "test", "-q", "--zstd", "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'metaroles[zstd]'" in err and len(err.strip().splitlines()) == 1 and "bug" not in err
    assert not (tmp_path / "c").exists(), "nothing written before the option was checked"


@given(st.lists(st.text(max_size=8).map(lambda t: t + "\n"), max_size=30), st.integers(1, 4), st.booleans())
def test_pieces_are_appended_as_their_joined_text(tmp_path_factory, lines, pieces, compressed):
    """A round's lines appended a chunk at a time read back as the one text they make, compressed or not."""
    from metaroles.core import files

    path = tmp_path_factory.mktemp("pieces") / ("log.jsonl.zst" if compressed else "log.jsonl")
    before, files._PIECES = files._PIECES, pieces
    try:
        files.append_durably(path, ["first\n"])
        files.append_durably(path, lines)
        files.append_text(path, lines)
    finally:
        files._PIECES = before
    assert files.read_text(path) == "first\n" + "".join(lines) * 2


@given(st.lists(st.text(max_size=8), max_size=30), st.integers(1, 4), st.booleans())
def test_a_file_written_atomically_from_pieces_made_as_it_goes_is_their_joined_text(
    tmp_path_factory, pieces, chunk, compressed
):
    """A large checkpoint is written from pieces made while it is written (an iterator, never joined whole):
    the file is the text they make, compressed or not, and a piece made late sees what the earlier ones did."""
    from metaroles.core import files

    path = tmp_path_factory.mktemp("atomic") / ("state.json.zst" if compressed else "state.json")
    made: list[str] = []

    def as_it_goes():
        for piece in pieces:
            made.append(piece)
            yield piece
        yield f"|{len(made)}"  # asked last: all the others were made (and written) before it

    before, files._PIECES = files._PIECES, chunk
    try:
        files.write_atomic(path, as_it_goes())
    finally:
        files._PIECES = before
    assert files.read_text(path) == "".join(pieces) + f"|{len(pieces)}"
