"""``metaroles run … --estimate``: what a run will cost, from dry runs with the test model, asking no model."""

import json
import math
import statistics
from functools import partial

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from metaroles import FunctionLLM, LLMRequest
from metaroles.cli import app
from metaroles.core.exceptions import ConfigError
from metaroles.llm.ledger import LedgerEntry
from metaroles.llm.model_files import SMOLLM2, local_model_available
from metaroles.llm.offline import DryRunLLM, RoughCount, TestLLM
from metaroles.project.estimate import MAX_DRY_RUNS, MIN_DRY_RUNS, SPREAD, Pace, estimate_run
from metaroles.project.scenario import run_scenario
from metaroles.team.options import RunOptions

runner = CliRunner()


def counted_model(name: str = "gpt-4o-mini") -> FunctionLLM:
    """A model that counts the calls it gets (an estimate must give it none)."""
    model = FunctionLLM(lambda request: model.asked.append(request) or "asked", model=name)  # type: ignore[attr-defined]
    model.asked = []  # type: ignore[attr-defined]
    return model


def ledger_figures(team) -> tuple[int, int, int]:
    entries = team.env.ledger.entries
    return len(entries), sum(e.prompt_tokens for e in entries), sum(e.completion_tokens for e in entries)


async def test_the_test_models_estimate_is_the_mean_of_its_runs_at_the_dry_runs_seeds():
    """The test model stands in for itself: its dry runs are its runs, whose course differs by seed (werewolf)."""
    estimate = await estimate_run("werewolf", model=TestLLM(11), options={}, run=RunOptions(seed=11))
    assert estimate.seeds == list(range(11, 11 + len(estimate.seeds)))
    assert len(estimate.seeds) > MIN_DRY_RUNS  # games of 4 to 30 calls: one settles only over many
    runs = []
    for seed in estimate.seeds:
        _, team = await run_scenario("werewolf", llm=TestLLM(seed), options={}, out_dir=None, run=RunOptions(seed=seed))
        runs.append(ledger_figures(team))
    assert estimate.calls == statistics.fmean(r[0] for r in runs)
    assert (estimate.calls_low, estimate.calls_high) == (min(r[0] for r in runs), max(r[0] for r in runs))
    assert estimate.prompt_tokens == statistics.fmean(r[1] for r in runs)
    assert estimate.completion_tokens == statistics.fmean(r[2] for r in runs)
    assert estimate.model_calls == 0 and estimate.cost == 0
    assert sum(action.calls for action in estimate.by_action.values()) == pytest.approx(estimate.calls)
    calls = [r[0] for r in runs]
    assert len(calls) < MAX_DRY_RUNS
    assert statistics.stdev(calls) / math.sqrt(len(calls)) <= SPREAD * statistics.fmean(calls)  # settled
    assert statistics.stdev(calls[:-1]) / math.sqrt(len(calls) - 1) > SPREAD * statistics.fmean(calls[:-1]) or (
        statistics.stdev([r[1] + r[2] for r in runs[:-1]]) / math.sqrt(len(calls) - 1)
        > SPREAD * statistics.fmean(r[1] + r[2] for r in runs[:-1])
    )  # and not one run earlier


async def test_an_estimate_asks_no_model_and_prices_its_calls_as_the_models():
    model = counted_model("gpt-4o-mini")
    estimate = await estimate_run("debate", model=model, options={"turns": 2}, run=RunOptions(seed=1), dry_runs=2)
    assert model.asked == []  # type: ignore[attr-defined]
    assert estimate.model == "gpt-4o-mini" and estimate.calls == 5  # two speeches each, then the verdict
    price = (0.00015, 0.0006)  # the ledger's table: USD per 1,000 prompt and answer tokens
    assert estimate.cost == pytest.approx(
        (estimate.prompt_tokens * price[0] + estimate.completion_tokens * price[1]) / 1000
    )
    assert estimate.seconds is None and "--tokens-per-minute" in estimate.pace  # no pace known for an endpoint
    speeches = estimate.by_action["SpeakAloud"]
    assert speeches.completion_tokens / speeches.calls == pytest.approx(75, abs=3)  # the debate's ANSWER_TOKENS


async def test_a_model_without_a_price_has_no_cost_but_its_calls_and_tokens():
    estimate = await estimate_run("debate", model=counted_model("house-model-7b"), options={"turns": 1},
                                  run=RunOptions(seed=2), dry_runs=1)  # fmt: skip
    assert estimate.cost is None and "--price" in estimate.pace and estimate.calls == 3
    priced = await estimate_run("debate", model=counted_model("house-model-7b"), options={"turns": 1},
                                run=RunOptions(seed=2, prices={"house-model-7b": (1.0, 2.0)}), dry_runs=1)  # fmt: skip
    assert priced.cost == pytest.approx((priced.prompt_tokens + 2 * priced.completion_tokens) / 1000)


async def test_rate_limits_give_the_time_and_a_budget_cuts_the_dry_run_as_the_run():
    pace = Pace(tokens_per_minute=600)
    limited = await estimate_run("debate", model=counted_model(), options={}, run=RunOptions(seed=1), pace=pace,
                                 dry_runs=1)  # fmt: skip
    assert limited.seconds is not None
    assert limited.seconds >= 60 * (limited.prompt_tokens + limited.completion_tokens) / 600
    broke = await estimate_run("debate", model=counted_model("gpt-4o"), options={},
                               run=RunOptions(seed=1, budget=1e-4), dry_runs=1)  # fmt: skip
    assert 0 < broke.calls < limited.calls  # the budget stops the dry run where it would stop the run


@settings(max_examples=60, deadline=None)
@given(tokens=st.integers(1, 400), action=st.sampled_from(["Speak", "Other"]), limit=st.none() | st.integers(1, 500))
def test_a_free_text_answer_is_as_long_as_declared_and_a_structured_one_as_the_test_models(tokens, action, limit):
    dry = DryRunLLM(3, model="m", answer_tokens={"Speak": tokens}, default_tokens=50)
    request = LLMRequest(messages=[{"role": "user", "content": "Say something about trams."}], action=action,
                         max_tokens=limit)  # fmt: skip
    answer = anyio.run(dry.complete, request)
    declared = tokens if action == "Speak" else (limit // 2 if limit else 50)
    wanted = max(1, min(declared, limit or declared))
    first_word = RoughCount().text(answer.text.split()[0])
    assert wanted - 4 < answer.usage.completion_tokens <= max(wanted, first_word)  # within a word of it
    schema = {"type": "object", "properties": {"opinion": {"type": "number"}}, "required": ["opinion"]}
    structured = request.model_copy(update={"output_schema": schema})
    assert anyio.run(dry.complete, structured).text == anyio.run(TestLLM(3).complete, structured).text
    assert dry.calls == 2


async def test_leading_messages_seen_before_are_counted_as_cached():
    dry = DryRunLLM(0, model="m", answer_tokens={})
    system = {"role": "system", "content": "You are one member of a society. " * 20}
    first = await dry.complete(LLMRequest(messages=[system, {"role": "user", "content": "a"}]))
    second = await dry.complete(LLMRequest(messages=[system, {"role": "user", "content": "b"}]))
    other = await dry.complete(
        LLMRequest(messages=[{"role": "system", "content": "else"}, {"role": "user", "content": "b"}])
    )
    assert first.usage.cached_tokens == 0 and other.usage.cached_tokens == 0
    assert second.usage.cached_tokens == RoughCount().chat([system]) > 0


def test_a_rounds_time_is_its_uncached_prompts_read_then_its_longest_answers_steps():
    pace = Pace(prefill_per_s=100, decode_step_s=(0.05, 0.01), batch=2)
    call = lambda prompt, cached, answer: LedgerEntry("r", "a", "m", prompt, answer, 0.0, cached_tokens=cached)  # noqa: E731
    one = [call(300, 100, 40)]
    three = [call(100, 0, 10), call(100, 50, 30), call(100, 0, 20)]  # two waves of at most two
    assert pace.seconds([one]) == pytest.approx(2 + 40 * 0.06)
    assert pace.seconds([one, three, []]) == pytest.approx(2 + 40 * 0.06 + 2.5 + 2 * 30 * 0.07)
    assert Pace().seconds([one]) is None
    assert Pace(requests_per_minute=2).seconds([three]) == pytest.approx(90)


def test_the_command_prints_the_estimate_and_refuses_what_it_cannot_use(tmp_path):
    said = runner.invoke(app, ["run", "debate", "--llm", "test", "--seed", "4", "--estimate", "-q",
                               "--runs-dir", str(tmp_path)])  # fmt: skip
    assert said.exit_code == 0, said.output
    estimate = json.loads(said.stdout.strip().splitlines()[-1])
    assert estimate["calls"] == 7 and estimate["model_calls"] == 0
    assert estimate["seeds"] == [4, 5, 6]  # a debate's course is fixed: the fewest dry runs settle it
    assert not any(tmp_path.iterdir())  # nothing written
    table = runner.invoke(app, ["run", "debate", "--llm", "test", "--estimate", "--set", "turns=1"])
    assert table.exit_code == 0 and "model calls" in table.stdout and "JudgeDebate" in table.stdout
    refused = runner.invoke(app, ["run", "debate", "--llm", "test", "--estimate", "--record", str(tmp_path / "c")])
    assert refused.exit_code == 2 and "--record" in refused.stderr and "Traceback" not in refused.output
    assert not (tmp_path / "c").exists()


def test_a_scenario_that_cannot_run_dry_is_named_in_one_line(tmp_path):
    scenario = tmp_path / "grumpy.py"
    scenario.write_text(
        "from pydantic import BaseModel\n"
        "from metaroles import Role, ScenarioPlan, Team\n"
        "class Config(BaseModel):\n    pass\n"
        "from metaroles import Action\n"
        "class Sulk(Action):\n"
        "    async def run(self, history):\n        raise RuntimeError('I only talk to real models')\n"
        "def build(config, llm):\n"
        "    team = Team(llm=llm)\n    team.hire([Role(name='G', actions=[Sulk])])\n"
        "    return ScenarioPlan(team=team, idea='go', send_to='G', n_round=2)\n"
    )
    said = runner.invoke(app, ["run", str(scenario), "--llm", "test", "--estimate"])
    assert said.exit_code in (1, 2), said.output
    assert "Traceback" not in said.output and said.stderr.count("\n") <= 2


async def test_answer_tokens_that_are_no_tokens_are_refused(tmp_path, monkeypatch):
    import metaroles.scenarios.debate as debate

    monkeypatch.setattr(debate, "ANSWER_TOKENS", {"SpeakAloud": "long"})
    with pytest.raises(ConfigError, match="ANSWER_TOKENS"):
        await estimate_run("debate", model=TestLLM(), options={}, run=RunOptions(), dry_runs=1)
    with pytest.raises(ConfigError, match="dry_runs"):
        await estimate_run("debate", model=TestLLM(), options={}, run=RunOptions(), dry_runs=0)


@pytest.mark.skipif(not local_model_available(SMOLLM2), reason="needs the embedded models (make demo installs them)")
async def test_the_embedded_models_tokens_are_counted_as_its_engine_counts_them():
    from metaroles.llm.local import LocalLLM

    model = LocalLLM(SMOLLM2, batch=2, max_tokens=1)
    counter = model.token_count()
    messages = [{"role": "system", "content": "You judge debates."}, {"role": "user", "content": "Who won, and why?"}]
    answered = await model.complete(LLMRequest(messages=messages))
    assert counter.chat(messages) == answered.usage.prompt_tokens
    assert counter.text("Trams, bicycles and buses.") >= 5
    speed = model.speed()
    assert speed is not None and speed["batch"] == 2 and not math.isnan(speed["prefill_per_s"])


def test_a_sweeps_estimate_is_the_sum_of_its_trials_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["sweep", "society", "--grid", "seed=0..2", "--set", "agents=30", "--set", "llm_agents=3"]
    said = runner.invoke(app, [*args, "--set", "rounds=2", "--estimate", "-q"])
    assert said.exit_code == 0, said.output
    estimate = json.loads(said.stdout.strip().splitlines()[-1])
    trials = []
    for seed in range(3):
        options = {"agents": 30, "llm_agents": 3, "rounds": 2}
        run = partial(run_scenario, "society", llm=TestLLM(seed), options=options, out_dir=None)
        trials.append(ledger_figures(anyio.run(partial(run, run=RunOptions(seed=seed)))[1]))
    assert estimate["calls"] == sum(t[0] for t in trials) == 3 * 3 * 3  # seeds × model agents × rounds
    assert estimate["prompt_tokens"] == pytest.approx(sum(t[1] for t in trials))
    assert estimate["completion_tokens"] == pytest.approx(sum(t[2] for t in trials))
    assert list(tmp_path.iterdir()) == []  # no sweep folder, no trial
    refused = runner.invoke(app, ["eval", "debate", "--estimate", "--record"])
    assert refused.exit_code == 2 and "--record" in refused.output and "Traceback" not in refused.output
