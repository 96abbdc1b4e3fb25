"""What is installed is read once per state of the import path, and again as soon as a package is installed."""

from __future__ import annotations

import os
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

from metaroles.core import installed

GROUP = "metaroles.test_installed"


def install(site: Path, name: str, version: str, entries: dict[str, str]) -> None:
    """A distribution as pip leaves it in ``site``: a ``.dist-info`` folder with its metadata and entry points."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = "".join(f"{key} = {value}\n" for key, value in entries.items())
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n{lines}")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    return folder


def test_a_second_question_is_answered_from_what_the_first_read(site: Path) -> None:
    """While no folder on the path changes, the distributions are not read again (a sweep asks once per trial)."""
    install(site, "alpha_plugin", "1.0", {"alpha": "alpha_plugin.scenario"})
    first = installed.entry_points(GROUP)
    assert [(e.name, e.value) for e in first] == [("alpha", "alpha_plugin.scenario")]
    stamp = os.stat(site).st_mtime_ns
    install(site, "beta_plugin", "2.5", {"beta": "beta_plugin.scenario"})
    os.utime(site, ns=(stamp, stamp))  # the folder's time as it was: only a read of the files would see beta
    assert installed.entry_points(GROUP) == first, "answered without reading the distributions again"


def test_a_package_installed_after_the_first_question_is_seen(site: Path) -> None:
    install(site, "alpha_plugin", "1.0", {"alpha": "alpha_plugin.scenario"})
    assert [e.name for e in installed.entry_points(GROUP)] == ["alpha"]
    assert installed.version("beta_plugin") is None
    before = os.stat(site).st_mtime_ns
    install(site, "beta_plugin", "2.5", {"beta": "beta_plugin.scenario"})
    os.utime(site, ns=(before + 1_000_000, before + 1_000_000))  # a coarse clock may not have ticked: it did
    assert sorted(e.name for e in installed.entry_points(GROUP)) == ["alpha", "beta"]
    assert installed.version("beta_plugin") == "2.5"


def test_a_folder_added_to_the_import_path_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert installed.version("gamma_plugin") is None
    other = tmp_path / "other"
    other.mkdir()
    install(other, "gamma_plugin", "0.3", {"gamma": "gamma_plugin.scenario"})
    monkeypatch.syspath_prepend(str(other))
    assert installed.version("gamma_plugin") == "0.3"
    assert [e.name for e in installed.entry_points(GROUP)] == ["gamma"]


def test_versions_are_the_installed_distributions() -> None:
    assert installed.version("pydantic") == metadata.version("pydantic")
    assert installed.version("no-such-distribution-here") is None


def git(folder: Path, *args: str) -> str:
    """Run git in ``folder`` (a test repository: no global config needed) and return what it printed."""
    command = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main", *args]
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def rev_parse(folder: Path) -> str | None:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def test_the_git_revision_is_what_git_rev_parse_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read from the repository's files, in each layout git leaves: a branch, packed refs, detached, a worktree."""
    monkeypatch.delenv("GIT_DIR", raising=False)
    repo = tmp_path / "repo"
    (repo / "sub" / "deeper").mkdir(parents=True)
    git(repo, "init", "-q")
    assert installed.git_revision(repo) is None and rev_parse(repo) is None  # a branch with no commit yet
    (repo / "a.txt").write_text("one")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "one")
    first = rev_parse(repo)
    assert first is not None and installed.git_revision(repo / "sub" / "deeper") == first
    git(repo, "pack-refs", "--all")  # the branch now lives in packed-refs only
    assert not (repo / ".git" / "refs" / "heads" / "main").exists()
    assert installed.git_revision(repo) == first
    (repo / "a.txt").write_text("two")
    git(repo, "commit", "-q", "-am", "two")
    second = rev_parse(repo)
    assert second != first and installed.git_revision(repo) == second  # a new commit: the loose ref wins
    git(repo, "checkout", "-q", "--detach", first)
    assert installed.git_revision(repo) == first == rev_parse(repo)
    git(repo, "worktree", "add", "-q", str(tmp_path / "tree"), "main")
    assert installed.git_revision(tmp_path / "tree") == second == rev_parse(tmp_path / "tree")
    outside = tmp_path / "plain"
    outside.mkdir()
    assert installed.git_revision(outside) == rev_parse(outside)  # None, unless the temporary folder is in a repository


def test_a_deleted_working_folder_has_no_git_revision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run started from a folder that no longer exists records no revision instead of failing."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert installed.git_revision() is None
