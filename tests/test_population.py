"""Populations from a census: raking keeps every marginal to the person, a sample's associations survive."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaroles.project.population import diversity, rake, read_census


def write_marginals(path: Path, table: dict[str, list[int]]) -> Path:
    lines = ["attribute,category,count"]
    lines += [f"{a},c{i},{count}" for a, counts in table.items() for i, count in enumerate(counts)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@st.composite
def censuses(draw: st.DrawFn) -> dict[str, list[int]]:
    """Five attributes of 2-6 categories, each category at least 1 % of a population of 10,000-1,000,000."""
    total = draw(st.integers(10_000, 1_000_000))
    table = {}
    for a in range(5):
        k = draw(st.integers(2, 6))
        weights = draw(st.lists(st.integers(1, 100), min_size=k, max_size=k))
        shares = [w / sum(weights) for w in weights]
        shares = [max(s, 0.01) for s in shares]
        counts = [round(s / sum(shares) * total) for s in shares]
        counts[0] += total - sum(counts)  # every attribute counts the same people
        table[f"a{a}"] = counts
    return table


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=censuses(), seed=st.integers(0, 10))
def test_100000_personas_have_every_census_marginal_within_1_percent(tmp_path: Path, table, seed: int) -> None:
    census = read_census(write_marginals(tmp_path / "census.csv", table))
    people = rake(census, 100_000, seed=seed)
    assert len(people) == 100_000
    for attribute, counts in table.items():
        have = Counter(p[attribute] for p in people)
        for i, count in enumerate(counts):
            target = count / sum(counts) * 100_000
            assert abs(have[f"c{i}"] - target) <= max(1.0, 0.01 * target), (attribute, i)


def test_a_samples_associations_survive_the_raking(tmp_path: Path) -> None:
    census = write_marginals(tmp_path / "census.csv", {"age": [500, 500], "income": [300, 700]})
    sample = tmp_path / "sample.csv"  # the young are mostly poor in the sample, the old mostly not
    sample.write_text("age,income,count\nc0,c0,90\nc0,c1,10\nc1,c0,5\nc1,c1,95\n", encoding="utf-8")
    people = rake(read_census(census, sample=sample), 10_000)
    young_poor = sum(p["age"] == "c0" and p["income"] == "c0" for p in people) / 5_000
    old_poor = sum(p["age"] == "c1" and p["income"] == "c0" for p in people) / 5_000
    assert young_poor > 0.5 > 0.1 > old_poor, (young_poor, old_poor)
    independent = rake(read_census(census), 10_000)
    assert 0.25 < sum(p["age"] == "c0" and p["income"] == "c0" for p in independent) / 5_000 < 0.35


def test_diversity_says_how_much_of_the_space_is_covered() -> None:
    attributes = {"a": ["x", "y"], "b": ["u", "v"]}
    one = [{"a": "x", "b": "u"}] * 10
    every = [{"a": a, "b": b} for a in "xy" for b in "uv"]
    assert diversity(one, attributes)["coverage"] == 0.25 and diversity(one, attributes)["entropy"] == 0
    assert diversity(every, attributes) == {"coverage": 1.0, "entropy": 1.0, "entropy.a": 1.0, "entropy.b": 1.0}


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "metaroles", "population", *args], capture_output=True, text=True, cwd=cwd
    )


def test_the_command_writes_personas_with_bios_in_each_format(tmp_path: Path) -> None:
    census = write_marginals(tmp_path / "census.csv", {"age": [60, 40], "region": [25, 25, 50]})
    for name in ("people.jsonl", "people.csv", "people.parquet"):
        made = cli(str(census), "--n", "200", "--out", name, cwd=tmp_path)
        assert made.returncode == 0 and "200 personas" in made.stdout, made.stderr
    rows = [json.loads(line) for line in (tmp_path / "people.jsonl").read_text(encoding="utf-8").splitlines()]
    assert Counter(r["age"] for r in rows) == {"c0": 120, "c1": 80} and rows[0]["bio"].startswith("age c")
    assert pq.read_table(tmp_path / "people.parquet").num_rows == 200
    assert (tmp_path / "people.csv").read_text(encoding="utf-8").startswith("age,region,bio\n")


def test_a_census_whose_marginals_disagree_or_a_bad_count_is_one_line_and_exit_2(tmp_path: Path) -> None:
    disagree = write_marginals(tmp_path / "a.csv", {"age": [60, 40], "region": [50, 80]})
    negative = tmp_path / "b.csv"
    negative.write_text("attribute,category,count\nage,young,-3\n", encoding="utf-8")
    for path, why in ((disagree, "marginals disagree (age sums to 100, region sums to 130)"), (negative, "count '-3'")):
        refused = cli(str(path), cwd=tmp_path)
        assert refused.returncode == 2 and why in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "personas.jsonl").exists()
    census = write_marginals(tmp_path / "c.csv", {"age": [60, 40]})
    none = cli(str(census), "--n", "0", cwd=tmp_path)
    assert none.returncode == 2 and "n=0 personas; give at least 1" in none.stderr
