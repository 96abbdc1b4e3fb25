"""One survey for people and for agents: a form people fill in, and the agents' answers scored against theirs.

A survey is a TOML file of closed questions::

    [[question]]
    id = "trust"
    text = "Generally speaking, would you say that most people can be trusted?"
    options = ["Most people can be trusted", "You can't be too careful"]

``metaroles form survey.toml --out form.json`` writes the form for a survey tool (SurveyJS's JSON:
a radio group per question; its results export as CSV with a column per question id), ``--out
form.csv`` a sheet with a column per question and a row per respondent (``codebook.csv`` beside it
lists the options). ``metaroles survey RUN --round K --questions survey.toml --compare people.csv``
asks the run's agents the same questions (each answers one option, by a schema) and scores, per
question, how close the agents' answer distribution is to the people's, in the style of SimBench
(Hu et al. 2025): ``100 × (1 − TVD(agents, people) / TVD(uniform, people))`` — 100 is the people's
distribution, 0 no better than answering at random, below 0 worse — with a 95 % bootstrap interval
over respondents (both samples resampled), and the mean over questions with its interval.
"""

from __future__ import annotations

import csv
import io
import json
import tomllib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metaroles.core.exceptions import ConfigError
from metaroles.core.files import write_atomic
from metaroles.project.interview import Answer, Closed

MAX_SURVEY_BYTES = 1 << 20
"""A survey file larger than this is refused (it is read whole)."""
MAX_PEOPLE_BYTES = 1 << 30
"""A people file larger than this is refused (it is read row by row)."""
RESAMPLES = 2000


@dataclass(frozen=True)
class Question:
    """A closed question of a survey."""

    id: str
    text: str
    options: tuple[str, ...]

    def closed(self) -> Closed:
        """The question as an interview asks it."""
        return Closed(self.text, self.options)


def read_survey(path: Path) -> list[Question]:
    """The questions of a survey file (see the module).

    Raises:
        ConfigError: Naming what is wrong: not TOML, no question, a question without an id, text or
            two distinct options, or two questions with one id.
    """
    if not path.is_file():
        raise ConfigError(f"{str(path)!r} is not a survey file; write one ([[question]] id, text, options)")
    if path.stat().st_size > MAX_SURVEY_BYTES:
        raise ConfigError(f"{str(path)!r} is larger than {MAX_SURVEY_BYTES} bytes; a survey is a short TOML file")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{str(path)!r} is not TOML ({exc}); see docs/surveys.md") from None
    entries = data.get("question")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{str(path)!r} has no [[question]]; give each an id, a text and its options")
    questions = [_question(path, n, entry) for n, entry in enumerate(entries, 1)]
    ids = [q.id for q in questions]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise ConfigError(f"{str(path)!r}: two questions have the id {twice[0]!r}; give each its own")
    return questions


def _question(path: Path, n: int, entry: Any) -> Question:
    where = f"{str(path)!r}, question {n}"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} is not a table; write [[question]] with id, text and options")
    qid, text, options = entry.get("id"), entry.get("text"), entry.get("options")
    if not isinstance(qid, str) or not qid.strip() or any(c in qid for c in ',\n\r"'):
        raise ConfigError(f'{where}: id {qid!r} must be a short name (no commas or quotes), e.g. id = "trust"')
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f'{where} ({qid}): give the question\'s text, e.g. text = "...?"')
    if not isinstance(options, list) or not all(isinstance(o, str) and o.strip() for o in options):
        raise ConfigError(f'{where} ({qid}): options must be a list of answers, e.g. options = ["yes", "no"]')
    if len(set(options)) < 2 or len(set(options)) != len(options):
        raise ConfigError(f"{where} ({qid}): give at least two options, each once; it has {options!r}")
    return Question(qid.strip(), text.strip(), tuple(options))


def write_form(questions: Sequence[Question], out: Path) -> list[Path]:
    """The form people fill in: SurveyJS JSON for ``.json``, else a CSV sheet and ``codebook.csv`` beside it.

    Raises:
        ConfigError: For a name that ends in neither ``.json`` nor ``.csv``.
    """
    if out.suffix == ".json":
        elements = [
            {"type": "radiogroup", "name": q.id, "title": q.text, "choices": list(q.options), "isRequired": True}
            for q in questions
        ]
        write_atomic(out, json.dumps({"pages": [{"name": "survey", "elements": elements}]}, indent=1) + "\n")
        return [out]
    if out.suffix != ".csv":
        raise ConfigError(f"--out {str(out)!r}: name a .json (SurveyJS) or a .csv (a sheet) form")
    write_atomic(out, _csv([["respondent", *(q.id for q in questions)]]))
    codebook = out.with_name("codebook.csv")
    entries = [[q.id, q.text, " | ".join(q.options)] for q in questions]
    write_atomic(codebook, _csv([["id", "text", "options"], *entries]))
    return [out, codebook]


def _csv(rows: Sequence[Sequence[str]]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue()


def read_people(path: Path, questions: Sequence[Question]) -> dict[str, list[str]]:
    """Each question's answers by people, from the CSV a survey tool exports (a column per question id).

    Empty cells are unanswered and skipped; other columns (a respondent's id, a time) are ignored.

    Raises:
        ConfigError: For a file that is missing or too large, a header without a question's column,
            or a cell that is not one of its question's options (named with its line).
    """
    if not path.is_file():
        raise ConfigError(f"--compare {str(path)!r} is not a file; pass the people's answers as CSV")
    if path.stat().st_size > MAX_PEOPLE_BYTES:
        raise ConfigError(f"--compare {str(path)!r} is larger than {MAX_PEOPLE_BYTES} bytes; sample it first")
    answers: dict[str, list[str]] = {q.id: [] for q in questions}
    with path.open(encoding="utf-8-sig", newline="") as file:
        rows = csv.DictReader(file)
        missing = [q.id for q in questions if q.id not in (rows.fieldnames or ())]
        if missing:
            raise ConfigError(
                f"--compare {str(path)!r} has no column {missing[0]!r}; its header names each question's id"
            )
        for line, row in enumerate(rows, 2):
            for q in questions:
                cell = (row.get(q.id) or "").strip()
                if cell and cell not in q.options:
                    raise ConfigError(
                        f"--compare {str(path)!r} line {line}, {q.id}: {cell!r} is not one of its options "
                        f"{list(q.options)}"
                    )
                if cell:
                    answers[q.id].append(cell)
    return answers


def compare(questions: Sequence[Question], agents: Sequence[Answer], people: dict[str, list[str]]) -> dict[str, Any]:
    """Score the agents' answer distribution against the people's, per question and overall (see the module).

    Raises:
        ConfigError: If a question has no answer from the agents or from the people (nothing to compare).
    """
    by_text: dict[str, list[str]] = {q.text: [] for q in questions}
    for a in agents:
        if a.question in by_text and a.answer:
            by_text[a.question].append(a.answer)
    scored = {}
    for q in questions:
        mine, theirs = by_text[q.text], people.get(q.id, [])
        if not mine or not theirs:
            who = "the agents" if not mine else "the people"
            raise ConfigError(f"question {q.id!r} has no answer from {who}; nothing to compare it with")
        scored[q.id] = _scored(q, mine, theirs)
    return {"questions": scored, "overall": _overall([s["score"] for s in scored.values()])}


def _shares(answers: Sequence[str], options: Sequence[str]) -> list[float]:
    counts = Counter(answers)
    return [counts[o] / len(answers) for o in options]


def _score(agents: Sequence[float], people: Sequence[float]) -> float:
    """SimBench-style: 100 × (1 − TVD(agents, people) / TVD(uniform, people)).

    When the people answer uniformly (no baseline to beat), the distance is scaled by its largest value instead.
    """
    tvd = sum(abs(a - p) for a, p in zip(agents, people, strict=True)) / 2
    uniform = 1 / len(people)
    baseline = sum(abs(uniform - p) for p in people) / 2
    if baseline == 0:
        return 100.0 if tvd == 0 else 100.0 * (1 - tvd / (1 - uniform))
    return 100.0 * (1 - tvd / baseline)


def _scored(q: Question, agents: list[str], people: list[str]) -> dict[str, Any]:
    """One question: both distributions, the score and its bootstrap interval over respondents."""
    import numpy as np
    from scipy import stats

    index = {o: i for i, o in enumerate(q.options)}
    mine, theirs = np.array([index[a] for a in agents]), np.array([index[p] for p in people])
    k = len(q.options)

    def statistic(x: Any, y: Any, axis: int = -1) -> Any:
        a = np.stack([(x == i).mean(axis=axis) for i in range(k)], axis=-1)
        p = np.stack([(y == i).mean(axis=axis) for i in range(k)], axis=-1)
        tvd = np.abs(a - p).sum(axis=-1) / 2
        baseline = np.abs(1 / k - p).sum(axis=-1) / 2
        return 100 * (1 - tvd / np.where(baseline == 0, 1 - 1 / k, baseline))

    agents_shares, people_shares = _shares(agents, q.options), _shares(people, q.options)
    score = _score(agents_shares, people_shares)
    interval = None  # a sample of one has no spread to resample
    if len(mine) > 1 and len(theirs) > 1:
        rng = np.random.default_rng(0)  # a fixed stream: the same answers give the same interval
        boot = stats.bootstrap((mine, theirs), statistic, n_resamples=RESAMPLES, method="percentile", random_state=rng)
        low, high = boot.confidence_interval
        interval = [_r(min(low, score)), _r(max(high, score))]
    return {
        "text": q.text,
        "agents": {"n": len(agents), "shares": dict(zip(q.options, map(_r, agents_shares), strict=True))},
        "people": {"n": len(people), "shares": dict(zip(q.options, map(_r, people_shares), strict=True))},
        "score": _r(score),
        "ci95": interval,
    }


def _overall(scores: list[float]) -> dict[str, Any]:
    """The mean score over questions, with a t interval when there are several."""
    import numpy as np
    from scipy import stats

    mean = float(np.mean(scores))
    if len(scores) < 2 or float(np.std(scores)) == 0:
        return {"questions": len(scores), "score": _r(mean), "ci95": [_r(mean), _r(mean)]}
    low, high = stats.t.interval(0.95, len(scores) - 1, loc=mean, scale=stats.sem(scores))
    return {"questions": len(scores), "score": _r(mean), "ci95": [_r(low), _r(high)]}


def comparison_markdown(report: dict[str, Any]) -> str:
    """The comparison as people read it: a line per question, then the mean."""
    lines = ["| question | agents | people | score [95 % CI] |", "|---|---|---|---|"]
    for qid, s in report["questions"].items():
        shown = "(too few to resample)" if s["ci95"] is None else f"[{s['ci95'][0]:.1f}, {s['ci95'][1]:.1f}]"
        lines.append(f"| {qid} | {s['agents']['n']} | {s['people']['n']} | {s['score']:.1f} {shown} |")
    overall = report["overall"]
    low, high = overall["ci95"]
    lines.append(
        f"\nMean over {overall['questions']} questions: {overall['score']:.1f} [{low:.1f}, {high:.1f}] "
        "(100: the people's distribution; 0: no closer than answering at random)"
    )
    return "\n".join(lines) + "\n"


def _r(value: float) -> float:
    return round(float(value), 6)
