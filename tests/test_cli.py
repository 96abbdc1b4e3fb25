"""The `metaroles` command, through typer's runner and as a real subprocess."""

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
from typer.testing import CliRunner

from metaroles.cli import app
from metaroles.record.eventlog import read_events

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def only_run_dir(root):
    (run_dir,) = [p for p in root.iterdir() if p.name != "latest"]
    assert (root / "latest").resolve() == run_dir.resolve()
    return run_dir


def test_help_is_everywhere():
    for command in ([], ["run"], ["resume"], ["fork"], ["graph"], ["show"], ["list"], ["diff"]):
        result = invoke(*command, "--help")
        assert result.exit_code == 0 and "Usage" in result.output


def test_investment_is_the_money_budget(tmp_path):
    result = invoke("run", "software_company", "--llm", "test:1", "--investment", "3", "--rounds", "2", "--no-save")
    assert result.exit_code == 0 and "of budget 3" in result.output


def test_run_honours_rounds_idea_seed_and_budget(tmp_path):
    out = tmp_path / "run"
    result = invoke(
        "run", "debate", "--llm", "test:2", "--rounds", "2", "--idea", "Trams?", "--seed", "11", "--out", str(out)
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["n_round"], manifest["idea"], manifest["seed"]) == (2, "Trams?", 11)
    assert {"metaroles", "python", "packages", "git_revision", "created"} <= set(manifest)
    assert "stopped (n_round) after 2 round(s)" in result.output
    assert "[Human → <all>] Trams?" in result.output
    assert json.loads((out / "state.json").read_text())["round"] == 2


def test_a_yaml_config_runs_like_the_options_it_holds(tmp_path):
    config = tmp_path / "debate.yaml"
    config.write_text("scenario: debate\nllm: test:3\nrounds: 3\nconfig:\n  turns: 1\n  pro: Ada\n")
    result = invoke("run", str(config), "--runs-dir", str(tmp_path / "runs"))
    assert result.exit_code == 0, result.output
    assert "[Ada → Bob, Judge]" in result.output
    manifest = json.loads((only_run_dir(tmp_path / "runs") / "manifest.json").read_text())
    assert (manifest["config"]["pro"], manifest["n_round"], manifest["llm"]) == ("Ada", 3, "test:3")


def test_bad_input_gets_one_line_and_exit_code_2(tmp_path):
    result = invoke("run", "debat", "--no-save")
    assert result.exit_code == 2
    assert "no scenario named 'debat'; did you mean 'debate'?" in result.output
    assert invoke("show", str(tmp_path / "missing")).exit_code == 2
    (tmp_path / "bad.yaml").write_text("just: [a, list\n")
    result = invoke("run", str(tmp_path / "bad.yaml"))
    assert result.exit_code == 2 and "is not valid YAML" in result.output
    result = invoke("run", "debate", "--set", "turns", "--no-save")
    assert result.exit_code == 2 and "expected KEY=VALUE" in result.output
    assert invoke("graph", str(tmp_path), "--format", "gif").exit_code == 2


def test_show_filters_by_role_and_round(tmp_path):
    invoke("run", "debate", "--llm", "test:1", "--set", "turns=1", "--out", str(tmp_path / "r"))
    everything = invoke("show", str(tmp_path / "r")).output.splitlines()
    assert everything[0].startswith("[round 0] [Human → <all>]")
    first = invoke("show", str(tmp_path / "r"), "--round", "1").output.splitlines()
    assert first and all(line.startswith("[round 1]") for line in first)
    judge = invoke("show", str(tmp_path / "r"), "--role", "Judge").output.splitlines()
    assert len(judge) == len(everything), "the judge hears every speech and rules to all"
    bob = invoke("show", str(tmp_path / "r"), "--role", "Bob", "--round", "1").output
    assert "[round 1] [Alice → Bob, Judge]" in bob


def test_fork_and_diff_on_the_command_line(tmp_path):
    invoke("run", "debate", "--llm", "test:4", "--set", "turns=2", "--out", str(tmp_path / "a"))
    result = invoke(
        "fork", str(tmp_path / "a"), "--from-round", "2", "--set", "role.Bob.llm=test:77", "--out", str(tmp_path / "b")
    )
    assert result.exit_code == 0, result.output
    differing = invoke("diff", str(tmp_path / "a"), str(tmp_path / "b"))
    diff = differing.output
    assert "first divergence in round 3" in diff or "first divergence in round 4" in diff
    assert differing.exit_code == 1, "runs that differ exit 1, as diff(1) does"
    same = invoke("fork", str(tmp_path / "a"), "--from-round", "1", "--out", str(tmp_path / "c"))
    assert same.exit_code == 0
    identical = invoke("diff", str(tmp_path / "a"), str(tmp_path / "c"))
    assert identical.output.startswith("identical:") and identical.exit_code == 0


PLUGIN = Path(__file__).resolve().parent / "plugin_pkg"


def test_an_installed_plugin_scenario_is_listed_and_runs(tmp_path):
    site, source = tmp_path / "site", tmp_path / "plugin"
    shutil.copytree(PLUGIN, source)  # the build writes next to the sources: not into the repository
    install = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
    built = subprocess.run([*install, "--target", str(site), str(source)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": str(site)}
    listed = subprocess.run([sys.executable, "-m", "metaroles", "list"], capture_output=True, text=True, env=env)
    assert listed.returncode == 0
    assert "debate\tmetaroles.scenarios.debate" in listed.stdout and "echo\tmetaroles_echo.scenario" in listed.stdout
    for kind in ("role: echoer\tmetaroles_echo.scenario:Echoer", "action: echo\tmetaroles_echo.scenario:Echo"):
        assert kind in listed.stdout
    assert "environment: quiet\tmetaroles_echo.scenario:QuietEnvironment" in listed.stdout
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "from metaroles.project.registry import load_plugin; print(load_plugin('roles', 'echoer')().name)",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert loaded.stdout.strip() == "Echo", loaded.stderr
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "metaroles",
            "run",
            "echo",
            "--llm",
            "test",
            "--set",
            "times=1",
            "--out",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert ran.returncode == 0, ran.stderr
    assert "[Echo → <all>] HELLO PLUG-IN !" in ran.stdout
    assert json.loads((tmp_path / "r" / "manifest.json").read_text())["scenario"] == "echo"
    missing = subprocess.run(
        [sys.executable, "-m", "metaroles", "resume", str(tmp_path / "nope")], capture_output=True, text=True
    )
    assert missing.returncode == 2 and missing.stderr.strip().count("\n") == 0, "one line"


def test_resume_and_graph_as_a_subprocess(tmp_path):
    out = tmp_path / "run"
    cli = [sys.executable, "-m", "metaroles"]
    assert (
        subprocess.run(
            [*cli, "run", "debate", "--llm", "test:3", "--set", "turns=1", "--out", str(out), "-q"]
        ).returncode
        == 0
    )
    for later in sorted((out / "checkpoints").glob("round-*.json"))[2:]:
        later.unlink()
    resumed = subprocess.run([*cli, "resume", str(out), "-q"], capture_output=True, text=True)
    assert resumed.returncode == 0 and "stopped (idle)" in resumed.stdout
    graph = subprocess.run([*cli, "graph", str(out), "--format", "svg"], capture_output=True, text=True)
    assert graph.returncode == 0 and (out / "flow.svg").read_text().lstrip().startswith("<?xml")


def test_replay_a_recorded_cassette_with_no_model(tmp_path):
    cassette = tmp_path / "debate.jsonl"
    first = invoke("run", "debate", "--llm", "test:6", "--set", "turns=1", "--record", str(cassette), "--no-save")
    replayed = invoke("run", "debate", "--replay", str(cassette), "--set", "turns=1", "--out", str(tmp_path / "r"))
    assert replayed.exit_code == 0, replayed.output

    def lines(output: str) -> list[str]:
        return [line for line in output.splitlines() if line.startswith("[")]

    assert lines(replayed.output) == lines(first.output) and len(lines(first.output)) == 4
    assert json.loads((tmp_path / "r" / "manifest.json").read_text())["llm"] == f"replay:{cassette}"
    assert invoke("run", "debate", "--replay", str(tmp_path / "none.jsonl"), "--no-save").exit_code == 2


def test_the_progress_display_follows_the_rounds():
    from metaroles import TestLLM
    from metaroles.cli.common import Live
    from metaroles.llm.limits import LimitedLLM
    from metaroles.project.registry import load_scenario

    module = load_scenario("debate")
    plan = module.build(module.Config(turns=1), TestLLM(1))
    plan.team.llm = LimitedLLM(TestLLM(1), max_in_flight=5, adaptive=True)
    live = Live(plan.n_round, enabled=True)  # never started here: it tracks the rounds, draws nothing
    shown: list[tuple[int, str]] = []

    def update(team) -> None:
        live(team)
        shown.append((len(team.env.ledger.entries), live.progress.tasks[0].fields["stats"]))

    plan.team.on_round = update
    anyio.run(lambda: plan.team.run(plan.n_round, idea=plan.idea))
    task = live.progress.tasks[0]
    assert task.completed == plan.team.env.round
    env, stats = plan.team.env, task.fields["stats"]
    record = env.round_record()
    assert plan.n_round > 1 and record.round == env.round, "from its second round on, the display reads the records"
    assert f"+{len(record.published)} {len(env.history)} msgs · " in stats and "ready 0/3" in stats
    calls = [(before, after, text) for (before, _), (after, text) in itertools.pairwise(shown)]
    assert any(after > before for before, after, _ in calls), "some rounds call the model"
    for before, after, text in calls:
        if after > before:  # a round's calls, their pace and the limit the adaptive model allows now
            assert f"{after - before} calls · " in text and " tok/s · " in text and "≤4 in flight" in text, text
        else:
            assert "calls" not in text and "tok/s" not in text, text


def test_a_progress_display_that_shows_nothing_has_the_bus_record_nothing():
    """Quiet or not on a terminal, the display reads no round's record, so the bus keeps none for it."""
    from metaroles import TestLLM
    from metaroles.cli.common import Live
    from metaroles.project.registry import load_scenario

    module = load_scenario("debate")
    plan = module.build(module.Config(turns=1), TestLLM(1))
    plan.team.on_round = Live(plan.n_round, enabled=False)
    anyio.run(lambda: plan.team.run(plan.n_round, idea=plan.idea))
    assert plan.team.env.round > 1 and plan.team.env.record is None


def test_show_prints_no_terminal_control_from_model_text(tmp_path):
    """Escape sequences in messages (window title, screen clear, colours) never reach the terminal."""
    hostile = "trams \x1b]0;owned\x07\x1b[2J\x1b[31mred\x1b[0m \x9b2J bell\x07 end"
    run_dir = tmp_path / "run"
    ran = invoke("run", "debate", "--llm", "test", "--set", f"topic={hostile}", "--out", str(run_dir))
    assert ran.exit_code == 0 and "trams" in ran.output and not any(ch in ran.output for ch in "\x1b\x07\x9b")
    for args in (["show", str(run_dir)], ["diff", str(run_dir), str(run_dir)]):
        out = invoke(*args).output
        assert not any(ch in out for ch in "\x1b\x07\x9b"), args
    assert "trams" in invoke("show", str(run_dir)).output and "red" in invoke("show", str(run_dir)).output


# -- a newcomer's first commands ---------------------------------------------------------------------------

NAMED_BAD = [
    (["run", "debate", "--rounds", "abc"], "Invalid value for '--rounds'"),
    (["run", "debate", "--bogus"], "No such option: --bogus"),
    (["bogus"], "No such command 'bogus'"),
    (["--bogus"], "No such option: --bogus (see: metaroles --help)"),
    (["run", "debate", "--llm", "tset"], "llm='tset' is not a known model"),
    (["run", "debate", "--llm", "gpt-nonsense"], "pass --llm openai --model gpt-nonsense"),
    (["run", "debate", "--llm", "test:abc"], "must be an integer"),
    (["run", "debate", "--llm", "openai"], "needs a model name"),
    (["run", "debate", "--llm", "test", "--set", "turns=two"], "option turns='two'"),
    (
        ["run", "debate", "--llm", "test", "--set", "turnz=2"],
        "'turnz' is not an option of this scenario; did you mean 'turns'?",
    ),
    (["run", "nowhere/peer_review.py", "--llm", "test"], "does not exist"),
    (["run", "json.decoder", "--llm", "test"], "lacks Config and build"),
    (["run", "nopkg.scenarios.review", "--llm", "test"], "cannot be imported"),
    (["run", "Debate!", "--llm", "test"], "is not a scenario name"),
    (["run", "debate", "--llm", "test", "--price", "gpt-4o=cheap"], "expected MODEL=PROMPT,COMPLETION"),
    (["run", "debate", "--llm", "test", "--price", "gpt-4o=1,nan"], "expected MODEL=PROMPT,COMPLETION"),
    (["run", "debate", "--llm", "test", "--temperature", "9"], "Invalid value for '--temperature'"),
    (["run", "debate", "--llm", "test", "--rate-limit", "0"], "Invalid value for '--rate-limit'"),
    (["run", "debate", "--llm", "test", "--max-in-flight", "x"], "Invalid value for '--max-in-flight'"),
]


def test_named_bad_invocations_are_one_clear_line_and_exit_2(monkeypatch, capsys):
    from metaroles.cli import main

    for name in ("METAROLES_LLM", "METAROLES_MODEL", "OPENAI_MODEL"):
        monkeypatch.delenv(name, raising=False)
    for args, said in NAMED_BAD:
        code = main([*args, "--no-save", "-q"] if args[0] == "run" else args)
        errors = [
            line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("model:")
        ]
        assert (code, len(errors)) == (2, 1) and said in errors[0], (args, errors)
    monkeypatch.setenv("METAROLES_LLM", "nonsense")
    assert main(["run", "debate", "--no-save", "-q"]) == 2
    assert "--llm 'nonsense' is not a provider" in capsys.readouterr().err


SCENARIO_FILE = '''"""A two-reviewer peer review, written by a user."""
from pydantic import BaseModel
from metaroles import Action, Role, ScenarioPlan, Team


class Config(BaseModel):
    rounds: int = 2


class Review(Action):
    instruction = "Review the paper."


def build(config, llm):
    team = Team(llm=llm)
    team.hire([Role(name="r1", profile="Harsh reviewer", actions=[Review]), Role(name="r2", actions=[Review])])
    return ScenarioPlan(team=team, idea="Paper: routing by address", send_to="", n_round=config.rounds)
'''


def test_your_own_scenario_runs_from_a_file_and_from_a_module(tmp_path, monkeypatch):
    path = tmp_path / "peer_review.py"
    path.write_text(SCENARIO_FILE)
    result = invoke("run", str(path), "--llm", "test:1", "--set", "rounds=1", "--runs-dir", str(tmp_path / "runs"))
    assert result.exit_code == 0, result.output
    assert "[r1 → <all>]" in result.output and "[r2 → <all>]" in result.output
    run_dir = only_run_dir(tmp_path / "runs")
    assert run_dir.name.startswith("peer_review-")
    assert json.loads((run_dir / "manifest.json").read_text())["scenario"] == str(path.resolve())
    monkeypatch.chdir(tmp_path)  # a scenario file outside the current folder is resumed only with --trust
    assert invoke("resume", str(run_dir), "-q").exit_code == 0, "resume finds the file again"
    package = tmp_path / "site" / "mypkg" / "scenarios"
    package.mkdir(parents=True)
    for folder in (package.parent, package):
        (folder / "__init__.py").write_text("")
    (package / "peer_review.py").write_text(SCENARIO_FILE)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    by_module = invoke("run", "mypkg.scenarios.peer_review", "--llm", "test:1", "--set", "rounds=1", "--no-save")
    assert by_module.exit_code == 0, by_module.output
    assert [line for line in by_module.output.splitlines() if line.startswith("[")] == [
        line for line in result.output.splitlines() if line.startswith("[")
    ]


def test_the_progress_shows_the_real_total_time_and_a_readable_model(capsys):
    from metaroles import TestLLM
    from metaroles.cli.common import Live, resolve
    from metaroles.project.registry import load_scenario

    module = load_scenario("debate")
    plan = module.build(module.Config(turns=1), TestLLM(1))
    live = Live(0, enabled=True)  # the total is not known before the scenario is built (never started: draws nothing)
    plan.team.on_round = live
    anyio.run(lambda: plan.team.run(plan.n_round, idea=plan.idea))
    task = live.progress.tasks[0]
    assert task.total == plan.n_round and task.completed == plan.team.env.round
    assert task.elapsed is not None and task.elapsed > 0
    resolve({"llm": "test:3"})
    said = capsys.readouterr().err
    assert "model: TestLLM (test)" in said and "object at 0x" not in said


def test_a_long_transcript_is_printed_only_on_request(tmp_path, monkeypatch):
    """Past the length a run directory keeps, the terminal gets a line saying where to read the rest, not all of it."""
    from metaroles.project import rundir

    short = invoke("run", "debate", "--llm", "test:3", "--set", "turns=1", "--out", str(tmp_path / "short"))
    printed = [line for line in short.output.splitlines() if line.startswith("[")]
    messages = json.loads((tmp_path / "short" / "report.json").read_text())["report"]["messages"]
    assert len(printed) == messages > 3, "a short run's transcript, a line per message"
    monkeypatch.setattr(rundir, "TRANSCRIPT_LIMIT", 3)
    long = invoke("run", "debate", "--llm", "test:3", "--set", "turns=1", "--out", str(tmp_path / "long"))
    live = [line for line in long.output.splitlines() if line.startswith("[")]  # printed as the rounds end ...
    assert long.exit_code == 0 and live == printed[:3]  # ... until the run goes past the limit
    assert "the transcript goes on past 3 messages: not printed; to read it: metaroles show" in long.output
    assert not (tmp_path / "long" / "transcript.md").exists(), "nor written, as the run directory's rule says"
    asked = invoke(
        "run", "debate", "--llm", "test:3", "--set", "turns=1", "--out", str(tmp_path / "asked"), "--transcript"
    )
    assert [line for line in asked.output.splitlines() if line.startswith("[")] == printed
    assert (tmp_path / "asked" / "transcript.md").exists()


def test_resume_of_a_quiet_run_stays_quiet(tmp_path):
    out = tmp_path / "run"
    assert invoke("run", "debate", "--llm", "test:3", "--set", "turns=1", "--out", str(out), "-q").exit_code == 0
    for later in sorted((out / "checkpoints").glob("round-*.json"))[2:]:
        later.unlink()
    resumed = invoke("resume", str(out))
    assert resumed.exit_code == 0 and "stopped (idle)" in resumed.output
    assert not [line for line in resumed.output.splitlines() if line.startswith("[")], "no transcript"


def test_a_scenario_file_or_module_that_fails_to_load_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    from metaroles.cli import main

    (tmp_path / "broken.py").write_text("from pydantic import BaseModel\nraise RuntimeError('no data folder')\n")
    (tmp_path / "bad_syntax.py").write_text("def build(:\n")
    (tmp_path / "brokenpkg").mkdir()
    (tmp_path / "brokenpkg" / "__init__.py").write_text("")
    (tmp_path / "brokenpkg" / "scenario.py").write_text("1 / 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cases = [
        (str(tmp_path / "broken.py"), "failed while loading: RuntimeError: no data folder"),
        (str(tmp_path / "bad_syntax.py"), "line 1"),
        ("brokenpkg.scenario", "failed while importing: ZeroDivisionError"),
    ]
    for target, said in cases:
        assert main(["run", target, "--llm", "test", "--no-save", "-q"]) == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(errors) == 1 and said in errors[0] and "a metaroles bug" not in errors[0], errors


def test_help_at_80_columns_wraps_each_options_text_under_it():
    env = {**os.environ, "COLUMNS": "80"}
    shown = subprocess.run(
        [sys.executable, "-m", "metaroles", "run", "--help"], capture_output=True, text=True, env=env, check=True
    )
    lines = shown.stdout.splitlines()
    assert max(map(len, lines)) <= 80
    llm = next(i for i, line in enumerate(lines) if line.lstrip().startswith("--llm"))
    assert "OpenAI-compatible server" in " ".join(lines[llm : llm + 3]), "the text sits beside its option, not squeezed"


def test_the_no_model_notice_is_one_line_that_keeps_the_extra_to_install(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "METAROLES_"))}
    code = "from metaroles.cli.common import _resolved\nfrom metaroles.llm.settings import LLMSettings\n"
    code += "import metaroles.llm.providers as p\np._auto.__defaults__ = (lambda name: False,)\n"
    code += "_resolved(LLMSettings())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**env, "COLUMNS": "60"})
    notice = [line for line in done.stderr.splitlines() if "no model configured" in line]
    assert len(notice) == 1 and "pip install 'metaroles[local]'" in notice[0], done.stderr


FAILING_SCENARIO = """
from pydantic import BaseModel
from metaroles import Action, Role, ScenarioPlan, Team

class Config(BaseModel):
    pass

class Boom(Action):
    async def run(self, history):
        raise ValueError("boom")

def build(config, llm, run_dir=None):
    run_dir.mkdir(parents=True, exist_ok=True)  # it may not exist yet
    open(run_dir / "built-here", "w").write("the run directory")
    team = Team(llm=llm)
    team.hire([Role(name="b", actions=[Boom])])
    return ScenarioPlan(team=team, idea="go", send_to="b", n_round=2)
"""


def test_a_failing_action_is_named_where_it_raised_and_traceback_prints_it(tmp_path, monkeypatch):
    path = tmp_path / "failing.py"
    path.write_text(FAILING_SCENARIO)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    failed = subprocess.run(
        [sys.executable, "-m", "metaroles", "run", str(path), "--llm", "test", "-q", "--out", str(out)],
        capture_output=True,
        text=True,
    )
    errors = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
    assert failed.returncode == 1 and len(errors) == 1 and f"at {path}:10" in errors[0], failed.stderr
    assert (out / "built-here").read_text() == "the run directory", "build() is given the run directory"
    logged = [e for e in read_events(out / "events.jsonl") if e["kind"] == "role_error"]
    assert logged[0]["detail"].startswith("ValueError: boom") and ":10 in run" in logged[0]["detail"]
    again = subprocess.run(
        [sys.executable, "-m", "metaroles", "resume", str(out), "-q", "--traceback"], capture_output=True, text=True
    )
    assert again.returncode == 1 and "Traceback (most recent call last)" in again.stderr
    assert 'raise ValueError("boom")' in again.stderr


def test_a_missing_extra_is_named_with_how_to_install_it(tmp_path):
    out = tmp_path / "run"
    assert invoke("run", "debate", "--llm", "test", "-q", "--out", str(out)).exit_code == 0
    for missing, args, said in (
        ("networkx", ["graph", str(out), "-f", "json"], "pip install 'metaroles[graph]'"),
        (
            "openai",
            ["run", "debate", "--llm", "openai", "--model", "m", "--base-url", "http://127.0.0.1:9/v1"],
            "[openai]",
        ),
    ):
        code = f"import sys\nsys.modules[{missing!r}] = None\nfrom metaroles.cli import main\nsys.exit(main({args!r}))"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert done.returncode == 2 and len(errors) == 1 and said in errors[0], done.stderr


# -- a scenario's options can be found, and a slip gets the nearest right name ----------------------


def test_a_scenarios_options_are_listed_with_types_defaults_and_what_they_do():
    result = invoke("list", "debate")
    assert result.exit_code == 0
    assert "turns: int = 3\n    Speeches per debater." in result.output
    assert "topic: str = 'Cities should" in result.output and "    The motion." in result.output
    assert "list[GameRole] = ['werewolf'" in invoke("list", "werewolf").output
    assert "NAME" in invoke("run", "--help").output and "FILE.py" in invoke("run", "--help").output


def test_slips_in_options_get_the_form_or_the_name_meant(tmp_path, monkeypatch):
    result = invoke("run", "society", "--set", "opinions=0.5", "--no-save")
    assert result.exit_code == 2 and """--set 'opinions=["a", "b"]'""" in result.output
    (tmp_path / "run.yaml").write_text("scenario: debate\nrouns: 3\n")
    result = invoke("run", str(tmp_path / "run.yaml"), "--no-save")
    assert result.exit_code == 2 and "did you mean 'rounds'?" in result.output
    monkeypatch.chdir(tmp_path)
    (tmp_path / "peer_review.py").write_text("")
    result = invoke("run", "peer_review", "--no-save")
    assert result.exit_code == 2 and "did you mean the file 'peer_review.py' here" in result.output


def test_role_llm_on_run_gives_that_role_its_model_and_resume_keeps_it(tmp_path):
    out = tmp_path / "r"
    assert (
        invoke(
            "run", "debate", "--llm", "test", "--set", "turns=1", "--set", "role.Bob.llm=test:7", "--out", str(out)
        ).exit_code
        == 0
    )
    assert json.loads((out / "manifest.json").read_text())["role_llms"] == {"Bob": "test:7"}
    result = invoke("run", "debate", "--llm", "test", "--set", "role.Bobb.llm=test:7", "--no-save")
    assert result.exit_code == 2 and "no role named 'Bobb'" in result.output


def test_a_build_that_returns_the_wrong_thing_is_the_users_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "wrong.py").write_text(
        "from pydantic import BaseModel\nclass Config(BaseModel):\n    pass\ndef build(config, llm):\n    return 5\n"
    )
    result = invoke("run", "wrong.py", "--llm", "test", "--no-save")
    assert result.exit_code == 2 and "build() returned int; return ScenarioPlan(" in result.output
    assert "a metaroles bug" not in result.output


def test_run_messages_takes_a_path_as_text_and_a_dead_letter_names_the_role_meant(tmp_path):
    import warnings

    from metaroles import Environment, Message, Role
    from metaroles.project.diff import run_messages

    invoke("run", "debate", "--llm", "test", "--set", "turns=1", "--out", str(tmp_path / "r"))
    assert run_messages(str(tmp_path / "r")) == run_messages(tmp_path / "r")
    env = Environment()
    env.add_roles([Role(name="Reviewer1")])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env.publish_message(Message("x", send_to="Reviwer1"))
    assert "did you mean 'Reviewer1'?" in str(caught[0].message)


def test_an_edge_carrying_two_actions_names_both():
    from collections import Counter

    from metaroles.flow.plot import edge_label

    assert edge_label(Counter({"WriteCode": 2, "WriteTest": 1})) == "WriteCode 2 · WriteTest 1"
    assert edge_label(Counter({"WriteCode": 3})) == "3"


def test_diff_of_two_unseeded_runs_compares_contents_and_says_why_ids_differ(tmp_path):
    for name in ("a", "b"):
        assert (
            invoke("run", "debate", "--llm", "test:3", "--set", "turns=1", "--out", str(tmp_path / name)).exit_code == 0
        )
    result = invoke("diff", str(tmp_path / "a"), str(tmp_path / "b"))
    assert result.exit_code == 0, result.output
    assert "same messages: 4 (by content;" in result.output and "a run without --seed draws fresh ids" in result.output
    assert "--llm test:N seeds the test model's answers, not the run" in result.output
    invoke("run", "debate", "--llm", "test:4", "--set", "turns=1", "--out", str(tmp_path / "c"))
    assert invoke("diff", str(tmp_path / "a"), str(tmp_path / "c")).exit_code == 1, "other answers still differ"


def test_a_scenario_files_action_ids_are_the_same_by_command_and_by_import(tmp_path):
    import subprocess
    import sys

    (tmp_path / "ids_by_import.py").write_text(SCENARIO_FILE)
    out = tmp_path / "run"
    assert (
        invoke(
            "run", str(tmp_path / "ids_by_import.py"), "--llm", "test:1", "--set", "rounds=1", "--out", str(out)
        ).exit_code
        == 0
    )
    state = json.loads((out / "state.json").read_text())
    made = {m["cause_by"] for m in state["history"] if m.get("sent_from") in ("r1", "r2")}
    imported = subprocess.run(
        [sys.executable, "-c", "import ids_by_import; print(ids_by_import.Review.action_id())"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert made == {imported} == {"ids_by_import.Review"}
    assert json.loads((out / "manifest.json").read_text())["module"] == "ids_by_import"
    assert invoke("fork", str(out), "--from-round", "1", "--out", str(tmp_path / "fork"), "--trust").exit_code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "module": "json"}))  # data never picks a module name
    json_module = sys.modules["json"]
    assert invoke("fork", str(out), "--from-round", "1", "--out", str(tmp_path / "fork2"), "--trust").exit_code == 0
    assert sys.modules["json"] is json_module


def test_a_scenario_whose_build_exits_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    from metaroles.cli import main as cli_main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "leaving.py").write_text(
        "import sys\nfrom pydantic import BaseModel\nclass Config(BaseModel):\n    pass\n"
        "def build(config, llm):\n    sys.exit('bye')\n"
    )
    assert cli_main(["run", "leaving.py", "--llm", "test", "--out", str(tmp_path / "run"), "-q"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("model: ")]
    assert lines == ["error: leaving.build() called sys.exit('bye'); raise an exception saying what is wrong instead"]


async def test_each_speech_is_printed_as_its_round_ends_and_the_run_ends_with_what_the_bus_did(capsys):
    from metaroles import FunctionLLM
    from metaroles.cli.common import Live, Transcript, what_the_bus_did
    from metaroles.project.scenario import run_scenario

    printed_before_bob_spoke: list[str] = []

    def answer(request) -> str:
        if request.role == "Bob":
            printed_before_bob_spoke.append(capsys.readouterr().out)
        if request.output_schema is not None:
            return '{"winner": "pro", "reasoning": "the clearer case for the motion", "confidence": 0.5}'
        return f"{request.role} speaks."

    live = Live(0, enabled=False, transcript=Transcript(None, wanted=None))
    _, team = await run_scenario(
        "debate", llm=FunctionLLM(answer), options={"turns": 1}, out_dir=None, on_progress=live
    )
    assert "[Alice → Bob, Judge] Alice speaks." in printed_before_bob_spoke[0], "Alice's speech came out at once"
    assert "Bob speaks." in capsys.readouterr().out
    lines = what_the_bus_did(team.env.history.storage, Path("runs/x"), rounds=team.env.round)
    assert "  Alice → Bob, Judge: 1" in lines and "  Human → <all>: 1" in lines
    assert any("Verdict(winner='pro'" in line for line in lines) and lines[-1].startswith("next: metaroles show runs/x")
