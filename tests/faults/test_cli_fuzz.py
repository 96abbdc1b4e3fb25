"""Bad command lines: each gets one line on stderr naming what is wrong, and exit 2 — never a traceback."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from metaroles.cli import main
from tests.faults.helpers import ok, run_args

RUN = ["run", "debate", "--llm", "test", "--no-save", "-q"]
BAD_RUN_OPTIONS = {
    "--rounds": ["x", "-1", "1.5", "99999999999999999999999"],
    "--seed": ["x", "1.5", ""],
    "--budget": ["x", "-1", "nan"],
    "--llm": ["bogus", "scripted:/nonexistent", "replay:/nonexistent", "test:x", "openai:"],
    "--set": [
        *("turns", "=1", "turns=abc", "nope=1", "turns=[1]", "turns=1e999", 'topic={"a": 1}', "turns=-5", "turns=0"),
        *("pro=<all>", "pro=", "pro=Judge", "con=Alice", "pro=Al\u202eice"),
    ],
    "--checkpoint-every": ["0", "x"],
    "--replay": ["/nonexistent.jsonl"],
    "--record": ["/tmp"],
    "--bogus": ["1"],
}


def cases(tmp: Path, parent: Path) -> list[list[str]]:
    found = [[*RUN[:1], "debat", *RUN[2:]], ["run", str(tmp / "none.yaml")], ["run", ""], ["run"]]
    found += [["bogus"], ["--bogus"]]
    found += [[*RUN, option, value] for option, values in BAD_RUN_OPTIONS.items() for value in values]
    saved = ["run", "debate", "--llm", "test", "-q"]
    found += [[*saved, "--out", "/proc/x"], [*saved, "--out", "/dev/null/x"], [*saved, "--runs-dir", "/dev/null"]]
    for target in (tmp / "missing", tmp / "file.txt", tmp):
        found += [["resume", str(target)], ["show", str(target)], ["graph", str(target)]]
        found += [["diff", str(target), str(parent)]]
        found += [["fork", str(target), "--from-round", "1", "--out", str(tmp / "child")]]
    fork = ["fork", str(parent), "--out", str(tmp / "child"), "-q"]
    found += [[*fork, "--from-round", value] for value in ("x", "-1", "")] + [fork]
    changes = ("role.Zed.llm=test", "role.Bob.llm=bogus", "nope=1")
    found += [[*fork, "--from-round", "2", "--set", value] for value in changes]
    found += [["graph", str(parent), "-f", "gif"], ["graph", str(parent), "-f", "png", "--out", "/proc/x/y.png"]]
    found += [["show", str(parent), "--round", "abc"], ["diff", str(parent)], ["list", "extra"], ["resume"]]
    found += [["run", "debate", *pair] for pair in itertools.product(["--rounds"], ["--seed"])]
    society = ["run", "society", "--llm", "test", "--no-save", "-q", "--set"]
    for value in ("opinions=[2,3]", "opinions=[0.5]", "agents=1e11", "degree=3", "degree=100000", "llm_agents=500"):
        found.append([*society, value])
    werewolf = ["run", "werewolf", "--llm", "test", "--no-save", "-q", "--set"]
    found += [[*werewolf, value] for value in ("max_days=-1", 'players=["", "b", "c", "d", "e", "f"]')]
    found += [[*werewolf, 'players=["a", "a", "c", "d", "e", "f"]'], [*werewolf, 'players=["<all>"]']]
    found += [["run", "debate", "--no-save", "-q", "--llm", name] for name in ("gpt-4o-2024-08-06", "openai")]
    found += [["run", "debate", "--no-save", "-q", "--model", "gpt-4o-2024-08-06"]]  # a model and no server
    found += [["fork", str(parent), "--from-round", "999", "--out", str(tmp / "late"), "-q"]]
    found += [["graph", str(parent), "-f", "png", "--out", str(tmp)], ["graph", str(parent), "--out", ""]]
    found += [["run", "debate", "--llm", "test", "-q", "--out", ""]]
    found += [["sweep", "debate", "--grid", "seed=0..999999", "-q"]]
    bad = tmp / "bad.json"
    bad.write_bytes(b"\xff\xfe")
    deep = tmp / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    found += [["run", "debate", "--no-save", "-q", "--llm", f"scripted:{path}"] for path in (bad, deep)]
    return found


@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("parent") / "debate"
    ok(*run_args("debate", out))
    return out


def test_every_bad_invocation_gets_one_line_and_exit_2(tmp_path, parent, capsys, monkeypatch):
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "METAROLES_MODEL", "METAROLES_LLM"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "file.txt").write_text("not a run")
    said = []
    for args in cases(tmp_path, parent):
        code = main(args)
        stderr = capsys.readouterr().err
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        others = [line for line in stderr.splitlines() if line.strip() and not line.startswith(("error:", "model:"))]
        said.append((args, code, errors, others))
    bad = [(args, code, errs, rest) for args, code, errs, rest in said if code != 2 or len(errs) != 1 or rest]
    assert bad == [], f"{len(bad)} of {len(said)} bad invocations were not one line and exit 2: {bad[:5]}"
    assert [args for args, _, errors, _ in said if "a metaroles bug" in errors[0]] == []
    assert len(said) >= 90


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("scenario: debate\na: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n", "alias"),
        ("scenario: debate\nx: " + "[" * 5000 + "]" * 5000 + "\n", "nests deeper than"),
        ("scenario: debate\nx: " + "[" * 30 + "]" * 30 + "\n", "nests deeper than"),
        ("scenario: debate\nturns: 1\n" + "# padding\n" * 40_000, "is over"),
        ("scenario: debate\nturns: \udcff\n", "not UTF-8"),
        ("scenario: debate\nturns: [1\n", "is not valid YAML"),
        ("- just\n- a list\n", "must be a mapping with 'scenario: NAME'"),
        ("scenario: debate\ntunrs: 2\n", "'tunrs' is not an option of this scenario"),
    ],
)
def test_a_hostile_or_broken_config_file_is_refused_before_anything_runs(tmp_path, capsys, text, said):
    path = tmp_path / "config.yaml"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    assert main(["run", str(path), "--llm", "test", "--no-save"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and said in errors[0], errors
