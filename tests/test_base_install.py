"""The smallest install: metaroles with its base dependencies only, in a fresh venv, runs the CLI.

No package is downloaded: metaroles is built into a wheel from a copy of the sources and
installed with pip into a fresh venv (console script included), which sees besides it exactly
the distributions the base package requires (their installed files, linked from this
environment). Anything the CLI imports beyond them (click, an extra's SDK) fails here.
"""

import os
import re
import shutil
import subprocess
import sys
import venv
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def base_closure() -> set[str]:
    """The distributions metaroles needs without extras, and theirs, transitively."""
    wanted, seen = ["metaroles"], set()
    while wanted:
        name = re.sub(r"[-_.]+", "-", wanted.pop()).lower()
        if name in seen:
            continue
        seen.add(name)
        for requirement in metadata.requires(name) or []:
            if "extra ==" in requirement or 'extra=="' in requirement:
                continue
            marker = requirement.partition(";")[2].strip()
            if marker and not _marker_holds(marker):
                continue
            wanted.append(re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0])
    return seen - {"metaroles"}


def _marker_holds(marker: str) -> bool:
    from packaging.markers import Marker

    return Marker(marker).evaluate({"extra": ""})


def link_site(site: Path, dists: set[str]) -> None:
    """Link each distribution's top-level files (packages and their metadata) into ``site``."""
    for name in dists:
        dist = metadata.distribution(name)
        base = Path(dist.locate_file(""))
        tops = {Path(f).parts[0] for f in dist.files or () if not str(f).startswith("..")}
        for top in tops - {"__pycache__"}:
            if not (site / top).exists() and (base / top).exists():
                (site / top).symlink_to(base / top)


def wheel(tmp: Path) -> Path:
    """metaroles built into a wheel from a copy of its sources (the build writes beside them, not here)."""
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("metaroles", "actions", "environments", "scenarios"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    build = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index"]
    built = subprocess.run([*build, "-w", str(tmp / "dist"), str(source)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    (found,) = (tmp / "dist").glob("metaroles-*.whl")
    return found


def test_the_cli_runs_on_the_base_package_alone(tmp_path):
    dists = base_closure()
    assert {"pydantic", "anyio", "typer", "rich", "pyyaml"} <= dists
    assert not dists & {"click", "openai", "networkx", "ray", "faiss-cpu", "llama-index-core", "redis"}
    env_dir, site = tmp_path / "venv", tmp_path / "site"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    site.mkdir()
    link_site(site, dists)
    (purelib,) = env_dir.glob("lib/python3*/site-packages")
    (purelib / "base.pth").write_text(f"{site}\n")
    python = env_dir / "bin" / "python"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_", "METAROLES_", "OPENAI_"))}
    install = [str(python), "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", str(wheel(tmp_path))]
    installed = subprocess.run(install, capture_output=True, text=True, env=clean)
    assert installed.returncode == 0, installed.stderr[-2000:]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [str(env_dir / "bin" / "metaroles"), *args]
        return subprocess.run(command, capture_output=True, text=True, env=clean, cwd=tmp_path)

    probe = subprocess.run([str(python), "-c", "import click"], capture_output=True, text=True, env=clean)
    assert probe.returncode != 0, "the fresh venv must not see this environment's packages"
    helped = cli("--help")
    assert helped.returncode == 0 and "run" in helped.stdout, helped.stderr[-2000:]
    listed = cli("list")
    assert listed.returncode == 0 and "debate" in listed.stdout, listed.stderr[-2000:]
    ran = cli("run", "debate", "--llm", "test", "--out", str(tmp_path / "run"))
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "stopped (idle)" in ran.stdout and (tmp_path / "run" / "transcript.md").is_file()
