"""Interviews and surveys of a run's roles, on a fork of it at a round: the run itself is never touched.

:func:`interview_run` rebuilds the run's roles from its manifest, restores them as they stood at
the end of round K (its checkpoint; from the last one before, the rounds between are run again in
memory), and puts each question to each chosen role through its own model, its system prompt
(profile, goal, constraints) and its memory as it stood. The answers are a table of a row per role
and question (:data:`COLUMNS`), written as ``answers.parquet`` into a folder of its own with
``interview.json`` (what was asked, of which run, at which round). Nothing is written into the run
directory; its files are only read.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from metaroles.bus.role import Role
from metaroles.bus.thinking import role_prefix
from metaroles.core.exceptions import ConfigError, RunDirCorrupt, UnknownRoleError
from metaroles.core.files import write_atomic
from metaroles.core.prompts import render_prompt
from metaroles.llm.protocol import LLM, LLMRequest, extract_json
from metaroles.messages.render import readable
from metaroles.project.rundir import CHECKPOINTS, check_run_dir, events_file, read_manifest
from metaroles.project.scenario import rebuilt_team
from metaroles.record.eventread import logged_through
from metaroles.record.numbering import numbered
from metaroles.record.restore import restore_checkpoint
from metaroles.team.control import JOURNAL, RunControl
from metaroles.team.team import Team

__all__ = ["ANSWERS", "COLUMNS", "Answer", "Closed", "attributes_of", "interview_run", "pick_roles", "stood_at"]

ANSWERS = "answers.parquet"
COLUMNS = ("role", "attributes", "question", "answer", "prompt_tokens", "completion_tokens")
MEMORY_MESSAGES = 20
"""The newest remembered messages a role is asked with (a small model's context is short)."""
ANSWER_TOKENS = 120
IN_FLIGHT = 32
"""Questions in flight at once (a batching engine decodes them together)."""
_PROMPT = """You are $name. What you have seen and said so far, oldest first:
$memory

An interviewer asks you: $question
Answer in your own voice, in one or two sentences."""


@dataclass(frozen=True)
class Answer:
    """One role's answer to one question."""

    role: str
    attributes: dict[str, Any]
    """The role as it stood at the round: its class, its scalar attributes (an agent's opinion, a player's
    seat), its stage (``state``) and what it keeps beyond the bus (``extra``: a persona, a stance, a summary)."""
    question: str
    answer: str
    prompt_tokens: int
    completion_tokens: int


def pick_roles(roles: Sequence[Role], chosen: str) -> list[Role]:
    """The roles ``chosen`` names: names or shell patterns (``a1*``), comma-separated; ``*`` for all.

    Raises:
        UnknownRoleError: If a name or pattern matches no role, listing some that exist.
    """
    patterns = [p.strip() for p in chosen.split(",") if p.strip()]
    picked = [r for r in roles if any(fnmatch.fnmatchcase(r.name, p) for p in patterns)]
    missing = [p for p in patterns if not any(fnmatch.fnmatchcase(r.name, p) for r in roles)]
    if missing or not picked:
        some = ", ".join(r.name for r in roles[:8]) + (", ..." if len(roles) > 8 else "")
        raise UnknownRoleError(f"no role of the run matches {', '.join(missing) or chosen!r}; its roles: {some}")
    return picked


async def interview_run(
    run_dir: Path,
    *,
    at_round: int,
    roles: str,
    questions: Sequence[str | Closed],
    out_dir: Path,
    llm: LLM,
    role_llms: dict[str, LLM] | None = None,
    max_tokens: int = ANSWER_TOKENS,
    memory: int = MEMORY_MESSAGES,
) -> list[Answer]:
    """Ask ``questions`` of the ``roles`` of the run in ``run_dir`` as they stood after ``at_round``.

    ``llm`` is the run's model (roles with a model of their own keep it: ``role_llms``); a role is
    asked with its newest ``memory`` messages, and answers in at most ``max_tokens``. The answers
    are written to ``out_dir/answers.parquet`` (needs pyarrow) and returned.

    Raises:
        ConfigError: If ``run_dir`` is not a run, has no checkpoint up to ``at_round``, ``out_dir``
            holds answers already, or no question is given.
        UnknownRoleError: If ``roles`` matches no role.
    """
    _checked(run_dir, out_dir, questions, at_round)
    team, restored = await stood_at(run_dir, at_round, llm, role_llms or {}, out_dir)
    picked = pick_roles(list(team.env.members), roles)
    answers = await _ask_all(
        picked, [q for q in questions if str(q).strip()], partial(answer, max_tokens=max_tokens, memory=memory)
    )
    _write(out_dir, answers, {"run_dir": run_dir, "round": at_round, "from_checkpoint": restored})
    return answers


async def stood_at(
    run_dir: Path, at_round: int, llm: LLM, role_llms: dict[str, LLM], scratch: Path, *, again: bool = True
) -> tuple[Team, int]:
    """The run's roles as they stood after ``at_round``, and the round of the checkpoint they were restored from.

    From the last checkpoint up to ``at_round`` the rounds since are run again in memory with ``llm``
    (the run's own model, or its answers), with what was injected meanwhile; ``again=False`` leaves
    them as the checkpoint holds them. What the roles write goes to ``scratch``; the run is only read.

    Raises:
        ConfigError: If the run has no checkpoint up to ``at_round``.
        RunDirCorrupt: If a checkpoint between that one and ``at_round`` cannot be read.
    """
    team = rebuilt_team(read_manifest(run_dir), llm, scratch, role_llms)
    restored = restore_checkpoint(run_dir / CHECKPOINTS, team.env, through_round=at_round)
    skipped = [n for n, _ in numbered(run_dir / CHECKPOINTS, "round") if restored.round < n <= at_round]
    if skipped:  # a checkpoint is there but could not be read: its round is not what an earlier one becomes
        raise RunDirCorrupt(
            f"the checkpoint of round {skipped[-1]} in {str(run_dir)!r} cannot be read, so the run as it stood "
            f"after round {at_round} is not known; ask at round {restored.round} (the last readable one up to it), "
            "or restore the checkpoints folder"
        )
    if again and restored.round < at_round:  # the rounds since its last checkpoint, again, in memory
        with tempfile.TemporaryDirectory(prefix="metaroles-asked-") as journal:
            _injected_again(team, run_dir, Path(journal))
            await team.run(at_round - restored.round)
    return team, restored.round


def _checked(run_dir: Path, out_dir: Path, questions: Sequence[str | Closed], at_round: int) -> None:
    """Check what an interview reads and writes (nothing written yet)."""
    if not [q for q in questions if str(q).strip()]:
        raise ConfigError("no question to ask: give one (or a file of one per line)")
    if out_dir.resolve().is_relative_to(run_dir.resolve()):
        raise ConfigError(f"{out_dir} is inside the run directory; the answers go into a folder of their own")
    if (out_dir / ANSWERS).exists():
        raise ConfigError(f"{out_dir / ANSWERS} exists already; pass another --out")
    check_run_dir(run_dir)
    _refuse_late(run_dir, at_round)


def _refuse_late(run_dir: Path, at_round: int) -> None:
    """Refuse a round the run has not logged whole (or a run with no checkpoint), naming the rounds there are.

    A round past the last checkpoint that the log holds (a live run paused after it) is run again in
    memory from that checkpoint, as a round between two checkpoints is.
    """
    last = max((n for n, _ in numbered(run_dir / CHECKPOINTS, "round")), default=None)
    if last is None:
        raise ConfigError(f"{str(run_dir)!r} has no checkpoint yet; ask once it has run a round")
    logged = max(last, logged_through(events_file(run_dir)) or 0)
    if at_round > logged:
        raise ConfigError(f"--round {at_round} is past the run's last logged round, {logged}; pick 0..{logged}")


def _injected_again(team: Team, run_dir: Path, scratch: Path) -> None:
    """What was injected after the checkpoint, published again where it landed (from a copy of the journal).

    Nothing is written to the run: the copy is the one a new injection would go to.
    """
    journal = run_dir / JOURNAL
    if journal.is_file():
        copy = scratch / JOURNAL
        shutil.copyfile(journal, copy)
        control = RunControl()
        control.replay(copy)
        team.control = control


async def _ask_all(
    roles: Sequence[Role], questions: Sequence[str | Closed], ask_one: Callable[[Role, str | Closed], Awaitable[Answer]]
) -> list[Answer]:
    """Each role answers each question; all at once, ``IN_FLIGHT`` at a time, in a fixed order."""
    answers: list[Answer | None] = [None] * (len(roles) * len(questions))
    limit = anyio.CapacityLimiter(IN_FLIGHT)

    async def ask(index: int, role: Role, question: str | Closed) -> None:
        async with limit:
            answers[index] = await ask_one(role, question)

    async with anyio.create_task_group() as group:
        for i, role in enumerate(roles):
            for j, question in enumerate(questions):
                group.start_soon(ask, i * len(questions) + j, role, question)
    return [a for a in answers if a is not None]


@dataclass(frozen=True)
class Closed:
    """A question with a fixed set of answers (a survey's): the model answers one of ``options``, by a schema."""

    text: str
    options: tuple[str, ...]

    def __str__(self) -> str:
        """The question as asked: its text, then its options."""
        return f"{self.text} Answer with one of: {'; '.join(self.options)}."

    def schema(self) -> dict[str, Any]:
        """The JSON schema of an answer: one of the options."""
        answer = {"type": "string", "enum": list(self.options)}
        return {"type": "object", "properties": {"answer": answer}, "required": ["answer"]}


async def answer(
    role: Role, question: str | Closed, *, max_tokens: int = ANSWER_TOKENS, memory: int = MEMORY_MESSAGES
) -> Answer:
    """``role``'s answer to ``question``: its own model, its system prompt and its newest ``memory`` messages.

    A :class:`Closed` question is answered by one of its options (the model's answer follows a schema;
    an answer that names none is empty).

    Raises:
        ConfigError: If the role has no model.
    """
    if role.llm is None:
        raise ConfigError(f"role {role.name!r} has no model to answer with; give the run one (--llm)")
    seen = "\n".join(f"- {m.sent_from or 'someone'}: {readable(m)}" for m in role.get_memories(memory))
    prompt = render_prompt(_PROMPT, name=role.name, memory=seen or "(nothing yet)", question=str(question))
    system = role_prefix(role.profile, role.name, role.goal, role.constraints)
    chat = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    schema = question.schema() if isinstance(question, Closed) else None
    request = LLMRequest(
        messages=chat, max_tokens=max_tokens, temperature=0.0, role=role.name, action="Interview", output_schema=schema
    )
    response = await role.llm.complete(request)
    return Answer(
        role=role.name,
        attributes=attributes_of(role),
        question=question.text if isinstance(question, Closed) else question,
        answer=_chosen(response.text, question) if isinstance(question, Closed) else response.text.strip(),
        prompt_tokens=response.usage.prompt_tokens,
        completion_tokens=response.usage.completion_tokens,
    )


def _chosen(text: str, question: Closed) -> str:
    """The option a closed question's answer names, else ``""``."""
    try:
        said = json.loads(extract_json(text)).get("answer")
    except (ValueError, AttributeError):
        return ""
    return said if said in question.options else ""


def attributes_of(role: Role) -> dict[str, Any]:
    """The role's class and settings, its own scalar attributes (a player's seat) and its ``readings`` (an opinion)."""
    own = {
        key: value
        for key, value in vars(role).items()
        if not key.startswith("_") and isinstance(value, str | int | float | bool) and key != "name"
    }
    own |= {name: getattr(role, name) for name in type(role).readings}
    extra = role.extra_state() if role.keeps_extra_state else None
    return {"class": type(role).__name__, **own, "state": role.rc.state, **({"extra": extra} if extra else {})}


def _attributes_column(pa: Any, rows: list[dict[str, Any]]) -> Any:
    """The roles' attributes as a struct column (a field each: ``df.attributes.str["opinion"]``).

    Roles whose attributes of one name differ in type (a seat a number here, a name there) are
    kept as JSON text instead, so nothing is lost.
    """
    try:
        return pa.array(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([json.dumps(row, sort_keys=True, default=str) for row in rows])


def _write(out_dir: Path, answers: Sequence[Answer], asked: dict[str, Any]) -> None:
    """``answers.parquet`` and ``interview.json`` into ``out_dir`` (each atomically)."""
    import pyarrow as pa  # the analysis extra: imported only when answers are written
    import pyarrow.parquet as pq

    out_dir.mkdir(parents=True, exist_ok=True)
    table = pa.table({column: [getattr(a, column) for a in answers] for column in COLUMNS if column != "attributes"})
    table = table.add_column(1, "attributes", _attributes_column(pa, [a.attributes for a in answers]))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    write_atomic(out_dir / ANSWERS, sink.getvalue().to_pybytes())
    summary = {
        **asked,
        "run_dir": os.path.abspath(asked["run_dir"]),
        "questions": sorted({a.question for a in answers}),
        "answers": len(answers),
    }
    summary["tokens"] = sum(a.prompt_tokens + a.completion_tokens for a in answers)
    write_atomic(out_dir / "interview.json", json.dumps(summary, indent=1, sort_keys=True) + "\n")
