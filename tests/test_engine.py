"""The continuous-batching engine for the embedded model (``LocalLLM(batch=N)``), for real."""

import anyio
import pytest
from hypothesis import given, settings

from metaroles import Action, LLMRequest, Role, Team
from metaroles.core.exceptions import ConfigError
from metaroles.llm.model_files import SMOLLM2, local_model_available
from tests.test_grammar import models

pytestmark = pytest.mark.skipif(
    not local_model_available(), reason="needs metaroles[local] and the embedded models (make demo installs them)"
)


def request(i: int, **kw: object) -> LLMRequest:
    messages = [
        {"role": "system", "content": "You are a townsperson in a discussion."},
        {"role": "user", "content": f"Say one thing about topic number {i}."},
    ]
    return LLMRequest(messages=messages, role=f"r{i}", action="talk", **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def llms():
    from metaroles.llm.local import LocalLLM

    return LocalLLM(SMOLLM2, max_tokens=24, batch=8), LocalLLM(SMOLLM2, max_tokens=24)


async def gathered(llm, order) -> dict:
    """Every call of ``order`` at once, answered by ``llm``: index → response."""
    answers = {}

    async def one(i: int) -> None:
        answers[i] = await llm.complete(request(i, seed=i))

    async with anyio.create_task_group() as group:
        for i in order:
            group.start_soon(one, i)
    return answers


async def test_calls_decoded_together_answer_as_each_alone_in_any_order(llms):
    batched, _ = llms
    alone = [await batched.complete(request(i, seed=i)) for i in range(3)]
    for order in (range(12), reversed(range(12))):  # more calls than slots: some wait for a free one
        answers = await gathered(batched, order)
        assert sorted(answers) == list(range(12))
        assert [answers[i].text for i in range(3)] == [a.text for a in alone]
        assert all(0 < answers[i].usage.completion_tokens <= 24 for i in answers)
        assert all(answers[i].usage.prompt_tokens == alone[0].usage.prompt_tokens for i in range(10))


async def test_the_embedded_default_answers_the_same_in_a_batch_as_alone_structured_or_not():
    """Qwen (the default, a 150k vocabulary), a grammar's redraw among its likeliest tokens: batched or one by one."""
    from metaroles.llm.local import LocalLLM

    batched = LocalLLM(max_tokens=16, batch=4)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}}}
    asked = [request(i, seed=i, output_schema=schema if i % 2 else None) for i in range(4)]
    together = {}

    async def one(i: int) -> None:
        together[i] = (await batched.complete(asked[i])).text

    async with anyio.create_task_group() as group:
        for i in range(4):
            group.start_soon(one, i)
    assert [together[i] for i in range(4)] == [(await batched.complete(a)).text for a in asked]
    assert all(isinstance(__import__("json").loads(together[i]), dict) for i in (1, 3))


async def test_a_seed_and_max_tokens_given_per_call_are_kept(llms):
    batched, _ = llms
    short = await batched.complete(request(1, max_tokens=3, temperature=0.9, seed=5))
    again = await batched.complete(request(1, max_tokens=3, temperature=0.9, seed=5))
    assert short.usage.completion_tokens <= 3 and short.text == again.text


async def test_structured_calls_follow_their_grammar_in_the_batch(llms):
    batched, _ = llms
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    answer = await batched.complete(request(0, output_schema=schema))
    assert isinstance(__import__("json").loads(answer.text)["ok"], bool)


async def test_a_prompt_that_cannot_fit_is_refused_by_name():
    from metaroles.llm.local import LocalLLM

    small = LocalLLM(SMOLLM2, max_tokens=8, batch=2, n_ctx=64)
    with pytest.raises(ConfigError, match="do not fit n_ctx=64"):
        await small.complete(request(0, max_tokens=60))
    with pytest.raises(ConfigError, match="batch=-1"):
        LocalLLM(SMOLLM2, batch=-1)


async def test_a_team_of_roles_runs_on_the_batched_engine(llms):
    batched, _ = llms

    class Talk(Action):
        instruction = "Say one short sentence about the town square."

    team = Team(llm=batched)
    team.hire([Role(name=f"p{i}", actions=[Talk], send_to="minutes") for i in range(6)])
    team.hire([Role(name="minutes", watch=[])])
    await team.run(1, idea="Discuss the square.", send_to=[f"p{i}" for i in range(6)])
    said = [m for m in team.env.history if m.sent_from.startswith("p")]
    assert len(said) == 6 and all(m.content for m in said)


def test_a_call_whose_grammar_does_not_parse_fails_alone():
    import threading

    from metaroles.llm.engine import BatchEngine, Outcome, Sampling
    from metaroles.llm.model_files import model_path

    engine = BatchEngine(model_path(SMOLLM2), slots=2, n_ctx=256)
    told: dict[str, Outcome] = {}
    ended = threading.Event()

    def tell(name: str):
        def done(outcome: Outcome) -> None:
            told[name] = outcome
            if len(told) == 2:
                ended.set()

        return done

    engine.submit(request(0).messages, Sampling(max_tokens=4, grammar="root ::= ("), tell("bad"))
    engine.submit(request(1).messages, Sampling(max_tokens=4, temperature=0.0), tell("good"))
    assert ended.wait(timeout=60)
    assert isinstance(told["bad"].error, ConfigError)
    good = told["good"]
    assert good.error is None and good.text and good.prompt_tokens > 0 and 0 < good.completion_tokens <= 4


@pytest.mark.timeout(900)  # two processes each load the model and decode: minutes on a busy 2-core laptop
def test_a_society_on_the_batched_engine_is_the_same_run_in_any_process(tmp_path):
    from tests.test_determinism import assert_same_bytes, contents, metaroles

    options = ["--set", "agents=12", "--set", "llm_agents=10", "--set", "rounds=1", "--seed", "4", "-q"]
    for hash_seed in (1, 2):
        metaroles(
            "run",
            "society",
            "--llm",
            "local",
            "--model",
            SMOLLM2,
            *options,
            "--out",
            str(tmp_path / str(hash_seed)),
            hash_seed=hash_seed,
        )
    first = contents(tmp_path / "1")
    assert any(b'"llm_calls"' in line for line in first["events.jsonl"].splitlines())  # the agents asked the model
    assert_same_bytes(first, contents(tmp_path / "2"))


@pytest.mark.parametrize("unified", [False, True], ids=["stream per call", "unified"])
async def test_the_prefix_cache_serves_a_shared_system_prompt_and_counts_it(unified):
    from metaroles.llm.local import LocalLLM

    llm = LocalLLM(SMOLLM2, max_tokens=4, batch=2, unified=unified)
    first = await llm.complete(request(0))
    second = await llm.complete(request(1))
    system = len(llm.engine().tokenize(llm.engine().chat_prompt(request(0).messages[:1])))
    assert first.usage.cached_tokens == 0
    assert system <= second.usage.cached_tokens < second.usage.prompt_tokens, "the system prompt, not the question"
    again = await llm.complete(request(1))
    assert again.usage.cached_tokens == again.usage.prompt_tokens - 1, "all but the last token, whose logits are needed"
    counters = llm.engine().counters
    assert counters.requests == 3 and counters.cached_tokens == second.usage.cached_tokens + again.usage.cached_tokens
    assert counters.prompt_tokens == first.usage.prompt_tokens + 2 * second.usage.prompt_tokens


@pytest.mark.parametrize("unified", [False, True], ids=["stream per call", "unified"])
async def test_a_prompt_shares_the_cached_prefix_of_another_slot(unified):
    """Two calls at once after one: the slot that kept the system prompt lends it to the other slot too."""
    from metaroles.llm.local import LocalLLM

    llm = LocalLLM(SMOLLM2, max_tokens=4, batch=2, unified=unified)
    await llm.complete(request(0))  # slot 0 keeps its prompt; slot 1 holds nothing
    system = len(llm.engine().tokenize(llm.engine().chat_prompt(request(0).messages[:1])))
    answers = []

    async def ask(n: int) -> None:
        answer = await llm.complete(request(n))
        answers.append(answer)

    async with anyio.create_task_group() as group:
        for n in (1, 2):
            group.start_soon(ask, n)
    cached = sorted(answer.usage.cached_tokens for answer in answers)
    assert cached[0] >= system, f"both calls start from the kept system prompt (cached: {cached}, system: {system})"
    assert all(answer.text for answer in answers)


def test_long_prompts_answer_the_same_from_the_cache_in_a_batch_as_decoded_alone():
    """Prompts of 200-300 tokens: all at once on four slots (each after the first takes the system
    prompt from the cache) and one by one on one slot, in the other order. With f16 keys and values
    llama.cpp's attention sums differently for 64+ query tokens or one token among 512+ cells, and
    most of these answers differed.
    """
    import threading

    from metaroles.llm.engine import BatchEngine, Outcome, Sampling
    from metaroles.llm.model_files import model_path

    rules = " ".join(f"Rule {k}: greet neighbour {k} and mention topic {k * 7 % 13}." for k in range(16))
    prompts = [
        [
            {"role": "system", "content": f"You are a townsperson in a discussion. {rules}"},
            {
                "role": "user",
                "content": " ".join(f"Fact {j}: topic {i + j} matters." for j in range(i * 3)) + " Speak.",
            },
        ]
        for i in range(6)
    ]

    def answers(engine: BatchEngine, order: list[int], *, together: bool) -> dict[int, str]:
        told: dict[int, str] = {}
        ended = threading.Event()

        def done(i: int):
            def tell(outcome: Outcome) -> None:
                assert outcome.error is None
                told[i] = outcome.text
                if len(told) == len(order) or not together:
                    ended.set()

            return tell

        for i in order:
            engine.submit(prompts[i], Sampling(max_tokens=12, temperature=0.2, seed=i), done(i))
            if not together:
                assert ended.wait(timeout=120)
                ended.clear()
        assert not together or ended.wait(timeout=120)
        return told

    batched = answers(BatchEngine(model_path(SMOLLM2), slots=4, n_ctx=512), list(range(6)), together=True)
    alone = BatchEngine(model_path(SMOLLM2), slots=1, n_ctx=512)
    assert len(alone.tokenize(alone.chat_prompt(prompts[5]))) > 256
    assert answers(alone, list(reversed(range(6))), together=False) == batched
    assert alone.counters.cached_tokens > 5 * 150, "the one slot kept the system prompt between calls"


async def test_a_verdict_decoded_under_its_grammar_validates_with_its_bounds(llms):
    """A small model once wrote ``"confidence": -3``: the grammar now carries the schema's bounds and lengths."""
    from metaroles.actions.debate import Verdict

    batched, _ = llms
    schema = Verdict.model_json_schema()
    asks = [request(i, output_schema=schema, max_tokens=120, temperature=1.0, seed=i) for i in range(6)]
    answers = []

    async def one(r: LLMRequest) -> None:
        answers.append(await batched.complete(r))

    async with anyio.create_task_group() as group:
        for r in asks:
            group.start_soon(one, r)
    verdicts = [Verdict.model_validate_json(a.text) for a in answers]  # raises on any out-of-bounds value
    assert all(0 <= v.confidence <= 1 and 20 <= len(v.reasoning) <= 200 for v in verdicts)


@settings(max_examples=40, deadline=None)
@given(model=models())
def test_llama_cpp_parses_the_grammar_of_every_generated_schema(llms, model) -> None:
    import llama_cpp

    from metaroles.llm.grammar import schema_grammar, to_gbnf

    text = to_gbnf(*schema_grammar(model.model_json_schema()))
    sampler = llama_cpp.llama_sampler_init_grammar(llms[0].engine().vocab, text.encode(), b"root")
    assert sampler, text
    llama_cpp.llama_sampler_free(sampler)


EXIT_MID_DECODE = """
import sys, threading
from metaroles.llm.engine import Sampling
from metaroles.llm.local import LocalLLM

engine = LocalLLM("smollm2-135m-instruct-q4_1", batch=4).engine()
ended = threading.Event()
for i in range(4):
    messages = [{"role": "user", "content": f"Write a long story about the number {i}."}]
    engine.submit(messages, Sampling(max_tokens=1500, temperature=0.8, seed=1), lambda outcome: ended.set())
while engine.running == 0 and not ended.is_set():
    pass  # until the engine's thread has taken the calls: it decodes now
sys.exit(130)  # as Ctrl-C ends the command: the interpreter finalises while a decode is under way
"""


def test_a_process_ending_mid_decode_stops_the_engine_before_the_model_is_freed():
    """Ctrl-C on an ``--llm local`` run once crashed in libggml-cpu (exit -11): the engine now closes at exit."""
    import subprocess
    import sys

    for _ in range(2):
        result = subprocess.run([sys.executable, "-c", EXIT_MID_DECODE], capture_output=True, text=True, check=False)
        assert result.returncode == 130, (result.returncode, result.stderr[-2000:])
