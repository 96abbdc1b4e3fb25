"""Runs whose roles use MCP servers' tools, from the command line: recorded, replayed without the servers.

Real servers: Node's reference filesystem server over stdio, and the SDK's own server over
streamable HTTP on 127.0.0.1. Every run is its own ``metaroles`` process.
"""

import json
from pathlib import Path

import pytest

from metaroles.cli import main
from tests.mcp_notes import OverHTTP
from tests.test_determinism import assert_same_bytes, contents, metaroles
from tests.test_mcp import FILESYSTEM, NOTES

TASK = "Add the numbers in numbers.txt and write the sum to sum.txt."


def call(name: str, **arguments: object) -> dict:
    return {"content": f"calling {name}", "tool_calls": [{"name": name, "arguments": arguments}]}


DONE = {"content": "The sum is 42.", "tool_calls": [{"name": "terminate", "arguments": {"status": "success"}}]}


def scripted(folder: Path, *steps: dict) -> str:
    path = folder / "script.json"
    path.write_text(json.dumps({"Assistant": {"think": [*steps, DONE]}}))
    return f"scripted:{path}"


def tool_results(run_dir: Path) -> list[tuple[str, str]]:
    """Each tool call's name and what the agent observed, from the run's saved state."""
    state = json.loads((run_dir / "state.json").read_text())
    messages = next(r for r in state["roles"] if r["name"] == "Assistant")["extra"]["messages"]
    return [(m["name"], m["content"]) for m in messages if m["role"] == "tool"]


def test_an_agent_does_its_task_with_node_and_http_servers_and_replays_without_them_elsewhere(tmp_path):
    if not FILESYSTEM.is_file():
        pytest.fail("Node's MCP filesystem server is needed: run `make need-mcp-servers` (make test does)")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "numbers.txt").write_text("20 22")
    llm = scripted(
        tmp_path,
        call("files__read_text_file", path=str(shared / "numbers.txt")),
        call("notes__add", a=20, b=22),
        call("files__write_file", path=str(shared / "sum.txt"), content="42"),
    )
    common = ["--seed", "7", "--idea", TASK, "-q"]
    http = OverHTTP()
    try:
        metaroles(
            "run", "assistant", "--llm", llm, "--mcp", f"files={FILESYSTEM} {shared}", "--mcp", f"notes={http.url}",
            "--record", str(tmp_path / "calls.jsonl"), "--out", str(tmp_path / "live"), *common, hash_seed=1,
        )  # fmt: skip
    finally:
        http.stop()  # absent from here on
    observed = tool_results(tmp_path / "live")
    assert [name for name, _ in observed] == ["files__read_text_file", "notes__add", "files__write_file", "terminate"]
    assert "20 22" in observed[0][1] and observed[1][1].endswith("42")
    assert (shared / "sum.txt").read_text() == "42"
    (shared / "sum.txt").unlink()
    manifest = json.loads((tmp_path / "live" / "manifest.json").read_text())
    assert [s["name"] for s in manifest["mcp"]["servers"]] == ["files", "notes"]
    metaroles("run", "assistant", "--replay", str(tmp_path / "calls.jsonl"), "--out", str(tmp_path / "replay"),
              *common, hash_seed=2)  # fmt: skip
    assert_same_bytes(contents(tmp_path / "live"), contents(tmp_path / "replay"))
    assert not (shared / "sum.txt").exists(), "a replay calls no server"


def test_permissions_ask_a_person_deny_and_the_decisions_replay_without_asking(tmp_path):
    steps = call("notes__add", a=1, b=2), call("notes__shout", text="hi"), call("notes__add", a=3, b=4)
    llm = scripted(tmp_path, *steps)
    rules = ["--permit", "Assistant:notes__add=ask", "--permit", "*:notes__sh*=deny"]
    common = ["--seed", "3", "--idea", TASK, "-q"]
    record = [*common, "--record", str(tmp_path / "calls.jsonl"), "--out", str(tmp_path / "live")]
    asked = metaroles(
        "run", "assistant", "--llm", llm, "--mcp", f"notes={' '.join(NOTES)}", *rules, *record, hash_seed=1,
        stdin="no\nyes\n",
    )  # fmt: skip
    assert asked.stderr.count("Assistant asks to call the tool notes__add") == 2
    observed = tool_results(tmp_path / "live")
    assert observed[0] == ("notes__add", "Error: Assistant may not call notes__add: asked, and not allowed")
    denied = "Error: Assistant may not call notes__shout: denied by the run's permissions"
    assert observed[1] == ("notes__shout", denied)
    assert observed[2][1].endswith("7")
    replayed = metaroles(
        "run", "assistant", "--replay", str(tmp_path / "calls.jsonl"), "--out", str(tmp_path / "replay"), *common,
        hash_seed=2, stdin="",
    )  # fmt: skip
    assert "asks to call" not in replayed.stderr, "a replay asks nobody"
    assert_same_bytes(contents(tmp_path / "live"), contents(tmp_path / "replay"))


def test_a_server_that_dies_mid_run_is_one_line_and_the_run_resumes_to_what_its_replay_gives(tmp_path):
    flag = tmp_path / "die"
    flag.write_text("")
    llm = scripted(tmp_path, call("notes__add", a=2, b=2), call("notes__die_if", path=str(flag)))
    common = ["--seed", "5", "--idea", TASK, "-q"]
    run_dir = tmp_path / "live"
    failed = metaroles(
        "run", "assistant", "--llm", llm, "--mcp", f"notes={' '.join(NOTES)}",
        "--record", str(tmp_path / "calls.jsonl"), "--out", str(run_dir), *common, hash_seed=1, code=1,
    )  # fmt: skip
    said = [line for line in failed.stderr.splitlines() if not line.startswith("model: ")]
    assert len(said) == 1 and "MCP server 'notes' stopped answering" in said[0], failed.stderr
    assert said[0].endswith(f"metaroles resume {run_dir}") and "Traceback" not in failed.stderr
    flag.unlink()  # the server runs again
    refused = metaroles("resume", str(run_dir), "-q", hash_seed=2, code=2)  # its manifest names a command: code
    said = [line for line in refused.stderr.splitlines() if not line.startswith("model: ")]
    assert len(said) == 1 and said[0].startswith("error: this run starts the MCP servers its manifest names (")
    metaroles("resume", str(run_dir), "-q", "--trust", hash_seed=2)
    observed = dict(tool_results(run_dir))  # (a scripted model starts its script again in a new process)
    assert observed["notes__add"].endswith("4") and observed["notes__die_if"].endswith("alive")
    assert "terminate" in observed
    metaroles("run", "assistant", "--replay", str(tmp_path / "calls.jsonl"), "--out", str(tmp_path / "replay"),
              *common, hash_seed=3)  # fmt: skip
    assert_same_bytes(contents(run_dir), contents(tmp_path / "replay"))


def test_bad_servers_and_rules_are_one_line_and_leave_nothing_behind(tmp_path, capsys):
    cases = {
        ("--mcp", "x=/nonexistent/server"): "MCP server 'x' did not start: command '/nonexistent/server' not found",
        ("--mcp", f"notes={' '.join(NOTES)} --crash"): "it said: notes: cannot read its conf",
        ("--mcp", "bad name=x"): "error: --mcp 'bad name=x': String should match pattern",
        ("--permit", "Assistant:notes__add"): "error: --permit (permissions) needs --mcp",
        ("--mcp", f"notes={' '.join(NOTES)}", "--permit", "Assistant:x=maybe"): "is not ROLE:TOOL=DECISION",
    }
    for number, (given, said) in enumerate(cases.items()):
        out = tmp_path / f"run{number}"
        assert main(["run", "assistant", "--llm", "test", *given, "--out", str(out), "-q"]) == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("model: ")]
        assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], lines
        assert not out.exists(), "nothing written for a run that never started"
    assert main(["run", "debate", "--llm", "test", "--mcp", f"notes={' '.join(NOTES)}", "-q", "--no-save"]) == 2
    assert "scenario 'debate' takes no tools" in capsys.readouterr().err
