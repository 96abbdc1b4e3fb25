"""The feed: a platform's rules (posts, cascades, follows, timelines) and the scenario that runs it on the bus."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from metaroles.environments.feed import (
    KINDS,
    RECOMMENDERS,
    Feed,
    Follows,
    chronological,
    generated_follows,
    popular,
    similar,
)
from metaroles.scenarios.feed import FeedAct, FeedChoice, Platform, read_personas

from metaroles import FunctionLLM, TestLLM
from metaroles.core.exceptions import ConfigError
from metaroles.project.interview import interview_run
from metaroles.project.scenario import resume_scenario, run_scenario
from metaroles.record.final_state import referenced_checkpoint
from metaroles.team.options import RunOptions
from tests.faults.helpers import contents
from tests.limited_server import LimitedServer
from tests.test_mcp import _free_port

SMALL = {"agents": 300, "rounds": 8, "activation": 0.2, "llm_share": 0.2}


def feed_of(
    users: int = 6, *, follows: Follows | None = None, recommend=chronological, activation: float = 0.5
) -> Feed:
    return Feed(
        stances=[(-1) ** i * 0.5 for i in range(users)],
        activity=[1.0] * users,
        follows=follows or generated_follows(users, 2, "t"),
        activation=activation,
        recommend=recommend,
        timeline=3,
        key="k",
    )


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# -- the rules ------------------------------------------------------------------------------------------


def test_replies_and_reposts_grow_their_cascade_and_each_action_counts():
    feed = feed_of()
    root = feed.publish(0, "first", 0.5, round=0)
    assert feed.apply(1, "reply", post=root.id, text="no", stance=-0.5, round=1) is None
    assert feed.apply(2, "repost", post=1, text="", stance=0.4, round=1) is None
    assert feed.apply(3, "repost", post=root.id, text="", stance=0.4, round=1) is None
    assert feed.apply(4, "like", post=root.id, text="", stance=0.3, round=1) is None
    cascade = feed.cascades[root.id]
    assert (cascade.size, cascade.depth, cascade.levels, cascade.breadth) == (4, 2, [1, 2, 1], 2)
    assert (root.replies, root.reposts, root.likes) == (1, 1, 1)
    assert feed.posts[2].text == "no" and feed.posts[2].parent == 1 and feed.posts[2].root == root.id
    assert feed.stances[4] == 0.3
    counts = feed.metrics()
    assert (counts["reply"], counts["repost"], counts["like"], counts["invalid"]) == (1, 2, 1, 0)
    assert feed.metrics()["repost"] == 0, "counts are the round's"


def test_refused_actions_say_why_and_change_nothing():
    feed = feed_of(follows=Follows(flat=generated_follows(6, 0, "t").flat, starts=generated_follows(6, 0, "t").starts))
    feed.publish(0, "first", 0.5, round=0)
    before = (len(feed.posts), feed.edges, list(feed.stances))
    assert "unknown action 'share'" in feed.apply(1, "share", post=0, text="", stance=1.0, round=1)
    assert "names no post" in feed.apply(1, "like", post=None, text="", stance=1.0, round=1)
    assert "post 9, which does not exist" in feed.apply(1, "repost", post=9, text="", stance=1.0, round=1)
    assert "oneself" in feed.apply(0, "follow", post=0, text="", stance=1.0, round=1)
    assert feed.apply(1, "follow", post=0, text="", stance=0.5, round=1) is None
    assert "already follows" in feed.apply(1, "follow", post=0, text="", stance=1.0, round=1)
    assert feed.edges == before[1] + 1 and feed.followers[0] == 1 and 0 in feed.followees(1)
    assert len(feed.posts) == before[0] and feed.metrics()["invalid"] == 5


def test_activation_is_a_function_of_the_key_and_round_and_about_the_chance_given():
    feed = feed_of(20_000, follows=generated_follows(20_000, 1, "t"), activation=0.05)
    first = feed.activate(3)
    assert first == feed.activate(3) and first != feed.activate(4)
    assert first == sorted(set(first))
    assert abs(len(first) - 1000) < 4 * math.sqrt(1000)
    assert feed_of(4, activation=1e-9).activate(1), "at least one user acts"


def test_timelines_leave_out_ones_own_and_what_was_shown_and_count_views():
    feed = feed_of(
        6, follows=Follows(flat=generated_follows(6, 0, "t").flat, starts=generated_follows(6, 0, "t").starts)
    )
    for author in (0, 1, 1, 2, 3):
        feed.publish(author, f"by {author}", 0.0, round=0)
    first = feed.timelines([1], 1)[0]
    assert first == [4, 3, 0], "the newest, none of user 1's own"
    assert feed.timelines([1], 2)[0] == [], "nothing is shown twice"
    assert feed.posts[4].views == 1


def test_chronological_shows_the_followed_first_and_popular_the_hottest():
    follows = Follows(flat=generated_follows(5, 0, "t").flat, starts=generated_follows(5, 0, "t").starts)
    feed = feed_of(5, follows=follows)
    feed.added[4] = {0}
    for author in (0, 1, 2, 0, 3):
        feed.publish(author, f"by {author}", 0.0, round=1)
    assert chronological(feed, [4], 3) == [[3, 0, 4]], "user 0's two posts, then the platform's newest"
    feed.posts[1].likes = 10
    feed.posts[2].reposts = 2
    assert popular(feed, [4], 2) == [[1, 2]]


def test_similar_finds_the_posts_nearest_a_users_interests_through_faiss():
    feed = feed_of(3)
    feed.interests = lambda user: ["cycling lanes and bikes", "parking for cars", "trams"][user]
    feed.publish(2, "more parking for cars downtown", 0.0, round=1)
    feed.publish(2, "new cycling lanes and bikes everywhere", 0.0, round=1)
    assert similar(feed, [0, 1], 1) == [[1], [0]]
    assert feed.vectors[0].ntotal == 2


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 7), st.sampled_from([*KINDS, "share"]), st.integers(-1, 12), st.floats(-1, 1)))
)
def test_the_cascades_and_stances_always_add_up(actions):
    feed = feed_of(8)
    feed.publish(0, "seed", 0.5, round=0)
    for user, kind, post, stance in actions:
        feed.apply(user, kind, post=None if post < 0 else post, text="t", stance=stance, round=1)
    assert sum(c.size for c in feed.cascades.values()) == len(feed.posts)
    for post in feed.posts:
        above = feed.posts[post.parent] if post.parent >= 0 else None
        assert post.depth == (above.depth + 1 if above else 0) and feed.posts[post.root].parent == -1
    for cascade in feed.cascades.values():
        assert sum(cascade.levels) == cascade.size and len(cascade.levels) == cascade.depth + 1
    n = feed.users
    mean = sum(feed.stances) / n
    got = feed.metrics()
    assert got["polarization"] == pytest.approx(sum(s * s for s in feed.stances) / n - mean * mean, abs=1e-6)
    assert got["follow_edges"] == sum(len(feed.followees(u)) for u in range(n))


# -- the scenario ----------------------------------------------------------------------------------------


async def test_a_feed_run_posts_spreads_and_measures_each_round(tmp_path):
    _, team = await run_scenario("feed", llm=TestLLM(), options=SMALL, out_dir=tmp_path / "run", run=RunOptions(seed=2))
    lines = rows(tmp_path / "run")
    assert [line["round"] for line in lines] == list(range(9))
    acted = [sum(line[k] for k in (*KINDS, "invalid")) for line in lines[3:]]
    assert acted == [line["activated"] for line in lines[1:-2]], "activated, it acts in the next round, applied after"
    last = lines[-1]
    assert last["posts_total"] > 1 and last["tracked"]["0"]["reach"] > 0
    assert 0 <= last["polarization"] <= 1 and last["follow_edges"] >= 300 * 5
    platform = team.env.roles["Platform"]
    assert isinstance(platform, Platform) and platform.feed is not None
    graph = platform.feed.follower_graph()
    assert graph.number_of_edges() == last["follow_edges"]
    cascade = platform.feed.cascade_graph(0)
    assert cascade.number_of_nodes() == last["tracked"]["0"]["size"]
    backed = [m for m in team.env.history if isinstance(m.instruct_content, FeedAct) and m.sent_from != "Platform"]
    assert backed and len(team.env.ledger.entries) > 0, "the model-backed users asked their model"


async def test_the_platform_rebuilt_from_its_memory_is_the_platform_that_ran(tmp_path):
    _, team = await run_scenario("feed", llm=TestLLM(), options=SMALL, out_dir=None, run=RunOptions(seed=4))
    platform = team.env.roles["Platform"]
    ran = platform.feed
    platform.feed = None
    platform.rc.news, platform.rc.remembered = [], 0
    rebuilt = platform.current_feed()
    assert rebuilt is not ran
    assert [
        vars(p) if not hasattr(p, "__slots__") else [getattr(p, f) for f in p.__slots__] for p in rebuilt.posts
    ] == [[getattr(p, f) for f in p.__slots__] for p in ran.posts]
    assert rebuilt.seen == ran.seen and list(rebuilt.stances) == list(ran.stances) and rebuilt.added == ran.added


async def test_a_feed_resumed_from_an_earlier_checkpoint_is_the_run_that_never_stopped(tmp_path):
    options = {**SMALL, "rounds": 9}
    await run_scenario(
        "feed", llm=TestLLM(), options=options, out_dir=tmp_path / "a", run=RunOptions(seed=1, checkpoint_every=3)
    )
    straight = contents(tmp_path / "a")
    for later in (tmp_path / "a" / "checkpoints").glob("round-*.json"):
        if int(later.stem[6:]) > 3:
            later.unlink()
    await resume_scenario(tmp_path / "a", llm=TestLLM())
    again = contents(tmp_path / "a")
    assert {k: v for k, v in again.items() if not k.startswith("checkpoints/")} == {
        k: v for k, v in straight.items() if not k.startswith("checkpoints/")
    }


def test_the_same_seed_in_two_processes_writes_the_same_feed(tmp_path):
    def run(out: Path, hash_seed: str) -> None:
        sets = [a for k, v in SMALL.items() for a in ("--set", f"{k}={v}")]
        args = [sys.executable, "-m", "metaroles", "run", "feed", "--llm", "test", "--seed", "9", *sets]
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run([*args, "--out", str(out), "-q"], capture_output=True, text=True, env=env, check=False)
        assert done.returncode == 0, done.stderr[-2000:]

    run(tmp_path / "a", "1")
    run(tmp_path / "b", "2")
    assert contents(tmp_path / "a") == contents(tmp_path / "b")


def test_a_feed_of_100000_users_is_the_same_in_two_processes_and_resumed_after_a_cut(tmp_path):
    """Users are built when first reached (a cast with names): which ones, and when, never shows in the run."""
    options = {"agents": 100_000, "activation": 0.025, "llm_share": 1}
    sets = [a for k, v in options.items() for a in ("--set", f"{k}={v}")]

    def cli(hash_seed: str, *args: str) -> None:
        base = [sys.executable, "-m", "metaroles", *args, "-q"]
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run(base, capture_output=True, text=True, env=env, check=False)
        assert done.returncode == 0, done.stderr[-2000:]

    for out, hash_seed in (("a", "1"), ("b", "2")):
        run = ["run", "feed", "--llm", "test", "--seed", "4", *sets, "--rounds", "4", "--checkpoint-every", "2"]
        cli(hash_seed, *run, "--out", str(tmp_path / out))
    straight = contents(tmp_path / "a")
    assert contents(tmp_path / "b") == straight
    first = json.loads((tmp_path / "a" / "checkpoints" / "round-0000.json").read_text())
    assert len(first["roles"]) < 100  # the platform and the users the first round reached, not 100,000
    assert referenced_checkpoint(tmp_path / "a" / "state.json") is not None  # writing all would build them all
    (tmp_path / "b" / "checkpoints" / "round-0004.json").unlink()  # cut after round 2
    cli("3", "resume", str(tmp_path / "b"))
    assert contents(tmp_path / "b") == straight


async def test_a_users_interview_sees_its_timeline_and_its_persona(tmp_path):
    _, team = await run_scenario("feed", llm=TestLLM(), options=SMALL, out_dir=tmp_path / "run", run=RunOptions(seed=2))
    acted = next(m.sent_from for m in team.env.history if isinstance(m.instruct_content, FeedAct))
    answers = await interview_run(
        tmp_path / "run",
        questions=["What do you think of the plan?"],
        llm=TestLLM(),
        roles=acted,
        out_dir=tmp_path / "ask",
        at_round=8,
    )
    assert [a.role for a in answers] == [acted] and answers[0].answer
    persona = team.env.roles[acted].persona
    assert answers[0].attributes["number"] == int(acted[1:]) and persona.bio


# -- bad input ---------------------------------------------------------------------------------------------


def test_a_persona_file_with_a_bad_row_is_named_by_line_before_anything_runs(tmp_path):
    good = tmp_path / "people.csv"
    good.write_text("bio,stance,activity,herd\nA nurse.,0.5,0.2,0.1\nA student.,-0.7,,\n")
    assert [p.stance for p in read_personas(good)] == [0.5, -0.7]
    bad = tmp_path / "bad.csv"
    bad.write_text("bio,stance,activity\nA nurse.,0.5,0.2\nA student.,1.7,0.5\n")
    with pytest.raises(ConfigError, match=r"bad.csv:3: stance='1.7': .*less than or equal to 1"):
        read_personas(bad)
    lines = tmp_path / "bad.jsonl"
    lines.write_text('{"bio": "x", "stance": 0}\n{"bio": "y", "stance": 0\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: not JSON"):
        read_personas(lines)
    out = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "metaroles",
            "run",
            "feed",
            "--llm",
            "test",
            "--set",
            f"personas={bad}",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("error")]
    assert done.returncode == 2 and len(errors) == 1 and "bad.csv:3" in errors[0], done.stderr
    assert not out.exists() and "Traceback" not in done.stderr


async def test_a_models_unknown_action_is_counted_said_once_and_the_run_goes_on(tmp_path):
    def answer(request) -> str:
        return json.dumps({"action": "share", "post": 1, "text": "", "stance": 0.1})

    with pytest.warns(UserWarning, match=r"action refused: unknown action: .*share") as said:
        await run_scenario(
            "feed", llm=FunctionLLM(answer), options={**SMALL, "llm_share": 1.0}, out_dir=tmp_path / "run"
        )
    assert len([w for w in said if "unknown action" in str(w.message)]) == 1
    lines = rows(tmp_path / "run")
    assert len(lines) == 9 and sum(line["invalid"] for line in lines[1:]) == sum(
        line["activated"] for line in lines[1:-2]
    )


RAISING = """
from metaroles.scenarios.feed import *  # noqa: F403
from metaroles.scenarios import feed
from pathlib import Path

def mine(platform, users, k):
    if len(platform.posts) > 12 and not Path(__file__).with_name("fixed").exists():
        raise ValueError("the ranking table is missing")
    return feed.RECOMMENDERS["popular"](platform, users, k)

def build(config, llm):
    return feed.build(config, llm, recommender=mine)
"""


def test_a_recommender_that_raises_stops_the_run_in_one_line_and_it_resumes(tmp_path):
    (tmp_path / "mine.py").write_text(RAISING)
    sets = [a for k, v in SMALL.items() for a in ("--set", f"{k}={v}")]
    base = [sys.executable, "-m", "metaroles"]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *args], capture_output=True, text=True, cwd=tmp_path, check=False)

    failed = cli("run", "mine.py", "--llm", "test", "--seed", "3", *sets, "--out", "a", "-q", "--checkpoint-every", "1")
    errors = [line for line in failed.stderr.splitlines() if line.startswith("error")]
    assert failed.returncode == 1 and len(errors) == 1, failed.stderr
    assert "recommender failed" in failed.stderr and "the ranking table is missing" in failed.stderr
    assert "metaroles resume" in failed.stderr and "Traceback" not in failed.stderr
    (tmp_path / "fixed").write_text("")
    resumed = cli("resume", "a", "-q", "--trust")
    assert resumed.returncode == 0, resumed.stderr
    straight = cli(
        "run", "mine.py", "--llm", "test", "--seed", "3", *sets, "--out", "b", "-q", "--checkpoint-every", "1"
    )
    assert straight.returncode == 0, straight.stderr
    one, two = contents(tmp_path / "a"), contents(tmp_path / "b")
    assert {k: v for k, v in one.items() if not k.startswith("checkpoints/")} == {
        k: v for k, v in two.items() if not k.startswith("checkpoints/")
    }


def test_a_dead_endpoint_among_several_is_said_once_and_the_others_answer_every_call(tmp_path):
    choice = FeedChoice(action="like", post=1, text="", stance=0.2).model_dump_json()
    live = LimitedServer(10**9, 60.0, answer=choice)
    dead = f"http://127.0.0.1:{_free_port()}/v1"
    try:
        args = ["run", "feed", "--llm", "openai", "--model", "m", "--base-url", f"{live.url},{dead}", "--seed", "1"]
        sets = ["--set", "agents=40", "--set", "llm_share=1", "--set", "activation=0.3", "--rounds", "4"]
        env = {**os.environ, "OPENAI_API_KEY": "sk-test"}
        done = subprocess.run(
            [sys.executable, "-m", "metaroles", *args, *sets, "--out", str(tmp_path / "run"), "-q"],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
    finally:
        live.stop()
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(dead) == 2, done.stderr  # the model's line names it, and the one warning
    lines = rows(tmp_path / "run")
    assert sum(line["like"] + line["invalid"] for line in lines[1:]) == sum(line["activated"] for line in lines[1:-2])
    assert len(live.admitted) >= sum(line["activated"] for line in lines[1:-1])
    assert "error" not in done.stderr and "Traceback" not in done.stderr


def test_the_built_in_recommenders_are_named():
    assert sorted(RECOMMENDERS) == ["chronological", "mixed", "popular", "similar"]


async def test_the_platforms_fan_out_is_logged_once_per_turn_and_read_back_whole(tmp_path):
    from metaroles.record.eventread import read_events

    await run_scenario("feed", llm=TestLLM(), options=SMALL, out_dir=tmp_path / "run", run=RunOptions(seed=2))
    lines = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    written = [c for line in lines for c in line.get("published", {}).get("caused_by", [])]
    assert written.count(["^"]) > 100, "a timeline after the first of its turn names its causes as the one before"
    timelines = [
        e for e in read_events(tmp_path / "run" / "events.jsonl") if e["kind"] == "publish" and e["role"] == "Platform"
    ]
    by_round: dict[int, list] = {}
    for event in timelines:
        assert event["caused_by"] != ["^"]
        by_round.setdefault(event["round"], []).append(event["caused_by"])
    assert all(all(c == causes[0] for c in causes) for causes in by_round.values())
    assert max(len(causes[0]) for causes in by_round.values()) > 20, "each timeline: the platform's whole news"


def test_the_feed_suite_compares_recommenders_by_polarization_and_spread(tmp_path):
    import pandas as pd

    from metaroles.project.evaluate import load_suite, run_eval

    suite = load_suite("feed", seeds=[0])
    rows = run_eval(suite, tmp_path / "eval", jobs=2)
    assert sorted(r["setting"] for r in rows) == sorted(["chronological", "mixed", "popular"] * 2)
    reach = {(r["task"], r["setting"]): r["seed_reach"] for r in rows}
    assert all(
        reach["from_the_most_followed", s] > reach["from_an_ordinary_user", s] for s in ("mixed", "chronological")
    )
    assert all(r["seed_reach"] > 0 and 0 < r["polarization"] < 1 and r["largest_cascade"] >= 1 for r in rows)
    summary = pd.read_csv(tmp_path / "eval" / "summary.csv")
    assert set(summary["metric"]) >= {"polarization", "seed_reach", "seed_size", "largest_cascade"}


def test_a_persona_file_is_streamed_and_whatever_is_not_one_is_a_line_naming_it(tmp_path):
    import os
    import tracemalloc

    big = tmp_path / "big.csv"
    with big.open("wb") as file:
        file.write(b"bio,stance\n" + b"".join(f"Person {i}.,0.{i}\n".encode() for i in range(5)))
        file.truncate(10 * 1024**3)  # 10 GB: what follows the rows (zeros, never written to disk) is never read
    tracemalloc.start()
    assert [p.bio for p in read_personas(big, limit=3)] == ["Person 0.", "Person 1.", "Person 2."]
    assert tracemalloc.get_traced_memory()[1] < 4 * 1024**2
    tracemalloc.stop()
    excel = tmp_path / "excel.csv"
    excel.write_bytes("\ufeffbio,stance\nA nurse.,0.5\n".encode())
    assert read_personas(excel)[0].bio == "A nurse.", "Excel's CSV UTF-8 starts with a byte-order mark"
    wide = tmp_path / "wide.csv"
    wide.write_text("bio,stance\n" + "x" * 200_000 + ",0.1\n")
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 10_000 + "]" * 10_000 + "\n")
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    for path, said in [
        (Path("/dev/zero"), "is not a regular file"),
        (fifo, "is not a regular file"),
        (wide, "wide.csv:2: a line longer than 64 KiB"),
        (deep, "deep.jsonl:1: JSON nested too deeply"),
        (big.with_name("absent.csv"), "is not a regular file"),
    ]:
        with pytest.raises(ConfigError, match=said):
            read_personas(path)
    for path in (Path("/dev/zero"), wide, deep, fifo):
        done = subprocess.run(
            [sys.executable, "-m", "metaroles", "run", "feed", "--llm", "test", "--set", f"personas={path}",
             "--out", str(tmp_path / "run"), "-q"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert not (tmp_path / "run").exists()


def test_a_parquet_personas_file_is_read_a_batch_at_a_time_and_only_its_persona_columns(tmp_path):
    """A population's Parquet (extra columns such as age or region) gives the feed its users' first rows only."""
    import tracemalloc

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 300_000
    table = pa.table(
        {
            "age": pa.array([20 + i % 60 for i in range(rows)]),
            "region": pa.array(["north", "south"] * (rows // 2)),
            "bio": pa.array([f"Person {i}, who rides the tram." for i in range(rows)]),
            "stance": pa.array([(i % 201 - 100) / 100 for i in range(rows)]),
            "notes": pa.array(["x" * 200] * rows),  # never read: not a persona's column
        }
    )
    pq.write_table(table, tmp_path / "people.parquet", row_group_size=8192)
    tracemalloc.start()
    personas = read_personas(tmp_path / "people.parquet", limit=5)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert [(p.bio, p.stance) for p in personas] == [
        (f"Person {i}, who rides the tram.", (i - 100) / 100) for i in range(5)
    ]
    assert peak < 16 * 1024**2, f"{peak} bytes: the file ({rows} rows) was read whole"
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"bio": ["A nurse.", "A cook."], "stance": [0.1, 3.0]}), bad)
    with pytest.raises(ConfigError, match=r"bad.parquet:2: stance=3.0"):
        read_personas(bad)
    (tmp_path / "not.parquet").write_text("bio,stance\n")
    with pytest.raises(ConfigError, match="is not Parquet"):
        read_personas(tmp_path / "not.parquet")
