"""Writes the studies suite's two scripted populations (run it to remake them; a test checks they are its output).

- ``human_like.json``: in each study's conditions, as many participants give each answer as people
  did in the paper (the counted option for the share of people who chose it; numbers spread around
  the published mean or median);
- ``random.json``: every participant answers at random (seeded) among the options or numbers allowed.

Both answer by the question each participant is shown (the scripted model's ``when``: a part of the
question found in no other), so one file answers all ten studies at the participants per condition their tasks give.
"""

from __future__ import annotations

import json
import random
import sys
import tomllib
from pathlib import Path
from typing import Any

from metaroles.scenarios.studies import STUDIES, TALKING, Config, design

SUITE = Path(__file__).resolve().parent.parent
SPREAD = {  # numbers around the published figures, cycled over a condition's participants
    ("trust", "sender"): None,  # the 32 senders' own amounts (reference.toml), spread over 50
    ("ultimatum_dictator", "ultimatum"): [50, 40, 50, 30, 40, 30],  # mean 40 (Oosterbeek et al. 2004)
    ("ultimatum_dictator", "dictator"): [0, 50, 30, 20, 50, 20],  # mean 28.3 (Engel 2011: 28.35)
    ("anchoring", "high"): [35, 45, 55, 45, 40, 50],  # median 45
    ("anchoring", "low"): [15, 25, 35, 25, 20, 30],  # median 25
}
MESSAGE = "Let's both cooperate: we each get 3 coins that way."


def human_like() -> dict[str, Any]:
    """Each participant's answers, as many of each as people gave."""
    script: dict[str, dict[str, list[Any]]] = {}
    for study, questions in STUDIES.items():
        reference = tomllib.loads((SUITE / "tasks" / study / "reference.toml").read_text(encoding="utf-8"))
        shares = _shares(study, reference)
        for condition, names in _by_condition(study).items():
            question = questions[condition]
            for j, name in enumerate(names):
                answer = _answer(study, condition, question.answer, j, len(names), shares, reference)
                script.setdefault(name, {}).setdefault("Answer", []).append(
                    {"when": marker(question.text), "answer": answer}
                )
                if TALKING.get(study) == condition:
                    talk = {"when": marker(question.text), "answer": {"text": MESSAGE}}
                    script[name].setdefault("Talk", []).append(talk)
    return script


def _shares(study: str, reference: dict[str, Any]) -> dict[str, float]:
    """The share of people who gave the counted answer, per condition."""
    human = reference["human"]
    if "counts" in human:
        return {c: k / n for c, (k, n) in zip(reference["compare"], human["counts"], strict=True)}
    if study == "pd_communication":  # d 0.46 as a log odds ratio: 66% against 46% cooperate (d 0.45)
        return {"message": 0.66, "silent": 0.46}
    return {}


def _answer(
    study: str, condition: str, kind: str, j: int, count: int, shares: dict[str, float], reference: dict[str, Any]
) -> dict[str, Any]:
    if kind.startswith("0-"):
        values = SPREAD[(study, condition)] or reference["human"]["values"]
        if SPREAD[(study, condition)] is None:
            return {"amount": values[j * len(values) // count]}
        return {"amount": values[j % len(values)]}
    target = reference["target"][condition]
    other = "A" if target != "A" else "B"
    return {"choice": target if j < round(shares[condition] * count) else other}


def random_answers(seed: int = 7) -> dict[str, Any]:
    """Each participant's answers drawn at random among those allowed."""
    draw = random.Random(seed)
    script: dict[str, dict[str, list[Any]]] = {}
    for study, questions in STUDIES.items():
        for condition, names in _by_condition(study).items():
            question = questions[condition]
            low, _, high = question.answer.partition("-")
            for name in names:
                if low == "0":
                    answer: dict[str, Any] = {"amount": draw.randint(0, int(high))}
                else:
                    answer = {"choice": draw.choice("ABC" if high == "C" else "AB")}
                script.setdefault(name, {}).setdefault("Answer", []).append(
                    {"when": marker(question.text), "answer": answer}
                )
                if TALKING.get(study) == condition:
                    talk = {"when": marker(question.text), "answer": {"text": "Hello."}}
                    script[name].setdefault("Talk", []).append(talk)
    return script


def marker(text: str) -> str:
    """A readable part of ``text``, from a word before where it first differs from the others, that no other holds."""
    others = [q.text for questions in STUDIES.values() for q in questions.values() if q.text != text]
    start = max(_common(text, other) for other in others)
    begin = text.rfind(" ", 0, max(start - 12, 0)) + 1
    for end in range(start + 20, len(text) + 20, 10):
        part = text[begin:end]
        if not any(part in other for other in others):
            return part
    raise ValueError(f"no part of {text!r} tells it from the other questions")


def _common(a: str, b: str) -> int:
    """How many characters ``a`` and ``b`` share from their start."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _by_condition(study: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    options = tomllib.loads((SUITE / "tasks" / study / "task.toml").read_text(encoding="utf-8"))["options"]
    for name, condition in design(Config(**options)).items():
        found.setdefault(condition, []).append(name)
    return found


def written() -> dict[str, str]:
    """File name → its text."""
    return {
        name: "{\n"
        + ",\n".join(f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in script.items())
        + "\n}\n"
        for name, script in (("human_like.json", human_like()), ("random.json", random_answers()))
    }


if __name__ == "__main__":
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
    for name, text in written().items():
        (folder / name).write_text(text, encoding="utf-8")
