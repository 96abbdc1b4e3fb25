import json
import re

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from metaroles import FunctionLLM, LLMRequest, TestLLM
from metaroles.core.exceptions import ConfigError
from metaroles.llm.cassette import CassetteLLM, CassetteMiss, request_key
from metaroles.project.scenario import run_scenario


def ask(text: str, role: str = "r", action: str = "a", **kw: object) -> LLMRequest:
    return LLMRequest(messages=[{"role": "user", "content": text}], role=role, action=action, **kw)  # type: ignore[arg-type]


def test_the_key_covers_what_decides_the_answer_and_nothing_else():
    base = request_key(ask("q"), "m")
    assert request_key(ask("q", role="other", action="b"), "m") == base, "who asks is not part of the hash"
    assert request_key(ask("q"), "m2") != base
    assert request_key(ask("q2"), "m") != base
    assert request_key(ask("q", temperature=0.5), "m") != base
    assert request_key(ask("q", output_schema={"type": "object"}), "m") != base
    assert request_key(ask("q", tools=[{"type": "function"}]), "m") != base


async def test_a_recorded_scenario_replays_identically_with_no_model(tmp_path):
    cassette = tmp_path / "debate.jsonl"
    recorder = CassetteLLM(cassette, mode="record", inner=TestLLM(seed=4))
    _, live = await run_scenario("debate", llm=recorder, options={"turns": 2}, out_dir=None)
    lines = cassette.read_text().splitlines()
    assert len(lines) == 5, "4 speeches and a verdict"
    assert {json.loads(line)["role"] for line in lines} == {"Alice", "Bob", "Judge"}

    player = CassetteLLM(cassette, mode="replay", model="test")
    _, replayed = await run_scenario("debate", llm=player, options={"turns": 2}, out_dir=None)
    transcript = [(m.sent_from, m.content) for m in live.env.history]
    assert [(m.sent_from, m.content) for m in replayed.env.history] == transcript


async def test_a_miss_names_role_action_and_hash(tmp_path):
    path = tmp_path / "c.jsonl"
    recorder = CassetteLLM(path, mode="record", inner=TestLLM())
    await recorder.complete(ask("known"))
    player = CassetteLLM(path, mode="replay", model="test")
    key = request_key(ask("unknown", role="alice", action="Speak"), "test")
    with pytest.raises(CassetteMiss, match=rf"role 'alice', action 'Speak', request hash {key}"):
        await player.complete(ask("unknown", role="alice", action="Speak"))


async def test_answers_holding_unicode_line_separators_replay_whole(tmp_path):
    path = tmp_path / "c.jsonl"
    said = "one\u2028two\x85three\x1cfour\rfive"
    recorder = CassetteLLM(path, mode="record", inner=FunctionLLM(lambda request: said, model="m"))
    await recorder.complete(ask("first"))
    await recorder.complete(ask("second"))
    player = CassetteLLM(path, mode="replay", model="m")
    assert [(await player.complete(ask(q))).text for q in ("first", "second")] == [said, said]


async def test_replay_or_live_falls_through_and_records(tmp_path):
    path = tmp_path / "c.jsonl"
    await CassetteLLM(path, mode="record", inner=FunctionLLM(lambda r: "old", model="m")).complete(ask("known"))
    calls: list[str] = []

    def live(request: LLMRequest) -> str:
        calls.append(request.messages[-1]["content"])
        return "fresh"

    both = CassetteLLM(path, mode="replay_or_live", inner=FunctionLLM(live, model="m"))
    assert (await both.complete(ask("known"))).text == "old"
    assert (await both.complete(ask("new"))).text == "fresh"
    assert calls == ["new"]
    assert len(path.read_text().splitlines()) == 2


async def test_concurrent_roles_asking_the_same_question_get_their_own_answers(tmp_path):
    path = tmp_path / "c.jsonl"
    gates = {"alice": anyio.Event(), "bob": anyio.Event()}

    async def answer(request: LLMRequest) -> str:
        await gates[request.role].wait()
        return f"answer for {request.role}"

    recorder = CassetteLLM(path, mode="record", inner=FunctionLLM(answer, model="m"))
    got: dict[str, str] = {}

    async def call(role: str) -> None:
        got[role] = (await recorder.complete(ask("same question", role=role))).text

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "alice")
        tg.start_soon(call, "bob")
        await wait_all_tasks_blocked()
        gates["bob"].set()  # bob's answer is recorded first
        await wait_all_tasks_blocked()
        gates["alice"].set()
    player = CassetteLLM(path, mode="replay", model="m")
    assert (await player.complete(ask("same question", role="alice"))).text == "answer for alice"
    assert (await player.complete(ask("same question", role="bob"))).text == "answer for bob"


def test_bad_cassettes_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist; record it first"):
        CassetteLLM(tmp_path / "none.jsonl", mode="replay")
    with pytest.raises(ConfigError, match="needs a live model"):
        CassetteLLM(tmp_path / "x.jsonl", mode="record")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"key": "k"}\n')
    with pytest.raises(ConfigError, match="line 1 is not a recorded call"):
        CassetteLLM(broken, mode="replay")


async def test_a_last_line_cut_by_a_kill_is_dropped_and_recording_goes_on_after_it(tmp_path):
    path = tmp_path / "c.jsonl"
    recorder = CassetteLLM(path, mode="record", inner=FunctionLLM(lambda r: "said", model="m"))
    await recorder.complete(ask("first"))
    whole = path.read_text()
    path.write_text(whole + whole[: len(whole) // 2])  # a second line the kill cut in half
    with pytest.warns(UserWarning, match="line 2 was cut short"):
        going_on = CassetteLLM(path, mode="replay_or_live", inner=FunctionLLM(lambda r: "new", model="m"))
    assert (await going_on.complete(ask("first"))).text == "said"
    assert (await going_on.complete(ask("second"))).text == "new"
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and lines[0] == whole.strip() and json.loads(lines[1])["response"]["text"] == "new"
    with pytest.warns(UserWarning, match="cut short"):
        path.write_text(path.read_text() + '{"key": ')
        CassetteLLM(path, mode="replay", model="m")
    assert path.read_text().endswith('{"key": '), "a replay changes nothing on disk"


async def test_a_cassette_that_would_put_nonsense_into_the_ledger_is_refused_by_line(tmp_path):
    good = tmp_path / "good.jsonl"
    recorder = CassetteLLM(good, mode="record", inner=TestLLM())
    await recorder.complete(ask("hi"))
    entry = json.loads(good.read_text())
    for change, said in (
        ({"usage": {"prompt_tokens": -5}}, "response.usage.prompt_tokens=-5"),
        ({"cost": -1e308}, "response.cost=-1e+308"),
        ({"cost": float("inf")}, "response.cost=inf"),
    ):
        bad = tmp_path / "bad.jsonl"
        bad.write_text(json.dumps({**entry, "response": {**entry["response"], **change}}) + "\n")
        with pytest.raises(ConfigError, match=re.escape(f"line 1: {said}")):
            CassetteLLM(bad, mode="replay")
    bad.write_text(json.dumps({k: v for k, v in entry.items() if k != "response"}) + "\n")
    with pytest.raises(ConfigError, match="line 1 has no response; record it again"):
        CassetteLLM(bad, mode="replay")


def test_record_refuses_a_cassette_that_holds_calls(tmp_path):
    from typer.testing import CliRunner

    from metaroles.cli import app

    cassette = tmp_path / "calls.jsonl"
    runner = CliRunner()
    first = runner.invoke(
        app, ["run", "debate", "--llm", "test", "--set", "turns=1", "--no-save", "--record", str(cassette)]
    )
    assert first.exit_code == 0 and cassette.stat().st_size > 0
    kept = cassette.read_bytes()
    again = runner.invoke(
        app, ["run", "debate", "--llm", "test", "--set", "turns=1", "--no-save", "--record", str(cassette)]
    )
    assert again.exit_code == 2 and "holds recorded calls already" in again.output
    assert cassette.read_bytes() == kept, "nothing lost"


def test_a_replay_without_a_seed_takes_the_recorded_runs_and_makes_the_same_run_directory(tmp_path):
    from metaroles.cli import main
    from tests.test_determinism import assert_same_bytes, contents

    cassette = tmp_path / "calls.jsonl"
    common = ["run", "debate", "--set", "turns=1", "-q"]
    assert main([*common, "--llm", "test", "--record", str(cassette), "--out", str(tmp_path / "recorded")]) == 0
    for name in ("first", "second"):
        assert main([*common, "--replay", str(cassette), "--out", str(tmp_path / name)]) == 0
    assert_same_bytes(contents(tmp_path / "first"), contents(tmp_path / "second"))
    state = {name: (tmp_path / name / "state.json").read_text() for name in ("recorded", "first")}
    assert state["recorded"] == state["first"], "the replay is the recorded run: its ids too"
