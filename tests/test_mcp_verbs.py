"""``metaroles mcp``: an assistant drives experiments through the project's verbs, as MCP tools over stdio."""

import json
import sys

from metaroles.agents.mcp import MCPClient, MCPServer
from metaroles.agents.tool import ToolCollection


async def test_an_assistant_lists_runs_shows_forks_diffs_evaluates_and_exports_inside_its_root(tmp_path):
    server = MCPServer(name="lab", command=[sys.executable, "-m", "metaroles", "mcp", "--root", str(tmp_path)])
    async with MCPClient([server]) as client:
        assert client.revisions == {"lab": "2026-07-28"}, "met without a handshake, at the current revision"
        tools = ToolCollection(*client.tools)
        assert [t.name for t in client.tools] == [f"lab__{verb}" for verb in  # a stable order: as they are made
            ["run", "fork", "eval", "list_scenarios", "show", "diff", "export"]]  # fmt: skip

        async def call(verb: str, **arguments: object):
            return await tools.execute(name=f"lab__{verb}", tool_input=arguments)

        assert "debate\t" in (await call("list_scenarios")).output
        assert "turns" in (await call("list_scenarios", scenario="debate")).output
        ran = await call("run", scenario="debate", llm="test", seed=7, options={"turns": 1}, out="runs/first")
        assert f"run directory: {tmp_path / 'runs' / 'first'}" in ran.output
        assert "[Alice → Bob, Judge] (SpeakAloud)" in (await call("show", run_dir="runs/first")).output
        forked = await call("fork", run_dir="runs/first", from_round=1, idea="Consider buses.", out="runs/second")
        assert "runs/second" in forked.output
        parted = await call("diff", run_a="runs/first", run_b="runs/second")
        assert "first divergence in round 1" in parted.output and "Consider buses." in parted.output
        exported = await call("export", run_dir="runs/first")
        table = (tmp_path / "runs" / "first" / "export" / "events.jsonl").read_text().splitlines()
        assert "wrote" in exported.output and json.loads(table[0])["kind"]
        evaluated = await call("eval", suite="debate", llm="test", seeds=1)
        assert evaluated.error is None and (tmp_path / "evals" / "debate" / "report.md").is_file()

        refused = {
            "run": await call("run", scenario="evil.py"),
            "show": await call("show", run_dir="../.."),
            "eval": await call("eval", suite=str(tmp_path)),
            "bad option": await call("run", scenario="debate", llm="test", options={"turns": "many"}),
        }
    assert "no scenario named 'evil.py'" in refused["run"].error and "--trust" in refused["run"].error
    assert "is outside" in refused["show"].error and "no suite named" in refused["eval"].error
    assert "metaroles run failed (exit 2): error: option turns='many'" in refused["bad option"].error
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["first", "second"], "nothing else written"


async def test_no_verb_imports_code_or_reads_a_file_outside_the_root_without_trust(tmp_path):
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir(), elsewhere.mkdir()
    planted = elsewhere / "ran"
    payload = f"open({str(planted)!r}, 'w').write('imported')\nclass Config: pass\ndef build(config, llm): pass\n"
    for where in (elsewhere / "x.py", root / "x.py"):
        where.write_text(payload)
    script = elsewhere / "s.json"
    script.write_text(json.dumps({"Alice": {"SpeakAloud": ["secret text from outside"]}}))
    people = elsewhere / "people.csv"
    people.write_text("bio,stance\nA spy.,0.5\n")
    server = MCPServer(name="lab", command=[sys.executable, "-m", "metaroles", "mcp", "--root", str(root)])
    async with MCPClient([server]) as client:
        tools = ToolCollection(*client.tools)

        async def call(verb: str, **arguments: object):
            return await tools.execute(name=f"lab__{verb}", tool_input=arguments)

        listed = [
            await call("list_scenarios", scenario=name)
            for name in (str(elsewhere / "x.py"), "../elsewhere/x.py", "x.py", "this.x", "venv.__main__")
        ]
        ran = [
            await call("run", scenario="debate", llm=f"scripted:{script}"),
            await call("run", scenario="debate", llm="replay:/etc/passwd"),
            await call("run", scenario="debate", llm="test", options={"role.Alice.llm": f"scripted:{script}"}),
            await call("run", scenario="feed", llm="test", options={"personas": str(people)}),
            await call("run", scenario="feed", llm="test", options={"personas": "../elsewhere/people.csv"}),
            await call("eval", suite="debate", llm=f"replay:{script}"),
        ]
    assert all("no scenario named" in r.error and "--trust" in r.error for r in listed), [r.error for r in listed]
    assert all("is outside" in r.error for r in ran), [r.error for r in ran]
    assert not planted.exists(), "no scenario file was imported"
    assert sorted(p.name for p in root.iterdir()) == ["x.py"], "nothing was written in the root"


async def test_a_file_inside_the_root_may_be_named(tmp_path):
    (tmp_path / "people.csv").write_text("bio,stance\nA nurse.,0.5\nA student.,-0.5\n")
    server = MCPServer(name="lab", command=[sys.executable, "-m", "metaroles", "mcp", "--root", str(tmp_path)])
    async with MCPClient([server]) as client:
        tools = ToolCollection(*client.tools)
        ran = await tools.execute(
            name="lab__run",
            tool_input={"scenario": "feed", "llm": "test", "rounds": 1,
                        "options": {"agents": 4, "personas": "people.csv"}, "out": "runs/feed"},
        )  # fmt: skip
    assert ran.error is None, ran.error
    manifest = json.loads((tmp_path / "runs" / "feed" / "manifest.json").read_text())
    assert manifest["config"]["personas"] == str(tmp_path / "people.csv")
