"""A role's context budget: recent items verbatim, older ones folded into a summary, memories recalled."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaroles import TestLLM
from metaroles.bus.action import Action
from metaroles.bus.context_budget import ContextBudget, ContextItem, ContextWindow, Recollection
from metaroles.llm.ledger import CostLedger
from metaroles.llm.protocol import estimate_tokens
from metaroles.project.scenario import resume_scenario, run_scenario
from metaroles.record.eventread import read_events
from metaroles.team.options import RunOptions
from tests.faults.helpers import contents

OVERHEAD = 16
"""Tokens of the window's own headings ("Earlier, in short:", "You remember:")."""


def asker() -> Action:
    action = Action()
    action.llm, action.ledger, action.role_name = TestLLM(3), CostLedger(), "u1"
    return action


def items(count: int, width: int = 120) -> list[ContextItem]:
    return [ContextItem(id=f"m{i}", round=i, text=f"Round {i}: " + "word " * (width // 5)) for i in range(count)]


async def test_a_window_stays_within_its_budget_and_records_each_folding():
    window, ask = ContextWindow(ContextBudget(tokens=300, reflect_every=3)), asker()
    sizes = []
    for n in range(1, 200):
        composed = await window.compose(items(n), query="word", round=n, asker=ask)
        sizes.append(estimate_tokens(composed))
    assert max(sizes) <= 300 + OVERHEAD
    assert len(window.compactions) >= 10
    folded = [i for c in window.compactions for i in c.folded]
    assert folded == [f"m{i}" for i in range(len(folded))], "each item folded once, in order"
    assert all(a.round < b.round for a, b in zip(window.compactions, window.compactions[1:], strict=False))
    assert sum(m.kind == "reflection" for m in window.memories) == len(window.compactions) // 3
    calls = {e.action for e in ask.ledger.entries}
    assert calls == {"Compact", "Reflect"} and all(e.role == "u1" for e in ask.ledger.entries)


async def test_without_a_budget_every_item_is_carried():
    window = ContextWindow(None)
    composed = await window.compose(items(50), query="x", round=50, asker=asker())
    assert composed.count("Round ") == 50 and not window.compactions and window.state() is None


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 900), min_size=1, max_size=60), st.integers(64, 600))
def test_whatever_the_items_the_context_fits_its_budget(widths, tokens):
    import anyio

    window, ask = ContextWindow(ContextBudget(tokens=tokens)), asker()
    past = [ContextItem(id=f"m{i}", round=i, text="x" * w) for i, w in enumerate(widths)]

    async def grow() -> list[int]:
        return [
            estimate_tokens(await window.compose(past[:n], query="x", round=n, asker=ask))
            for n in range(1, len(past) + 1)
        ]

    newest = max(estimate_tokens(item.text) for item in past)  # the newest item is always kept, whatever its size
    assert max(anyio.run(grow)) <= tokens + OVERHEAD + newest


def test_recall_weighs_recency_importance_and_relevance():
    window = ContextWindow(ContextBudget(tokens=400))
    window.memories = [
        Recollection(text="the bus lanes on main street", round=10, importance=5),
        Recollection(text="the bus lanes on main street", round=90, importance=5),
        Recollection(text="a cat video", round=95, importance=9),
        Recollection(text="the bus lanes vote", round=95, importance=1),
    ]
    got = window.recall("bus lanes main street", round=100, tokens=400)
    assert got[0] is window.memories[1], "relevant, recent and important"
    assert got.index(window.memories[1]) < got.index(window.memories[0]), "the same memory, older, weighs less"
    assert window.recall("bus lanes main street", round=100, tokens=12) == got[:1], "as many as fit"


async def test_a_window_saved_and_loaded_composes_the_same():
    window, ask = ContextWindow(ContextBudget(tokens=200)), asker()
    for n in range(1, 60):
        await window.compose(items(n), query="word", round=n, asker=ask)
    again = ContextWindow(ContextBudget(tokens=200))
    again.load(window.state())
    assert await again.compose(items(60), query="word", round=60, asker=ask) == await window.compose(
        items(60), query="word", round=60, asker=ask
    )


def test_a_budget_too_small_to_hold_anything_is_refused():
    from metaroles.scenarios.feed import Config

    with pytest.raises(ValueError, match="holds nothing; give 64 or more, or 0"):
        Config(context_tokens=10)


# -- the acceptance run: 20 model-backed users over 300 rounds -----------------------------------------


def everyone_acts(tmp_path: Path) -> str:
    path = tmp_path / "people.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["bio", "stance", "activity", "herd"])
        for i in range(20):
            writer.writerow([f"Resident {i} of the old town.", round(-1 + i / 10, 2), 1, 0.5])
    return str(path)


def prompt_tokens(run: Path) -> dict[int, float]:
    """Per round, the mean prompt tokens of its model calls (``metrics.jsonl``: the users' calls and their foldings)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {row["round"]: row["llm"]["prompt_tokens"] / row["llm"]["calls"] for row in rows if "llm" in row}


LONG = {"agents": 20, "rounds": 300, "activation": 1.0, "llm_share": 1.0, "timeline": 3, "follows": 3}


async def test_three_hundred_rounds_of_twenty_model_users_stay_flat_with_a_budget_and_grow_without(tmp_path):
    people = everyone_acts(tmp_path)
    options = {**LONG, "personas": people, "context_tokens": 600}
    run = RunOptions(seed=1, checkpoint_every=50)
    await run_scenario("feed", llm=TestLLM(2), options=options, out_dir=tmp_path / "kept", run=run)
    everything = {**options, "context_tokens": 0, "rounds": 150}  # half as long is enough to see it grow
    await run_scenario("feed", llm=TestLLM(2), options=everything, out_dir=tmp_path / "all", run=run)
    kept, grown = prompt_tokens(tmp_path / "kept"), prompt_tokens(tmp_path / "all")
    assert len(kept) == 299 and len(grown) == 149
    stretches = [statistics.fmean(kept[r] for r in range(a, a + 50)) for a in (51, 101, 151, 201, 251)]
    assert max(stretches) <= 1.1 * min(stretches), f"flat once the budget is reached: {stretches}"
    assert max(kept[r] for r in range(20, 301)) <= 600 + 300, "the 600-token context, the persona and the timeline"
    assert grown[150] > 10 * kept[150] and grown[150] > 1.8 * grown[75], "without a budget the prompt grows"
    events = read_events(tmp_path / "kept" / "events.jsonl")
    folds = [e for e in events if e["kind"] == "llm_call" and e["action"] == "Compact"]
    assert len({e["role"] for e in folds}) == 20 and len(folds) > 20 * 20, "every user folded its past, again and again"


async def test_a_budgeted_run_resumed_from_a_checkpoint_is_the_run_that_never_stopped(tmp_path):
    options = {**LONG, "rounds": 60, "personas": everyone_acts(tmp_path), "context_tokens": 200}
    await run_scenario(
        "feed", llm=TestLLM(2), options=options, out_dir=tmp_path / "a", run=RunOptions(seed=4, checkpoint_every=20)
    )
    straight = contents(tmp_path / "a")
    for later in (tmp_path / "a" / "checkpoints").glob("round-*.json"):
        if int(later.stem[6:]) > 40:
            later.unlink()
    await resume_scenario(tmp_path / "a", llm=TestLLM(2))
    again = contents(tmp_path / "a")
    same = {k: v for k, v in again.items() if not k.startswith("checkpoints/")}
    assert same == {k: v for k, v in straight.items() if not k.startswith("checkpoints/")}


async def test_a_budgeted_run_on_shards_is_the_one_process_run(tmp_path):
    from metaroles.sharding.backends import LocalBackend
    from tests.test_sharding import run_files

    options = {**LONG, "rounds": 40, "personas": everyone_acts(tmp_path), "context_tokens": 200}
    await run_scenario("feed", llm=TestLLM(2), options=options, out_dir=tmp_path / "one", run=RunOptions(seed=6))
    run = RunOptions(seed=6, backend=LocalBackend(2))
    await run_scenario("feed", llm=TestLLM(2), options=options, out_dir=tmp_path / "two", run=run)
    assert run_files(tmp_path / "two") == run_files(tmp_path / "one")
    assert '"action": "Compact"' in (tmp_path / "one" / "events.jsonl").read_text().replace('"action":"', '"action": "')
