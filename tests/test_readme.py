import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)


def test_readme_opens_with_the_two_commands():
    first_block = re.search(r"```sh\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["make demo", "make test"]


def test_your_own_role_example_runs_and_prints_the_reply():
    example = python_blocks()[0]
    assert len(example.strip().splitlines()) <= 20
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(example, "README.md", "exec"), {"__name__": "readme_example"})
    assert out.getvalue().strip() == "loud: HELLO BUS!"


def test_every_readme_snippet_runs():
    for block in python_blocks()[1:]:
        exec(compile(block, "README.md", "exec"), {"__name__": "readme_snippet"})


def test_the_pictures_the_readme_shows_exist():
    pictures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README.read_text(encoding="utf-8"))
    assert pictures and all((README.parent / p).is_file() for p in pictures)


def readme_example(name: str) -> str:
    text = README.read_text(encoding="utf-8")
    found = re.search(rf"<!-- example: {name} .*?-->\n```python\n(.*?)```", text, flags=re.DOTALL)
    assert found is not None, f"the README has no {name!r} example"
    return found.group(1)


def test_the_write_a_scenario_section_runs_its_scenario():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(readme_example("write-a-scenario"), "README.md", "exec"), {"__name__": "readme_scenario"})
    assert out.getvalue().startswith("Decision on 2 reviews: "), out.getvalue()


def test_the_write_a_scenario_entry_points_are_the_registry_s_groups():
    import tomllib

    from metaroles.project.registry import ENTRY_POINTS

    text = README.read_text(encoding="utf-8")
    block = re.search(r"## Write a scenario.*?```toml\n(.*?)```", text, flags=re.DOTALL)
    assert block is not None
    groups = tomllib.loads(block.group(1))["project"]["entry-points"]
    assert set(groups) == {ENTRY_POINTS, "metaroles.roles"}


def test_the_coming_from_metagpt_section_has_its_table_and_its_example_runs():
    text = README.read_text(encoding="utf-8")
    section = text.split("## Coming from MetaGPT / OpenManus", 1)[1].split("\n## ", 1)[0]
    for name in (
        "_aask",
        "MessageQueue.dump",
        "get_roles",
        "history_text",
        "Terminate",
        "assistant_message",
        "FINISHED",
    ):
        assert name in section, name
    exec(compile(readme_example("coming-from-metagpt"), "README.md", "exec"), {"__name__": "readme_porting"})


def test_the_protocol_pages_examples_run():
    for page in ("mcp.md", "a2a.md"):
        text = (README.parent / "docs" / page).read_text(encoding="utf-8")
        blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
        assert blocks, f"docs/{page} has no runnable example"
        for block in blocks:
            exec(compile(block, f"docs/{page}", "exec"), {"__name__": "docs_example"})
