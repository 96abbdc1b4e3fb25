"""What a run will cost before it runs: ``metaroles run NAME --estimate``.

The scenario runs dry — its config, rounds, budget and seed as given, nothing written — with a
:class:`~metaroles.llm.offline.DryRunLLM` standing in for the run's model (and for each role's own
model): the test model's answers, a free-text answer as long as the scenario declares that
action's answers are (its ``ANSWER_TOKENS``: action name → tokens; else half the call's
``max_tokens``, else :data:`DEFAULT_ANSWER_TOKENS`), the tokens counted as the real model counts them
(the embedded model's own vocabulary and chat template; four characters a token for a model
whose tokenizer is not here), priced at the ledger's price of the real model. No model is asked.

The dry runs take consecutive seeds from the run's, at least :data:`MIN_DRY_RUNS`, until the
standard error of their calls' and tokens' means is within :data:`SPREAD` of the means (at most
:data:`MAX_DRY_RUNS`): a scenario whose course depends on its answers (who is voted out of a
werewolf game: 4 to 32 calls) runs dry more often than one whose course is fixed (a debate). The
estimate is their mean, with the range of the calls. The expected time is the command's start, a
dry run's own (the framework's) and the model's: at its measured pace (``EmbeddedModel.prefill_per_s``
and ``decode_step_s`` for the embedded models), else at the rate limits given
(``--tokens-per-minute``, ``--requests-per-minute``), else unknown.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from pydantic import BaseModel

from metaroles.core.exceptions import ConfigError
from metaroles.llm.ledger import LedgerEntry
from metaroles.llm.offline import DryRunLLM, TestLLM, TokenCount
from metaroles.llm.protocol import LLM
from metaroles.project.sweep import TrialBatch
from metaroles.project.trials import RUN_KEYS
from metaroles.team.options import RunOptions

MIN_DRY_RUNS = 3
MAX_DRY_RUNS = 40
SPREAD = 0.1
"""The standard error of the dry runs' mean calls and tokens, as a share of the means, an estimate stops at."""

DEFAULT_ANSWER_TOKENS = 100
"""A free-text answer's tokens when neither the scenario nor the call's ``max_tokens`` says."""


class Pace(BaseModel):
    """How fast the model answers: as measured (an engine's prefill and decoding steps), or held by rate limits."""

    prefill_per_s: float | None = None
    """Prompt tokens read a second (those not served from a prefix cache)."""
    decode_step_s: tuple[float, float] | None = None
    """A decoding step's seconds: so much, plus so much for each call decoded in it."""
    batch: int = 1
    """Calls decoded together at most."""
    tokens_per_minute: float | None = None
    requests_per_minute: float | None = None

    def seconds(self, rounds: Sequence[Sequence[LedgerEntry]]) -> float | None:
        """The model's time for the calls of these rounds (``None``: nothing says how fast it is).

        Measured: each round's calls decoded together, ``batch`` at a time: their uncached prompts read,
        then as many steps as the longest answer has. Rate limits: the run's tokens and calls at the limits.
        """
        if self.prefill_per_s and self.decode_step_s:
            return sum(self._round(calls) for calls in rounds if calls)
        calls = [call for each in rounds for call in each]
        tokens = sum(call.tokens for call in calls)
        limits = [
            60 * tokens / self.tokens_per_minute if self.tokens_per_minute else None,
            60 * len(calls) / self.requests_per_minute if self.requests_per_minute else None,
        ]
        known = [limit for limit in limits if limit is not None]
        return max(known) if known else None

    def _round(self, calls: Sequence[LedgerEntry]) -> float:
        assert self.prefill_per_s and self.decode_step_s
        fixed, per_call = self.decode_step_s
        waves, width = math.ceil(len(calls) / self.batch), min(len(calls), self.batch)
        prefill = sum(call.prompt_tokens - call.cached_tokens for call in calls) / self.prefill_per_s
        return prefill + waves * max(call.completion_tokens for call in calls) * (fixed + per_call * width)


class ActionFigures(BaseModel):
    """An action's calls and tokens in one run (the mean over the dry runs)."""

    calls: float
    prompt_tokens: float
    completion_tokens: float


class Estimate(BaseModel):
    """What a run will cost: the mean over its dry runs."""

    scenario: str
    model: str
    counted: str
    """How tokens were counted: the model's own tokenizer, or four characters a token."""
    seeds: list[int]
    """The dry runs' seeds."""
    calls: float
    calls_low: int
    calls_high: int
    prompt_tokens: float
    completion_tokens: float
    cost: float | None
    """USD at the ledger's prices; ``None`` when a model has no price (``--price``)."""
    seconds: float | None
    """Expected wall time: the command's start, the framework's (a dry run's) and the model's; ``None`` when the
    model's pace is unknown."""
    pace: str
    """Where the model's time comes from."""
    by_action: dict[str, ActionFigures]
    model_calls: int = 0
    """Calls any real model got while estimating: none."""


async def estimate_run(
    name: str,
    *,
    model: LLM,
    options: Mapping[str, Any],
    run: RunOptions,
    role_llms: Mapping[str, LLM] | None = None,
    pace: Pace | None = None,
    dry_runs: int | None = None,
) -> Estimate:
    """Estimate a run of scenario ``name`` on ``model`` (and ``role_llms``) with ``options`` and ``run``: the module.

    Raises:
        ConfigError: If the scenario cannot run dry (what it raised, named), or ``dry_runs`` < 1.

    ``dry_runs``: exactly so many (default: as many as the spread asks, see the module).
    """
    from metaroles.project.registry import load_scenario

    if dry_runs is not None and dry_runs < 1:
        raise ConfigError(f"dry_runs={dry_runs!r}: an estimate needs at least one dry run")
    startup = time.process_time()  # what this process took to get here: what the run's command takes to start
    declared = _declared(load_scenario(name), name)
    counts = {role: (llm, _count(llm)) for role, llm in (role_llms or {}).items()}
    count, first = _count(model), run.seed or 0
    runs: list[_DryRun] = []
    for seed in range(first, first + (dry_runs or MAX_DRY_RUNS)):
        stand_in = _stand_in(model, seed - first, count, declared, seed)
        for_roles = {role: _stand_in(llm, seed - first, own, declared, seed) for role, (llm, own) in counts.items()}
        runs.append(await _dry_run(name, options, replace(run, seed=seed), stand_in, for_roles))
        if dry_runs is None and _settled(runs):
            break
    return _summed(name, model, count, runs, pace or pace_of(model), startup)


def _settled(runs: Sequence[_DryRun]) -> bool:
    """Whether enough dry runs were made: the standard errors of their mean calls and tokens within the spread."""
    if len(runs) < MIN_DRY_RUNS:
        return False
    for figures in ([len(r.ledger.entries) for r in runs], [r.ledger.total_tokens for r in runs]):
        mean = statistics.fmean(figures)
        if mean and statistics.stdev(figures) / math.sqrt(len(figures)) > SPREAD * mean:
            return False
    return True


async def estimate_trials(batch: TrialBatch, *, model: LLM, jobs: int = 1, pace: Pace | None = None) -> Estimate:
    """Estimate a sweep's or an evaluation's trials (``batch``) on ``model``: a dry run each, on its own seed, summed.

    The time is theirs ``jobs`` at a time. Raises as :func:`estimate_run`.
    """
    from metaroles.project.registry import load_scenario

    startup = time.process_time()
    declared = _declared(load_scenario(batch.scenario), batch.scenario)
    count, pace = _count(model), pace or pace_of(model)
    runs = []
    for params, config in zip(batch.params, batch.configs, strict=True):
        run = RunOptions(**{key: params[key] for key in RUN_KEYS if key in params})
        stand_in = _stand_in(model, run.seed or 0, count, declared, run.seed or 0)
        runs.append(await _dry_run(batch.scenario, config, run, stand_in, {}))
    each = _summed(batch.scenario, model, count, runs, pace, 0.0)
    total, calls = len(runs), sum(len(run.ledger.entries) for run in runs)
    return each.model_copy(
        update={
            "calls": calls,
            "calls_low": calls,
            "calls_high": calls,
            "prompt_tokens": each.prompt_tokens * total,
            "completion_tokens": each.completion_tokens * total,
            "cost": None if each.cost is None else each.cost * total,
            "seconds": None if each.seconds is None else startup + each.seconds * total / max(1, min(jobs, total)),
            "by_action": {
                action: figures.model_copy(update={key: value * total for key, value in figures.model_dump().items()})
                for action, figures in each.by_action.items()
            },
        }
    )


async def _dry_run(
    name: str, options: Mapping[str, Any], run: RunOptions, stand_in: LLM, for_roles: Mapping[str, LLM]
) -> _DryRun:
    """One dry run of scenario ``name``: its ledger, wall time and calls by round."""
    from metaroles.project.scenario import run_scenario

    marks: list[int] = []
    begun = time.perf_counter()
    try:
        _, team = await run_scenario(
            name, llm=stand_in, options=dict(options), out_dir=None, run=run, role_llms=dict(for_roles),
            on_round=lambda team: marks.append(len(team.env.ledger.entries)),
        )  # fmt: skip
    except (ConfigError, KeyboardInterrupt):
        raise
    except Exception as exc:
        raise ConfigError(f"scenario {name!r} cannot run dry for an estimate: {type(exc).__name__}: {exc}") from exc
    return _DryRun(run.seed or 0, team.env.ledger, time.perf_counter() - begun, marks)


class _DryRun:
    """A dry run's seed, ledger, wall time and calls by round."""

    __slots__ = ("ledger", "rounds", "seconds", "seed")

    def __init__(self, seed: int, ledger: Any, seconds: float, marks: Sequence[int]) -> None:
        self.seed, self.ledger, self.seconds = seed, ledger, seconds
        entries, ends = ledger.entries, [*marks, len(ledger.entries)]
        self.rounds = [entries[begin:end] for begin, end in itertools.pairwise([0, *ends])]


def _summed(
    name: str, model: LLM, count: TokenCount | None, runs: Sequence[_DryRun], pace: Pace, startup: float
) -> Estimate:
    """The dry runs' mean figures as an :class:`Estimate`."""
    calls = [len(run.ledger.entries) for run in runs]
    prompt = statistics.fmean(sum(e.prompt_tokens for e in run.ledger.entries) for run in runs)
    completion = statistics.fmean(sum(e.completion_tokens for e in run.ledger.entries) for run in runs)
    unpriced = {m for run in runs for m in run.ledger.unpriced()}
    timed = [pace.seconds(run.rounds) for run in runs]
    model_seconds = None if None in timed else statistics.fmean(t for t in timed if t is not None)
    framework = startup + statistics.fmean(run.seconds for run in runs)
    actions: dict[str, list[int]] = {}
    for run in runs:
        for entry in run.ledger.entries:
            figures = actions.setdefault(entry.action, [0, 0, 0])
            figures[0] += 1
            figures[1] += entry.prompt_tokens
            figures[2] += entry.completion_tokens
    return Estimate(
        scenario=name,
        model=str(getattr(model, "model", type(model).__name__)),
        counted="four characters a token" if count is None else "the model's own tokenizer",
        seeds=[run.seed for run in runs],
        calls=statistics.fmean(calls),
        calls_low=min(calls),
        calls_high=max(calls),
        prompt_tokens=prompt,
        completion_tokens=completion,
        cost=None if unpriced else statistics.fmean(run.ledger.total_cost for run in runs),
        seconds=None if model_seconds is None else framework + model_seconds,
        pace=_said_pace(pace, model, unpriced),
        by_action={
            action: ActionFigures(
                calls=f[0] / len(runs), prompt_tokens=f[1] / len(runs), completion_tokens=f[2] / len(runs)
            )
            for action, f in sorted(actions.items())
        },
    )


def _said_pace(pace: Pace, model: LLM, unpriced: set[str]) -> str:
    """Where the time comes from (and what is missing), for a person."""
    if isinstance(model, TestLLM):
        said = "the test model answers at once: the time is the framework's"
    elif pace.prefill_per_s and pace.decode_step_s:
        fixed, per_call = pace.decode_step_s
        said = (
            f"measured: {pace.prefill_per_s:g} prompt tokens a second, a decoding step {fixed * 1000:g} ms "
            f"+ {per_call * 1000:g} ms a call in it, {pace.batch} calls at once"
        )
    elif pace.tokens_per_minute or pace.requests_per_minute:
        said = "the rate limits given (--tokens-per-minute, --requests-per-minute)"
    else:
        said = "unknown: give --tokens-per-minute or --requests-per-minute"
    if unpriced:
        said += f"; no price for {', '.join(sorted(unpriced))}: give --price MODEL=PROMPT,COMPLETION"
    return said


def pace_of(model: LLM) -> Pace:
    """What is known of ``model``'s speed: the embedded models' measured tokens per second, the test model's none."""
    if isinstance(model, TestLLM):
        return Pace(prefill_per_s=math.inf, decode_step_s=(0.0, 0.0))
    speed: Callable[[], dict[str, Any] | None] | None = getattr(model, "speed", None)
    measured = speed() if callable(speed) else None
    return Pace() if measured is None else Pace.model_validate(measured)


def _count(model: LLM) -> TokenCount | None:
    """``model``'s own token count, when it offers one (the embedded models)."""
    count: Callable[[], TokenCount] | None = getattr(model, "token_count", None)
    return count() if callable(count) else None


def _stand_in(model: LLM, nth: int, count: TokenCount | None, declared: Mapping[str, int], seed: int) -> DryRunLLM:
    """The ``nth`` dry run's stand-in for ``model`` (a run of ``seed``): answers under its name, counted as it counts.

    The test model stands in for itself: its own seed (the first dry run is the very run), its answers' lengths.
    """
    name = str(getattr(model, "model", "") or type(model).__name__)
    if isinstance(model, TestLLM):
        return DryRunLLM(model.seed + nth, model=name, count=count, answer_tokens=None)
    return DryRunLLM(seed, model=name, count=count, answer_tokens=declared, default_tokens=DEFAULT_ANSWER_TOKENS)


def _declared(module: Any, name: str) -> dict[str, int]:
    """The scenario's ``ANSWER_TOKENS``, checked.

    Raises:
        ConfigError: If it is not a mapping of action names to positive whole numbers.
    """
    declared = getattr(module, "ANSWER_TOKENS", {})
    if not isinstance(declared, Mapping) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v > 0 for k, v in declared.items()
    ):
        raise ConfigError(
            f"scenario {name!r}'s ANSWER_TOKENS={declared!r} must map action names to tokens, e.g. {{'Speak': 120}}"
        )
    return dict(declared)
