"""Renderers of the message-flow graph: picture, interactive page (in a real headless browser), GraphML, Mermaid."""

import json
import random
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import anyio
import networkx as nx
import pytest
from PIL import Image

from metaroles import TestLLM
from metaroles.cli import main
from metaroles.flow.graph import role_graph, to_mermaid, write_graphml
from metaroles.flow.page import page_data, render_html
from metaroles.flow.plot import aggregate, draw, render
from metaroles.project.diff import run_messages
from metaroles.project.scenario import run_scenario
from metaroles.record.eventlog import read_events


@pytest.fixture
def run_dir(tmp_path):
    folder = tmp_path / "run"
    anyio.run(lambda: run_scenario("debate", llm=TestLLM(3), options={"turns": 2}, out_dir=folder))
    return folder


def society_events(roles: int = 50, rounds: int = 4) -> list[dict]:
    """A synthetic log: each agent tells two neighbours on a ring, every round."""
    rng, names, events = random.Random(1), [f"agent{i:02d}" for i in range(roles)], []
    for round_no in range(1, rounds + 1):
        for i, name in enumerate(names):
            message_id = f"m{len(events)}"
            action = rng.choice(["Share", "Reply"])
            events.append(
                {
                    "seq": len(events) + 1,
                    "round": round_no,
                    "kind": "publish",
                    "role": name,
                    "message_id": message_id,
                    "cause_by": f"x.{action}",
                    "send_to": [],
                    "caused_by": [],
                }
            )
            for step in (1, -1):
                events.append(
                    {
                        "seq": len(events) + 1,
                        "round": round_no,
                        "kind": "deliver",
                        "role": names[(i + step) % roles],
                        "message_id": message_id,
                    }
                )
    return events


@pytest.mark.parametrize("size", [3, 50])
def test_the_picture_decodes_and_shows_every_role(tmp_path, run_dir, size):
    events = read_events(run_dir / "events.jsonl") if size == 3 else society_events(size)
    png = render(events, tmp_path / "flow.png", title="test")
    with Image.open(png) as image:
        image.verify()
    with Image.open(png) as image:
        assert image.size[0] >= 1400 and image.getextrema()[0][0] < 100, "large enough, and not blank"
    svg = ET.parse(render(events, tmp_path / "flow.svg", title="test"))
    labels = {t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")} | {el.get("id", "") for el in svg.iter()}
    graph = aggregate(events)
    assert graph.number_of_nodes() == (4 if size == 3 else size)
    assert sum(d["count"] for *_, d in graph.edges(data=True)) == sum(e["kind"] == "deliver" for e in events)
    assert svg.getroot().tag.endswith("svg") and labels


def test_graphml_reads_back_with_networkx_and_mermaid_is_well_formed(tmp_path, run_dir):
    events = read_events(run_dir / "events.jsonl")
    back = nx.read_graphml(write_graphml(events, tmp_path / "flow.graphml"))
    assert back.number_of_edges() == role_graph(events).number_of_edges() == sum(e["kind"] == "deliver" for e in events)
    lines = to_mermaid(events).splitlines()
    assert lines[0] == "sequenceDiagram"
    grammar = re.compile(r"^    (Note over \w+: round \d+|\w+->>\w+: [^\n]+)$")
    assert all(grammar.match(line) for line in lines[1:]), [line for line in lines[1:] if not grammar.match(line)]


def test_the_page_holds_its_data_and_fetches_nothing(tmp_path, run_dir):
    events = read_events(run_dir / "events.jsonl")
    texts = {m.id: m.content for m in run_messages(run_dir)}
    page = render_html(events, tmp_path / "flow.html", title="debate <test>", texts=texts).read_text()
    embedded = json.loads(page_json(page))
    assert embedded["title"] == "debate <test>" and "<test>" not in page
    shown = set(embedded["texts"].values())
    assert {text[:500] for text in texts.values()} <= shown, "every message's text is in the page"
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", page))
    assert urls == {"http://www.w3.org/2000/svg"}, "only the SVG namespace name, which is never fetched"
    assert not re.search(r"<(link|img|iframe)\b|<script[^>]+src=", page)
    data = page_data(events, texts)
    assert len(data["deliveries"]) == sum(e["kind"] == "deliver" for e in events)


def page_json(page: str) -> str:
    """The text of the page's one data element."""
    found = re.findall(r'<script id="data" type="application/json">(.*?)</script>', page, flags=re.S)
    assert len(found) == 1
    return found[0]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("Debian's chromium is needed for the browser test: run `make need-chromium` (make test does)")
    return found


def dump_dom(page, fragment: str = "") -> str:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ]
    profile = page.parent / "chromium-profile"
    result = subprocess.run(
        [chromium(), *flags, f"--user-data-dir={profile}", "--dump-dom", page.as_uri() + fragment],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_the_page_in_a_headless_browser_shows_the_roles_and_filters_by_round(tmp_path, run_dir):
    events = read_events(run_dir / "events.jsonl")
    page = render_html(events, tmp_path / "flow.html", texts={m.id: m.content for m in run_messages(run_dir)})
    dom = dump_dom(page)
    shown = re.findall(r'class="role-label"[^>]*>([^<]+)<', dom)
    assert sorted(shown) == sorted(role_graph(events).nodes())
    pairs = {(d["from"], d["to"]) for d in page_data(events)["deliveries"] if d["from"] != d["to"]}
    assert f'data-edges="{len(pairs)}"' in dom
    round_one = {
        (d["from"], d["to"]) for d in page_data(events)["deliveries"] if d["round"] == 1 and d["from"] != d["to"]
    }
    assert f'data-edges="{len(round_one)}"' in dump_dom(page, "#round=1"), "the round filter applies"


def test_run_data_cannot_script_the_page(tmp_path):
    """A run directory named with the data placeholder and messages carrying markup: inert text in a real browser."""
    hostile = (
        "<img src=x onerror=\"document.body.dataset.pwned='img'\"> "
        "</script><script>document.body.dataset.pwned='tag'</script> <!--"
    )
    run_dir = tmp_path / "a__DATA__b<i>"
    code = main(["run", "debate", "--llm", "test", "--set", f"topic={hostile}", "--out", str(run_dir), "-q"])
    assert code == 0
    assert main(["graph", str(run_dir), "-f", "html", "--out", str(tmp_path / "flow.html")]) == 0
    page = (tmp_path / "flow.html").read_text()
    assert "<img" not in page and page.count("</script>") == 2 and page.count("<!--") == 0
    assert json.loads(page_json(page))["title"] == f"debate · {run_dir.name}"
    dom = dump_dom(tmp_path / "flow.html")
    assert "data-pwned" not in dom and "<img" not in dom, "the markup in the data ran"
    assert f"<title>debate · {run_dir.name}</title>" in dom.replace("&lt;", "<").replace("&gt;", ">")


def broadcast_society(agents: int = 100, rounds: int = 3) -> list[dict]:
    """A synthetic log of the default society of agents that broadcast: every message reaches every other agent."""
    names, events = [f"a{i}" for i in range(agents)], []
    for round_no in range(1, rounds + 1):
        for name in names:
            message_id = f"{round_no}-{name}"
            publish = {"round": round_no, "kind": "publish", "role": name, "message_id": message_id}
            events.append({**publish, "cause_by": "x.Share", "send_to": ["<all>"], "caused_by": []})
            for other in names:
                if other != name:
                    events.append({"round": round_no, "kind": "deliver", "role": other, "message_id": message_id})
    return [{"seq": i + 1, **e} for i, e in enumerate(events)]


def test_a_broadcasting_crowd_is_drawn_to_one_all_node_and_the_page_stays_small(tmp_path):
    events = broadcast_society(100)
    graph = aggregate(events)
    assert graph.number_of_edges() == 100 and set(graph.successors("a7")) == {"<all>"}
    assert graph.edges["a7", "<all>"]["count"] == 3, "one edge per broadcast, not one per recipient"
    texts = {e["message_id"]: "an opinion of about forty characters, ok" for e in events if e["kind"] == "publish"}
    page = render_html(events, tmp_path / "flow.html", texts=texts)
    assert page.stat().st_size < 150_000, page.stat().st_size
    small = aggregate(broadcast_society(5))
    assert "<all>" not in small and small.number_of_edges() == 20, "a small team still shows who heard whom"


def test_the_picture_and_the_page_give_each_action_the_same_colour(run_dir):
    from metaroles.flow.plot import action_colours

    events = read_events(run_dir / "events.jsonl")
    data = page_data(events)
    assert data["colours"] == action_colours(aggregate(events)) and len(set(data["colours"].values())) >= 2
    figure = draw(events)
    try:
        drawn = {line.get_label(): line.get_color() for line in figure.axes[0].get_legend().get_lines()}
    finally:
        import matplotlib.pyplot as plt

        plt.close(figure)
    assert all(drawn[action] == colour for action, colour in data["colours"].items())


@pytest.mark.parametrize("size", [3, 50])
def test_the_legend_covers_no_node(run_dir, size):
    import matplotlib.pyplot as plt

    from metaroles.flow.plot import layout

    events = read_events(run_dir / "events.jsonl") if size == 3 else society_events(size)
    figure = draw(events)
    try:
        axes = figure.axes[0]
        box = axes.get_legend().get_window_extent(figure.canvas.get_renderer()).expanded(1.05, 1.05)
        centres = axes.transData.transform(list(layout(aggregate(events)).values()))
        assert not [c for c in centres if box.contains(*c)]
    finally:
        plt.close(figure)
