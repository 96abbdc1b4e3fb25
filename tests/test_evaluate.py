"""Evaluations: suites of tasks scored in the sandbox, tables with intervals, replay and resume."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from metaroles import FunctionLLM
from metaroles.core.exceptions import ConfigError
from metaroles.project.evaluate import Suite, interval, load_suite, run_eval
from metaroles.project.scenario import run_scenario
from tests.faults.helpers import killed, ok

WORD_COUNT = "A module whose count_words(text) returns how many words text has."
EVAL_FILES = ("eval.jsonl", "eval.csv", "eval.parquet", "summary.csv", "report.md", "ensemble.json", "ensemble.md")


def answers(code: str) -> dict[str, str]:
    """What each of the company's actions answers: a one-module plan, then ``code`` and a passing test."""
    return {
        "WritePRD": json.dumps({"goal": "Count words", "user_stories": ["I count words"], "requirements": ["count"]}),
        "WriteDesign": json.dumps({"modules": [{"name": "counter", "purpose": "count words"}]}),
        "WriteTasks": json.dumps({"tasks": [{"module": "counter", "description": "count_words(text) -> int"}]}),
        "WriteCode": f"```python\n{code}```",
        "WriteTest": "def test_nothing():\n    assert True\n",
    }


async def scored(tmp_path: Path, code: str, task: str = "word_count", **options: object) -> dict[str, object]:
    """The software suite's score of a company whose engineer writes ``code`` for ``task``."""
    suite = load_suite("software", tasks=[task])
    script = answers(code)
    llm = FunctionLLM(lambda request: script[request.action])
    run_dir = tmp_path / "run"
    await run_scenario("software_company", llm=llm, options={**suite.tasks[0].options, **options}, out_dir=run_dir)
    with suite.scorer() as scorer:
        return scorer.score(run_dir, suite.tasks[0])


async def test_a_correct_program_scores_four_and_passes_every_acceptance_test(tmp_path: Path) -> None:
    score = await scored(tmp_path, "def count_words(text):\n    return len(text.split())\n")
    assert score["executability"] == 4
    assert score["tests_passed"] == score["tests_total"] == 3 and score["pass_rate"] == 1.0
    assert score["loc"] == 2 and score["fix_attempts"] == 0 and not score["timed_out"]


async def test_a_syntax_error_scores_zero(tmp_path: Path) -> None:
    score = await scored(tmp_path, "def count_words(text)\n    return 0\n")
    assert score["executability"] == 0 and score["tests_passed"] == 0
    assert "SyntaxError" in str(score["first_problem"])


async def test_a_program_without_the_asked_function_scores_one_and_a_wrong_one_two_or_three(tmp_path: Path) -> None:
    assert (await scored(tmp_path / "a", "def words(text):\n    return 0\n"))["executability"] == 1
    assert (await scored(tmp_path / "b", "def count_words(text):\n    return -1\n"))["executability"] == 2
    partly = await scored(tmp_path / "c", "def count_words(text):\n    return len(text.split(' ')) if text else 0\n")
    assert partly["executability"] == 3 and 0 < partly["tests_passed"] < partly["tests_total"]


async def test_a_program_that_hangs_is_cut_at_the_limit_with_the_tests_it_finished(tmp_path: Path) -> None:
    code = "def count_words(text):\n    while 'fox' in text:\n        pass\n    return len(text.split())\n"
    score = await scored(tmp_path, code)  # the last test (by name) counts the words of a text with a fox
    assert score["timed_out"] is True
    assert score["executability"] == 3 and score["tests_passed"] == 2, "the tests before the hang count"


async def test_a_program_writing_outside_its_folder_is_refused_and_scores_zero(tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    code = f"_ = open({str(target)!r}, 'w').write('out')\n\ndef count_words(text):\n    return len(text.split())\n"
    score = await scored(tmp_path, code)
    assert not target.exists(), "the sandbox let the program write outside its folder"
    assert score["executability"] == 0 and "Error" in str(score["first_problem"])


def test_the_software_suite_has_thirty_specified_tasks_with_hidden_tests() -> None:
    suite = load_suite("software")
    assert suite.scenario == "software_company" and len(suite.tasks) >= 30
    for task in suite.tasks:
        assert task.options["idea"] and (task.folder / "acceptance.py").is_file()
        tests = (task.folder / "acceptance.py").read_text()
        assert "from solution import" in tests and "def test_" in tests
        assert (task.folder / "acceptance.py").read_text() not in task.options["idea"]


def test_bad_suites_and_tasks_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no suite 'nope'"):
        load_suite("nope")
    with pytest.raises(ConfigError, match="no task 'nope'"):
        load_suite("software", tasks=["nope"])
    with pytest.raises(ConfigError, match="max_fix_loops"):
        load_suite("software", tasks=["fizzbuzz"], settings={"bad": {"max_fix_loops": -1}})


def suite_folder(tmp_path: Path) -> Path:
    """A suite of one's own: two software tasks, scored by the software suite's scorer, two settings."""
    software = load_suite("software")
    folder = tmp_path / "suite"
    for task in ("word_count", "leap_year"):
        (folder / "tasks" / task).mkdir(parents=True)
        for name in ("task.toml", "acceptance.py"):
            (folder / "tasks" / task / name).write_bytes((software.folder / "tasks" / task / name).read_bytes())
    (folder / "score.py").write_bytes((software.folder / "score.py").read_bytes())
    (folder / "suite.toml").write_text(
        'scenario = "software_company"\nseeds = [0, 1]\nmetrics = ["executability", "pass_rate"]\ntimeout = 10\n'
        "[settings.fix]\nmax_fix_loops = 1\n[settings.no_fix]\nmax_fix_loops = 0\n"
    )
    return folder


def test_an_eval_recorded_then_replayed_gives_the_same_tables_byte_for_byte(tmp_path: Path) -> None:
    suite = load_suite(suite_folder(tmp_path))
    rows = run_eval(suite, tmp_path / "live", llm={"llm": "test"}, record=True, jobs=2)
    assert [(r["task"], r["setting"], r["seed"]) for r in rows][:3] == [
        ("leap_year", "fix", 0),
        ("leap_year", "fix", 1),
        ("leap_year", "no_fix", 0),
    ]
    assert all(r["status"] == "done" and r["executability"] in range(5) for r in rows)
    assert len(list((tmp_path / "live").glob("*/cassette.jsonl"))) == 8
    run_eval(suite, tmp_path / "again", llm={"llm": "test:99"}, replay=tmp_path / "live")  # another model: unused
    for name in EVAL_FILES:
        assert (tmp_path / "again" / name).read_bytes() == (tmp_path / "live" / name).read_bytes(), name
    summary = pd.read_csv(tmp_path / "live" / "summary.csv")
    no_fix = summary[(summary.metric == "executability") & (summary.setting == "no_fix")].iloc[0]
    assert no_fix["n"] == 4 and "diff" in summary.columns
    frame = pd.read_parquet(tmp_path / "live" / "eval.parquet")
    assert list(frame.columns[:4]) == ["task", "setting", "seed", "status"] and len(frame) == 8
    assert "| executability | no_fix | 4 |" in (tmp_path / "live" / "report.md").read_text()


def test_a_replay_without_a_recording_is_refused(tmp_path: Path) -> None:
    suite = load_suite(suite_folder(tmp_path))
    with pytest.raises(ConfigError, match="holds no recorded trial"):
        run_eval(suite, tmp_path / "out", replay=tmp_path)


def test_a_killed_eval_runs_only_the_missing_trials_when_run_again(tmp_path: Path) -> None:
    folder = suite_folder(tmp_path)
    args = ["eval", str(folder), "--llm", "test", "-q"]
    ok(*args, "--out", str(tmp_path / "whole"))
    killed("point=append:events.jsonl:40", *args, "--out", str(tmp_path / "cut"))
    finished = {p.parent.name: p.stat().st_mtime_ns for p in (tmp_path / "cut").glob("*/report.json")}
    assert 0 < len(finished) < 8 and not (tmp_path / "cut" / "eval.csv").exists()
    ok(*args, "--out", str(tmp_path / "cut"))
    assert {name: (tmp_path / "cut" / name / "report.json").stat().st_mtime_ns for name in finished} == finished
    for name in EVAL_FILES:
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name


def test_the_bootstrap_interval_holds_the_mean_and_is_the_same_every_time() -> None:
    values = [0.0, 1.0, 1.0, 4.0, 3.0, 2.0]
    mean, low, high = interval(values)
    assert low <= mean <= high and (mean, low, high) == interval(list(values))
    assert interval([]) == (None, None, None) and interval([2.0]) == (2.0, None, None)


def test_a_suite_object_lists_its_trials_task_setting_seed(tmp_path: Path) -> None:
    from metaroles.project.evaluate import trial_batch

    suite: Suite = load_suite(suite_folder(tmp_path), seeds=[3])
    batch = trial_batch(suite, tmp_path)
    assert batch.names[:2] == ["task=leap_year,setting=fix,seed=3", "task=leap_year,setting=no_fix,seed=3"]
    assert batch.configs[1]["max_fix_loops"] == 0 and "idea" in batch.configs[1]


@pytest.mark.parametrize("left_out", ["Architect", "ProjectManager", "QA"])
async def test_a_company_without_a_role_still_ships_and_is_scored(tmp_path: Path, left_out: str) -> None:
    code = "def count_words(text):\n    return len(text.split())\n"
    score = await scored(tmp_path, code, without=[left_out])
    assert score["executability"] == 4
    events = (tmp_path / "run" / "events.jsonl").read_text()
    assert f'"{left_out}"' not in events and '"Engineer"' in events
    tested = (tmp_path / "run" / "workspace" / "test_report.json").exists()
    assert tested == (left_out != "QA")


def test_a_setting_that_gives_one_role_another_model_is_recorded_and_replayed(tmp_path: Path) -> None:
    suite = load_suite(
        "software", tasks=["leap_year"], seeds=[0], settings={"base": {}, "other": {"role.Engineer.llm": "test:9"}}
    )
    rows = run_eval(suite, tmp_path / "live", llm={"llm": "test"}, record=True)
    assert [r["setting"] for r in rows] == ["base", "other"] and all(r["status"] == "done" for r in rows)
    other = tmp_path / "live" / "task=leap_year,setting=other,seed=0"
    assert json.loads((other / "manifest.json").read_text())["role_llms"] == {"Engineer": "test:9"}
    engineer_calls = (other / "cassette.Engineer.jsonl").read_text().splitlines()
    assert engineer_calls and all(json.loads(line)["role"] == "Engineer" for line in engineer_calls)
    assert '"role": "Engineer"' not in (other / "cassette.jsonl").read_text()
    run_eval(suite, tmp_path / "again", llm={"llm": "test:5"}, replay=tmp_path / "live")
    for name in EVAL_FILES:
        assert (tmp_path / "again" / name).read_bytes() == (tmp_path / "live" / name).read_bytes(), name


def test_werewolf_debate_and_society_suites_give_win_rates_agreement_and_polarisation(tmp_path: Path) -> None:
    werewolf = load_suite("werewolf", seeds=[0, 1], tasks=["six_players"])
    rows = run_eval(werewolf, tmp_path / "werewolf", jobs=2)
    assert all(r["villagers_win"] + r["werewolves_win"] <= 1 and r["winner"] for r in rows)
    summary = pd.read_csv(tmp_path / "werewolf" / "summary.csv").set_index("metric")
    rate = summary.loc["werewolves_win"]
    assert rate["n"] == 2 and rate["mean"] == sum(r["werewolves_win"] for r in rows) / 2

    debate = load_suite("debate", seeds=[0, 1, 2], tasks=["trams", "homework"])
    rows = run_eval(debate, tmp_path / "debate", jobs=2)
    agreement = pd.read_csv(tmp_path / "debate" / "summary.csv").set_index("metric").loc["agreement"]
    by_motion = [[r["winner"] for r in rows if r["task"] == task] for task in ("trams", "homework")]
    expected = sum(max(w.count(x) for x in w) / 3 for w in by_motion) / 2
    assert agreement["mean"] == pytest.approx(expected) and agreement["n"] == 6
    ensemble = json.loads((tmp_path / "debate" / "ensemble.json").read_text())  # a motion's seeds: one ensemble
    for task, winners in zip(("trams", "homework"), by_motion, strict=True):
        counted = ensemble["arms"][f"{task} · default"]["winner"]
        assert {value: c["count"] for value, c in counted["values"].items()} == Counter(winners)
        groups = ensemble["agreement"][f"{task} · default"]
        assert [g["count"] for g in groups] == sorted(Counter(winners).values(), reverse=True)

    society = load_suite("society", seeds=[0], tasks=["epsilon_0_05", "epsilon_0_5"])
    rows = run_eval(society, tmp_path / "society")
    polarised, agreed = (next(r for r in rows if r["task"] == t) for t in ("epsilon_0_05", "epsilon_0_5"))
    assert polarised["clusters"] > agreed["clusters"] and polarised["variance"] > agreed["variance"]
    assert "| epsilon_0_05 |" in (tmp_path / "society" / "report.md").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope"], "no suite 'nope'"),
        (["software", "--record", "--replay", "x"], "exclude each other"),
        (["software", "--without", "Nobody", "--task", "fizzbuzz"], "'Architect', 'ProjectManager' or 'QA'"),
        (["software", "--setting", ":x=1"], "give each setting a new NAME"),
        (["software", "--task", "nope"], "no task 'nope'"),
    ],
)
def test_bad_eval_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "metaroles", "eval", *args, "--out", str(tmp_path / "e")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "e").exists(), "nothing ran"


async def test_a_prompt_variant_setting_reaches_the_model_and_a_missing_folder_is_refused(tmp_path: Path) -> None:
    variants = tmp_path / "terse"
    variants.mkdir()
    (variants / "write_code.txt").write_text("TERSE: write $path for $task. $feedback")
    asked: list[str] = []
    script = answers("def count_words(text):\n    return len(text.split())\n")

    def model(request):  # type: ignore[no-untyped-def]
        asked.append(f"{request.action}: {request.messages[-1]['content']}")
        return script[request.action]

    options = {"idea": WORD_COUNT, "prompts": str(variants)}
    await run_scenario("software_company", llm=FunctionLLM(model), options=options, out_dir=tmp_path / "run")
    code_prompts = [text for text in asked if text.startswith("WriteCode")]
    assert code_prompts == ["WriteCode: TERSE: write counter.py for count_words(text) -> int. "]
    assert any(text.startswith("WritePRD") and "TERSE" not in text for text in asked), "the other prompts are shipped"
    with pytest.raises(ConfigError, match="is not a folder"):
        load_suite("software", tasks=["fizzbuzz"], settings={"bad": {"prompts": str(tmp_path / "none")}})


def test_an_eval_on_ray_writes_the_tables_an_eval_in_processes_writes(ray_address: str, tmp_path: Path) -> None:
    suite = load_suite(suite_folder(tmp_path), seeds=[0])
    local = run_eval(suite, tmp_path / "local", jobs=2)
    on_ray = run_eval(suite, tmp_path / "ray", backend="ray", ray_address=ray_address)
    assert on_ray == local and len(local) == 4
    for name in ("eval.jsonl", "eval.csv", "summary.csv", "report.md"):
        assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name


# -- a suite is code someone may have sent: its scorer runs apart, with a limit; bad suites are refused


def tiny_suite(tmp_path: Path, score: str = "def score(run_dir, task):\n    return {'ok': 1}\n", **toml: str) -> Path:
    """A one-task, one-seed debate suite whose score.py is ``score`` and whose suite.toml has ``toml`` set."""
    folder = tmp_path / "tiny"
    (folder / "tasks" / "one").mkdir(parents=True)
    (folder / "tasks" / "one" / "task.toml").write_text("[options]\nturns = 1\n")
    (folder / "score.py").write_text(score)
    lines = {"scenario": '"debate"', "seeds": "[0]", **toml}
    (folder / "suite.toml").write_text("".join(f"{key} = {value}\n" for key, value in lines.items()))
    return folder


def eval_cli(*args: str, cwd: Path | None = None):  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    command = [sys.executable, "-m", "metaroles", "eval", *args, "--quiet"]
    return subprocess.run(command, capture_output=True, text=True, check=False, cwd=cwd)


def test_a_scorer_that_hangs_raises_or_answers_badly_fails_its_trial_and_the_eval_says_why(tmp_path: Path) -> None:
    hangs = "import time\ndef score(run_dir, task):\n    time.sleep(1000)\n"
    for score, limit, why in (  # only the scorer that hangs meets a short limit (a busy machine answers slowly)
        (hangs, "1", "took more than 1 s to answer and was stopped"),
        ("def score(run_dir, task):\n    raise KeyError('winner')\n", "300", "KeyError: 'winner'"),
        ("def score(run_dir, task):\n    return [1, 2]\n", "300", "score() returned list; return a dict"),
    ):
        folder = tiny_suite(tmp_path / str(len(why)), score, score_timeout=limit)
        (row,) = run_eval(load_suite(folder), tmp_path / str(len(why)) / "out", llm={"llm": "test"})
        assert row["status"] == "failed" and why in row["error"] and "score.py" in row["error"], row
    result = eval_cli(str(folder), "--out", str(tmp_path / "cli"))
    assert result.returncode == 1 and "scoring:" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"settings": "5"}, "settings=5 must be tables"),
        ({"seeds": '"abc"'}, "seeds='abc' must be a list of integers"),
        ({"scenario": '"../elsewhere.py"'}, "outside the suite's folder; it is code: read it, then pass --trust"),
        ({"scenario": '"os.path"'}, "not a registered scenario; importing it runs its code"),
        ({"score_timeout": "-1"}, "score_timeout=-1 must be a number of seconds"),
    ],
)
def test_a_bad_suite_is_one_line_and_exit_2_before_any_trial(
    tmp_path: Path, change: dict[str, str], message: str
) -> None:
    folder = tiny_suite(tmp_path, **change)
    result = eval_cli(str(folder), "--out", str(tmp_path / "e"))
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "e").exists()


def test_bad_eval_options_and_files_are_refused_up_front(tmp_path: Path) -> None:
    folder = tiny_suite(tmp_path)
    for args, message in (
        (["--seeds", "1000000"], "asks for 1000000 trials"),
        (["--llm", "nope"], "llm='nope'"),
        (["--set", "role.Nobody.llm=test"], "no role named 'Nobody'"),
    ):
        result = eval_cli(str(folder), *args, "--out", str(tmp_path / "e"))
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)
        assert not (tmp_path / "e").exists(), "nothing ran"
    (folder / "suite.toml").write_bytes(b'scenario = "d\xe9bate"\n')
    assert "UTF-8" in eval_cli(str(folder)).stderr
    (folder / "suite.toml").write_text('scenario = "debate"\n')
    (folder / "score.py").write_text("def score(run_dir, task) return 1\n")
    result = eval_cli(str(folder), "--out", str(tmp_path / "e"))
    assert result.returncode == 2 and "score.py': line 1: expected ':'; fix the file" in result.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "suite.toml").write_text('scenario = "debate"\n')
    assert "has no tasks" in eval_cli(str(empty)).stderr


def test_a_suites_scenario_file_is_found_from_the_suites_folder(tmp_path: Path) -> None:
    folder = tiny_suite(tmp_path, scenario='"talk.py"')
    (folder / "talk.py").write_text((Path(__file__).parents[1] / "scenarios" / "debate.py").read_text())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = eval_cli(str(folder), "--out", str(tmp_path / "e"), cwd=elsewhere)
    assert result.returncode == 0, result.stderr
    assert "1 of 1 trials done" in result.stdout


def test_the_report_names_the_model_states_each_scale_and_rounds_its_figures(tmp_path: Path) -> None:
    suite = load_suite("debate", seeds=[0, 1], tasks=["trams"])
    rows = run_eval(suite, tmp_path / "e", llm={"llm": "test"})
    text = (tmp_path / "e" / "report.md").read_text()
    assert "Model: `test` (seeded by each trial's seed) — the offline test model" in text, text
    assert "- **pro_wins**: 0 or 1 per trial" in text and "- **confidence**: 0-1" in text
    assert [row["model"] for row in rows] == ["test:0", "test:1"]
    figures = [cell for line in text.splitlines() if line.startswith("| confidence") for cell in line.split("|")[4:6]]
    assert figures and all(len(part.strip().partition(".")[2]) <= 3 for cell in figures for part in cell.split("–"))


def test_the_reference_company_calibrates_the_paper_table_and_replays_it(tmp_path: Path) -> None:
    """The scripted reference company scores 4 and passes every acceptance test: the table measures the model."""
    suite = load_suite("software")
    script = suite.folder / "reference_company.json"
    generated = importlib.util.spec_from_file_location("reference_company", suite.folder / "reference_company.py")
    assert generated is not None and generated.loader is not None
    module = importlib.util.module_from_spec(generated)
    generated.loader.exec_module(module)
    assert json.loads(script.read_text(encoding="utf-8")) == module.script(), "regenerate reference_company.json"
    rows = run_eval(suite, tmp_path / "ref", llm={"llm": f"scripted:{script}"}, record=True, jobs=2)
    assert len(rows) == 31 and all(r["executability"] == 4 and r["pass_rate"] == 1.0 for r in rows)
    assert all(r["files"] == 1 and r["tokens_per_line"] > 0 and r["fix_attempts"] == 0 for r in rows)
    table = (tmp_path / "ref" / "table.md").read_text()
    head = (
        "| task | executability | pass_rate | running_s | total_tokens | files | loc_per_file | loc | tokens_per_line |"
    )
    assert head in table and "| **all (31 trials)** | **4.0** [4.0, 4.0] | **1.0** [1.0, 1.0] |" in table
    assert sum(1 for line in table.splitlines() if line.startswith("| ")) == 1 + 31 + 1
    run_eval(suite, tmp_path / "again", llm={"llm": "test"}, replay=tmp_path / "ref")
    for name in EVAL_FILES:  # the table's running time is the clock's; every other file is the same
        assert (tmp_path / "again" / name).read_bytes() == (tmp_path / "ref" / name).read_bytes(), name


def test_ablation_compares_the_company_by_role_and_a_suite_without_ablations_refuses_it(tmp_path: Path) -> None:
    suite = load_suite("software", tasks=["leap_year"], ablation=True)
    assert list(suite.settings) == ["default", "without_qa", "without_architect", "pm_and_engineer"]
    assert suite.settings["pm_and_engineer"]["without"] == ["Architect", "ProjectManager", "QA"]
    script = suite.folder / "reference_company.json"
    rows = run_eval(suite, tmp_path / "abl", llm={"llm": f"scripted:{script}"})
    assert {r["setting"]: r["executability"] for r in rows} == dict.fromkeys(suite.settings, 4)
    table = (tmp_path / "abl" / "table.md").read_text()
    assert [line for line in table.splitlines() if line.startswith("## ")] == [f"## {s}" for s in suite.settings]
    with pytest.raises(ConfigError, match=r"no \[ablations.NAME\] settings"):
        load_suite("debate", ablation=True)


def test_a_rubric_rates_each_run_by_weighted_criteria_recorded_and_replayed(tmp_path: Path) -> None:
    rater = tmp_path / "rater.json"
    rater.write_text(
        json.dumps({"Rater": {"argues": [{"score": 8, "why": "both argue"}], "fair": [{"score": 2, "why": "no"}]}})
    )
    rubric = (
        f'\n[rubric]\nllm = "scripted:{rater}"\n'
        '[[rubric.criteria]]\nname = "argues"\nweight = 3\nquestion = "Does each side argue the motion?"\n'
        '[[rubric.criteria]]\nname = "fair"\nquestion = "Is the verdict fair?"\n'
    )
    folder = tiny_suite(tmp_path, metrics='["rubric"]')
    (folder / "suite.toml").write_text((folder / "suite.toml").read_text() + rubric)
    suite = load_suite(folder)
    rows = run_eval(suite, tmp_path / "live", llm={"llm": "test"}, record=True)
    assert (rows[0]["rubric.argues"], rows[0]["rubric.fair"], rows[0]["rubric"]) == (0.8, 0.2, 0.65)
    cassette = tmp_path / "live" / "task=one,setting=default,seed=0" / "rubric.jsonl"
    asked = [json.loads(line) for line in cassette.read_text().splitlines()]
    assert [a["action"] for a in asked] == ["argues", "fair"]
    assert "Does each side argue the motion?" in asked[0]["request"]["messages"][-1]["content"]
    assert "Alice" in asked[0]["request"]["messages"][-1]["content"], "the rater reads the transcript"
    rater.unlink()  # no rater any more: the replay answers from the recorded trial's cassette
    run_eval(suite, tmp_path / "again", llm={"llm": "test:9"}, replay=tmp_path / "live")
    for name in EVAL_FILES:
        assert (tmp_path / "again" / name).read_bytes() == (tmp_path / "live" / name).read_bytes(), name


def test_a_bad_rubric_is_refused_by_name(tmp_path: Path) -> None:
    for bad, said in (
        ('[rubric]\nllm = "test"\n', "needs \\[\\[rubric.criteria\\]\\]"),
        ('[rubric]\n[[rubric.criteria]]\nname = "x"\n', "needs a name and a question"),
        ('[rubric]\n[[rubric.criteria]]\nname = "x"\nquestion = "q"\nweight = -1\n', "weight=-1"),
        ('[rubric]\n[[rubric.criteria]]\nname = "x"\nquestion = "q"\nweight = inf\n', "weight=inf"),
        ('[rubric]\n[[rubric.criteria]]\nname = "x"\nquestion = "q"\nweight = nan\n', "weight=nan"),
    ):
        folder = tiny_suite(tmp_path / said.replace("\\", "").replace(" ", "_"))
        (folder / "suite.toml").write_text((folder / "suite.toml").read_text() + bad)
        with pytest.raises(ConfigError, match=said):
            load_suite(folder)


def test_a_scorer_from_a_suite_not_built_in_runs_in_the_sandbox_unless_trusted(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    score = (
        "import subprocess\nfrom pathlib import Path\n"
        "def score(run_dir, task):\n"
        f"    said = (Path(run_dir) / 'manifest.json').read_text()[:1]\n"
        f"    for attempt in (lambda: Path({str(outside / 'written')!r}).write_text('x'),\n"
        f"                    lambda: Path(run_dir, 'planted').write_text('x'),\n"
        f"                    lambda: subprocess.run(['touch', {str(outside / 'touched')!r}], check=True)):\n"
        "        try:\n            attempt()\n        except Exception:\n            pass\n"
        "    return {'read': said == '{'}\n"
    )
    folder = tiny_suite(tmp_path, score)
    result = eval_cli(str(folder), "--llm", "test", "--out", str(tmp_path / "sandboxed"))
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (tmp_path / "sandboxed" / "eval.jsonl").read_text().splitlines()]
    assert [row["read"] for row in rows] == [True], "it reads the run directory"
    assert not list(outside.iterdir()) and not list((tmp_path / "sandboxed").rglob("planted")), "it wrote nothing"
    trusted = eval_cli(str(folder), "--llm", "test", "--trust", "--out", str(tmp_path / "trusted"))
    assert trusted.returncode == 0, trusted.stderr
    assert sorted(p.name for p in outside.iterdir()) == ["touched", "written"], "trusted, it runs as plain code"


def test_report_figures_keep_four_significant_digits_and_never_say_minus_zero() -> None:
    from metaroles.project.evaluate import figure

    assert [figure(v) for v in (0.000123456, -0.0000001, 12.3456, 0.0, 123456.0, "0.5", "abc", 3)] == [
        "0.0001235", "-1e-07", "12.35", "0", "1.235e+05", "0.5", "abc", 3,
    ]  # fmt: skip


def test_a_warning_many_trials_give_alike_is_said_once(capsys) -> None:
    import warnings

    from metaroles.cli import app, main

    @app.command("warn-twice", hidden=True)
    def warn_twice() -> None:
        for _ in range(18):
            warnings.warn("the same thing", UserWarning, stacklevel=1)
        warnings.warn("another thing", UserWarning, stacklevel=1)

    try:
        assert main(["warn-twice"]) == 0
    finally:
        app.registered_commands = [c for c in app.registered_commands if c.name != "warn-twice"]
    said = capsys.readouterr().err
    assert said.count("warning: the same thing") == 1 and said.count("warning: another thing") == 1
