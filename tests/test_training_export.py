"""Runs as training data: `export --format sft|trajectories|atif`, loaded by `datasets`, the same after replay."""

import json
from pathlib import Path

import pytest

from metaroles.cli import main
from metaroles.project.evaluate import load_suite, run_eval
from tests.test_evaluate import suite_folder


def test_a_recorded_run_exports_the_chats_the_model_saw_and_datasets_loads_them(tmp_path: Path, capsys) -> None:
    cassette = tmp_path / "calls.jsonl"
    assert (
        main(
            [
                "run",
                "debate",
                "--llm",
                "test",
                "--set",
                "turns=2",
                "--out",
                str(tmp_path / "run"),
                "--record",
                str(cassette),
            ]
        )
        == 0
    )
    out = tmp_path / "sft.jsonl"
    assert main(["export", str(tmp_path / "run"), "--format", "sft", "--out", str(out)]) == 0
    recorded = [json.loads(line) for line in cassette.read_text().splitlines()[1:]]  # the first: the run's seed
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == len(recorded) >= 4
    for line, call in zip(lines, recorded, strict=True):  # exactly what the model got, then what it said
        assert line["messages"][:-1] == call["request"]["messages"]
        assert line["messages"][-1] == {"role": "assistant", "content": call["response"]["text"]}
        assert (line["role"], line["action"]) == (call["role"], call["action"])
    datasets = pytest.importorskip("datasets")
    loaded = datasets.load_dataset("json", data_files=str(out), split="train")
    assert loaded.num_rows == len(lines) and loaded[0]["messages"][-1]["role"] == "assistant"
    assert main(["export", str(tmp_path / "run"), "--format", "trajectories", "--out", str(tmp_path / "t.jsonl")]) == 0
    episodes = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert sorted(e["role"] for e in episodes) == sorted({c["role"] for c in recorded})
    assert sum(len(e["steps"]) for e in episodes) == len(recorded)
    assert datasets.load_dataset("json", data_files=str(tmp_path / "t.jsonl"), split="train").num_rows == len(episodes)


def test_an_eval_exports_every_trial_with_its_reward_and_a_replay_exports_the_same_bytes(tmp_path: Path) -> None:
    suite = load_suite(suite_folder(tmp_path))
    rows = run_eval(suite, tmp_path / "live", llm={"llm": "test"}, record=True)
    run_eval(suite, tmp_path / "again", llm={"llm": "test:99"}, replay=tmp_path / "live")
    for form in ("sft", "trajectories", "atif"):
        for name in ("live", "again"):
            assert (
                main(["export", str(tmp_path / name), "--format", form, "--out", str(tmp_path / f"{name}.{form}")]) == 0
            )
        assert (tmp_path / f"live.{form}").read_bytes() == (tmp_path / f"again.{form}").read_bytes(), form
    lines = [json.loads(line) for line in (tmp_path / "live.sft").read_text().splitlines()]
    by_trial = {line["trial"]: line["reward"] for line in lines}
    assert len(by_trial) == len(rows) == 8, "every trial of the eval"
    for row in rows:  # the suite's first metric is the reward; the scorer's other figures come along
        trial = f"task={row['task']},setting={row['setting']},seed={row['seed']}"
        assert by_trial[trial] == row["executability"]
    assert {line["scores"]["pass_rate"] for line in lines} <= {r["pass_rate"] for r in rows}
    assert (
        main(
            ["export", str(tmp_path / "live"), "--format", "sft", "--reward", "pass_rate", "--out", str(tmp_path / "p")]
        )
        == 0
    )
    assert {json.loads(line)["reward"] for line in (tmp_path / "p").read_text().splitlines()} <= {
        r["pass_rate"] for r in rows
    }


def test_exporting_what_recorded_no_calls_or_is_no_run_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    assert main(["run", "debate", "--llm", "test", "--set", "turns=1", "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    assert main(["export", str(tmp_path / "run"), "--format", "sft"]) == 2
    assert "recorded no model calls" in capsys.readouterr().err
    assert main(["export", str(tmp_path), "--format", "trajectories"]) == 2
    assert "neither a run directory nor an evaluation folder" in capsys.readouterr().err
    assert not (tmp_path / "run" / "export").exists(), "nothing written"


def test_a_torn_last_call_is_left_out_with_a_warning_naming_it(tmp_path: Path, capsys) -> None:
    cassette = tmp_path / "calls.jsonl"
    run = [
        "run",
        "debate",
        "--llm",
        "test",
        "--set",
        "turns=1",
        "--out",
        str(tmp_path / "run"),
        "--record",
        str(cassette),
    ]
    assert main(run) == 0
    whole = cassette.read_text().splitlines()
    cassette.write_text("\n".join(whole[:-1]) + "\n" + whole[-1][: len(whole[-1]) // 2])  # killed mid-write
    capsys.readouterr()
    assert main(["export", str(tmp_path / "run"), "--format", "sft", "--out", str(tmp_path / "sft.jsonl")]) == 0
    said = capsys.readouterr().err
    assert f"line {len(whole)} was cut short" in said and "left out of the export" in said, said
    assert len((tmp_path / "sft.jsonl").read_text().splitlines()) == len(whole) - 2, "all but the seed and the torn"


def _kept(value: object) -> object:
    """``value`` without the keys whose value is None (what a columnar round trip adds for absent fields)."""
    if isinstance(value, dict):
        return {k: _kept(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_kept(v) for v in value]
    return value


def test_a_tool_using_run_exports_atif_trajectories_that_validate_and_come_back_from_datasets(tmp_path: Path) -> None:
    import datasets
    from nat.atif.trajectory import Trajectory

    script = tmp_path / "script.json"
    calls = [{"name": "weather", "arguments": {"city": "Lyon"}, "id": "call_1"},
             {"name": "terminate", "arguments": {"status": "success"}, "id": "call_2"}]  # fmt: skip
    script.write_text(json.dumps({"*": {"*": [{"content": "", "tool_calls": [c]} for c in calls]}}))
    run, cassette = tmp_path / "run", tmp_path / "calls.jsonl"
    made = ["run", "assistant", "--llm", f"scripted:{script}", "--out", str(run), "--record", str(cassette), "-q"]
    assert main(made) == 0
    out = tmp_path / "atif.jsonl"
    assert main(["export", str(run), "--format", "atif", "--out", str(out)]) == 0
    recorded = [json.loads(line) for line in cassette.read_text().splitlines()[1:]]
    (line,) = [json.loads(text) for text in out.read_text().splitlines()]
    trajectory = Trajectory.model_validate(line)  # the format's own models, extra fields forbidden
    assert trajectory.schema_version == "ATIF-v1.7" and trajectory.agent.extra == {"role": "Assistant"}
    answers = [s for s in trajectory.steps if s.source == "agent" and not s.is_copied_context]
    assert len(answers) == len(recorded) == 2
    called = [(c.tool_call_id, c.function_name, c.arguments) for s in answers for c in s.tool_calls or []]
    assert called == [("call_1", "weather", {"city": "Lyon"}), ("call_2", "terminate", {"status": "success"})]
    (result,) = answers[0].observation.results  # type: ignore[union-attr]
    assert result.source_call_id == "call_1" and "Unknown tool 'weather'" in str(result.content)
    prompts = sum(c["response"]["usage"]["prompt_tokens"] for c in recorded)
    assert trajectory.final_metrics is not None and trajectory.final_metrics.total_prompt_tokens == prompts
    assert [s.step_id for s in trajectory.steps] == list(range(1, len(trajectory.steps) + 1))

    loaded = datasets.load_dataset("json", data_files=str(out), split="train")
    assert [_kept(row) for row in loaded] == [_kept(line)], "the same trajectory back from a dataset"
    Trajectory.model_validate(_kept(loaded[0]))
