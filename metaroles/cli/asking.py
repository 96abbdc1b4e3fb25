"""``metaroles interview`` and ``survey``: ask a run's roles questions on a fork at a round; the run is untouched.

Each writes ``answers.parquet`` (role, attributes, question, answer, tokens) and ``interview.json``
into a folder of its own (``--out``; by default next to the run), and prints the answers (an
interview) or a summary with the model's tokens per second (a survey).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import anyio
import typer

from metaroles.cli.common import (
    LLM_HELP,
    TRUST_HELP,
    app,
    fail,
    manifest_model,
    reported,
    resolve,
    run_dir_at,
    trusted,
)

if TYPE_CHECKING:
    from metaroles.project.interview import Answer, Closed
    from metaroles.project.surveys import Question

ROUND_HELP = "ask the roles as they stood at the end of this round"
OUT_HELP = "the folder of the answers (default: next to the run, RUN-asked-rROUND)"


@app.command()
def interview(
    run_dir: Annotated[Path, typer.Argument(help="the run directory")],
    question: Annotated[str, typer.Argument(help="the question")],
    at_round: Annotated[int, typer.Option("--round", min=0, help=ROUND_HELP)],
    role: Annotated[str, typer.Option(help="the role to ask (a name; a pattern such as 'a1*' asks several)")],
    out: Annotated[Path | None, typer.Option(help=OUT_HELP)] = None,
    llm: Annotated[str | None, typer.Option(help=f"{LLM_HELP} (default: the run's own)")] = None,
    trust: Annotated[bool, typer.Option("--trust", help=TRUST_HELP)] = False,
) -> None:
    """Ask one role a question as it stood after a round (on a fork: the run directory is not changed)."""
    answers, _ = _ask(run_dir, at_round, role, [question], out, llm, trust=trust)
    for answer in answers:
        typer.echo(f"{answer.role}: {answer.answer}")


@app.command()
def survey(
    run_dir: Annotated[Path, typer.Argument(help="the run directory")],
    at_round: Annotated[int, typer.Option("--round", min=0, help=ROUND_HELP)],
    questions: Annotated[
        Path, typer.Option(metavar="FILE", help="the questions: one per line, or a survey (.toml: closed questions)")
    ],
    roles: Annotated[str, typer.Option(help="whom to ask: names or patterns, comma-separated ('*': everyone)")] = "*",
    out: Annotated[Path | None, typer.Option(help=OUT_HELP)] = None,
    llm: Annotated[str | None, typer.Option(help=f"{LLM_HELP} (default: the run's own)")] = None,
    compare: Annotated[
        Path | None,
        typer.Option(metavar="PEOPLE.csv", help="score the agents' answers against people's (a survey tool's CSV)"),
    ] = None,
    trust: Annotated[bool, typer.Option("--trust", help=TRUST_HELP)] = False,
) -> None:
    """Ask many roles many questions as they stood after a round; the answers as a table (answers.parquet)."""
    if not questions.is_file():
        raise fail(f"--questions {str(questions)!r} is not a file; write one question per line")
    with reported():
        survey_questions, people = _survey(questions, compare)
    asked: list[str | Closed] = [q.closed() for q in survey_questions] if survey_questions else _lines(questions)
    answers, seconds = _ask(run_dir, at_round, roles, asked, out, llm, trust=trust)
    completion = sum(a.completion_tokens for a in answers)
    typer.echo(
        f"{len(answers)} answers from {len({a.role for a in answers})} roles in {seconds:.1f} s "
        f"({completion / max(seconds, 1e-9):.0f} completion tokens/s)"
    )
    if people is not None:
        _compared(survey_questions, answers, people, out or _default_out(run_dir, at_round))


def _lines(questions: Path) -> list[str | Closed]:
    asked = [line.strip() for line in questions.read_text(encoding="utf-8", errors="replace").splitlines()]
    return [q for q in asked if q]


def _survey(questions: Path, compare: Path | None) -> tuple[list[Question], dict[str, list[str]] | None]:
    """The closed questions of a ``.toml`` survey (none for a file of lines), and the people's answers if given.

    A people file that does not fit the survey is refused here, before any model is asked.
    """
    from metaroles.core.exceptions import ConfigError
    from metaroles.project.surveys import read_people, read_survey

    if questions.suffix != ".toml":
        if compare is not None:
            raise ConfigError("--compare needs closed questions: pass a survey (.toml), see docs/surveys.md")
        return [], None
    survey_questions = read_survey(questions)
    return survey_questions, read_people(compare, survey_questions) if compare is not None else None


def _compared(questions: list[Question], answers: list[Answer], people: dict[str, list[str]], folder: Path) -> None:
    """Score the answers against the people's; ``comparison.json`` and ``comparison.md`` into ``folder``."""
    import json

    from metaroles.core.files import write_atomic
    from metaroles.project.surveys import compare, comparison_markdown

    with reported():
        report = compare(questions, answers, people)
    write_atomic(folder / "comparison.json", json.dumps(report, indent=1) + "\n")
    write_atomic(folder / "comparison.md", comparison_markdown(report))
    typer.echo(comparison_markdown(report), nl=False)


@app.command()
def form(
    survey_file: Annotated[Path, typer.Argument(metavar="SURVEY.toml", help="the survey's closed questions")],
    out: Annotated[Path, typer.Option(help="form.json (SurveyJS) or form.csv (a sheet, with codebook.csv)")],
) -> None:
    """The survey as a form people fill in: the same questions the agents answer (metaroles survey --compare)."""
    from metaroles.project.surveys import read_survey, write_form

    with reported():
        written = write_form(read_survey(survey_file), out)
    typer.echo("written: " + ", ".join(str(p) for p in written))


def _default_out(run_dir: Path, at_round: int) -> Path:
    return run_dir.parent / f"{run_dir.name}-asked-r{at_round}"


def _ask(
    run_dir: Path,
    at_round: int,
    roles: str,
    questions: list[str | Closed],
    out: Path | None,
    spec: str | None,
    *,
    trust: bool,
) -> tuple[list[Answer], float]:
    """Ask, under the CLI's error reporting; the answers and the seconds they took."""
    from metaroles.project.interview import interview_run
    from metaroles.project.rundir import read_manifest

    with reported():
        manifest = read_manifest(run_dir_at(run_dir))
        trusted(manifest["scenario"], run_dir, trust=trust)
        model = resolve({"llm": spec}) if spec else manifest_model(manifest)
        role_llms = {name: resolve({"llm": str(s)}) for name, s in (manifest.get("role_llms") or {}).items()}
        folder = out or _default_out(run_dir, at_round)
        started = time.monotonic()
        answers = anyio.run(
            lambda: interview_run(
                run_dir, at_round=at_round, roles=roles, questions=questions, out_dir=folder, llm=model,
                role_llms=role_llms,
            )
        )  # fmt: skip
        typer.echo(f"answers: {folder / 'answers.parquet'}", err=True)
    return answers, time.monotonic() - started
