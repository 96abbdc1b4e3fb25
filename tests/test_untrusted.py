"""Data never runs code: a received run directory, dump or suite is read without importing what it names.

Each test plants a payload (a module on the path that, imported, writes a file outside the run
directory) where a type, a scenario or a scorer is named, then opens the data every way a user
can: nothing ran, and nothing outside the run directory changed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from metaroles import Environment, EnvironmentState, Message, Team
from metaroles.cli import app
from metaroles.core.schema import UnresolvedContent

runner = CliRunner()
PAYLOAD = "metaroles_payload_probe"
REAL_TYPE = "metaroles.actions.debate.Verdict"


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, list(args), catch_exceptions=False)


@pytest.fixture
def payload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module that, imported, writes ``ran`` outside the run directory: where ``marker`` says."""
    folder = tmp_path / "site"
    folder.mkdir()
    marker = tmp_path / "ran"
    (folder / f"{PAYLOAD}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n"
        "from pydantic import BaseModel\nclass Verdict(BaseModel):\n    winner: str = ''\n"
    )
    monkeypatch.syspath_prepend(str(folder))
    sys.modules.pop(PAYLOAD, None)
    return marker


def nothing_ran(marker: Path) -> None:
    assert not marker.exists(), "a module named in the data was imported"
    assert PAYLOAD not in sys.modules


def planted_run(tmp_path: Path) -> Path:
    """A finished debate whose judge's verdict names the payload's class instead of its own."""
    run_dir = tmp_path / "runs" / "r"
    assert (
        invoke("run", "debate", "--llm", "test:1", "--set", "turns=1", "--seed", "3", "--out", str(run_dir)).exit_code
        == 0
    )
    planted = 0
    for path in run_dir.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".jsonl"):
            text = path.read_text(encoding="utf-8")
            planted += text.count(REAL_TYPE)
            path.write_text(text.replace(REAL_TYPE, f"{PAYLOAD}.Verdict"), encoding="utf-8")
    assert planted >= 2, "the verdict is in the state and in the checkpoint's messages"
    return run_dir


def test_opening_a_run_directory_never_imports_the_types_it_names(
    tmp_path: Path, payload: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = planted_run(tmp_path)
    monkeypatch.chdir(tmp_path)
    for args in (
        ["show", str(run_dir)],
        ["graph", str(run_dir), "--format", "html", "--out", str(tmp_path / "g.html")],
        ["diff", str(run_dir), str(run_dir)],
        ["fork", str(run_dir), "--from-round", "1", "--out", str(tmp_path / "fork")],
        ["resume", str(run_dir), "--rounds", "4"],
    ):
        result = invoke(*args)
        assert result.exit_code in (0, 1), (args, result.output)
        assert "Traceback" not in result.output
        nothing_ran(payload)
    state = EnvironmentState.model_validate_json((run_dir / "state.json").read_text(encoding="utf-8"))
    verdicts = [m for m in state.history if m.instruct_content is not None]
    assert verdicts
    for message in verdicts:
        assert isinstance(message.instruct_content, UnresolvedContent)
        assert type(message.instruct_content).type_path == f"{PAYLOAD}.Verdict"
        assert "not loaded" in type(message.instruct_content).note
    nothing_ran(payload)


def test_a_message_dump_keeps_an_unknown_type_as_data_and_writes_it_back_unchanged(payload: Path) -> None:
    dumped = {"content": "ruling", "instruct_content": {"type": f"{PAYLOAD}.Verdict", "value": {"winner": "Alice"}}}
    message = Message.model_validate(dumped)
    nothing_ran(payload)
    assert message.instruct_content is not None and message.instruct_content.model_dump() == {"winner": "Alice"}
    again = Message.model_validate_json(message.model_dump_json())
    assert again.model_dump()["instruct_content"] == dumped["instruct_content"]
    env = Environment()
    env.history.add(message)
    assert Environment(**env.model_dump()).history.storage[0].model_dump() == message.model_dump()
    nothing_ran(payload)


def test_a_type_already_loaded_is_restored_as_itself() -> None:
    from metaroles.actions.debate import Verdict

    verdict = Verdict.model_validate({"winner": "pro", "confidence": 0.5, "reasoning": "the clearer of the two cases"})
    message = Message.model_validate_json(Message(content="v", instruct_content=verdict).model_dump_json())
    assert type(message.instruct_content) is Verdict


def test_a_serialized_team_naming_an_unloaded_type_loads_as_data(tmp_path: Path, payload: Path) -> None:
    team = Team()
    team.env.publish_message(
        Message.model_validate({"content": "x", "instruct_content": {"type": f"{PAYLOAD}.Verdict", "value": {}}})
    )
    folder = team.serialize(tmp_path / "team")
    Team.deserialize(folder.parent)
    nothing_ran(payload)


@pytest.mark.parametrize("named", ["inside", "module"])
def test_resume_and_fork_refuse_a_scenario_the_run_directory_names_without_trust(
    tmp_path: Path, payload: Path, monkeypatch: pytest.MonkeyPatch, named: str
) -> None:
    run_dir = tmp_path / "runs" / "r"
    assert invoke("run", "debate", "--llm", "test:1", "--set", "turns=1", "--out", str(run_dir)).exit_code == 0
    manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    if named == "inside":  # a .py the sender put in the run directory, which lies in the current folder
        (run_dir / "evil.py").write_text(f"import {PAYLOAD}\n")
        manifest["scenario"] = str(run_dir / "evil.py")
    else:
        manifest["scenario"] = f"{PAYLOAD}.scenario"  # as venv.__main__: importing it runs it
    (run_dir / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    for args in (["resume", str(run_dir)], ["fork", str(run_dir), "--from-round", "1"]):
        result = invoke(*args)
        assert result.exit_code == 2 and "--trust" in result.output, result.output
        nothing_ran(payload)


def test_list_imports_a_scenario_file_outside_the_folder_or_a_module_only_with_trust(
    tmp_path: Path, payload: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    outside = tmp_path / "x.py"
    outside.write_text(f"import {PAYLOAD}\n")
    for named in (str(outside), "../x.py", PAYLOAD + ".x", "this.x"):
        done = invoke("list", named)
        assert done.exit_code == 2 and "--trust" in done.output, (named, done.output)
    assert not payload.exists(), "nothing was imported"
    own = here / "mine.py"
    own.write_text(
        "from pydantic import BaseModel\nclass Config(BaseModel):\n    n: int = 1\ndef build(c, llm): pass\n"
    )
    assert "n: int = 1" in invoke("list", "mine.py").output, "a file in the current folder is the user's own"
    assert invoke("list", str(outside), "--trust").exit_code != 0 or payload.exists()
    assert payload.exists(), "--trust imports it"
