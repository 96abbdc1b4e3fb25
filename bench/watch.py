"""What watching a run costs, what the page is sent and how fast it draws; how fast a big run's replay opens and jumps.

Live (``--agents`` 10,000, ``--rounds`` 10, the test model): the same society run three ways, the
ways interleaved ``--repeat`` times — alone; followed by ``metaroles watch`` (another process) with
a page open in headless chromium; and serving its own page with its controls (``--watch``: the run
keeps its controls, a page process it starts serves the page) with a page open.
``watch_cost_*`` is the median, over the repetitions, of the run's time (wall, and the CPU of the
run's own process) over the lone run's, less one (this machine's noise is several per cent);
``watch_cost_*_round`` compares the run's pace once under way (a round's start to the next's, from
round 2 on: the browser's and the page's start-up left out). ``--pin`` puts each run on the first
core and the browser and the page's process on the second, as on a machine where the browser has
a core of its own. ``own_page_process_cpu_over_the_runs`` is the CPU the own page's process took
over the run's (on the other core: its start-up, each round's delta — ``delta_ms_per_round`` —
and the streams). ``stream_bytes_per_round`` is the size of
each round's event on the stream (the round's delta; the page never receives the history);
``render_ms`` is the page's own measure of drawing a round (``performance.now()`` around it).
``shown_after_round_s`` is how soon a stepped round shows on the run's own page after its line is in
``events.jsonl`` (a 30-agent society under ``--control``, stepped five times from the page).

Replay (``--replay-agents`` 10,000 × ``--replay-rounds`` 100: a million messages): ``open_s`` is
from loading the page of the finished run to its showing the last round, ``jump_s`` from moving the
timeline to a round to the page showing it, for rounds spread over the run (median and max).

Run: ``python bench/watch.py`` (needs Debian's chromium and playwright: ``make test`` installs both).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson
from playwright.sync_api import Page, sync_playwright

from metaroles.flow.link import POLL_SECONDS, RunLink, answer_link
from metaroles.flow.timeline import Timeline
from metaroles.team.control import RunControl

CHROMIUM = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking"]


PINNED: list[str] = []
"""``taskset -c 0`` with ``--pin``: each run on the first core; the browser and the page's process on the second."""


def society(agents: int, rounds: int, out: Path, *extra: str) -> list[str]:
    return [*PINNED, sys.executable, "-m", "metaroles", "run", "society", "--set", f"agents={agents}",
            "--rounds", str(rounds), "--llm", "test", "--seed", "1", "-q", "--out", str(out), *extra]  # fmt: skip


def timed(command: list[str], follow=None) -> tuple[float, float, list[float] | None]:
    """Run ``command``; its wall and CPU seconds (its own process's: not a page process it started and waited
    for), and what ``follow`` (the process, its exit event) returned."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    exited, ended = threading.Event(), {}

    def reap() -> None:
        os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: its /proc entry stays
        wall = time.perf_counter() - started
        ticks = [int(f) for f in Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()[11:15]]
        _, status, _ = os.wait4(process.pid, 0)
        hz = os.sysconf("SC_CLK_TCK")
        ended.update(code=os.waitstatus_to_exitcode(status), wall=wall, cpu=(ticks[0] + ticks[1]) / hz,
                     children_cpu=(ticks[2] + ticks[3]) / hz)  # fmt: skip
        exited.set()

    threading.Thread(target=reap, daemon=True).start()
    result = follow(process, exited) if follow else None
    process.stderr.read()
    exited.wait()
    process.returncode = ended["code"]
    assert ended["code"] == 0, f"{command} failed"
    CHILDREN_CPU.append(ended["children_cpu"])
    return ended["wall"], ended["cpu"], result


CHILDREN_CPU: list[float] = []
"""The CPU seconds of the processes each timed run waited for (a run's own page: ``--watch``)."""


def page_follows(url: str, done: threading.Event, times: list[float]) -> None:
    """A headless chromium page on ``url`` until ``done``; its render times land in ``times``."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM)
        page = browser.new_page()
        page.goto(url)
        while not done.wait(0.5):
            try:
                times[:] = page.evaluate("window.renderTimes")
            except Exception:  # the page's server is gone with the run
                break
        browser.close()


def with_external_watcher(out: Path):
    def follow(process: subprocess.Popen, exited: threading.Event) -> list[float]:
        while not (out / "manifest.json").exists() and not exited.is_set():
            exited.wait(0.02)
        watcher = subprocess.Popen([sys.executable, "-m", "metaroles", "watch", str(out)], stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, text=True)  # fmt: skip
        url = re.search(r"http://\S+/", watcher.stdout.readline()).group(0)
        return _page_until_exit(url, exited, finally_stop=watcher)

    return follow


def with_own_page(process: subprocess.Popen, exited: threading.Event) -> list[float]:
    for line in process.stderr:
        found = re.search(r"http://\S+#token=\S+", line)
        if found:
            if PINNED:  # the page's process (the run's child) goes where the browser is
                for child in Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split():
                    os.sched_setaffinity(int(child), os.sched_getaffinity(0))
            return _page_until_exit(found.group(0), exited)
    return []


def _page_until_exit(url: str, exited: threading.Event, finally_stop: subprocess.Popen | None = None) -> list[float]:
    done, times = threading.Event(), []
    page = threading.Thread(target=page_follows, args=(url, done, times))
    page.start()
    exited.wait()
    done.set()
    page.join()
    if finally_stop is not None:
        finally_stop.terminate()
        finally_stop.wait()
    return times


def round_period(run_dir: Path) -> float:
    """Seconds from one round's start to the next's, from round 2 on (the run's pace once it is under way)."""
    starts = [orjson.loads(line)["start_ns"] for line in (run_dir / "timings.jsonl").read_bytes().splitlines()]
    return (starts[-1] - starts[2]) / (len(starts) - 3) / 1e9


def link_cost(requests: int = 2000) -> dict:
    """What the run's process spends on its own page: the CPU its link thread takes to answer a request.

    The page's process asks the run where it stands every ``POLL_SECONDS`` (and on each click); the
    run's only other work for its page is spawning it. Measured on the thread's own CPU clock.
    """
    control = RunControl()
    ours, theirs = socket.socketpair()
    answering = threading.Thread(target=answer_link, args=(ours, control, None, "token"), daemon=True)
    answering.start()
    link = RunLink(theirs)
    clock = time.pthread_getcpuclockid(answering.ident)
    before = time.clock_gettime(clock)
    for _ in range(requests):
        link.pause()  # a request that does something, and brings back the state as every answer does
    spent = (time.clock_gettime(clock) - before) / requests
    link.close()
    answering.join()
    return {
        "link_us_per_request": round(spent * 1e6, 1),
        "link_share_of_a_core": round(spent / POLL_SECONDS, 6),  # the page's process asks 1/POLL_SECONDS a second
    }


def live(agents: int, rounds: int, repeat: int, folder: Path) -> dict:
    runs: dict[str, list[tuple[float, float, float]]] = {"alone": [], "external": [], "own": []}
    renders: list[float] = []
    page_cpu: list[float] = []
    for n in range(repeat):
        ways = [("alone", [], None), ("external", [], "external"), ("own", ["--watch"], with_own_page)]
        for name, extra, follow in ways if n % 2 == 0 else reversed(ways):
            out = folder / f"{name}-{n}"
            chosen = with_external_watcher(out) if follow == "external" else follow
            wall, cpu, times = timed(society(agents, rounds, out, *extra), chosen)
            runs[name].append((wall, cpu, round_period(out)))
            if name == "own":
                page_cpu.append(CHILDREN_CPU[-1] / cpu)
            renders += times or []
    pairs = {name: list(zip(runs["alone"], runs[name], strict=True)) for name in ("external", "own")}
    cost = {
        f"watch_cost_{name}_{kind}": round(statistics.median(b[i] / a[i] - 1 for a, b in pairs[name]), 4)
        for name in pairs
        for i, kind in ((0, "wall"), (1, "cpu"), (2, "round"))
    }
    timeline = Timeline(folder / "alone-0")
    timeline.refresh()
    sizes = [len(b"event: round\ndata: " + orjson.dumps(timeline.delta(r)) + b"\n\n") for r in timeline.rounds[1:]]
    delta_s = []
    for r in timeline.rounds[1:]:
        started = time.perf_counter()
        timeline.delta(r)
        delta_s.append(time.perf_counter() - started)
    startup, _, _ = timed(society(agents, 0, folder / "startup"))  # building the society, no round
    round_s = (statistics.median(w for w, _, _ in runs["alone"]) - startup) / rounds
    return {
        "agents": agents, "rounds": rounds, "repeat": repeat,
        "runs_wall_cpu_round": {name: [[round(x, 3) for x in run] for run in done] for name, done in runs.items()},
        "round_ms": round(1000 * round_s, 1), "delta_ms_per_round": round(1000 * statistics.median(delta_s), 2),
        **cost, "own_page_process_cpu_over_the_runs": round(statistics.median(page_cpu), 4),
        "stream_bytes_per_round_median": int(statistics.median(sizes)), "stream_bytes_per_round_max": max(sizes),
        "events_jsonl_bytes_per_round": (folder / "alone-0" / "events.jsonl").stat().st_size // len(timeline.rounds),
        "render_ms_median": round(statistics.median(renders), 1) if renders else None,
        "render_ms_max": round(max(renders), 1) if renders else None, "rounds_rendered": len(renders),
    }  # fmt: skip


def shown_after_round(folder: Path, agents: int = 30, steps: int = 5) -> dict:
    """Seconds from a stepped round's line in ``events.jsonl`` to the run's own page showing that round.

    A ``--control`` society (paused before round 1) is stepped from its page ``steps`` times; after each
    step, the page's clock when it shows the round less the log's modification time (the round written).
    Was a test's assertion (under a second); a speed is a figure, and a loaded machine's is another.
    """
    out = folder / "stepped"
    command = society(agents, steps + 1, out, "--control", "--checkpoint-every", "1")  # the last round: resumed
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = next((m.group(0) for line in process.stderr if (m := re.search(r"http://127\S+#token=\S+", line))), None)
    assert url is not None, "the run printed no page URL"
    shown: list[float] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM)
        page = browser.new_page()
        page.goto(url)
        page.wait_for_selector("body[data-controller=yes][data-control=paused]", timeout=60_000)
        for round_no in range(1, steps + 1):
            page.click("#step")
            page.wait_for_selector(f"body[data-round='{round_no}'][data-waiting-at='{round_no}']", timeout=60_000)
            shown.append(page.evaluate("Date.now()") / 1000 - (out / "events.jsonl").stat().st_mtime)
        page.click("#resume")
        browser.close()
    process.stderr.read()
    process.wait()
    return {
        "shown_after_round_s_median": round(statistics.median(shown), 3),
        "shown_after_round_s_max": round(max(shown), 3),
    }


def replay(agents: int, rounds: int, folder: Path, jumps: int) -> dict:
    out = folder / f"society-{agents}x{rounds}"  # kept between runs of the bench: making it takes minutes
    started = time.perf_counter()
    if not (out / "report.json").exists():
        shutil.rmtree(out, ignore_errors=True)
        timed(society(agents, rounds, out))
    made = time.perf_counter() - started
    messages = sum(1 for _ in open(out / "checkpoints" / "messages.jsonl", "rb"))
    watcher = subprocess.Popen([sys.executable, "-m", "metaroles", "watch", str(out)], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        url = re.search(r"http://\S+/", watcher.stdout.readline()).group(0)
        opened, jumped = _scrub(url, rounds, jumps)
    finally:
        watcher.terminate()
        watcher.wait()
    return {
        "replay_messages": messages, "replay_events_jsonl_mb": round((out / "events.jsonl").stat().st_size / 1e6),
        "replay_made_s": round(made, 1), "open_s": round(opened, 3),
        "jump_s_median": round(statistics.median(jumped), 3), "jump_s_max": round(max(jumped), 3),
    }  # fmt: skip


def _scrub(url: str, rounds: int, jumps: int) -> tuple[float, list[float]]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM)
        page: Page = browser.new_page()
        started = time.perf_counter()
        page.goto(url)
        page.wait_for_selector("body[data-ready=yes]", timeout=120_000)
        opened = time.perf_counter() - started
        assert int(page.get_attribute("body", "data-round")) >= rounds  # the last round is shown
        jumped = []
        for target in random.Random(7).sample(range(1, rounds + 1), jumps):
            started = time.perf_counter()
            page.fill("#scrub", str(target))  # the slider's stops are the rounds 0, 1, 2, ...
            page.dispatch_event("#scrub", "input")
            page.wait_for_selector(f"body[data-round='{target}']", timeout=60_000)
            jumped.append(time.perf_counter() - started)
        browser.close()
    return opened, jumped


def screenshots(folder: Path, out: Path) -> dict:
    """The live view (30 agents paused after round 2, a message injected) and the replay view (a role's panel)."""
    out.mkdir(parents=True, exist_ok=True)
    run = folder / "shown"
    command = society(30, 6, run, "--control", "--checkpoint-every", "1", "--set", "llm_agents=3", "--record",
                      str(folder / "calls.jsonl"))  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = next(m.group(0) for line in process.stderr if (m := re.search(r"http://\S+#token=\S+", line)))
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM)
        page = browser.new_page(viewport={"width": 1280, "height": 760})
        page.goto(url)
        page.wait_for_selector("body[data-controller=yes][data-waiting-at='0']")
        page.click("#step")
        page.wait_for_selector("body[data-waiting-at='1']")
        page.click("#inject-box summary")
        page.fill("#inject-name", "rumour")
        page.fill("#inject-text", "The bridge is closed today.")
        page.click("#inject")
        page.click("#step")
        page.wait_for_selector("body[data-round='2'][data-waiting-at='2']")
        page.wait_for_function("document.querySelector('#flow').innerText.includes('The bridge is closed')")
        page.click("#flow .role >> text=a3 >> nth=0")
        page.wait_for_selector("#panel:not([hidden])")
        page.screenshot(path=str(out / "watch-live.png"))
        page.click("#resume")
        process.wait()
        replay = browser.new_page(viewport={"width": 1280, "height": 760})
        watcher = subprocess.Popen([sys.executable, "-m", "metaroles", "watch", str(run)], stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, text=True)  # fmt: skip
        replay.goto(re.search(r"http://\S+/", watcher.stdout.readline()).group(0))
        replay.wait_for_selector("body[data-ready=yes]")
        replay.fill("#scrub", "4")
        replay.dispatch_event("#scrub", "input")
        replay.wait_for_selector("body[data-round='4']")
        replay.click("#flow .role >> text=a1 >> nth=0")
        replay.wait_for_selector("body[data-state='a1@4']")
        replay.fill("#ask-question", "What changed your mind?")
        replay.click("#ask")
        replay.wait_for_selector("body[data-asked=yes]")
        replay.screenshot(path=str(out / "watch-replay.png"), full_page=True)
        drawn = views(replay, out)
        watcher.terminate()
        drawn += compared(browser, run, folder / "fork", out)
        browser.close()
    return {"screenshots": [str(out / "watch-live.png"), str(out / "watch-replay.png"), *drawn]}


def views(page, out: Path) -> list[str]:
    """The replay's figures over the rounds, who talks to whom, a conversation, a role's panel, the spread."""
    page.check("#chart-pick input[value=mean]")
    page.check("#chart-pick input[value=variance]")
    page.locator("#chart-box").screenshot(path=str(out / "watch-figures.png"))
    page.click("#network-box summary")
    page.wait_for_selector("body[data-network='4']")
    page.locator("#network-box").screenshot(path=str(out / "watch-network.png"))
    page.click("#dist-box summary")
    page.wait_for_selector("body[data-distribution='4']")
    page.locator("#dist-box").screenshot(path=str(out / "watch-distribution.png"))
    page.locator("#panel").screenshot(path=str(out / "watch-panel.png"))
    page.click("#flow tbody tr .said-cell >> nth=0")
    page.wait_for_selector("body[data-thread]")
    page.locator("#thread").screenshot(path=str(out / "watch-conversation.png"))
    names = (
        "watch-figures.png",
        "watch-network.png",
        "watch-conversation.png",
        "watch-panel.png",
        "watch-distribution.png",
    )
    return [str(out / name) for name in names]


def compared(browser, run: Path, fork: Path, out: Path) -> list[str]:
    """The run beside a fork of it from round 3 with a stubborn agent (``--compare``), as a picture."""
    made = [sys.executable, "-m", "metaroles", "fork", str(run), "--from-round", "3", "--intervene", "rule:a0=1.0"]
    subprocess.run([*made, "--out", str(fork), "-q"], check=True, capture_output=True)
    watcher = subprocess.Popen([sys.executable, "-m", "metaroles", "watch", str(run), "--compare", str(fork)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    page = browser.new_page(viewport={"width": 1280, "height": 760})
    page.goto(re.search(r"http://\S+/", watcher.stdout.readline()).group(0))
    page.wait_for_selector("body[data-ready=yes][data-compared]")
    page.check("#chart-pick input[value=mean]")
    page.locator("#chart-box").screenshot(path=str(out / "watch-compare.png"))
    watcher.terminate()
    return [str(out / "watch-compare.png")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--replay-agents", type=int, default=10_000)
    parser.add_argument("--replay-rounds", type=int, default=100)
    parser.add_argument("--jumps", type=int, default=10)
    parser.add_argument("--only", choices=["live", "replay", "none"], default=None)
    parser.add_argument("--replay-dir", type=Path, default=Path(tempfile.gettempdir()) / "metaroles-bench-replay")
    parser.add_argument("--screenshots", type=Path, default=None, help="write the live and replay views' pictures here")
    parser.add_argument("--pin", action="store_true", help="the run on core 0, the browser and the page on core 1")
    args = parser.parse_args()
    if args.pin:
        PINNED[:] = ["taskset", "-c", "0"]
        os.sched_setaffinity(0, {1})  # this process, and what it starts: chromium, `metaroles watch`
    figures: dict = {"load_before": round(os.getloadavg()[0], 2), "pinned": args.pin}
    with tempfile.TemporaryDirectory(prefix="metaroles-watch-bench-") as folder:
        if args.screenshots is not None:
            figures |= screenshots(Path(folder), args.screenshots)
            args.only = args.only or "none"
        if args.only in (None, "live"):
            figures |= (
                link_cost()
                | shown_after_round(Path(folder))
                | live(args.agents, args.rounds, args.repeat, Path(folder))
            )
    if args.only in (None, "replay"):
        figures |= replay(args.replay_agents, args.replay_rounds, args.replay_dir, args.jumps)
    figures["load_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
