"""Tools from real MCP servers (the official SDK, stdio and streamable HTTP), recorded, replayed without them."""

import json
import sys
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaroles import ScriptedLLM
from metaroles.agents.agent import ToolCallAgent
from metaroles.agents.mcp import MCPClient, MCPServer, MCPServerGone, MCPWarning, ToolCassette
from metaroles.agents.permissions import Permissions
from metaroles.agents.tool import Terminate, ToolCollection, ToolFailure, ToolResult
from metaroles.core.exceptions import ConfigError, ToolError
from metaroles.flow.link import bind
from tests.mcp_notes import OverHTTP

NOTES = [sys.executable, str(Path(__file__).with_name("mcp_notes.py"))]
FILESYSTEM = Path(__file__).parents[1] / "build" / "node" / "node_modules" / ".bin" / "mcp-server-filesystem"
CALLS = [
    ("notes__add", {"a": 2, "b": 3}),
    ("notes__shout", {"text": "storm"}),
    ("notes__fail", {"why": "the disk is full"}),
    ("notes__add", {"a": "two", "b": 3}),  # the schema refuses it before the server sees it
    ("notes__secret", {}),
]


def stdio(**options) -> MCPServer:
    return MCPServer(name="notes", command=NOTES, **options)


async def results(client: MCPClient) -> list[str]:
    tools = ToolCollection(*client.tools)
    return [repr(await tools.execute(name=name, tool_input=arguments)) for name, arguments in CALLS]


async def test_a_stdio_servers_tools_are_called_and_replay_answers_them_with_no_server(tmp_path):
    cassette = tmp_path / "tools.jsonl"
    server = stdio(env={"NOTES_TOKEN": "s3cr3t-token"})
    async with MCPClient([server], cassette=ToolCassette(cassette, "record")) as client:
        assert {t.name for t in client.tools} >= {"notes__add", "notes__shout", "notes__fail", "notes__slow"}
        live = await results(client)
    assert live[0].startswith("ToolResult(output='5'") and "'STORM'" in live[1]
    assert "ToolFailure" in live[2] and "MCP tool notes.fail" in live[2]
    assert "ToolFailure" in live[3] and "argument 'a'='two' must be of JSON type integer" in live[3]
    assert "'has a token'" in live[4]  # the server had its secret ...
    assert b"s3cr3t-token" not in cassette.read_bytes()  # ... and the cassette never did
    assert "s3cr3t-token" not in str(server.recorded()), "nor what a run's manifest keeps of the server"
    gone = MCPServer(name="notes", command=["/nonexistent/notes-server"])  # replay starts no server
    async with MCPClient([gone], cassette=ToolCassette(cassette, "replay")) as client:
        assert await results(client) == live


async def test_a_streamable_http_server_gives_the_same_answers(tmp_path):
    server = OverHTTP()
    try:
        async with MCPClient([MCPServer(name="notes", url=server.url)]) as client:
            over_http = await results(client)
    finally:
        server.stop()
    async with MCPClient([stdio()]) as client:
        assert await results(client) == over_http


async def test_a_call_past_its_timeout_is_an_observation_and_the_server_goes_on():
    async with MCPClient([stdio(timeout=0.5)]) as client:
        tools = ToolCollection(*client.tools)
        late = await tools.execute(name="notes__slow", tool_input={"seconds": 600})
        assert isinstance(late, ToolFailure)
        assert late.error == "MCP tool notes.slow gave no answer in 0.5 s (timeout=0.5)"
        assert (await tools.execute(name="notes__add", tool_input={"a": 1, "b": 1})).output == "2"


async def test_an_agent_does_its_task_with_a_servers_tools_and_replays_it_without_the_server(tmp_path):
    script = {"coder": {"think": [
        {"content": "adding", "tool_calls": [{"name": "notes__add", "arguments": {"a": 20, "b": 22}}]},
        {"content": "done", "tool_calls": [{"name": "terminate", "arguments": {"status": "success"}}]},
    ]}}  # fmt: skip

    async def task(mode: str, server: MCPServer) -> list[tuple[str, str]]:
        async with MCPClient([server], cassette=ToolCassette(tmp_path / "tools.jsonl", mode)) as client:
            coder = ToolCallAgent(name="coder", llm=ScriptedLLM(script), tools=[*client.tools, Terminate()])
            await coder.run("What is 20 + 22?")
        return [(str(m.role), m.content or "") for m in coder.messages]

    recorded = await task("record", stdio())
    assert any("executed:\n42" in text for _, text in recorded)
    assert await task("replay", MCPServer(name="notes", command=["/nonexistent/notes-server"])) == recorded


async def test_an_agent_edits_files_through_nodes_filesystem_server_and_replays_it_without_node(tmp_path):
    if not FILESYSTEM.is_file():
        pytest.fail("Node's MCP filesystem server is needed: run `make need-mcp-servers` (make test does)")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "idea.txt").write_text("a game of snakes")

    def read(path: str) -> dict:
        return {"name": "fs__read_text_file", "arguments": {"path": path}}

    script = {"coder": {"think": [
        {"content": "reading", "tool_calls": [read(str(shared / "idea.txt"))]},
        {"content": "peeking", "tool_calls": [read("/etc/hostname")]},
        {"content": "writing", "tool_calls": [
            {"name": "fs__write_file", "arguments": {"path": str(shared / "plan.md"), "content": "1. snakes"}},
        ]},
        {"content": "done", "tool_calls": [{"name": "terminate", "arguments": {"status": "success"}}]},
    ]}}  # fmt: skip

    async def task(mode: str, command: list[str]) -> list[str]:
        cassette = ToolCassette(tmp_path / "fs.jsonl", mode)
        async with MCPClient([MCPServer(name="fs", command=command)], cassette=cassette) as client:
            coder = ToolCallAgent(name="coder", llm=ScriptedLLM(script), tools=[*client.tools, Terminate()])
            await coder.run("Plan the game in plan.md.")
        return [m.content or "" for m in coder.messages]

    recorded = await task("record", [str(FILESYSTEM), str(shared)])
    revision = next(json.loads(line) for line in (tmp_path / "fs.jsonl").read_text().splitlines() if '"tools"' in line)
    assert revision["revision"] < "2026-07-28", "Node's server speaks an earlier revision: initialized as before"
    said = "\n".join(recorded)
    assert "a game of snakes" in said and "Access denied - path outside allowed directories" in said
    assert (shared / "plan.md").read_text() == "1. snakes"
    (shared / "plan.md").unlink()
    assert await task("replay", ["/nonexistent/node"]) == recorded
    assert not (shared / "plan.md").exists()  # replayed: nothing ran


async def test_servers_that_cannot_start_or_die_mid_run_are_one_line_naming_them(tmp_path):
    with pytest.raises(ConfigError, match=r"MCP server 'fs' did not start: command 'no-such-mcp-server' not found"):
        async with MCPClient([MCPServer(name="fs", command=["no-such-mcp-server"])]):
            pass
    crashing = MCPServer(name="notes", command=[*NOTES, "--crash"])
    with pytest.raises(ConfigError, match=r"MCP server 'notes' did not start: .*it said: notes: cannot read its conf"):
        async with MCPClient([crashing]):
            pass
    with pytest.raises(ConfigError, match=r"MCP server 'notes' did not start"):
        async with MCPClient([MCPServer(name="notes", url=f"http://127.0.0.1:{_free_port()}/mcp")]):
            pass
    async with MCPClient([stdio()]) as client:
        tools = ToolCollection(*client.tools)
        with pytest.raises(MCPServerGone, match=r"MCP server 'notes' stopped answering"):
            await tools.execute(name="notes__die", tool_input={})
    with pytest.raises(ConfigError, match="holds no tools of MCP server 'other'"):
        async with MCPClient(
            [MCPServer(name="other", command=["x"])], cassette=ToolCassette(_cassette_of(tmp_path), "replay")
        ):
            pass
    with pytest.raises(ValueError, match=r"needs a command \(stdio\) or a url"):
        MCPServer(name="nothing")


def _free_port() -> int:
    sock = bind(0)
    port = sock.getsockname()[1]
    sock.close()  # nobody listens there now
    return port


def _cassette_of(folder: Path) -> Path:
    path = folder / "empty-tools.jsonl"
    path.write_text("")
    return path


async def test_malformed_content_is_an_observation_and_a_schema_no_model_could_fill_is_left_out_by_name():
    raw = MCPServer(name="raw", command=[sys.executable, str(Path(__file__).with_name("mcp_raw.py"))])
    with pytest.warns(MCPWarning, match=r"MCP server 'raw': its tool 'unfillable' is left out: its input schema"):
        client = await MCPClient([raw]).__aenter__()
    try:
        tools = ToolCollection(*client.tools)
        assert sorted(tools.tool_map) == ["raw__broken", "raw__ok"]
        broken = await tools.execute(name="raw__broken", tool_input={})
        assert (
            broken.error
            == "MCP tool raw.broken answered with malformed content (content: Input should be a valid list)"
        )
        assert (await tools.execute(name="raw__ok", tool_input={})).output == "fine", "the server goes on"
    finally:
        await client.__aexit__(None, None, None)


async def test_permissions_allow_ask_and_deny_per_role_and_the_answers_replay_without_the_policy(tmp_path):
    rules = {"judge": {"notes__add": "deny"}, "coder": {"notes__shout": "allow", "notes__*": "ask"}, "*": {"*": "deny"}}
    permissions = Permissions(rules=rules)
    assert permissions.decision("coder", "notes__shout") == "allow", "a tool's own name before a pattern"
    assert (
        permissions.decision("coder", "notes__add") == "ask" and permissions.decision("judge", "notes__add") == "deny"
    )
    assert permissions.decision("someone", "notes__add") == "deny", "everyone's rules after the role's own"
    with pytest.raises(ConfigError, match="the permissions ask about some calls and nobody is there to ask"):
        MCPClient([stdio()], permissions=permissions)
    asked = []

    async def policy(role: str, tool: str, arguments: dict) -> bool:
        asked.append((role, tool, arguments))
        return arguments.get("a", 0) < 10

    async def calls(client: MCPClient) -> list[str]:
        coder = ToolCollection(*client.tools_for("coder"))
        judge = ToolCollection(*client.tools_for("judge"))
        made = [coder.execute(name="notes__add", tool_input={"a": 1, "b": 2})]
        made += [coder.execute(name="notes__add", tool_input={"a": 50, "b": 2})]
        made += [coder.execute(name="notes__shout", tool_input={"text": "x"})]
        made += [judge.execute(name="notes__add", tool_input={"a": 1, "b": 2})]
        return [repr(await call) for call in made]

    cassette = tmp_path / "tools.jsonl"
    async with MCPClient(
        [stdio()], cassette=ToolCassette(cassette, "record"), permissions=permissions, ask=policy
    ) as client:
        live = await calls(client)
    assert asked == [("coder", "notes__add", {"a": 1, "b": 2}), ("coder", "notes__add", {"a": 50, "b": 2})]
    assert "output='3'" in live[0] and "coder may not call notes__add: asked, and not allowed" in live[1]
    assert "'X'" in live[2] and "judge may not call notes__add: denied by the run's permissions" in live[3]
    async with MCPClient([stdio()], cassette=ToolCassette(cassette, "replay"), permissions=permissions) as client:
        assert await calls(client) == live  # nobody asked: the decisions are on the cassette
    assert len(asked) == 2


async def test_a_servers_resources_and_prompts_are_readable_and_replay_without_it(tmp_path):
    cassette = tmp_path / "tools.jsonl"

    async def read(client: MCPClient) -> tuple[str, str, str, list[str]]:
        reader = next(t for t in client.tools if t.name == "notes__read_resource")
        assert reader.parameters["properties"]["uri"]["enum"] == ["notes://today"]
        assert "notes://today: Today's note" in reader.description
        tools = ToolCollection(*client.tools)
        text = (await tools.execute(name="notes__read_resource", tool_input={"uri": "notes://today"})).output
        refused = await tools.execute(name="notes__read_resource", tool_input={"uri": "notes://nope"})
        with pytest.raises(ToolError, match=r"MCP tool notes\.prompts/get 'nosuch': "):
            await client.prompt("notes", "nosuch")
        return text, refused.error, await client.prompt("notes", "greet", {"name": "Ann"}), sorted(tools.tool_map)

    async with MCPClient([stdio()], cassette=ToolCassette(cassette, "record")) as client:
        live = await read(client)
    assert live[0] == "buy milk" and "argument 'uri'='notes://nope' must be one of ['notes://today']" in live[1]
    assert live[2] == "user: Say hello to Ann."
    async with MCPClient(
        [MCPServer(name="notes", command=["/nonexistent"])], cassette=ToolCassette(cassette, "replay")
    ) as client:
        assert await read(client) == live


calls = st.lists(
    st.tuples(
        st.sampled_from(["notes", "files"]),
        st.sampled_from(["add", "shout"]),
        st.dictionaries(st.sampled_from(["a", "b", "text"]), st.integers(-3, 3) | st.text(max_size=5), max_size=2),
        st.sampled_from([None, "Ann", "Ben"]),
        st.booleans(),
        st.text(max_size=8),
    ),
    max_size=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(made=calls)
def test_a_cassette_answers_every_recorded_call_with_its_own_result_in_order_and_nothing_else(tmp_path_factory, made):
    path = tmp_path_factory.mktemp("cassette") / "tools.jsonl"
    recording = ToolCassette(path, "record")
    for server, tool, arguments, role, failed, text in made:
        result = ToolFailure(error=text or "x") if failed else ToolResult(output=text)
        recording.wrote_call(server, tool, arguments, result, role)
    replaying = ToolCassette(path, "replay")
    for server, tool, arguments, role, failed, text in made:
        answer = replaying.answer(server, tool, arguments, role)
        assert (answer.error, answer.output) == ((text or "x", None) if failed else (None, text))
    assert all(replaying.held(s, t, a, r) is None for s, t, a, r, _, _ in made), "each answered once"


async def test_a_person_on_the_watch_page_allows_or_refuses_a_call_and_silence_is_no():
    from metaroles.agents.permissions import desk_asker
    from metaroles.llm.human import PageDesk

    desk = PageDesk()
    ask = desk_asker(desk, seconds=60)

    async def answer(text: str) -> None:
        while not desk.pending():
            await anyio.wait_all_tasks_blocked()
        question = desk.pending()[0]
        assert (
            question.role == "coder" and "notes__add" in question.prompt and question.fields == {"allow": ["yes", "no"]}
        )
        desk.answer(question.number, text)

    for said, allowed in (("yes", True), ("no", False), ("maybe", False)):
        async with anyio.create_task_group() as group:
            group.start_soon(answer, said)
            assert await ask("coder", "notes__add", {"a": 1}) is allowed
    assert await desk_asker(PageDesk(), seconds=0.01)("coder", "notes__add", {}) is False


async def test_credentials_never_reach_an_error_a_manifest_or_a_cassette_of(tmp_path):
    token = "s3cr3t-token-value"
    crashing = MCPServer(name="notes", command=[*NOTES, "--crash"], env={"NOTES_TOKEN": token})
    with pytest.raises(ConfigError) as refused:
        async with MCPClient([crashing]):
            pass
    said = str(refused.value)
    assert "it said: notes: cannot read its configuration" in said and token not in said, said
    assert "http://***@127.0.0.1:1/db" in said
    served = OverHTTP()
    try:
        url = served.url.replace("http://", "http://user:pa55word@")
        cassette = ToolCassette(tmp_path / "tools.jsonl", "record")
        async with MCPClient([MCPServer(name="notes", url=url)], cassette=cassette) as client:
            assert (await ToolCollection(*client.tools).execute(name="notes__add", tool_input={"a": 1, "b": 2})).output
    finally:
        served.stop()
    recorded = MCPServer(name="notes", url=url).recorded()
    assert "pa55word" not in str(recorded) and recorded["url"].startswith("http://***@127.0.0.1:")
    assert "pa55word" not in (tmp_path / "tools.jsonl").read_text()


async def test_an_answer_past_the_limit_is_kept_cut_with_a_note():
    from mcp import types

    from metaroles.agents.mcp import observed
    from metaroles.core.guard import MAX_ANSWER

    huge = types.CallToolResult(content=[types.TextContent(type="text", text="x" * (3 * MAX_ANSWER))])
    kept = observed(huge, "'notes__big'").output
    assert len(kept) < MAX_ANSWER + 200 and kept.endswith(
        f"{2 * MAX_ANSWER:,} more characters than the {MAX_ANSWER:,} kept]"
    )


async def test_a_tools_list_that_cannot_be_read_names_the_server_in_one_line():
    deep = MCPServer(name="raw", command=[sys.executable, str(Path(__file__).with_name("mcp_raw.py")), "--deep"],
                     start_timeout=10)  # fmt: skip
    with pytest.raises(ConfigError, match=r"MCP server 'raw' did not list its tools in 10 s"):
        async with MCPClient([deep]):
            pass


def test_a_cassette_that_is_not_text_is_one_line_naming_it(tmp_path):
    cassette = tmp_path / "tools.jsonl"
    cassette.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    with pytest.raises(ConfigError, match=r"tools.jsonl' is not text \(byte 0 is not UTF-8\)"):
        ToolCassette(cassette, "replay")


async def test_each_server_is_met_at_the_newest_revision_it_speaks_and_an_unknown_one_is_one_line(tmp_path):
    async with MCPClient([stdio()]) as client:  # the SDK's server: 2026-07-28, no handshake
        assert client.revisions == {"notes": "2026-07-28"}
        assert repr(await client.call("notes", "add", {"a": 2, "b": 3})).startswith("ToolResult(output='5'")
    raw = [sys.executable, str(Path(__file__).with_name("mcp_raw.py"))]
    cassette = tmp_path / "tools.jsonl"
    async with MCPClient([MCPServer(name="raw", command=raw)], cassette=ToolCassette(cassette, "record")) as client:
        assert client.revisions == {"raw": "2025-11-25"}, "a server before it: initialized as before"
        assert "fine" in repr(await client.call("raw", "ok", {}))
    assert '"revision": "2025-11-25"' in cassette.read_text(), "the cassette says which revision answered"
    unknown = MCPServer(name="raw", command=[*raw, "--revision", "1999-01-01"])
    with pytest.raises(ConfigError) as refused:
        async with MCPClient([unknown]):
            pass
    said = str(refused.value)
    assert "'raw'" in said and "1999-01-01" in said and "\n" not in said


def test_the_tool_tapes_old_names_still_work_and_say_their_new_ones(tmp_path):
    import metaroles.agents.a2a as a2a
    import metaroles.agents.mcp as mcp
    import metaroles.llm.proxy as proxy

    with pytest.warns(DeprecationWarning, match="ToolTape is now ToolCassette"):
        assert mcp.ToolTape is ToolCassette
    with pytest.warns(DeprecationWarning, match="tape_beside is now tool_cassette_beside"):
        assert mcp.tape_beside(tmp_path / "calls.jsonl") == tmp_path / "calls.tools.jsonl"
    cassette = ToolCassette(tmp_path / "calls.tools.jsonl", "record")
    with pytest.warns(DeprecationWarning, match="tape= is now cassette="):
        assert MCPClient([], tape=cassette).cassette is cassette
    with pytest.warns(DeprecationWarning, match="tape= is now cassette="):
        assert a2a.A2AAgent("Critic", "http://127.0.0.1:9", tape=cassette).cassette is cassette
    with pytest.warns(DeprecationWarning, match="Tape is now ExchangeCassette"):
        assert proxy.Tape is proxy.ExchangeCassette
    with pytest.raises(AttributeError, match="no attribute 'Tapes'"):
        _ = mcp.Tapes
