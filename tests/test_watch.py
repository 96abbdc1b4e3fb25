"""Watching and steering a run: the page in a real headless browser, the controls, injections resumed and forked."""

import hashlib
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path

import anyio
import anyio.lowlevel
import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaroles import DeadLetterWarning, Environment, TestLLM
from metaroles.cli import main
from metaroles.cli.watching import interviewer
from metaroles.core.exceptions import InvalidValueError
from metaroles.flow.link import LinkLost, RunLink, answer_link
from metaroles.flow.timeline import said_columns
from metaroles.flow.watch import WatchServer, bind, watch_app
from metaroles.llm.human import HumanQuestion, PageDesk
from metaroles.project.interview import interview_run
from metaroles.project.scenario import fork_scenario, resume_scenario, run_scenario
from metaroles.record.eventread import read_events
from metaroles.sharding.backends import LocalBackend
from metaroles.team.control import JOURNAL, Injection, RunControl, read_journal
from metaroles.team.options import RunOptions

SOCIETY = ["society", "--set", "agents=30", "--set", "rounds=6", "--llm", "test", "--seed", "3", "-q"]
SOCIETY += ["--checkpoint-every", "1"]  # a message's text reaches the page with its round's checkpoint
SAME = ("events.jsonl", "state.json", "metrics.jsonl", JOURNAL, "checkpoints")
RUMOUR = '<img src=x onerror="document.body.dataset.pwned=1">A storm is coming.'


def chromium_args() -> list[str]:
    return ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking"]


def launch(playwright):
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("Debian's chromium is needed for the browser tests: run `make need-chromium` (make test does)")
    return playwright.chromium.launch(
        executable_path=found, args=[*chromium_args(), "--disable-component-update", "--disable-sync"]
    )


def opened(playwright, url: str, ready: str = "body[data-ready=yes]"):  # type: ignore[no-untyped-def]
    """Debian's chromium on the page at ``url``, once ``ready`` holds: the browser and the page."""
    browser = launch(playwright)
    page = browser.new_page()
    page.goto(url)
    page.wait_for_selector(ready, timeout=30_000)
    return browser, page


def digest(folder: Path, names=SAME) -> dict[str, str]:
    found = {}
    for name in names:
        path = folder / name
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            found[str(file.relative_to(folder))] = hashlib.sha256(file.read_bytes()).hexdigest()
    return found


def steered_from_python(out: Path, injections: list[Injection]) -> None:
    control = RunControl(schedule=injections)
    anyio.run(
        lambda: run_scenario(
            "society",
            llm=TestLLM(3),
            options={"agents": 30, "rounds": 6},
            out_dir=out,
            run=RunOptions(seed=3, checkpoint_every=1),
            control=control,
        )
    )


def start_run(out: Path) -> tuple[subprocess.Popen, str, Callable[[], str]]:
    command = [sys.executable, "-m", "metaroles", "run", *SOCIETY, "--out", str(out), "--control"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    url = next((m.group(1) for line in process.stderr if (m := re.search(r"(http://127\S+/#token=\S+)", line))), None)
    if url is None:
        raise AssertionError(f"the run printed no page URL (exit {process.wait()})")
    rest: list[str] = []
    drain = threading.Thread(target=lambda: rest.append(process.stderr.read()), daemon=True)
    drain.start()

    def rest_of_stderr() -> str:
        drain.join(60)
        return "".join(rest)

    return process, url, rest_of_stderr


def test_the_page_steps_pauses_and_injects_and_the_run_equals_one_steered_from_python(tmp_path):
    playwright_api = pytest.importorskip("playwright.sync_api")
    process, url, rest_of_stderr = start_run(tmp_path / "page")
    try:
        with playwright_api.sync_playwright() as playwright:
            browser = launch(playwright)
            page = browser.new_page()
            page.goto(url)
            page.wait_for_selector("body[data-controller=yes][data-control=paused]", timeout=30_000)
            assert page.get_attribute("body", "data-waiting-at") == "0"  # --control: waits before round 1
            page.click("#step")
            page.wait_for_selector("body[data-round='1'][data-control=paused][data-waiting-at='1']", timeout=30_000)
            # how soon after its end the page shows a round is a figure: bench/watch.py shown_after_round_s
            page.click("#inject-box summary")
            page.fill("#inject-name", "rumour")
            page.fill("#inject-text", RUMOUR)
            page.click("#inject")
            page.click("#step")
            page.wait_for_selector("body[data-round='2'][data-waiting-at='2']", timeout=30_000)
            shown = "document.querySelector('#flow').innerText.includes('A storm is coming.')"
            page.wait_for_function(shown, timeout=30_000)  # its text comes with its round, or with the checkpoint
            assert page.query_selector("#flow img") is None and page.get_attribute("body", "data-pwned") is None
            page.close()  # closed while paused: the run stays paused, and another page may take the controls
            second = browser.new_page()
            second.goto(url)
            second.wait_for_selector("body[data-controller=yes][data-waiting-at='2']", timeout=30_000)
            second.click("#resume")
            assert process.wait(timeout=120) == 0
            browser.close()
    finally:
        process.kill()
    said = rest_of_stderr()
    assert "Traceback" not in said and "ERROR" not in said, said  # the page's end is no news to the user
    journal = read_journal(tmp_path / "page" / JOURNAL)
    assert [(i.name, i.after_round, i.content) for i in journal] == [("rumour", 1, RUMOUR)]
    steered_from_python(tmp_path / "python", [Injection(name="rumour", content=RUMOUR, after_round=1)])
    assert digest(tmp_path / "page") == digest(tmp_path / "python")


def test_a_second_controller_is_refused_a_wrong_token_too_and_watchers_are_fine(tmp_path):
    steered_from_python(tmp_path / "run", [])
    control = RunControl()
    server = WatchServer(watch_app(tmp_path / "run", control=control, token="secret"), bind(0)).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.post("/api/control/claim", headers={"X-Control-Token": "wrong"}).status_code == 403
            first = client.post("/api/control/claim", headers={"X-Control-Token": "secret"}).json()["controller"]
            with client.stream("GET", f"/api/stream?from=99&controller={first}") as stream:
                lines = stream.iter_lines()  # held: a dropped iterator closes the stream
                assert next(lines).startswith("event: info")  # the controller's page is open
                second = client.post("/api/control/claim", headers={"X-Control-Token": "secret"})
                assert second.status_code == 409 and "another page controls this run" in second.json()["error"]
                pause = {"X-Control-Token": "secret", "X-Controller": first}
                assert client.post("/api/control/pause", headers=pause).json()["paused"] is True
                assert client.get("/api/info").status_code == 200  # watching needs no token
                refused = client.post("/api/control/inject", headers=pause, json={"content": "hi", "send_to": []})
                assert refused.status_code == 400 and "send_to" in refused.json()["error"]
            assert client.get("/api/round/3").json()["round"] == 3
            assert client.get("/api/role/nobody").status_code == 404
            assert client.get("/api/round/x").status_code == 400
    finally:
        server.stop()
    assert control.paused  # the page that paused it is gone: paused it stays


def run_with_injection(out: Path, *, stop_at: int | None, every: int = 1) -> None:
    control = RunControl(schedule=[Injection(name="rumour", content="Storm.", after_round=2)])
    stopping = threading.Event()
    if stop_at is not None:  # a run stopped right after the injection (as a kill before the next round is)
        control.listeners.append(lambda c: stopping.set() if c.barrier_round == stop_at else None)
    anyio.run(
        lambda: run_scenario(
            "debate",
            llm=TestLLM(3),
            options={"turns": 3},
            out_dir=out,
            run=RunOptions(seed=5, checkpoint_every=every),
            control=control,
            stopping=stopping,
        )
    )


@pytest.mark.parametrize("every", [1, 3])
def test_an_injection_is_published_again_by_resume_unless_the_checkpoint_holds_it(tmp_path, every):
    run_with_injection(tmp_path / "whole", stop_at=None, every=every)
    run_with_injection(tmp_path / "cut", stop_at=2, every=every)
    assert len(read_journal(tmp_path / "cut" / JOURNAL)) == 1
    anyio.run(lambda: resume_scenario(tmp_path / "cut", llm=TestLLM(3)))
    names = ("events.jsonl", "state.json", "transcript.md", JOURNAL)
    assert digest(tmp_path / "cut", names) == digest(tmp_path / "whole", names)
    assert (tmp_path / "whole" / "transcript.md").read_text().count("Storm.") == 1


def test_a_fork_after_an_injection_keeps_it_and_one_before_does_not(tmp_path):
    run_with_injection(tmp_path / "parent", stop_at=None)
    for from_round, kept in ((4, 1), (2, 0)):
        child = tmp_path / f"child{from_round}"
        anyio.run(partial(fork_scenario, tmp_path / "parent", from_round=from_round, out_dir=child, llm=TestLLM(3)))
        assert len(read_journal(child / JOURNAL)) == kept
        assert (child / "transcript.md").read_text().count("Storm.") == kept
    assert digest(tmp_path / "child4", ("events.jsonl",)) == digest(tmp_path / "parent", ("events.jsonl",))


def test_bad_input_to_watch_and_steering_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["watch", str(tmp_path)]) == 2
    assert "is not a run directory" in capsys.readouterr().err
    steered_from_python(tmp_path / "run", [])
    held = bind(0)
    try:
        assert main(["watch", str(tmp_path / "run"), "--port", str(held.getsockname()[1])]) == 2
        assert "cannot be used" in capsys.readouterr().err
    finally:
        held.close()
    (tmp_path / "bad.jsonl").write_text('{"name": "x"}\n')
    assert main(["run", "debate", "--llm", "test", "--interventions", str(tmp_path / "bad.jsonl"), "-q"]) == 2
    assert "line 1 is not an injection" in capsys.readouterr().err
    assert main(["run", "debate", "--llm", "test", "--watch", "--no-save", "-q"]) == 2
    assert "need a run directory" in capsys.readouterr().err
    assert main(["watch", str(tmp_path / "run"), "--listen-fd", "9999", "--link-fd", "9998"]) == 2
    assert "not for use by hand ([Errno 9] Bad file descriptor)" in capsys.readouterr().err
    assert main(["watch", str(tmp_path / "run"), "--link-fd", "9998"]) == 2
    assert "not for use by hand (both are needed)" in capsys.readouterr().err
    with pytest.raises(Exception, match="after_round"):
        RunControl().inject("hi", after_round=-1)


def test_a_replay_scrubs_to_a_round_and_a_role_panel_asks_on_a_fork(tmp_path):
    playwright_api = pytest.importorskip("playwright.sync_api")
    steered_from_python(tmp_path / "run", [Injection(name="rumour", content=RUMOUR, after_round=3)])
    before = digest(tmp_path / "run")
    run = tmp_path / "run"
    server = WatchServer(watch_app(run, interviewer=interviewer(run, trust=False)), bind(0)).start()
    try:
        with playwright_api.sync_playwright() as playwright:
            browser, page = opened(playwright, server.url, "body[data-ready=yes][data-round='7']")  # the last round
            page.fill("#scrub", "4")  # the slider's fifth stop: round 4
            page.dispatch_event("#scrub", "input")
            page.wait_for_selector("body[data-round='4']", timeout=30_000)
            assert "A storm is coming." in page.inner_text("#flow") and page.query_selector("#flow img") is None
            page.fill("#filter-role", "a5")
            rows = [row.split("\t") for row in page.inner_text("#flow tbody").splitlines()]
            assert rows and all(r[0] in ("a5", "Intervention") or "a5" in r[1].split(", ") for r in rows)
            page.click("#flow .role >> text=a5 >> nth=0")
            page.wait_for_selector("#panel:not([hidden])")
            assert page.inner_text("#panel-role") == "a5 at round 4"
            page.fill("#ask-question", "Where do you stand?")
            page.click("#ask")
            page.wait_for_selector("body[data-asked=yes]", timeout=60_000)
            shown = page.inner_text("#ask-answer")
            browser.close()
    finally:
        server.stop()
    asked = anyio.run(
        lambda: interview_run(run, at_round=4, roles="a5", questions=["Where do you stand?"], out_dir=tmp_path / "q",
                              llm=TestLLM(3))
    )  # fmt: skip
    assert shown == f"a5: {asked[0].answer}"
    assert digest(run) == before


@given(text=st.text(max_size=30))
@settings(max_examples=25, deadline=None)
def test_a_delta_reads_the_columns_it_shows_as_the_whole_line_has_them(text):
    said = {
        "role": ["a", "b"], "message_id": ["m1", "m2"], "cause_by": ["x.Say", "x.Say"], "send_to": [["b"], ["a"]],
        "caused_by": [[], ["m1"]], "to": [["b", "c"], []],
    }  # fmt: skip
    line = {"seq": 1, "round": 2, "kind": "round", "end": 9, "published": said}
    line |= {"llm_calls": [{"role": "a", "tokens": 3}], "events": [{"kind": "intervention", "detail": text}]}
    raw = orjson.dumps(line)
    fast = said_columns(raw)
    assert fast["published"] == {k: v for k, v in said.items() if k in ("role", "message_id", "cause_by", "to")}
    assert fast["events"] == line["events"] and fast["llm_calls"] == line["llm_calls"]


def test_an_injection_into_a_sharded_run_makes_the_one_process_run(tmp_path):
    for name, backend in (("one", None), ("sharded", LocalBackend(2))):
        control = RunControl(schedule=[Injection(name="rumour", content="Storm.", after_round=2)])
        anyio.run(
            lambda name=name, backend=backend, control=control: run_scenario(
                "society", llm=TestLLM(3), options={"agents": 30, "rounds": 5}, out_dir=tmp_path / name,
                run=RunOptions(seed=3, checkpoint_every=1, backend=backend), control=control,
            )
        )  # fmt: skip
    names = ("events.jsonl", "state.json", "metrics.jsonl", JOURNAL)
    assert digest(tmp_path / "one", names) == digest(tmp_path / "sharded", names)
    assert b'"kind":"intervention"' in (tmp_path / "sharded" / "events.jsonl").read_bytes()


def test_ctrl_c_while_paused_stops_the_run_at_its_barrier_and_resume_finishes_it_as_if_never_paused(tmp_path):
    debate = ["debate", "--llm", "test", "--seed", "4", "-q"]
    whole = subprocess.run([sys.executable, "-m", "metaroles", "run", *debate, "--out", str(tmp_path / "whole")],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert whole.returncode == 0, whole.stderr
    command = [sys.executable, "-m", "metaroles", "run", *debate, "--out", str(tmp_path / "cut"), "--control"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    url = next(m.group(1) for line in process.stderr if (m := re.search(r"(http://\S+/)#token=", line)))
    with httpx.Client(base_url=url, timeout=60) as client, client.stream("GET", "/api/stream?from=99") as stream:
        lines = stream.iter_lines()  # the page's stream says when the run waits at its first barrier
        assert any(line.startswith("data:") and '"waiting_at":0' in line for line in lines)
        process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 130
    resumed = subprocess.run([sys.executable, "-m", "metaroles", "resume", str(tmp_path / "cut"), "-q"],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    names = ("events.jsonl", "state.json", "transcript.md")
    assert digest(tmp_path / "cut", names) == digest(tmp_path / "whole", names)


def test_python_steps_pauses_and_injects_from_another_thread_as_the_page_does(tmp_path):
    control = RunControl(paused=True)
    waits: dict[int, threading.Event] = {n: threading.Event() for n in range(8)}
    control.listeners.append(lambda c: c.waiting_at is not None and waits[c.waiting_at].set())

    def steer() -> None:
        assert waits[0].wait(60)  # paused before round 1
        control.step()
        assert waits[1].wait(60)
        control.inject("Storm.", name="rumour")  # lands at the barrier the run waits at
        control.step(2)
        assert waits[3].wait(60)
        control.resume()

    helper = threading.Thread(target=steer)
    helper.start()
    run_with(tmp_path / "steered", control)
    helper.join()
    run_with(tmp_path / "planned", RunControl(schedule=[Injection(name="rumour", content="Storm.", after_round=1)]))
    names = ("events.jsonl", "state.json", "transcript.md", JOURNAL)
    assert digest(tmp_path / "steered", names) == digest(tmp_path / "planned", names)


def run_with(out: Path, control: RunControl) -> None:
    anyio.run(
        lambda: run_scenario(
            "debate", llm=TestLLM(3), options={"turns": 3}, out_dir=out, run=RunOptions(seed=5), control=control
        )
    )


def test_pause_stops_a_running_run_at_its_next_barrier_until_it_is_resumed(tmp_path):
    control = RunControl()
    waiting = threading.Event()
    control.listeners.append(lambda c: c.barrier_round == 2 and c.waiting_at is None and c.pause())
    control.listeners.append(lambda c: c.waiting_at is not None and waiting.set())

    def resume_when_paused() -> None:
        assert waiting.wait(60)
        assert control.state() == {"paused": True, "waiting_at": 3, "round": 3}  # the round after the pause
        control.resume()

    helper = threading.Thread(target=resume_when_paused)
    helper.start()
    run_with(tmp_path / "paused", control)
    helper.join()
    run_with(tmp_path / "straight", RunControl())
    names = ("events.jsonl", "state.json", "transcript.md")
    assert digest(tmp_path / "paused", names) == digest(tmp_path / "straight", names)


async def test_the_page_process_steers_the_run_over_its_link_and_errors_come_back_named():
    control, desk = RunControl(paused=True), PageDesk()
    ours, theirs = socket.socketpair()
    runs_side = threading.Thread(target=answer_link, args=(ours, control, desk, "tok"), daemon=True)
    runs_side.start()
    link = RunLink(theirs)
    assert (link.token, link.asks_people) == ("tok", True)
    link.resume()
    assert control.state()["paused"] is False and link.state()["paused"] is False
    link.step()
    assert control.state()["paused"] is True
    link.inject(Injection(name="rumour", content="Storm.", send_to=["Ann"]))
    env = Environment()
    with pytest.warns(DeadLetterWarning, match="from 'Intervention'"):  # no Ann in this bare environment
        await control.barrier(env, threading.Event())  # publishes the injection, then takes the step asked for
    assert [(m.content, sorted(m.send_to)) for m in env.history] == [("Storm.", ["Ann"])]
    with pytest.raises(InvalidValueError, match="question 7 waits for no answer"):
        link.answer(7, "Ben")  # the run's own error, named; the link goes on
    question = HumanQuestion(number=1, role="Cat", action="Vote", prompt="Who?", fields={"vote": ["Ann", "Ben"]})
    said: list[str | None] = []
    async with anyio.create_task_group() as group:
        group.start_soon(lambda: _ask_into(desk, question, said))
        while not desk.pending():
            await anyio.lowlevel.checkpoint()
        link.pause()  # every answer brings the run's state: the question held for the person
        assert link.pending() == [question]
        link.answer(1, "Ben")
    assert said == ["Ben"] and desk.pending() == []
    lost = threading.Event()
    link.follow(lost=lost.set)
    ours.shutdown(socket.SHUT_RDWR)  # the run ends: its page's process hears it
    assert lost.wait(60)
    runs_side.join(60)
    with pytest.raises(LinkLost):
        link.pause()
    ours, theirs = socket.socketpair()  # and the other way: the page's process closes the link
    runs_side = threading.Thread(target=answer_link, args=(ours, control, None, "tok"), daemon=True)
    runs_side.start()
    RunLink(theirs).close()
    runs_side.join(60)
    assert not runs_side.is_alive()


async def _ask_into(desk: PageDesk, question: HumanQuestion, said: list[str | None]) -> None:
    said.append(await desk.ask(question, 60.0))


def _controls(lines):  # type: ignore[no-untyped-def]
    """The controls' state as a stream tells it, each time it changes."""
    event = ""
    for line in lines:
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: ") and event in ("info", "control"):
            data = orjson.loads(line.removeprefix("data: "))
            yield data["control"] if event == "info" else data


def test_the_runs_own_page_is_served_by_a_process_that_ends_with_the_run_even_a_killed_one(tmp_path):
    process, url, _ = start_run(tmp_path / "run")
    try:
        page_pid = int(Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()[0])
        page_exited = os.pidfd_open(page_pid)
        with httpx.Client(base_url=url.split("#")[0], timeout=60) as client:  # served by the page's process
            with client.stream("GET", "/api/stream?from=0") as stream:  # the run waits at its first barrier
                assert any(control.get("waiting_at") == 0 for control in _controls(stream.iter_lines()))
        process.kill()  # no goodbye: the page's process sees its link close
        assert select.select([page_exited], [], [], 60)[0] == [page_exited]
        os.close(page_exited)
    finally:
        process.kill()
        process.wait()


def test_the_page_answers_only_its_own_address_and_no_other_site_changes_anything(tmp_path):
    steered_from_python(tmp_path / "run", [])
    asked: list[str] = []

    async def interviewer(role: str, at: int | None, question: str) -> list[dict[str, str]]:
        asked.append(question)
        return [{"role": role, "answer": "yes"}]

    server = WatchServer(watch_app(tmp_path / "run", interviewer=interviewer), bind(0)).start()
    port = server.url.rsplit(":", 1)[1].strip("/")
    question = {"role": "Alice", "round": 1, "question": "Why?"}
    try:  # a page of evil.example rebound to 127.0.0.1 is same-origin there: it sends any header it likes
        with httpx.Client(base_url=server.url, timeout=30, headers={"X-Metaroles": "1"}) as client:
            rebound = {"Host": f"evil.example:{port}"}
            assert client.get("/api/round/1", headers=rebound).status_code == 421
            assert client.post("/api/interview", headers=rebound, json=question).status_code == 421
            foreign = {"Origin": "http://evil.example"}
            assert client.post("/api/interview", headers=foreign, json=question).status_code == 403
            assert not asked, "no model call was answered for another site"
            assert client.get("/api/round/1", headers={"Host": f"localhost:{port}"}).status_code == 200
            assert client.post("/api/interview", headers={"Origin": server.url.rstrip("/")}, json=question).is_success
            big = client.post("/api/interview", content=b"x" * (17 * 1024 * 1024))
            assert big.status_code == 413
    finally:
        server.stop()
    assert asked == ["Why?"]


def test_every_open_stream_gets_every_round_before_the_page_closes_at_the_runs_end(tmp_path):
    anyio.run(lambda: run_scenario("society", llm=TestLLM(3), options={"agents": 30, "rounds": 20},
                                   out_dir=tmp_path / "run", run=RunOptions(seed=3)))  # fmt: skip
    server = WatchServer(watch_app(tmp_path / "run"), bind(0)).start()
    opened = threading.Semaphore(0)
    seen: list[int] = []

    async def watcher(client: httpx.AsyncClient) -> None:
        rounds = 0
        async with client.stream("GET", "/api/stream?from=0") as stream:
            async for line in stream.aiter_lines():
                if line.startswith("event: info"):
                    opened.release()
                rounds += line == "event: round"
        seen.append(rounds)

    async def watch() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client, anyio.create_task_group() as group:
            for _ in range(100):
                group.start_soon(watcher, client)
            for _ in range(100):
                await anyio.to_thread.run_sync(opened.acquire)
            server.end()  # the run ended: the page closes

    try:
        anyio.run(watch)
    finally:
        server.stop()
    assert len(seen) == 100 and set(seen) == {seen[0]} and seen[0] >= 20, seen


def test_the_page_draws_the_figures_over_the_rounds_and_a_roles_panel_shows_its_messages(tmp_path):
    playwright_api = pytest.importorskip("playwright.sync_api")
    run = tmp_path / "run"
    long = "The council will vote on the bridge. " * 10  # past what a panel shows before "more"
    steered_from_python(run, [Injection(name="notice", content=long, after_round=3)])
    written = [orjson.loads(line) for line in (run / "metrics.jsonl").read_bytes().splitlines()]
    rows = {m["id"]: m for m in map(orjson.loads, (run / "checkpoints" / "messages.jsonl").read_bytes().splitlines())}
    server = WatchServer(watch_app(run), bind(0)).start()
    try:
        with playwright_api.sync_playwright() as playwright:
            browser, page = opened(playwright, server.url, "body[data-ready=yes][data-round='7']")
            picks = page.eval_on_selector_all("#chart-pick input", "ticks => ticks.map(t => [t.value, t.checked])")
            numeric = sorted(k for k, v in written[-1].items() if k != "round" and isinstance(v, int | float))
            assert [name for name, _ in picks] == numeric and sum(on for _, on in picks) == 3
            page.check("#chart-pick input[value=mean]")
            page.check("#chart-pick input[value=variance]")
            for name in ("mean", "variance"):
                drawn = page.eval_on_selector_all(
                    f"#chart circle[data-series={name}]",
                    "dots => dots.map(d => [Number(d.dataset.round), Number(d.dataset.value), d.textContent])",
                )
                assert [(r, v) for r, v, _ in drawn] == [(row["round"], row[name]) for row in written], name
                assert all(said == f"{name}, round {r}: {v:g}" or said.endswith(f": {v}") for r, v, said in drawn)
            assert page.get_attribute("#now-line", "data-round") == "7"
            page.fill("#scrub", "4")
            page.dispatch_event("#scrub", "input")
            page.wait_for_selector("#now-line[data-round='4']", state="attached", timeout=30_000)
            page.uncheck("#chart-pick input[value=mean]")
            assert page.query_selector("#chart circle[data-series=mean]") is None
            page.click("#flow .role >> text=a5 >> nth=0")  # a role's panel: what it was sent and said, as messages
            page.wait_for_selector("#panel:not([hidden])")
            read = "items => items.map(i => [i.title, i.querySelector('.role')?.textContent, i.innerText])"
            news = page.eval_on_selector_all("#panel-memory li", read)
            assert news and all(rows[i]["sent_from"] == sender for i, sender, _ in news)
            assert all(f"{rows[i]['content'][:40]}" in shown for i, _, shown in news if len(rows[i]["content"]) < 240)
            (cut,) = [i for i, _, _ in news if rows[i]["content"] == long]
            summary = page.inner_text(f"#panel-memory li[title='{cut}'] summary")
            assert summary == long[:240] + "…" and "Intervention" in page.inner_text(f"#panel-memory li[title='{cut}']")
            page.click(f"#panel-memory li[title='{cut}'] summary")  # expanded: the whole text
            assert long.strip() in page.inner_text(f"#panel-memory li[title='{cut}'] details")
            page.click("#network-box summary")  # who talks to whom, through the round shown (4)
            page.wait_for_selector("body[data-network='4']", timeout=30_000)
            drawn = page.eval_on_selector_all(
                "#network line", "lines => lines.map(l => [l.dataset.from, l.dataset.to, Number(l.dataset.count)])"
            )
            page.click("#network circle[data-role=a7]")
            page.wait_for_selector("#panel-role:text('a7 at round 4')")
            browser.close()
    finally:
        server.stop()
    events = [e for e in read_events(run / "events.jsonl") if e["round"] <= 4]
    sender = {e["message_id"]: e["role"] for e in events if e["kind"] == "publish"}
    sent = Counter(  # the log's own count of who reached whom, rounds 0..4
        (sender[e["message_id"]], e["role"])
        for e in events
        if e["kind"] == "deliver" and sender[e["message_id"]] != e["role"]
    )
    assert sorted(drawn) == sorted([a, b, n] for (a, b), n in sent.items())


def test_a_message_opens_the_conversation_it_started_as_the_log_links_it(tmp_path):
    playwright_api = pytest.importorskip("playwright.sync_api")
    run = tmp_path / "debate"
    assert main(["run", "debate", "--llm", "test", "--set", "turns=3", "--out", str(run), "-q"]) == 0
    lines = [orjson.loads(line) for line in (run / "events.jsonl").read_bytes().splitlines()]
    published = [
        (line["round"], p["message_id"][i], p["role"][i], p["caused_by"][i])
        for line in lines if (p := line.get("published"))
        for i in range(len(p["message_id"]))
    ]  # fmt: skip
    opening = next(m for m in published if m[2] == "Alice")
    thread = {opening[1]}
    for _, message, _, causes in published:  # what it caused, and what that caused
        if any(c in thread for c in causes):
            thread.add(message)
    expected = [(r, m, who) for r, m, who, _ in published if m in thread]
    assert len(expected) > 2, "a debate answers its opening"
    server = WatchServer(watch_app(run), bind(0)).start()
    try:
        with playwright_api.sync_playwright() as playwright:
            browser, page = opened(playwright, server.url, "body[data-ready=yes]")
            page.fill("#scrub", str(opening[0]))
            page.dispatch_event("#scrub", "input")
            page.wait_for_selector(f"body[data-round='{opening[0]}']", timeout=30_000)
            page.click("#flow tbody tr:has(.role:text-is('Alice')) .said-cell")
            page.wait_for_selector(f"body[data-thread='{opening[1]}']", timeout=30_000)
            shown = page.eval_on_selector_all(
                "#thread-messages li",
                "items => items.map(i => [Number(i.dataset.round), i.title, i.querySelector('.role').textContent])",
            )
            title = page.inner_text("#thread-title")
            browser.close()
    finally:
        server.stop()
    assert [tuple(row) for row in shown] == expected
    assert title == f"the conversation from Alice's SpeakAloud of round {opening[0]}"


def test_two_branches_side_by_side_name_the_round_they_part_and_unrelated_runs_say_so(tmp_path):
    from metaroles.project.diff import first_divergence, run_messages

    playwright_api = pytest.importorskip("playwright.sync_api")
    society = ["society", "--llm", "test", "--set", "agents=12", "--set", "rounds=6", "--seed", "3", "-q"]
    assert main(["run", *society, "--checkpoint-every", "1", "--out", str(tmp_path / "a")]) == 0
    fork = [
        "fork",
        str(tmp_path / "a"),
        "--from-round",
        "3",
        "--intervene",
        "rule:a0=1.0",
        "--out",
        str(tmp_path / "b"),
    ]
    assert main([*fork, "-q"]) == 0
    assert main(["run", "debate", "--llm", "test", "--out", str(tmp_path / "d"), "-q"]) == 0
    parting = first_divergence(run_messages(tmp_path / "a"), run_messages(tmp_path / "b"))
    assert parting is not None and parting > 3
    theirs = [orjson.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_bytes().splitlines()]
    seen = {}
    with playwright_api.sync_playwright() as playwright:
        browser = launch(playwright)
        for other in ("b", "d"):
            server = WatchServer(watch_app(tmp_path / "a", compare=tmp_path / other), bind(0)).start()
            try:
                page = browser.new_page()
                page.goto(server.url)
                page.wait_for_selector("body[data-ready=yes][data-compared]", timeout=30_000)
                page.check("#chart-pick input[value=mean]")
                note, compared = page.inner_text("#compare-note"), page.get_attribute("body", "data-compared")
                if other == "b":
                    dashed = page.get_attribute("#chart polyline[data-run=other][data-series=mean]", "data-values")
                    line = page.get_attribute("#parting-line", "data-round")
                seen[other] = (note, compared)
            finally:
                server.stop()
        browser.close()
    note, compared = seen["b"]
    assert compared == line == str(parting) and f"first differ in round {parting}" in note
    assert orjson.loads(dashed) == [row["mean"] for row in theirs], "the other run's own figures"
    note, compared = seen["d"]
    assert compared == "unrelated" and "not branches of one run" in note


def test_a_sweeps_report_is_a_page_with_its_picture_and_nothing_else_of_the_folder_is_served(tmp_path):
    from metaroles.flow.reports import report_app

    playwright_api = pytest.importorskip("playwright.sync_api")
    folder = tmp_path / "sweep"
    grid = ["--grid", "graph_seed=0..3", "--grid", "epsilon=0.1,0.3", "--set", "agents=10", "--set", "rounds=3"]
    assert main(["sweep", "society", *grid, "--out", str(folder), "-q"]) == 0
    server = WatchServer(report_app(folder), bind(0)).start()
    try:
        assert httpx.get(server.url + "file/sweep.jsonl").status_code == 404, "only the report's pictures"
        assert httpx.get(server.url + "file/rounds.svg").content == (folder / "rounds.svg").read_bytes()
        assert httpx.get(server.url + "file/../sweep.jsonl").status_code == 404
        with playwright_api.sync_playwright() as playwright:
            browser = launch(playwright)
            page = browser.new_page()
            page.goto(server.url)
            page.wait_for_function("document.querySelector('img').complete")
            drawn = page.evaluate("document.querySelector('img').naturalWidth")
            shown = page.inner_text("#ensemble-md")
            browser.close()
    finally:
        server.stop()
    assert drawn > 0 and shown.strip() == (folder / "ensemble.md").read_text().strip()
    process = subprocess.Popen([sys.executable, "-m", "metaroles", "watch", str(folder)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        url = re.search(r"http://\S+/", process.stdout.readline()).group(0)
        assert "epsilon=0.3" in httpx.get(url).text
    finally:
        process.terminate()
        process.wait(timeout=60)


def test_a_roles_panel_shows_its_persona_state_and_model_calls_and_the_readings_spread_as_the_run_held_them(tmp_path):
    from metaroles.cli.watching import state_reader
    from metaroles.project.panel import states_at

    playwright_api = pytest.importorskip("playwright.sync_api")
    society = [*SOCIETY[:-3], "--set", "llm_agents=3", "-q"]  # a0..a2 ask the model
    cassette = tmp_path / "calls.jsonl"
    assert (
        main(["run", *society, "--record", str(cassette), "--checkpoint-every", "3", "--out", str(tmp_path / "run")])
        == 0
    )
    assert main(["run", *society, "--checkpoint-every", "1", "--out", str(tmp_path / "every")]) == 0
    run = tmp_path / "run"
    recorded = [orjson.loads(line) for line in cassette.read_bytes().splitlines()[1:]]
    logged = [c for line in map(orjson.loads, (run / "events.jsonl").read_bytes().splitlines())
              if line["round"] <= 4 for c in line.get("llm_calls", ()) if c["role"] == "a1"]  # fmt: skip
    # the state at round 4 as the run checkpointed every round holds it (not run again: read back)
    _, held = anyio.run(lambda: states_at(tmp_path / "every", 4, TestLLM(3), {}, again=False))
    mean = next(row["mean"] for row in map(orjson.loads, (run / "metrics.jsonl").read_bytes().splitlines())
                if row["round"] == 4)  # fmt: skip
    server = WatchServer(watch_app(run, states=state_reader(run, trust=False)), bind(0)).start()
    try:
        state = httpx.get(server.url + "api/state/a1?round=4").json()  # between the checkpoints of rounds 3 and 6
        assert (state["as_of"], state["note"]) == (4, "") and state["state"] == orjson.loads(orjson.dumps(held["a1"]))
        calls = httpx.get(server.url + "api/role/a1?round=4").json()["calls"]
        mine = [entry for entry in recorded if entry["role"] == "a1"][: len(logged)]
        assert calls["count"] == len(logged) > 1 and [c["tokens"] for c in calls["calls"]] == [
            c["tokens"] for c in logged
        ]
        assert [c["prompt"] for c in calls["calls"]] == [e["request"]["messages"] for e in mine]
        assert [c["answer"] for c in calls["calls"]] == [e["response"]["text"] for e in mine]
        spread = httpx.get(server.url + "api/distribution?round=4").json()
        opinion = spread["readings"]["opinion"]
        assert sum(opinion["counts"]) == opinion["n"] == 30 and abs(opinion["mean"] - mean) < 1e-6
        with playwright_api.sync_playwright() as playwright:
            browser, page = opened(playwright, server.url, "body[data-ready=yes]")
            page.fill("#scrub", "4")
            page.dispatch_event("#scrub", "input")
            page.wait_for_selector("body[data-round='4']", timeout=30_000)
            page.click("#dist-box summary")
            page.wait_for_selector("body[data-distribution='4']", timeout=30_000)
            bins = page.eval_on_selector_all("#dist rect.bin", "bars => bars.map(b => Number(b.dataset.count))")
            page.click("#flow .role >> text=a1 >> nth=0")
            page.wait_for_selector("body[data-state='a1@4']", timeout=30_000)
            keys = page.eval_on_selector_all("#panel-state dt", "ts => ts.map(t => t.textContent)")
            values = page.eval_on_selector_all("#panel-state dd", "ds => ds.map(d => d.innerText)")
            shown = dict(zip(keys, values, strict=True))
            persona = page.eval_on_selector_all("#panel-persona dt", "ts => ts.map(t => t.textContent)")
            drawn = page.eval_on_selector_all("#panel-calls li", "items => items.map(i => Number(i.dataset.tokens))")
            page.click("#panel-calls li >> nth=0 >> summary")
            prompt = page.inner_text("#panel-calls li >> nth=0")
            browser.close()
    finally:
        server.stop()
    assert bins == opinion["counts"]
    assert shown["memory"] == str(held["a1"]["memory"]) and shown["opinion"] == str(held["a1"]["readings"]["opinion"])
    assert persona == ["profile"] and drawn == [c["tokens"] for c in logged]
    assert mine[0]["request"]["messages"][1]["content"][:60] in prompt and mine[0]["response"]["text"] in prompt


def test_the_roles_state_of_a_run_whose_answers_are_not_kept_is_its_checkpoints_and_says_so(tmp_path):
    from starlette.testclient import TestClient

    from metaroles.cli.watching import state_reader

    run = tmp_path / "run"
    assert main(["run", *SOCIETY[:-2], "--checkpoint-every", "3", "--out", str(run)]) == 0
    manifest = orjson.loads((run / "manifest.json").read_bytes())
    (run / "manifest.json").write_bytes(orjson.dumps({**manifest, "llm": "openai"}))  # a served model, no cassette
    app = watch_app(run, states=state_reader(run, trust=False))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        state = client.get("/api/state/a1?round=4").json()
        assert state["as_of"] == 3 and "it recorded no cassette" in state["note"] and state["state"]["memory"] > 0
        assert client.get("/api/state/nobody?round=4").status_code == 404
    refused = watch_app(run, states="a role's state is read by rebuilding the run's roles: not yours")
    with TestClient(refused, base_url="http://127.0.0.1") as client:
        answer = client.get("/api/distribution?round=4")
        assert answer.status_code == 403 and "not yours" in answer.json()["error"]


def test_a_structured_answer_shows_its_fields_and_every_round_has_its_texts_between_checkpoints(tmp_path):
    from starlette.testclient import TestClient

    run = tmp_path / "company"
    assert main(["run", "software_company", "--llm", "test", "--checkpoint-every", "50", "--out", str(run), "-q"]) == 0
    rows = {m["id"]: m for m in map(orjson.loads, (run / "checkpoints" / "messages.jsonl").read_bytes().splitlines())}
    app = watch_app(run)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        said = client.get("/api/role/Architect").json()["said"]
    assert said and all(fields == rows[i]["instruct_content"]["value"] for i, _, _, _, fields in said)
    untold = []
    control = RunControl()  # at each barrier: every message of the rounds logged so far has its text
    control.listeners.append(lambda c: untold.append(_untold(tmp_path / "sparse")))
    anyio.run(lambda: run_scenario("society", llm=TestLLM(3), options={"agents": 20, "rounds": 6},
                                   out_dir=tmp_path / "sparse", run=RunOptions(seed=3, checkpoint_every=5),
                                   control=control))  # fmt: skip
    assert len(untold) == 7 and untold == [0] * 7


def _untold(run: Path) -> int:
    from metaroles.flow.timeline import Timeline

    timeline = Timeline(run)
    timeline.refresh()
    ids = [i for number in timeline.rounds for i in timeline.line(number)["published"]["message_id"]]
    return len(ids) - len(timeline.messages(ids)) if ids else 0


def test_a_page_read_from_many_threads_at_once_gives_what_one_reader_gives(tmp_path):
    """The page serves a timeline from worker threads at once: a fresh one read by eight at a time agrees with one."""
    from metaroles.flow.timeline import Timeline

    run = tmp_path / "run"
    society = ["run", "society", "--llm", "test", "--set", "agents=30", "--set", "rounds=12", "--seed", "2"]
    assert main([*society, "--out", str(run), "-q"]) == 0
    alone = Timeline(run)
    alone.refresh()
    expected = (alone.series(), [alone.delta(r) for r in alone.rounds])
    assert "mean" in expected[0]["series"] and len(expected[0]["rounds"]) == 14  # rounds 0 to 13
    for _ in range(15):
        timeline, start = Timeline(run), threading.Barrier(8)
        got: list[object] = [None] * 8

        def read(i: int, timeline: Timeline, start: threading.Barrier, got: list[object]) -> None:
            start.wait()
            timeline.refresh()
            got[i] = [timeline.delta(r) for r in expected[0]["rounds"]] if i % 2 else timeline.series()

        threads = [threading.Thread(target=read, args=(i, timeline, start, got)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert got == [expected[i % 2] for i in range(8)]
