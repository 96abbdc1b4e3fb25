"""A rubric: a model reads a run's transcript and scores it against weighted criteria (an autorater).

For open-ended scenarios whose outcome no program can check (did each debater argue the motion?
was the judge fair?), a suite declares its rubric as data in ``suite.toml``::

    [rubric]
    llm = "local"                      # the model that reads (a spec as --llm gives it)
    [[rubric.criteria]]
    name = "argues_the_motion"
    weight = 2
    question = "Does each debater argue their side of the motion, rather than ask what it is?"

Each criterion is one structured call (a score from 0 to 10 and why); the trial's row gets
``rubric.NAME`` (0-1) per criterion and ``rubric``, their mean weighted by ``weight``. Every call is
recorded in the trial's ``rubric.jsonl``; scoring the trial again answers from it, and so does a
replayed evaluation, from the recorded trial's cassette: the scores come back byte for byte, no model asked.
"""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel, Field

from metaroles.bus.action import complete_structured
from metaroles.core.exceptions import ConfigError, LLMOutputInvalid
from metaroles.core.files import read_text
from metaroles.llm.cassette import CassetteLLM, CassetteMode
from metaroles.llm.protocol import LLMRequest
from metaroles.llm.providers import llm_from_settings
from metaroles.llm.settings import LLMSettings
from metaroles.project.rundir import read_manifest

CASSETTE = "rubric.jsonl"
TRANSCRIPT_CHARS = 6000
"""The transcript's end the model reads (a small model's context holds this much with the question)."""

RATER = (
    "You rate a transcript of a multi-agent simulation against one question. Answer with a score from 0 "
    "(not at all) to 10 (fully), and one sentence saying why."
)


class Rating(BaseModel):
    """The rater's answer to one criterion."""

    score: int = Field(ge=0, le=10)
    why: str = Field(min_length=1, max_length=300)


@dataclass(frozen=True)
class Criterion:
    """One weighted question of a rubric."""

    name: str
    question: str
    weight: float = 1.0


@dataclass(frozen=True)
class Rubric:
    """A suite's rubric: its rater model and its criteria."""

    llm: str
    criteria: tuple[Criterion, ...]

    @classmethod
    def from_spec(cls, spec: Any, where: str) -> Rubric | None:
        """The ``[rubric]`` table of ``suite.toml`` (``None`` without one).

        Raises:
            ConfigError: Naming what is missing or of the wrong kind.
        """
        if spec is None:
            return None
        criteria = spec.get("criteria") if isinstance(spec, dict) else None
        if not isinstance(criteria, list) or not criteria:
            raise ConfigError(f"{where}: [rubric] needs [[rubric.criteria]] tables with a name and a question")
        made = []
        for item in criteria:
            name, question, weight = item.get("name"), item.get("question"), item.get("weight", 1)
            if not (isinstance(name, str) and name and isinstance(question, str) and question):
                raise ConfigError(f"{where}: a rubric criterion needs a name and a question, got {item!r}")
            if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight < math.inf:
                raise ConfigError(f"{where}: criterion {name!r} has weight={weight!r}; give a positive number")
            made.append(Criterion(name=name, question=question, weight=float(weight)))
        return cls(llm=str(spec.get("llm") or "local"), criteria=tuple(made))

    def score(self, run_dir: Path) -> dict[str, Any]:
        """The trial's rubric scores, from its cassette (or its replayed trial's), else from the rater, recorded."""
        with ThreadPoolExecutor(1) as thread:  # its own event loop: the caller may be inside one (a notebook)
            return thread.submit(anyio.run, self._score, run_dir).result()

    async def _score(self, run_dir: Path) -> dict[str, Any]:
        transcript = _transcript(run_dir)
        rater = self._rater(run_dir)
        found: dict[str, Any] = {}
        for criterion in self.criteria:
            prompt = f"Question: {criterion.question}\n\nTranscript:\n{transcript}\n\nQuestion: {criterion.question}"
            messages = [{"role": "system", "content": RATER}, {"role": "user", "content": prompt}]
            request = LLMRequest(messages=messages, role="Rater", action=criterion.name, temperature=0.0)
            try:
                rating = await complete_structured(rater, request, Rating, ledger=None, retries=1)
                found[f"rubric.{criterion.name}"] = rating.score / 10
            except LLMOutputInvalid:
                found[f"rubric.{criterion.name}"] = None
        rated = [(c.weight, found[f"rubric.{c.name}"]) for c in self.criteria if found[f"rubric.{c.name}"] is not None]
        total = sum(w for w, _ in rated)
        found["rubric"] = round(sum(w * s for w, s in rated) / total, 6) if total else None
        return found

    def _rater(self, run_dir: Path) -> CassetteLLM:
        """The rater behind the trial's cassette: replayed from it (or from the cassette of the trial it replayed)."""
        own = run_dir / CASSETTE
        replayed = str(read_manifest(run_dir).get("replayed_from") or "")
        recorded = Path(replayed).parent / CASSETTE if replayed else None
        if recorded is not None and recorded.is_file():
            return CassetteLLM(recorded, mode=CassetteMode.REPLAY)
        if own.is_file():
            return CassetteLLM(
                own, mode=CassetteMode.REPLAY_OR_LIVE, inner=llm_from_settings(LLMSettings(llm=self.llm))
            )
        return CassetteLLM(own, mode=CassetteMode.RECORD, inner=llm_from_settings(LLMSettings(llm=self.llm)))


def _transcript(run_dir: Path) -> str:
    """The run's transcript (``transcript.md``), its end when it is long."""
    path = run_dir / "transcript.md"
    text = read_text(path) if path.is_file() else json.dumps(read_manifest(run_dir))
    return text[-TRANSCRIPT_CHARS:]
