"""A run as a panel (a row per role and round), queried with DuckDB as a social scientist would."""

from __future__ import annotations

import json
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


def test_each_roles_own_state_every_round_is_the_runs_own_as_its_checkpoints_hold_it(tmp_path: Path) -> None:
    from metaroles.llm.providers import resolve_llm
    from metaroles.project.panel import STATE, state_of
    from metaroles.project.rundir import read_manifest
    from metaroles.project.scenario import rebuilt_team
    from metaroles.record.restore import restore_checkpoint

    run = tmp_path / "run"
    made = metaroles("run", "society", "--llm", "test:3", "--set", "agents=8", "--rounds", "7",
                     "--checkpoint-every", "3", "--out", str(run), "-q")  # fmt: skip
    assert made.returncode == 0, made.stderr
    exported = metaroles("export", str(run), "--format", "panel")
    assert exported.returncode == 0 and "warning" not in exported.stderr, exported.stderr
    panel = str(run / "export" / "panel.parquet")
    columns = ", ".join((*STATE, "attributes"))
    rows = duckdb.sql(f"select round, role, {columns} from '{panel}' order by round, role").fetchall()
    by_round: dict[int, dict[str, tuple]] = {}
    for row in rows:
        by_round.setdefault(row[0], {})[row[1]] = row[2:]
    assert sorted(by_round) == list(range(8)) and all(None not in v for r in by_round.values() for v in r.values())
    manifest = read_manifest(run)
    for kept in (0, 3, 6, 7):  # the rounds whose checkpoint the run kept: restored, each role reads the same
        team = rebuilt_team(manifest, resolve_llm("test:3"), tmp_path / f"at{kept}", {})
        restore_checkpoint(run / "checkpoints", team.env, through_round=kept)
        assert team.env.round == kept
        now = {role.name: tuple(state_of(role).values()) for role in team.env.members}
        assert by_round[kept] == now, kept
    memory = dict(duckdb.sql(f"select role, list(memory order by round) from '{panel}' group by role").fetchall())
    assert all(m == sorted(m) and m[-1] > m[1] for m in memory.values()), "a society's memories only grow"
    opinion = "avg(json_extract(attributes, '$.opinion')::DOUBLE)"
    means = duckdb.sql(f"select round, {opinion} from '{panel}' group by round order by round").fetchall()
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r for r, _ in means] == [m["round"] for m in metrics]
    assert all(abs(mean - m["mean"]) < 2e-6 for (_, mean), m in zip(means, metrics, strict=True)), "the run's opinions"
    news = duckdb.sql(f"select sum(news) from '{panel}' where round > 0 group by round order by round").fetchall()
    assert all(n[0] > 0 for n in news), "each round's roles observed what was sent the round before"


def test_a_run_whose_answers_were_not_kept_gets_its_panel_without_the_state_and_a_line_saying_why(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    made = metaroles("run", "society", "--llm", "test", "--set", "agents=4", "--rounds", "2", "--out", str(run), "-q")
    assert made.returncode == 0, made.stderr
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**manifest, "llm": "openai", "cassette": ""}))  # asked live
    exported = metaroles("export", str(run), "--format", "panel")
    assert exported.returncode == 0, exported.stderr
    warning = [line for line in exported.stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "'openai'" in warning[0] and "--record" in warning[0], exported.stderr
    panel = str(run / "export" / "panel.parquet")
    assert one(f"select count(*), count(memory), count(attributes), sum(sent) from '{panel}'") == (12, 0, 0, 8)


def test_a_run_that_recorded_its_answers_gets_its_state_from_them_without_asking_its_model(tmp_path: Path) -> None:
    run = tmp_path / "run"
    made = metaroles("run", "society", "--llm", "test", "--set", "agents=4", "--rounds", "2", "--out", str(run),
                     "--record", str(tmp_path / "calls.jsonl"), "-q")  # fmt: skip
    assert made.returncode == 0, made.stderr
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**manifest, "llm": "openai"}))  # a model not here to ask
    exported = metaroles("export", str(run), "--format", "panel")
    assert exported.returncode == 0 and "warning" not in exported.stderr, exported.stderr
    panel = str(run / "export" / "panel.parquet")
    assert one(f"select count(*), count(memory), count(attributes) from '{panel}'") == (12, 12, 12)
