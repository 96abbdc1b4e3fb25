"""A2A v1.0: a role served as an agent (card, JSON-RPC, streaming), a remote agent as a member, replayed without it."""

import json
import os
import subprocess
import sys

import httpx
import pytest
from a2a.types import AgentCard
from google.protobuf import json_format

from metaroles import TestLLM
from metaroles.agents.a2a import CARD_PATH, RoleServer
from metaroles.cli import main
from metaroles.core.installed import version
from metaroles.project.scenario import built_team
from tests.test_determinism import assert_same_bytes, contents, metaroles
from tests.test_mcp import _free_port


def rpc(method: str, text: str) -> dict:
    message = {"messageId": f"m-{method}", "role": "ROLE_USER", "parts": [{"text": text}]}
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"message": message}}


def test_a_served_role_has_its_card_at_the_well_known_path_answers_json_rpc_and_streams():
    alice = built_team("debate", {}, TestLLM(3)).env.roles["Alice"]
    with RoleServer(alice) as server, httpx.Client(base_url=server.url, headers={"A2A-Version": "1.0"}) as http:
        card = http.get(CARD_PATH).json()
        assert card["name"] == "Alice" and card["capabilities"]["streaming"] is True
        parsed = json_format.ParseDict(card, AgentCard())  # the SDK's own type: an unknown field is refused
        assert parsed.version == version("metaroles") and not parsed.capabilities.push_notifications
        assert [(k.id, k.name, list(k.output_modes)) for k in parsed.skills] == [
            (a.action_id(), a.name, ["text/plain"]) for a in alice.actions
        ] and [k.id for k in parsed.skills] == ["metaroles.actions.debate.SpeakAloud"]
        assert parsed.description.startswith(f"Alice, {alice.profile} of a metaroles society")
        assert card["supportedInterfaces"][0] == {
            "url": server.url,
            "protocolBinding": "JSONRPC",
            "protocolVersion": "1.0",
        }
        task = http.post("/", json=rpc("SendMessage", "Should cities ban cars?")).json()["result"]["task"]
        assert task["status"]["state"] == "TASK_STATE_COMPLETED"
        said = task["artifacts"][0]["parts"][0]["text"]
        assert said and said == alice.rc.memory.get()[-1].content, "the role's own turn is the answer"
        with http.stream("POST", "/", json=rpc("SendStreamingMessage", "And buses?")) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            events = [json.loads(line[5:])["result"] for line in stream.iter_lines() if line.startswith("data:")]
    kinds = [next(iter(event)) for event in events]
    assert kinds == ["task", "statusUpdate", "artifactUpdate", "statusUpdate"]
    assert events[1]["statusUpdate"]["status"]["state"] == "TASK_STATE_WORKING"
    assert events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"


def test_a_role_served_by_one_process_joins_anothers_society_and_the_society_replays_without_it(tmp_path):
    served = subprocess.Popen(
        [sys.executable, "-m", "metaroles", "a2a", "debate", "Alice", "--llm", "test", "--seed", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONHASHSEED": "4"},
    )  # fmt: skip
    try:
        line = served.stdout.readline()
        assert line.startswith("serving Alice of debate as an A2A agent at http://127.0.0.1:"), line
        url = line.split(" at ")[1].split()[0]
        common = ["--seed", "7", "--set", "turns=1", "-q"]
        metaroles("run", "debate", "--llm", "test", "--a2a", f"Critic={url}", "--record", str(tmp_path / "calls.jsonl"),
                  "--out", str(tmp_path / "live"), *common, hash_seed=1)  # fmt: skip
    finally:
        served.terminate()
        served.wait(60)
    state = json.loads((tmp_path / "live" / "state.json").read_text())
    critic = [m for m in state["history"] if m["sent_from"] == "Critic"]
    assert len(critic) == 1 and critic[0]["content"] and not critic[0]["content"].startswith("(no answer")
    assert json.loads((tmp_path / "live" / "manifest.json").read_text())["a2a"] == {"Critic": url}
    metaroles("run", "debate", "--llm", "test", "--replay", str(tmp_path / "calls.jsonl"),
              "--out", str(tmp_path / "replay"), *common, hash_seed=2)  # fmt: skip
    assert_same_bytes(contents(tmp_path / "live"), contents(tmp_path / "replay"))


def test_an_agent_card_at_a_dead_url_is_one_line_naming_the_agent_and_nothing_is_written(tmp_path, capsys):
    dead = f"http://127.0.0.1:{_free_port()}"
    for given, said in [
        (f"Critic={dead}", f"error: A2A agent 'Critic' has no card at {dead}{CARD_PATH}"),
        ("Critic", "error: --a2a 'Critic' is not NAME=URL"),
    ]:
        out = tmp_path / "run"
        assert main(["run", "debate", "--llm", "test", "--a2a", given, "--out", str(out), "-q"]) == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("model: ")]
        assert len(lines) == 1 and lines[0].startswith(said), lines
        assert not out.exists()


async def test_an_agent_that_stops_answering_is_a_run_error_and_the_tape_keeps_only_what_it_said(tmp_path):
    from metaroles.agents.a2a import A2AAgent, A2AAgentGone
    from metaroles.agents.mcp import ToolCassette

    alice = built_team("debate", {}, TestLLM(3)).env.roles["Alice"]
    server = RoleServer(alice)
    cassette = ToolCassette(tmp_path / "tools.jsonl", "record")
    async with A2AAgent("Alice", server.url, cassette=cassette) as agent:
        assert (await agent.send("Cars?")).output
        server.stop()
        with pytest.raises(A2AAgentGone, match=r"A2A agent 'Alice' at http://127\.0\.0\.1:\d+ stopped answering"):
            await agent.send("Still there?")
    async with A2AAgent("Alice", "http://127.0.0.1:9", cassette=ToolCassette(cassette.path, "replay")) as agent:
        assert (await agent.send("Cars?")).output, "what was answered before replays"
        missed = await agent.send("Still there?")
    assert "was not called with" in missed.error, "what never got an answer is not made up"


def test_a_served_role_refuses_bodies_past_the_limit_and_other_hosts(tmp_path):
    from metaroles.core.guard import MAX_BODY

    alice = built_team("debate", {}, TestLLM(3)).env.roles["Alice"]
    with RoleServer(alice) as server, httpx.Client(base_url=server.url, headers={"A2A-Version": "1.0"}) as http:
        port = server.url.rsplit(":", 1)[1]
        assert http.post("/", content=b"{" + b" " * MAX_BODY + b"}").status_code == 413

        def trickled():  # no Content-Length: the body is counted as it streams
            for _ in range(MAX_BODY // (1 << 20) + 2):
                yield b" " * (1 << 20)

        assert http.post("/", content=trickled()).status_code == 413
        assert http.get(CARD_PATH, headers={"Host": f"evil.example:{port}"}).status_code == 421
        assert http.get(CARD_PATH).status_code == 200, "the server is still there"
    assert not alice.rc.memory.get(), "nothing reached the role"


async def test_a_remote_answer_past_the_limit_is_kept_cut_and_credentials_stay_off_disk(tmp_path):
    from metaroles import Action, Role
    from metaroles.agents.a2a import A2AAgent
    from metaroles.agents.mcp import ToolCassette
    from metaroles.core.guard import MAX_ANSWER

    class Flood(Action):
        async def run(self, history):
            return "y" * (5 * MAX_ANSWER)

    with RoleServer(Role(name="Flooder", actions=[Flood])) as server:
        url = server.url.replace("http://", "http://user:pa55word@")
        cassette = ToolCassette(tmp_path / "tools.jsonl", "record")
        async with A2AAgent("Flooder", url, cassette=cassette) as agent:
            answer = (await agent.send("Say a lot.")).output
    assert MAX_ANSWER < len(answer) < MAX_ANSWER + 200 and "answer cut" in answer
    written = (tmp_path / "tools.jsonl").read_text()
    assert len(written) < 2 * MAX_ANSWER and "pa55word" not in written


def test_an_agents_credentials_are_not_in_the_manifest(tmp_path):
    served = subprocess.Popen(
        [sys.executable, "-m", "metaroles", "a2a", "debate", "Alice", "--llm", "test", "--seed", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        url = served.stdout.readline().split(" at ")[1].split()[0].replace("http://", "http://critic:pa55word@")
        metaroles("run", "debate", "--llm", "test", "--a2a", f"Critic={url}", "--record", str(tmp_path / "calls.jsonl"),
                  "--out", str(tmp_path / "live"), "--set", "turns=1", "-q", hash_seed=1)  # fmt: skip
    finally:
        served.terminate()
        served.wait(60)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files and not [p for p in files if b"pa55word" in p.read_bytes()]
    assert json.loads((tmp_path / "live" / "manifest.json").read_text())["a2a"]["Critic"].startswith("http://***@")


async def test_a_served_role_answers_http_json_as_application_a2a_json_and_the_sdks_client_uses_it():
    from a2a.client import ClientConfig, create_client
    from a2a.types import Message, Part, Role, SendMessageRequest

    alice = built_team("debate", {}, TestLLM(3)).env.roles["Alice"]
    with RoleServer(alice) as server:
        async with httpx.AsyncClient(base_url=server.url, headers={"A2A-Version": "1.0"}) as http:
            card = (await http.get(CARD_PATH)).json()
            assert [i["protocolBinding"] for i in card["supportedInterfaces"]] == ["JSONRPC", "HTTP+JSON"]
            message = {"messageId": "m-rest", "role": "ROLE_USER", "parts": [{"text": "Should cities ban cars?"}]}
            sent = await http.post("/message:send", json={"message": message},
                                   headers={"content-type": "application/a2a+json"})  # fmt: skip
            assert sent.status_code == 200 and sent.headers["content-type"].startswith("application/a2a+json")
            assert sent.json()["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
            rest = ClientConfig(streaming=False, httpx_client=http, supported_protocol_bindings=["HTTP+JSON"])
            client = await create_client(server.url, rest)
            request = SendMessageRequest(message=Message(role=Role.ROLE_USER, parts=[Part(text="And buses?")],
                                                         message_id="m-sdk"))  # fmt: skip
            answers = [event async for event in client.send_message(request)]
            await client.close()
    assert answers and answers[-1].task.artifacts[0].parts[0].text == alice.rc.memory.get()[-1].content
