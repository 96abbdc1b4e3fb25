"""``metaroles mcp``: an assistant drives experiments through the project's verbs, as MCP tools over stdio."""

import json
import sys

from metaroles.agents.mcp import MCPClient, MCPServer
from metaroles.agents.tool import ToolCollection


async def test_an_assistant_lists_runs_shows_forks_diffs_evaluates_and_exports_inside_its_root(tmp_path):
    server = MCPServer(name="lab", command=[sys.executable, "-m", "metaroles", "mcp", "--root", str(tmp_path)])
    async with MCPClient([server]) as client:
        tools = ToolCollection(*client.tools)
        assert sorted(tools.tool_map) == [f"lab__{verb}" for verb in sorted(
            ["list_scenarios", "run", "show", "fork", "diff", "eval", "export"]
        )]  # fmt: skip

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
