"""A run as a panel (a row per role and round), queried with DuckDB as a social scientist would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb

from metaroles.record.eventread import read_events


def one(query: str) -> tuple:
    """The first row of a query's answer."""
    return duckdb.sql(query).fetchall()[0]


def metaroles(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metaroles", *args], capture_output=True, text=True, check=False)


def test_every_role_has_a_row_in_every_round_with_what_it_did_and_the_scenarios_figures(tmp_path: Path) -> None:
    run = tmp_path / "run"
    made = metaroles("run", "studies", "--llm", "test", "--set", "study=pd_communication", "--set", "participants=4",
                     "--out", str(run), "-q")  # fmt: skip
    assert made.returncode == 0, made.stderr
    exported = metaroles("export", str(run), "--format", "panel")
    assert exported.returncode == 0 and "rows: a role and a round each" in exported.stdout, exported.stderr
    panel = str(run / "export" / "panel.parquet")
    events = list(read_events(run / "events.jsonl"))
    roles = {e["role"] for e in events if e.get("role") not in (None, "Human")}
    rounds = {e["round"] for e in events if e["kind"] == "round_start"}
    shape = one(f"select count(*), count(distinct role), count(distinct round) from '{panel}'")
    assert shape == (len(roles) * len(rounds), len(roles), len(rounds))
    sent = dict(duckdb.sql(f"select role, sum(sent) from '{panel}' group by role").fetchall())
    published = {r: sum(e["kind"] == "publish" and e.get("role") == r for e in events) for r in roles}
    assert sent == published
    tokens = one(f"select sum(tokens) from '{panel}'")[0]
    assert tokens == sum(e.get("tokens", 0) for e in events if e["kind"] == "llm_call") > 0
    talkers = duckdb.sql(
        f"select role from '{panel}' where list_contains(actions, 'Talk') and conditions = '\"message\"'"
    ).fetchall()
    assert len(talkers) == 4, "the four in the message condition talked, as the study's record says"
    last = f"round = (select max(round) from '{panel}')"
    assert one(f"select count(*) from '{panel}' where {last} and answers is not null")[0] == 8


def test_a_panel_of_a_folder_that_is_no_run_is_one_line_and_exit_2(tmp_path: Path) -> None:
    refused = metaroles("export", str(tmp_path), "--format", "panel")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
