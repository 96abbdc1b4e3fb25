"""The house: layered subpackages with one-way imports, short functions, and installed names that cannot collide."""

import ast
import os
import subprocess
import sys
import sysconfig
import textwrap
import venv
from pathlib import Path

import grimp
import networkx as nx
import pytest

import metaroles

ROOT = Path(__file__).resolve().parents[1]
LAYERS = [
    "core",
    "messages",
    "llm",
    "longterm",
    "bus",
    "agents",
    "record",
    "telemetry",
    "sharding",
    "team",
    "project",
    "flow",
    "cli",
    "compat",
]
"""Bottom to top, as the import-linter contract in pyproject.toml lists them (top first)."""


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("metaroles", cache_dir=None)


def test_the_import_graph_of_metaroles_has_no_cycle(graph):
    """Type-only imports count too: a cycle hidden under TYPE_CHECKING is still a cycle."""
    edges = nx.DiGraph()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            edges.add_edge(module, imported)
    cycles = [sorted(c) for c in nx.strongly_connected_components(edges) if len(c) > 1]
    assert cycles == []


def test_no_layer_imports_a_layer_above_it(graph):
    for lower_index, lower in enumerate(LAYERS):
        for upper in LAYERS[lower_index + 1 :]:
            chains = graph.find_shortest_chains(importer=f"metaroles.{lower}", imported=f"metaroles.{upper}")
            assert not chains, f"metaroles.{lower} reaches up into metaroles.{upper}: {sorted(chains)[:3]}"


def test_the_layer_contract_of_pyproject_names_every_subpackage():
    packages = sorted(p.name for p in (ROOT / "metaroles").iterdir() if (p / "__init__.py").is_file())
    contract = (ROOT / "pyproject.toml").read_text()
    assert sorted(LAYERS) == packages
    assert all(f'"metaroles.{layer}"' in contract for layer in LAYERS)


def _function_sizes(path: Path) -> list[tuple[str, int]]:
    """Each function's length: its body's, docstring included (a typer command's options are not)."""
    return [
        (node.name, node.end_lineno - node.body[0].lineno + 1)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None
    ]


def test_function_bodies_stay_under_40_lines():
    """A module's size follows its concept (``bench/house.py`` reports them); a function's stays readable."""
    too_big = []
    for path in sorted((ROOT / "metaroles").rglob("*.py")):
        too_big += [(str(path.relative_to(ROOT)), name, n) for name, n in _function_sizes(path) if n > 40]
    assert too_big == []


def test_the_public_api_is_importable_from_the_top():
    for name in ("Role", "Action", "Message", "Environment", "Team", "Bus", "ScenarioPlan", "run_scenario"):
        assert name in metaroles.__all__ and hasattr(metaroles, name)


def test_metaroles_runs_debate_from_a_folder_with_its_own_scenarios_actions_and_environments(tmp_path):
    """A research repository's own folders must not hide the scenarios metaroles ships."""
    for folder in ("scenarios", "actions", "environments"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text(f'"""The research repository\'s own {folder}."""\n')
    (tmp_path / "scenarios" / "mine.py").write_text("NOT_A_METAROLES_SCENARIO = True\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    args = [sys.executable, "-m", "metaroles", "run", "debate", "--llm", "test", "--set", "turns=1", "--no-save", "-q"]
    result = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, env=env, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "stopped (idle)" in result.stdout
    import_here = "import scenarios, metaroles.scenarios as s; print(scenarios.__file__); print(s.__file__)"
    found = subprocess.run([sys.executable, "-c", import_here], capture_output=True, text=True, cwd=tmp_path, env=env)
    theirs, ours = found.stdout.split()
    assert theirs == str(tmp_path / "scenarios" / "__init__.py") and Path(ours) == ROOT / "scenarios" / "__init__.py"


def test_pip_install_puts_nothing_named_scenarios_actions_or_environments_at_the_top(tmp_path):
    """A real ``pip install .`` into a fresh virtual environment (dependencies from this one)."""
    target = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(target)
    python = target / "bin" / "python"
    here = sysconfig.get_paths()["purelib"]
    (Path(_site_packages(python)) / "parent.pth").write_text(here + "\n")  # pip, setuptools, pydantic: no download
    install = [str(python), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--quiet", str(ROOT)]
    result = subprocess.run(install, capture_output=True, text=True, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    site = Path(_site_packages(python))
    top = {p.name for p in site.iterdir()}
    assert not top & {"scenarios", "actions", "environments"}, sorted(top)
    assert {"scenarios", "actions", "environments"} <= {p.name for p in (site / "metaroles").iterdir()}
    check = textwrap.dedent(
        """
        import metaroles.scenarios.debate, metaroles.actions.prompts
        from importlib import resources
        print(metaroles.scenarios.debate.__file__)
        print(resources.files("metaroles.actions.prompts").joinpath("judge.txt").is_file())
        print(resources.files("metaroles.flow").joinpath("page.html").is_file())
        """
    )
    shown = subprocess.run([str(python), "-c", check], capture_output=True, text=True, cwd=tmp_path, check=False)
    assert shown.returncode == 0, shown.stderr[-2000:]
    debate, judge, page = shown.stdout.split()
    assert debate.startswith(str(site)) and judge == page == "True"


def _site_packages(python: Path) -> str:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def _package_of(path: Path) -> str:
    """``bus`` for ``metaroles/bus/role.py``; the installed folders (scenarios, actions...) count as packages too."""
    parts = path.relative_to(ROOT).parts
    return parts[1] if parts[0] == "metaroles" and len(parts) > 2 else parts[0]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own_private_names(trees: dict[Path, ast.Module]) -> dict[str, set[str]]:
    """Each private name, with the packages that define it: a def, a class, ``self.name =``, a module name, a slot."""
    owners: dict[str, set[str]] = {}
    for path, tree in trees.items():
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.append(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    names.append(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.append(node.id)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                names.append(node.value)  # a __slots__ entry
            for name in filter(_private, names):
                owners.setdefault(name, set()).add(_package_of(path))
    return owners


def test_no_package_reads_another_packages_private_names():
    """Outside ``self``/``cls``, ``x._name`` (read or written) must be a private name of the reader's own package.

    The scan cannot know ``x``'s type, so it goes by who defines the name: the reader's package must
    define it, and no package of a lower layer may (a stand-in in ``sharding`` that defined a
    private name a Role has would let ``bus`` read it on both, ``sharding`` may not); ``super()._think()``
    in a subclass is the hook's own use. ``from
    metaroles.other import _name`` fails too. The folders that install inside metaroles
    (scenarios, actions, environments) count as packages above every layer.
    """
    folders = ("metaroles", "scenarios", "actions", "environments")
    sources = [path for folder in folders for path in (ROOT / folder).rglob("*.py")]
    trees = {path: ast.parse(path.read_text()) for path in sources}
    owners = _own_private_names(trees)
    layer = {name: number for number, name in enumerate(["metaroles", *LAYERS])}
    reads = []
    for path, tree in sorted(trees.items()):
        package, where = _package_of(path), str(path.relative_to(ROOT))
        below = {p for p, number in layer.items() if number < layer.get(package, len(layer))} - {package}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("metaroles."):
                source = node.module.split(".")[1]  # type: ignore[union-attr]
                reads += [(where, node.lineno, a.name) for a in node.names if _private(a.name) and source != package]
            elif isinstance(node, ast.Attribute) and _private(node.attr):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue
                if isinstance(node.value, ast.Call) and getattr(node.value.func, "id", "") == "super":
                    continue  # a subclass calling the hook it overrides (MetaGPT's _think, _act...)
                defined = owners.get(node.attr, {package})
                if package not in defined or defined & below:
                    reads.append((where, node.lineno, node.attr))
    assert reads == []


def test_the_team_speaks_to_its_runtime_and_never_asks_which_it_has() -> None:
    """``Team`` runs, measures, checkpoints and records through a ``Runtime`` (``team/runtime.py``): no shard branch."""
    tree = ast.parse((ROOT / "metaroles" / "team" / "team.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not imported & {"metaroles.sharding.driver", "metaroles.sharding.session"}
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    attributes = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert not names & {"ShardedRun", "RemoteRole", "Sharded", "sharded"}
    assert not attributes & {"_sharded", "take_later", "later", "write_driver", "note_history"}


def test_the_users_environment_shows_the_users_api_and_the_runtime_holds_the_plumbing() -> None:
    """MetaGPT's and the README's calls stay on ``Environment``; what a runtime drives it with is behind handles."""
    import inspect

    from metaroles import Environment
    from metaroles.bus.delivery import BusDrive
    from metaroles.bus.environment import Round

    public = {name for name in dir(Environment()) if not name.startswith("_")}
    plumbing = {"swap_roles", "adopt_roles", "publish_ranked", "rebuild_ready", "routes_version", "take_steps"}
    plumbing |= {"take_published", "run_turns", "deliver_published", "add_late"}
    assert public & plumbing == set()
    assert "late" not in inspect.signature(Environment.add_to_history).parameters
    users = {"add_role", "add_roles", "get_role", "get_roles", "role_names", "publish_message", "run", "history"}
    assert users <= public, "MetaGPT's API stays"
    assert {"swap_roles", "adopt_roles", "rebuild_ready", "add_late"} <= set(dir(BusDrive))
    assert {"run_turns", "take_published", "add_published", "deliver_published"} <= set(dir(Round))
    assert isinstance(Environment().drive, BusDrive)


def test_docs_architecture_names_every_module() -> None:
    """``docs/architecture.md`` is the map: every module of the package is named there, in its layer."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    modules = sorted(p for p in (ROOT / "metaroles").rglob("*.py") if p.stem not in ("__init__", "__main__"))
    unnamed = [str(p.relative_to(ROOT)) for p in modules if f"`{p.stem}`" not in doc and f"`{p.stem} " not in doc]
    assert unnamed == [], "name them in docs/architecture.md (its 'Every module' section)"
