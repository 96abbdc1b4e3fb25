import json

import pytest
from metaroles.actions.debate import JudgeDebate, SpeakAloud, Verdict

from metaroles import ConfigError, FunctionLLM, TestLLM
from metaroles.cli import main
from metaroles.llm.model_files import local_model_available
from metaroles.messages.render import readable
from metaroles.project.scenario import run_scenario
from metaroles.record.eventlog import read_events


async def run_debate(seed: int) -> list[tuple[str, str]]:
    _, team = await run_scenario("debate", llm=TestLLM(seed), options={"turns": 2}, out_dir=None)
    return [(m.sent_from, m.content) for m in team.env.history]


async def test_debate_runs_end_to_end_offline():
    report, team = await run_scenario("debate", llm=TestLLM(1), options={}, out_dir=None)
    history = team.env.history.storage
    speakers = [m.sent_from for m in history]
    assert speakers == ["Human", "Alice", "Bob", "Alice", "Bob", "Alice", "Bob", "Judge"]
    assert all(m.cause_by == SpeakAloud.action_id() for m in history[1:7])
    assert history[1].send_to == {"Bob", "Judge"} and history[2].send_to == {"Alice", "Judge"}
    verdict = history[-1]
    assert verdict.cause_by == JudgeDebate.action_id()
    assert isinstance(verdict.instruct_content, Verdict)
    assert report.stop_reason == "idle"
    assert team.env.dead_letters == []


async def test_same_seed_gives_an_identical_transcript():
    first, second = await run_debate(7), await run_debate(7)
    assert first == second
    assert await run_debate(8) != first


async def test_run_directory_holds_transcript_state_and_report(tmp_path):
    report, team = await run_scenario("debate", llm=TestLLM(), options={"turns": 1}, out_dir=tmp_path / "run")
    run = tmp_path / "run"
    markdown = (run / "transcript.md").read_text()
    assert markdown.startswith("# debate\n") and "## Before round 1" in markdown and "## Round 1" in markdown
    assert all(readable(m).split("\n")[0] in markdown for m in team.env.history)
    assert markdown.count("\n- **") == len(team.env.history), "one item per message"
    state = json.loads((run / "state.json").read_text())
    assert len(state["history"]) == len(team.env.history)
    assert json.loads((run / "report.json").read_text())["report"]["stop_reason"] == report.stop_reason


def test_cli_runs_a_scenario_and_prints_the_transcript(tmp_path, capsys):
    assert main(["run", "debate", "--llm", "test:3", "--set", "turns=1", "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[Alice → Bob, Judge]" in out and "[Judge → <all>]" in out and "stopped (idle)" in out
    (run_dir,) = [p for p in tmp_path.iterdir() if p.name != "latest"]
    assert run_dir.name.startswith("debate-") and (run_dir / "state.json").exists()
    assert (tmp_path / "latest").resolve() == run_dir.resolve(), "runs/latest is the run just made"
    assert main(["run", "debate", "--llm", "test:3", "--set", "turns=1", "--runs-dir", str(tmp_path)]) == 0
    newer = next(p for p in tmp_path.iterdir() if p.name not in ("latest", run_dir.name))
    assert (tmp_path / "latest").resolve() == newer.resolve(), "and moves to the next one"
    assert main(["show", str(tmp_path / "latest")]) == 0


def test_cli_unknown_scenario_is_a_clear_error(capsys):
    assert main(["run", "nosuch", "--no-save"]) == 2
    known = "['assistant', 'debate', 'economic_games', 'feed', 'society', 'software_company', 'studies', 'werewolf']"
    assert f"no scenario named 'nosuch'; known scenarios: {known}" in capsys.readouterr().err


async def test_unknown_scenario_name():
    with pytest.raises(ConfigError, match="is not a scenario name"):
        await run_scenario("../etc", llm=TestLLM(), options={}, out_dir=None)


def test_cli_records_a_cassette_and_replays_it_with_no_model(tmp_path, capsys):
    cassette = tmp_path / "debate.jsonl"
    common = ["run", "debate", "--set", "turns=1", "--no-save"]
    assert main([*common, "--llm", "test:9", "--record", str(cassette)]) == 0
    recorded = capsys.readouterr().out
    assert main([*common, "--llm", f"replay:{cassette}"]) == 0
    replayed = capsys.readouterr().out
    assert replayed == recorded
    assert "[Judge → <all>]" in replayed


def test_cli_resumes_a_run_directory_from_its_last_checkpoint(tmp_path, capsys):
    assert main(["run", "debate", "--llm", "test:4", "--set", "turns=2", "--runs-dir", str(tmp_path)]) == 0
    finished = capsys.readouterr().out
    run_dir = (tmp_path / "latest").resolve()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert (manifest["scenario"], manifest["llm"], manifest["config"]["turns"]) == ("debate", "test:4", 2)
    checkpoints = sorted((run_dir / "checkpoints").glob("round-*.json"))
    assert checkpoints[0].name == "round-0000.json" and len(checkpoints) >= 4
    for later in checkpoints[3:]:  # as if the process had died during round 3
        later.unlink()
    (run_dir / "transcript.md").unlink()
    assert main(["resume", str(run_dir)]) == 0
    resumed = capsys.readouterr().out
    assert resumed.split("\n\n")[0] == finished.split("\n\n")[0], "same transcript"
    assert (run_dir / "transcript.md").exists()
    events = read_events(run_dir / "events.jsonl")
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), "the log was cut back, then continued"
    state = json.loads((run_dir / "state.json").read_text())
    assert sum(e["kind"] == "publish" for e in events) == len(state["history"]), "no round logged twice"


def test_cli_resume_of_something_that_is_not_a_run_directory(tmp_path, capsys):
    assert main(["resume", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err == f"error: no run directory at {str(tmp_path / 'nope')!r}\n", "one line"
    assert main(["resume", str(tmp_path)]) == 2
    assert "is not a run directory (no manifest.json)" in capsys.readouterr().err


@pytest.mark.skipif(
    not local_model_available(), reason="needs metaroles[local] and the embedded models (make demo installs them)"
)
async def test_the_demo_debate_on_the_embedded_default_argues_the_motion_and_ends_with_a_valid_verdict():
    """What a newcomer's `make demo` shows: each side on the motion (not asking what it is), then a verdict."""
    from metaroles.actions.debate import Verdict

    from metaroles.llm.local import LocalLLM

    llm = LocalLLM(temperature=0.0)  # the embedded default, as `metaroles run debate` makes it
    report, team = await run_scenario("debate", llm=llm, options={"turns": 1}, out_dir=None)
    speeches = [m.content.lower() for m in team.env.history if m.sent_from in ("Alice", "Bob")]
    assert len(speeches) == 2
    for speech in speeches:  # the motion: cities should replace cars with trams and bicycles in their centres
        assert {"cars", "trams", "bicycles", "cities", "city", "car", "tram", "bicycle", "centres"} & set(
            speech.replace(".", " ").replace(",", " ").split()
        ), speech
        assert "topic" not in speech, speech
    verdicts = [m.instruct_content for m in team.env.history if m.sent_from == "Judge"]
    assert len(verdicts) == 1 and isinstance(verdicts[0], Verdict), "the grammar keeps the verdict valid"
    assert report.stop_reason == "idle"


def garbage_once(inner):
    """A model that answers the first structured request, and both of its retries, with garbage."""
    spoiled = []

    async def answer(request):
        if request.output_schema is not None and len(spoiled) < 3:
            spoiled.append(request.role)
            return "I think maybe 0.7?? {not json"
        return await inner.complete(request)

    return FunctionLLM(answer, model="garbage-once"), spoiled


@pytest.mark.parametrize(
    ("scenario", "options"),
    [
        ("debate", {"turns": 1}),
        ("society", {"agents": 12, "rounds": 3, "llm_agents": 4}),
        ("werewolf", {}),
        ("software_company", {}),
    ],
)
async def test_a_failed_structured_answer_is_data_not_a_crash(tmp_path, scenario, options):
    llm, spoiled = garbage_once(TestLLM(5))
    report, team = await run_scenario(scenario, llm=llm, options=options, out_dir=tmp_path / "run")
    assert len(spoiled) == 3 and len(set(spoiled)) == 1, "one structured answer failed, retries included"
    failed = [m for m in team.env.history.storage if "error" in m.metadata]
    assert len(failed) == 1 and failed[0].sent_from == spoiled[0]
    assert failed[0].metadata["error"]["type"] == "LLMOutputInvalid"
    assert report.rounds >= 1 and (tmp_path / "run" / "transcript.md").is_file()
    assert "failed" in (tmp_path / "run" / "transcript.md").read_text()
    if scenario == "society":
        metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        assert metrics[-1]["failed_answers"] == 1 and metrics[0]["failed_answers"] in (0, 1)


async def test_a_structured_verdict_reads_as_fields_in_the_transcript_and_in_show(tmp_path, capsys):
    await run_scenario("debate", llm=TestLLM(2), options={"turns": 1}, out_dir=tmp_path / "run")
    transcript = (tmp_path / "run" / "transcript.md").read_text()
    assert "(JudgeDebate):\n  - **winner**: " in transcript and '{"winner"' not in transcript
    assert main(["show", str(tmp_path / "run"), "--role", "Judge"]) == 0
    shown = capsys.readouterr().out
    assert "(JudgeDebate)\n  - **winner**: " in shown and "  - **confidence**: " in shown


async def test_a_big_run_writes_its_transcript_only_when_asked_and_show_still_prints_it(tmp_path, monkeypatch, capsys):
    from metaroles.project import rundir
    from metaroles.team.options import RunOptions

    monkeypatch.setattr(rundir, "TRANSCRIPT_LIMIT", 3)  # a debate of 2 turns holds more messages than that
    big, asked = tmp_path / "big", tmp_path / "asked"
    await run_scenario("debate", llm=TestLLM(1), options={"turns": 2}, out_dir=big)
    await run_scenario("debate", llm=TestLLM(1), options={"turns": 2}, out_dir=asked, run=RunOptions(transcript=True))
    assert not (big / rundir.TRANSCRIPT).exists() and (asked / rundir.TRANSCRIPT).is_file()
    assert main(["show", str(big)]) == 0
    shown = capsys.readouterr().out
    assert shown.count("[round ") >= 4 and "SpeakAloud" in shown


def test_cli_no_transcript(tmp_path):
    out = tmp_path / "run"
    assert main(["run", "debate", "--llm", "test", "-q", "--no-transcript", "--out", str(out)]) == 0
    assert (out / "state.json").is_file() and not (out / "transcript.md").exists()


async def test_each_debater_is_told_the_motion_and_its_side_in_every_message():
    """A 135M model given a transcript asked "What's the topic?": the motion and the side now lead each request."""
    from metaroles import FunctionLLM

    asked: list[tuple[str, list[dict]]] = []

    def model(request):  # type: ignore[no-untyped-def]
        asked.append((request.role, request.messages))
        if request.output_schema:
            return '{"winner": "pro", "reasoning": "the pro side answered every point", "confidence": 0.6}'
        return f"speech by {request.role}"

    await run_scenario(
        "debate", llm=FunctionLLM(model), options={"turns": 2, "topic": "Homework should go."}, out_dir=None
    )
    speeches = [(role, messages) for role, messages in asked if role in ("Alice", "Bob")]
    assert len(speeches) == 4
    for role, (system, user) in speeches:
        stance = "agree with" if role == "Alice" else "disagree with"
        assert "Homework should go." in system["content"] and "Homework should go." in user["content"]
        assert ("for the motion" if role == "Alice" else "against the motion") in system["content"]
        assert f"You {stance} the motion." in user["content"]
    assert "Your opponent said: speech by Alice" in speeches[1][1][1]["content"], "the reply answers the opponent"
    assert "Your opponent said" not in speeches[0][1][1]["content"], "the opening has no one to answer"


def test_the_embedded_model_is_named_as_small_with_how_to_use_a_real_one(capsys):
    from metaroles.cli.common import resolve
    from metaroles.llm.model_files import local_model_available

    if not local_model_available():
        pytest.skip("needs metaroles[local] and the embedded models (make demo installs them)")
    resolve({"llm": "local"})
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert (
        "Qwen2.5-Coder-0.5B-Instruct" in line
        and "small model" in line
        and "--llm openai --base-url URL --model NAME" in line
    )
