"""Replicated human studies: ten classic experiments scored as their papers tested people.

A population scripted to answer as people did replicates them; one answering at random does not;
every figure cites its source; the scorer's statistics are scipy's and statsmodels' on the paper's
own data (the human side is recomputed, not typed in).
"""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaroles.project.evaluate import load_suite, run_eval

SUITE = load_suite("studies")
POPULATIONS = SUITE.folder / "populations"
SCORE: dict[str, Any] = runpy.run_path(str(SUITE.folder / "score.py"))  # the built-in scorer, ours


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The suite with one seed for each scripted population: the rows per population, and where each ran."""
    suite = load_suite("studies", seeds=[0])
    out = tmp_path_factory.mktemp("studies")
    found: dict[str, Any] = {"out": out}
    for name in ("human_like", "random"):
        found[name] = run_eval(suite, out / name, llm={"llm": f"scripted:{POPULATIONS / f'{name}.json'}"}, jobs=2)
    return found


def test_ten_studies_each_state_a_hypothesis_a_test_and_cite_their_human_figures() -> None:
    assert len(SUITE.tasks) >= 10
    for task in SUITE.tasks:
        study = tomllib.loads((task.folder / "reference.toml").read_text(encoding="utf-8"))
        assert len(study["hypothesis"]) > 40 and study["test"] in {
            "two_proportions",
            "one_mean",
            "two_means",
            "two_medians",
        }
        human = study["human"]
        assert ("counts" in human or "values" in human or "effect" in human) and len(human["source"]) > 80, task.name
        assert any(str(year) in human["source"] for year in range(1940, 2030)), task.name


def test_a_human_like_population_replicates_the_studies_and_a_random_one_does_not(evaluated) -> None:
    human, chance = ({r["task"]: r for r in evaluated[n]} for n in ("human_like", "random"))
    assert all(r["status"] == "done" for r in evaluated["human_like"] + evaluated["random"])
    assert all(r["answered"] == {"trust": 50, "pd_communication": 200}.get(task, 100) for task, r in human.items())
    mean = {
        name: sum(r["score"] for r in rows.values()) / len(rows)
        for name, rows in (("human", human), ("chance", chance))
    }
    assert mean["human"] >= 0.9, {t: r["score"] for t, r in human.items()}
    assert mean["chance"] <= 0.2, {t: r["score"] for t, r in chance.items()}
    assert sum(r["replicated"] for r in human.values()) >= 9
    for task, row in human.items():
        assert row["effect_low"] <= row["effect"] <= row["effect_high"], task
        assert row["effect"] * row["human_effect"] > 0, task
    across = SCORE["across"](evaluated["human_like"])
    assert across["ecs"] > 0.9 and across["replication_rate"] >= 0.9, across


def test_the_report_and_table_show_every_study(evaluated) -> None:
    out = evaluated["out"] / "human_like"
    table = (out / "table.md").read_text(encoding="utf-8")
    for task in SUITE.tasks:
        assert f"| {task.name} |" in table
    assert "| **all (10 trials)** | **0.9" in table, "the overall score, and no mean of effects in their own units"
    said = (out / "report.md").read_text(encoding="utf-8")
    assert "- asian_disease, human = counts 109 of 152, 34 of 155: Tversky & Kahneman (1981)" in said
    assert "- pd_communication, human = effect 0.46: Balliet (2010)" in said
    assert "- trust: Senders send money although" in said and "no source given" not in said
    again = run_eval(load_suite("studies", seeds=[0]), out, llm={"llm": f"scripted:{POPULATIONS / 'human_like.json'}"})
    assert [r["score"] for r in again] == [r["score"] for r in evaluated["human_like"]], "finished trials are kept"


def test_the_human_side_is_the_papers_own_test_on_its_data() -> None:
    framing = tomllib.loads((SUITE.folder / "tasks/asian_disease/reference.toml").read_text(encoding="utf-8"))
    human = SCORE["human_side"](framing)
    assert abs(human["effect"] - (109 / 152 - 34 / 155)) < 1e-6
    assert human["effect_low"] < human["effect"] < human["effect_high"] and human["posterior"] > 0.999
    trust = tomllib.loads((SUITE.folder / "tasks/trust/reference.toml").read_text(encoding="utf-8"))
    assert round(SCORE["human_side"](trust)["effect"] * 10, 2) == 5.16, "Berg et al.'s senders sent $5.16 on average"


@settings(max_examples=60, deadline=None)
@given(
    a=st.integers(0, 40),
    b=st.integers(0, 40),
    human=st.floats(-0.9, 0.9).filter(lambda x: abs(x) > 0.05),
)
def test_the_score_is_bounded_and_an_effect_against_peoples_never_replicates(a: int, b: int, human: float) -> None:
    study = {"test": "two_proportions", "compare": ["x", "y"], "human": {"effect": human}}
    agents = SCORE["measure"](study, [[1] * a + [0] * (40 - a), [1] * b + [0] * (40 - b)])
    found = SCORE["compare"](agents, SCORE["human_side"](study))
    assert 0 <= found["score"] <= 1 and 0 <= found["pas"] <= 1 and 0 <= found["closeness"] <= 1
    if agents["effect"] * human <= 0:
        assert found["replicated"] == 0 and found["closeness"] == 0 and found["pas"] == 0


def test_the_scripted_populations_are_what_their_generator_writes(tmp_path: Path) -> None:
    made = subprocess.run(
        [sys.executable, str(POPULATIONS / "make.py"), str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert made.returncode == 0, made.stderr
    for name in ("human_like.json", "random.json"):
        assert (tmp_path / name).read_bytes() == (POPULATIONS / name).read_bytes(), name
        assert json.loads((tmp_path / name).read_text(encoding="utf-8"))


def test_a_talking_condition_hears_its_partner_before_deciding(tmp_path: Path) -> None:
    out, cassette = tmp_path / "pd", tmp_path / "pd.jsonl"
    ran = subprocess.run(
        [sys.executable, "-m", "metaroles", "run", "studies", "--llm", f"scripted:{POPULATIONS / 'human_like.json'}",
         "--set", "study=pd_communication", "--set", "participants=100", "--record", str(cassette),
         "--out", str(out), "-q"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    asked = [json.loads(line) for line in cassette.read_text(encoding="utf-8").splitlines()[1:]]
    told = [call for call in asked if "your partner sent you this message" in json.dumps(call)]
    assert len(told) == 100, "each of the 100 who talked heard its partner"


def test_an_odd_number_of_talkers_is_one_line_and_exit_2(tmp_path: Path) -> None:
    ran = subprocess.run(
        [sys.executable, "-m", "metaroles", "run", "studies", "--llm", "test", "--set", "study=pd_communication",
         "--set", "participants=5", "--out", str(tmp_path / "x"), "-q"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert ran.returncode == 2 and "participants=5 cannot be paired" in ran.stderr and len(ran.stderr.splitlines()) == 1
