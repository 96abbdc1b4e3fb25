"""The scenario registry: scenarios that ship with metaroles and those installed plug-ins contribute.

A scenario is a module ``metaroles.scenarios.NAME`` (the repository's ``scenarios/`` folder) or
one a plug-in names in entry-point group ``metaroles.scenarios``, with a pydantic ``Config`` and
``build(config, llm) -> ScenarioPlan``. Plug-ins may also contribute roles, actions and
environments (groups ``metaroles.roles``, ``metaroles.actions``, ``metaroles.environments``).
"""

from __future__ import annotations

import ast
import difflib
import importlib
import importlib.util
import inspect
import itertools
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel

from metaroles.core import installed
from metaroles.core.exceptions import ConfigError
from metaroles.sharding.transfer import FILE_SCENARIO
from metaroles.team.team import Team

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_IDENTIFIER_CHARS = re.compile(r"[^A-Za-z0-9_]")
SCENARIOS = "metaroles.scenarios"
"""The package of the scenarios that ship with metaroles."""


@dataclass(frozen=True)
class ScenarioPlan:
    """A built scenario: the team and how to start it."""

    team: Team
    idea: str
    send_to: str | set[str]
    n_round: int


ENTRY_POINTS = "metaroles.scenarios"
"""Entry-point group through which installed packages contribute scenarios (name = module)."""


def load_scenario(name: str, *, module: str | None = None) -> ModuleType:
    """Import scenario ``name``: a registered name, a module's dotted path, or a ``.py`` file.

    A registered name is ``metaroles.scenarios.NAME`` or one an installed plug-in contributes;
    ``mypkg.scenarios.peer_review`` is imported as is; ``path/to/peer_review.py`` is loaded from
    the file, as the module ``peer_review`` (as ``import peer_review`` would name it, so its action
    ids are the same whether the file runs by ``metaroles run`` or from a notebook beside it; a
    name another module has already is not taken) or as ``module`` when a manifest recorded it.
    Either must define ``Config`` (a pydantic model) and ``build(config, llm)``.

    Raises:
        ConfigError: If there is no such scenario (the message suggests the closest name), or the
            module lacks ``Config`` or ``build``.
    """
    if name.endswith(".py"):
        return _checked(name, _from_file(Path(name), module))
    if "." in name and all(_IDENTIFIER.match(part) for part in name.split(".")):
        try:
            return _checked(name, importlib.import_module(name))
        except ModuleNotFoundError as exc:
            raise ConfigError(
                f"scenario module {name!r} cannot be imported ({exc}); is its package installed?"
            ) from None
        except Exception as exc:  # the user's module raised while it was imported
            raise ConfigError(f"scenario module {name!r} failed while importing: {type(exc).__name__}: {exc}") from None
    if not _NAME.match(name):
        raise ConfigError(
            f"scenario {name!r} is not a scenario name (e.g. 'debate'), a module (e.g. 'mypkg.scenarios.review') "
            "or a .py file (e.g. 'review.py')"
        )
    known = known_scenarios()
    if name not in known:
        close = difflib.get_close_matches(name, list(known), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        if Path(f"{name}.py").is_file():
            hint = f"did you mean the file {name + '.py'!r} here (metaroles run {name}.py)? "
        raise ConfigError(f"no scenario named {name!r}; {hint}known scenarios: {sorted(known)}")
    return importlib.import_module(known[name])


def unregistered_module(name: str) -> bool:
    """Whether ``name`` is a module path (not a file) that no shipped or plug-in scenario registers.

    Importing one runs its code (``venv.__main__`` makes a virtualenv): a name that came with data
    (a manifest, a suite) is imported only when its user says so (``--trust``).
    """
    return not name.endswith(".py") and "." in name and name not in known_scenarios().values()


def recorded_scenario(manifest: dict[str, Any]) -> ModuleType:
    """The scenario a run directory's manifest names, loaded as it was when the run was made.

    A scenario file loads under the module name the manifest records (a run made before names were
    recorded: the name files had then), so a resumed or forked run makes the same action ids.
    """
    name = str(manifest["scenario"])
    if not name.endswith(".py"):
        return load_scenario(name)
    path = Path(name).resolve()
    recorded = manifest.get("module")
    if recorded is None:  # made before module names were recorded
        return load_scenario(name, module=legacy_module_name(path))
    if recorded not in (path.stem, legacy_module_name(path)):  # data never picks a module name (os, json, ...)
        recorded = None
    return load_scenario(name, module=recorded)


LEGACY_PREFIX = "metaroles_user_scenario_"
"""The module-name prefix scenario files were loaded under before they took their own names."""


def file_module_name(path: Path) -> str:
    """The module name a scenario file loads under: its stem, unless another module has that name."""
    stem = path.stem
    if not stem.isidentifier() or stem in sys.builtin_module_names:
        return legacy_module_name(path)
    known = sys.modules.get(stem)
    if known is not None:
        return stem if getattr(known, "__file__", None) == str(path) else legacy_module_name(path)
    try:
        found = importlib.util.find_spec(stem)
    except (ImportError, ValueError):
        found = None
    return stem if found is None or found.origin == str(path) else legacy_module_name(path)


def legacy_module_name(path: Path) -> str:
    """The name a scenario file was loaded under before (a run directory made then resumes with its ids)."""
    return f"{LEGACY_PREFIX}{_IDENTIFIER_CHARS.sub('_', path.stem)}"


def _from_file(path: Path, module_name: str | None = None) -> ModuleType:
    """The scenario module in file ``path``, imported once per process (see :func:`load_scenario`)."""
    if not path.is_file():
        raise ConfigError(
            f"scenario file {str(path)!r} does not exist; pass the path of a .py file with Config and build"
        )
    resolved = path.resolve()
    module_name = module_name or file_module_name(resolved)
    known = sys.modules.get(module_name)
    if known is not None and getattr(known, "__file__", None) == str(resolved):
        setattr(known, FILE_SCENARIO, str(resolved))
        return known
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    if spec is None or spec.loader is None:
        raise ConfigError(f"scenario file {str(path)!r} cannot be loaded as Python")
    module = importlib.util.module_from_spec(spec)
    setattr(module, FILE_SCENARIO, str(resolved))
    sys.modules[module_name] = module  # pydantic and pickle look classes up by their module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        del sys.modules[module_name]
        raise ConfigError(f"scenario file {str(path)!r} line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:  # the file raised while it ran
        del sys.modules[module_name]
        raise ConfigError(f"scenario file {str(path)!r} failed while loading: {type(exc).__name__}: {exc}") from None
    return module


def _checked(name: str, module: ModuleType) -> ModuleType:
    missing = [attr for attr in ("Config", "build") if not hasattr(module, attr)]
    if missing:
        raise ConfigError(
            f"scenario {name!r} lacks {' and '.join(missing)}; a scenario module defines a pydantic Config "
            "and build(config, llm) -> ScenarioPlan (see the README's 'Write a scenario')"
        )
    return module


def known_scenarios() -> dict[str, str]:
    """Scenario name → module: those that ship with metaroles and those plug-ins contribute."""
    package = importlib.import_module(SCENARIOS)
    folder = Path(next(iter(package.__path__)))
    found = {p.stem: f"{SCENARIOS}.{p.stem}" for p in folder.glob("*.py") if not p.stem.startswith("_")}
    for entry in installed.entry_points(ENTRY_POINTS):
        found.setdefault(entry.name, entry.value.partition(":")[0])
    return dict(sorted(found.items()))


@dataclass(frozen=True)
class OptionDoc:
    """One option of a scenario's ``Config``, as ``metaroles list NAME`` shows it."""

    name: str
    kind: str
    """Its type, as written in the class."""
    default: str
    """Its default, or ``required``."""
    description: str
    """Its attribute docstring (or ``Field(description=...)``), if any."""


def scenario_options(module: ModuleType) -> list[OptionDoc]:
    """The options of a scenario's ``Config``: name, type, default and description, in declaration order."""
    config: type[BaseModel] = module.Config
    written = _as_written(config)
    found = []
    for name, field in config.model_fields.items():
        if field.is_required():
            default = "required"
        elif field.default_factory is not None:
            default = repr(field.default_factory())  # type: ignore[call-arg]
        else:
            default = repr(field.default)
        kind, note = written.get(name, (str(field.annotation).replace("typing.", ""), ""))
        found.append(OptionDoc(name, kind, default, field.description or note))
    return found


def _as_written(config: type) -> dict[str, tuple[str, str]]:
    """Per field of the class body: its type as written, and the string after it (the house's field docs)."""
    written: dict[str, tuple[str, str]] = {}
    for klass in reversed(config.__mro__):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in itertools.pairwise([*body, ast.Pass()]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                said = (
                    after.value.value if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) else ""
                )
                written[node.target.id] = (ast.unparse(node.annotation), " ".join(str(said).split()))
    return written


PLUGIN_KINDS = ("roles", "actions", "environments")
"""Besides scenarios, plug-ins contribute these, each through entry-point group ``metaroles.KIND``."""


def plugins(kind: str) -> dict[str, str]:
    """Name → ``module:attribute`` of the roles, actions or environments installed plug-ins contribute.

    Raises:
        ConfigError: On an unknown kind.
    """
    if kind not in PLUGIN_KINDS:
        raise ConfigError(f"plug-in kind {kind!r} is not one of {PLUGIN_KINDS}")
    return dict(sorted((e.name, e.value) for e in installed.entry_points(f"metaroles.{kind}")))


def load_plugin(kind: str, name: str) -> Any:
    """The role class, action class or environment class a plug-in contributes as ``name``.

    Raises:
        ConfigError: If no installed plug-in contributes it (the message lists those that do).
    """
    for entry in installed.entry_points(f"metaroles.{kind}"):
        if entry.name == name:
            return entry.load()
    raise ConfigError(f"no plug-in contributes {kind[:-1]} {name!r}; installed: {sorted(plugins(kind))}")
