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
