"""People in the loop: a person plays a role (terminal, page, is_human); recorded, the run replays without them."""

import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, create_model

from metaroles import Action, HumanRole, LLMRequest, Role, Team, TestLLM
from metaroles.llm.human import HumanLLM, HumanQuestion, PageDesk, parse_answer

WEREWOLF = ["werewolf", "--llm", "test", "--seed", "2", "-q"]
SAME = ("events.jsonl", "state.json", "metrics.jsonl", "transcript.md")


def metaroles(*argv: str, stdin: str = "", timeout: float = 180) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "metaroles", *argv]
    return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=timeout)


def same_run(one: Path, two: Path) -> None:
    for name in SAME:
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    for path in sorted((one / "checkpoints").iterdir()):
        assert path.read_bytes() == (two / "checkpoints" / path.name).read_bytes(), path.name


def test_a_person_plays_a_werewolf_at_the_terminal_and_the_cassette_replays_the_game_without_them(tmp_path):
    answers = "Ben\nI suspect Ben, he is too quiet.\n" * 30
    recorded = ["--record", str(tmp_path / "game.cassette"), "--out", str(tmp_path / "live")]
    played = metaroles("run", *WEREWOLF, "--human", "Cat", *recorded, stdin=answers)
    assert played.returncode == 0, played.stderr[-2000:]
    assert played.stderr.count("[Cat — your turn]") >= 3
    assert "answer (target: Ann/Ben/Eve/Fay) >" in played.stderr  # a vote is a choice among the living
    transcript = (tmp_path / "live" / "transcript.md").read_text()
    assert "**Cat** → Ann, Ben, Cat, Dan, Eve, Fay, Moderator (Respond): I suspect Ben, he is too quiet." in transcript
    assert json.loads((tmp_path / "live" / "manifest.json").read_text())["humans"] == ["Cat"]
    replayed = metaroles("run", *WEREWOLF, "--replay", str(tmp_path / "game.cassette"), "--out", str(tmp_path / "re"))
    assert replayed.returncode == 0, replayed.stderr[-2000:]
    assert "your turn" not in replayed.stderr  # nobody is asked
    same_run(tmp_path / "live", tmp_path / "re")


def test_no_answer_in_time_leaves_it_to_the_roles_model_and_an_answer_not_a_choice_is_asked_again():
    choice = create_model("Choice", target=(str, ...)).model_json_schema()
    choice["properties"]["target"]["enum"] = ["Ann", "Ben"]
    desk = PageDesk()
    person = HumanLLM(TestLLM(5), desk, seats={"Cat"}, timeout=0.05)
    request = LLMRequest(messages=[{"role": "user", "content": "Whom?"}], output_schema=choice, role="Cat")

    async def ask() -> tuple[str, str]:
        timed_out = (await person.complete(request)).text  # nobody answers: the model does
        async with anyio.create_task_group() as group:
            answered: list[str] = []

            async def answer() -> None:
                answered.append((await HumanLLM(TestLLM(5), desk, seats={"Cat"}).complete(request)).text)

            group.start_soon(answer)
            while not desk.pending():
                await anyio.wait_all_tasks_blocked()
            desk.answer(desk.pending()[0].number, "Zed")  # not a living player: refused, and asked again
            while not desk.pending():
                await anyio.wait_all_tasks_blocked()
            again = desk.pending()[0]
            assert again.refused == "Zed" and again.fields == {"target": ["Ann", "Ben"]}
            desk.answer(again.number, "Ben")
        return timed_out, answered[0]

    timed_out, chosen = anyio.run(ask)
    default = anyio.run(TestLLM(5).complete, request).text
    assert timed_out == default and json.loads(chosen) == {"target": "Ben"}
    other = LLMRequest(messages=[{"role": "user", "content": "Hi"}], role="Ann")
    assert anyio.run(person.complete, other).text == anyio.run(TestLLM(5).complete, other).text  # not a seat
    with pytest.raises(Exception, match="waits for no answer"):
        desk.answer(99, "late")


NAMES = st.text(alphabet=st.characters(categories=("L", "N")), min_size=1, max_size=8)  # a player's name


@given(options=st.lists(NAMES, min_size=1, max_size=5, unique=True), pick=st.integers(min_value=0), flag=st.booleans())
def test_a_persons_words_become_an_answer_the_schema_takes(options, pick, flag):
    target = options[pick % len(options)]
    model: type[BaseModel] = create_model("Pick", target=(str, ...), save=(bool, ...))
    schema = model.model_json_schema()
    schema["properties"]["target"]["enum"] = options
    text = parse_answer(f"target={target} save={'yes' if flag else 'no'}", schema)
    assert text is not None and json.loads(text) == {"target": target, "save": flag}
    assert parse_answer(json.dumps({"target": target, "save": flag}), schema) == text
    assert parse_answer("target=" + "".join(options) + "!", schema) is None


class Greet(Action):
    async def run(self, history):
        return await self.aask("Say hello to the team.")


class Reviewer(Role):
    def __init__(self, **kwargs):
        super().__init__(name="Reviewer", actions=[Greet], **kwargs)


class ScriptedDesk:
    """A desk whose person has written their answers down in advance."""

    def __init__(self, answers: list[str]) -> None:
        self.answers, self.asked = answers, []

    async def ask(self, question: HumanQuestion, seconds: float) -> str | None:
        self.asked.append(question)
        return self.answers.pop(0) if self.answers else None


def test_metagpt_is_human_seats_a_person_where_the_team_model_asks_one():
    desk = ScriptedDesk(["Hello from a person."])
    team = Team(llm=HumanLLM(TestLLM(1), desk, seats=()))
    team.hire([Reviewer(is_human=True), Role(name="Other", actions=[Greet])])
    anyio.run(lambda: team.run(n_round=2, idea="Start."))
    said = {m.sent_from: m.content for m in team.env.history if m.sent_from in ("Reviewer", "Other")}
    assert said["Reviewer"] == "Hello from a person." and said["Other"] != said["Reviewer"]
    assert [q.role for q in desk.asked] == ["Reviewer"]
    assert Role(**Role(name="Person", is_human=True).model_dump()).is_human  # a dump keeps the flag
    seat = ScriptedDesk(["Hi, I am a person too."])
    other = Team(llm=HumanLLM(TestLLM(1), seat, seats=()))
    other.hire([HumanRole(name="Guest", actions=[Greet])])
    anyio.run(lambda: other.run(n_round=1, idea="Start."))
    assert [m.content for m in other.env.history if m.sent_from == "Guest"] == ["Hi, I am a person too."]
    with pytest.warns(UserWarning, match="asks no person"):
        Team(llm=TestLLM(1)).hire([Reviewer(is_human=True)])


def test_a_person_answers_on_the_watch_page_with_the_runs_token(tmp_path):
    command = [sys.executable, "-m", "metaroles", "run", *WEREWOLF, "--human", "Cat", "--watch", "--out", str(tmp_path)]
    pipes = {"stderr": subprocess.PIPE, "stdout": subprocess.DEVNULL, "stdin": subprocess.DEVNULL}
    process = subprocess.Popen([*command, "--human-timeout", "60"], text=True, **pipes)
    try:
        url = next(m.group(0) for line in process.stderr if (m := re.search(r"http://\S+#token=\S+", line)))
        threading.Thread(target=process.stderr.read, daemon=True).start()  # drain the rest
        assert _answer_on_the_page(url) >= 3
        assert process.wait(timeout=120) == 0
    finally:
        process.kill()
    assert "I suspect Ben (from the page)." in (tmp_path / "transcript.md").read_text()


def _answer_on_the_page(url: str) -> int:
    base, token = url.split("#token=")
    answered = 0
    with httpx.Client(base_url=base, timeout=60) as client:
        claimed = client.post("/api/control/claim", headers={"X-Control-Token": token}).json()["controller"]
        headers = {"X-Control-Token": token, "X-Controller": claimed}
        try:
            with client.stream("GET", f"/api/stream?from=999&controller={claimed}") as stream:
                event = ""
                for text in stream.iter_lines():
                    if text.startswith("event: "):
                        event = text[7:]
                    elif text.startswith("data: ") and event == "human" and text != "data: []":
                        question = json.loads(text[6:])[0]
                        listed = [v for values in question["fields"].values() for v in values]
                        pick = "Ben" if "Ben" in listed or not listed else listed[0]  # Ben may be dead by now
                        reply = pick if question["fields"] else "I suspect Ben (from the page)."
                        done = client.post(
                            "/api/human", headers=headers, json={"number": question["number"], "text": reply}
                        )
                        assert done.status_code == 200, done.text
                        answered += 1
        except (httpx.RemoteProtocolError, httpx.ReadError):
            pass  # the run ended and took its page with it
    return answered


def test_at_the_terminal_a_wrong_answer_is_asked_again_and_a_persons_answer_is_marked_as_a_persons(tmp_path):
    import io
    import os

    from metaroles.llm.human import PERSON, TerminalDesk

    choice = create_model("Choice", target=(str, ...)).model_json_schema()
    choice["properties"]["target"]["enum"] = ["Ann", "Ben"]
    read, write = os.pipe()
    os.write(write, b"Zed\nBen\n")
    os.close(write)  # as a pipe of typed lines ends
    said = io.StringIO()
    with os.fdopen(read) as answers:
        person = HumanLLM(TestLLM(5), TerminalDesk(answers_from=answers, prompt_to=said), seats={"Cat"}, timeout=60)
        request = LLMRequest(messages=[{"role": "user", "content": "Whom?"}], output_schema=choice, role="Cat")
        response = anyio.run(person.complete, request)
    assert json.loads(response.text) == {"target": "Ben"} and response.model == PERSON
    assert "answer (target: Ann/Ben) >" in said.getvalue()
    assert "'Zed' is not a choice (target: Ann/Ben); try again" in said.getvalue()


def test_a_persons_answers_are_marked_in_the_cassette_ledger_and_exports(tmp_path):
    answers = "Ben\nI suspect Ben, he is too quiet.\n" * 30
    played = metaroles("run", *WEREWOLF, "--human", "Cat", "--record", str(tmp_path / "game.jsonl"),
                       "--out", str(tmp_path / "live"), stdin=answers)  # fmt: skip
    assert played.returncode == 0, played.stderr[-2000:]
    calls = [json.loads(line) for line in (tmp_path / "game.jsonl").read_text().splitlines()[1:]]
    cat = {call["response"]["model"] for call in calls if call["role"] == "Cat"}
    assert "person" in cat and "person" not in {call["response"]["model"] for call in calls if call["role"] != "Cat"}
    ledger = json.loads((tmp_path / "live" / "ledger.json").read_text())
    assert "person" in json.dumps(ledger)
    out = tmp_path / "sft.jsonl"
    assert metaroles("export", str(tmp_path / "live"), "--format", "sft", "--out", str(out)).returncode == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert "person" in {row["answered_by"] for row in rows if row["role"] == "Cat"}
    assert {row["answered_by"] for row in rows if row["role"] != "Cat"} == {"model"}
