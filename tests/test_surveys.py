"""One survey for people and agents: the form people fill in, and the agents' distributions scored against theirs."""

import csv
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaroles.cli import main
from metaroles.core.exceptions import ConfigError
from metaroles.project.interview import Answer
from metaroles.project.surveys import Question, compare, read_people, read_survey, write_form
from tests.faults.helpers import ok

SURVEY = """
[[question]]
id = "trust"
text = "Generally speaking, would you say that most people can be trusted?"
options = ["Most people can be trusted", "You can't be too careful"]

[[question]]
id = "trams"
text = "Should cities replace cars with trams in their centres?"
options = ["Yes", "No", "Not sure"]
"""


@pytest.fixture
def survey(tmp_path: Path) -> Path:
    (tmp_path / "survey.toml").write_text(SURVEY)
    return tmp_path / "survey.toml"


def people_file(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=["respondent", "trust", "trams"])
        writer.writeheader()
        writer.writerows({"respondent": str(i), **row} for i, row in enumerate(rows))
    return path


def surveyed(run: Path, survey: Path, people: Path, out: Path) -> int:
    """``metaroles survey RUN --round 2 --questions SURVEY --compare PEOPLE --out OUT``; its exit code."""
    asked = ["survey", str(run), "--round", "2", "--questions", str(survey)]
    return main([*asked, "--compare", str(people), "--out", str(out)])


def agents(question: Question, answers: list[str]) -> list[Answer]:
    return [Answer(f"a{i}", {}, question.text, a, 0, 0) for i, a in enumerate(answers)]


def test_the_form_is_a_surveyjs_page_or_a_sheet_with_its_codebook(survey: Path, tmp_path: Path) -> None:
    questions = read_survey(survey)
    write_form(questions, tmp_path / "form.json")
    page = json.loads((tmp_path / "form.json").read_text())["pages"][0]["elements"]
    assert [(e["type"], e["name"], e["choices"]) for e in page] == [
        ("radiogroup", "trust", ["Most people can be trusted", "You can't be too careful"]),
        ("radiogroup", "trams", ["Yes", "No", "Not sure"]),
    ]
    assert main(["form", str(survey), "--out", str(tmp_path / "form.csv")]) == 0
    assert (tmp_path / "form.csv").read_text() == "respondent,trust,trams\n"
    codebook = list(csv.reader((tmp_path / "codebook.csv").open()))
    assert codebook[2] == ["trams", "Should cities replace cars with trams in their centres?", "Yes | No | Not sure"]


def test_agents_that_answer_as_the_people_score_100_and_at_random_0(survey: Path, tmp_path: Path) -> None:
    trust, trams = read_survey(survey)
    rows = [{"trust": trust.options[i % 4 == 0], "trams": trams.options[i % 2]} for i in range(40)]
    rows.append({"trust": "", "trams": "Not sure"})  # an unanswered cell is skipped
    people = read_people(people_file(tmp_path / "people.csv", rows), [trust, trams])
    assert len(people["trust"]) == 40 and len(people["trams"]) == 41
    alike = agents(trust, [r["trust"] for r in rows[:40]]) + agents(trams, [r["trams"] for r in rows])
    report = compare([trust, trams], alike, people)
    assert report["questions"]["trust"]["score"] == 100.0 and report["questions"]["trams"]["score"] == 100.0
    low, high = report["questions"]["trust"]["ci95"]
    assert low < 100.0 <= high, "the interval reflects 40 people and 40 agents, not certainty"
    uniform = agents(trust, list(trust.options) * 20) + agents(trams, list(trams.options) * 20)
    assert compare([trust, trams], uniform, people)["questions"]["trust"]["score"] == pytest.approx(0.0, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from("abc"), min_size=1, max_size=40), st.lists(st.sampled_from("abc"), min_size=1, max_size=40)
)
def test_a_score_is_at_most_100_and_100_only_for_the_peoples_distribution(mine: list[str], theirs: list[str]) -> None:
    question = Question("q", "Which?", ("a", "b", "c"))
    scored = compare([question], agents(question, mine), {"q": theirs})["questions"]["q"]
    same = all(mine.count(o) / len(mine) == theirs.count(o) / len(theirs) for o in "abc")
    assert scored["score"] <= 100.0 + 1e-9
    assert (abs(scored["score"] - 100.0) < 1e-9) == same
    if len(mine) > 1 and len(theirs) > 1:
        assert scored["ci95"][0] <= scored["score"] <= scored["ci95"][1]
    else:
        assert scored["ci95"] is None, "one answer has no spread to resample"


def test_a_people_file_that_does_not_fit_the_survey_is_named_by_line(survey: Path, tmp_path: Path) -> None:
    questions = read_survey(survey)
    bad = people_file(tmp_path / "p.csv", [{"trust": "You can't be too careful", "trams": "Maybe"}])
    with pytest.raises(ConfigError, match=r"line 2, trams: 'Maybe' is not one of its options"):
        read_people(bad, questions)
    (tmp_path / "q.csv").write_text("respondent,trust\n1,Most people can be trusted\n")
    with pytest.raises(ConfigError, match="has no column 'trams'"):
        read_people(tmp_path / "q.csv", questions)
    (tmp_path / "s.toml").write_text('[[question]]\nid = "x"\ntext = "?"\noptions = ["one"]\n')
    with pytest.raises(ConfigError, match="give at least two options"):
        read_survey(tmp_path / "s.toml")


def test_a_runs_agents_answer_the_survey_by_its_options_and_are_scored_against_people(
    survey: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    ok(
        "run",
        "society",
        "--llm",
        "test",
        "--seed",
        "3",
        "--set",
        "agents=12",
        "--set",
        "rounds=3",
        "--out",
        str(run),
        "-q",
    )
    rows = [{"trust": "You can't be too careful", "trams": ["Yes", "No"][i % 2]} for i in range(30)]
    people = people_file(tmp_path / "people.csv", rows)
    out = tmp_path / "asked"
    assert surveyed(run, survey, people, out) == 0
    import pyarrow.parquet as pq

    table = pq.read_table(out / "answers.parquet").to_pylist()
    _, trams = read_survey(survey)
    assert len(table) == 24 and {r["answer"] for r in table if r["question"] == trams.text} <= set(trams.options)
    report = json.loads((out / "comparison.json").read_text())
    assert report["questions"]["trust"]["agents"]["n"] == 12 and report["questions"]["trust"]["people"]["n"] == 30
    assert "| trust | 12 | 30 |" in capsys.readouterr().out

    bad = people_file(tmp_path / "bad.csv", [{"trust": "Nobody", "trams": "Yes"}])
    assert surveyed(run, survey, bad, tmp_path / "b") == 2
    err = capsys.readouterr().err
    assert "'Nobody' is not one of its options" in err and err.count("\n") == 1
    assert not (tmp_path / "b").exists(), "refused before any model was asked"
