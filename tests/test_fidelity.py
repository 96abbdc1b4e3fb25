"""Human studies as suites: a population that behaves as people did is told apart from one that does not."""

import json
import tomllib
from pathlib import Path

from metaroles.project.evaluate import load_suite, run_eval
from tests.test_evaluate import eval_cli

POPULATIONS = load_suite("fidelity").folder / "populations"


def test_a_human_like_population_is_nearer_to_people_than_a_selfish_one_with_intervals_apart(tmp_path: Path) -> None:
    suite = load_suite("fidelity", seeds=[0])
    found = {}
    for name in ("human_like", "selfish"):
        rows = run_eval(suite, tmp_path / name, llm={"llm": f"scripted:{POPULATIONS / f'{name}.json'}"})
        assert [r["status"] for r in rows] == ["done", "done"]
        found[name] = {r["task"]: r for r in rows}
    for task in ("ultimatum", "public_goods"):
        assert found["human_like"][task]["distance"] < 0.05 < 0.15 < found["selfish"][task]["distance"], task
    human, selfish = found["human_like"]["ultimatum"], found["selfish"]["ultimatum"]
    assert human["offer_share_low"] <= human["offer_share"] <= human["offer_share_high"]
    assert human["offer_share_low"] > selfish["offer_share_high"], "the bootstrap intervals do not overlap"
    assert selfish["offer_share"] == 0.01 and selfish["rejection_rate"] == 0.0
    goods = found["human_like"]["public_goods"]
    assert goods["rounds"] == 10 and json.loads(goods["by_round"])[0] > json.loads(goods["by_round"])[-1]


def test_every_reference_figure_cites_its_source() -> None:
    for reference in (load_suite("fidelity").folder / "tasks").glob("*/reference.toml"):
        figures = tomllib.loads(reference.read_text(encoding="utf-8"))
        assert figures, reference
        for name, figure in figures.items():
            assert ("value" in figure or "low" in figure) and len(figure["source"]) > 40, (reference, name)


def test_eval_help_lists_every_built_in_suite() -> None:
    shown = " ".join(eval_cli("--help").stdout.split())
    for folder in (Path(load_suite("fidelity").folder).parent).iterdir():
        assert folder.name in shown, folder.name


def test_the_report_cites_every_figure_and_the_distance_puts_each_gap_on_its_statistics_range(tmp_path: Path) -> None:
    from metaroles.project.evaluate import report

    suite = load_suite("fidelity", seeds=[0])
    said = report(suite, [], [])
    assert "## The human figures compared with, and their sources" in said
    assert "ultimatum, offer_share = 0.4: Oosterbeek, Sloof & van de Kuilen (2004)" in said
    assert "public_goods, decline = ≥ 0.0: Ledyard (1995)" in said
    score = {}
    exec((suite.folder / "score.py").read_text(), score)  # the built-in scorer, ours
    assert score["_gap"](-1.0, {"low": 0.0, "span": 2.0}) == 0.5, "a fall of a whole share is half the range of -1..1"
    assert abs(score["_gap"](0.1, {"value": 0.4}) - 0.3) < 1e-9, "a share's gap is itself"
