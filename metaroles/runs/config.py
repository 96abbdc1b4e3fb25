"""How to run a scenario: run options, and scenario configs read from YAML files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metaroles.core.exceptions import ConfigError

RUN_OPTIONS = ("rounds", "idea", "llm", "model", "base_url", "seed", "budget")
"""Keys of a YAML config file that set how to run, not the scenario's own options."""


@dataclass(frozen=True)
class ConfigFile:
    """A scenario config read from YAML."""

    scenario: str
    run: dict[str, Any]
    """Run options (``rounds``, ``idea``, ``llm``, ``seed``, ``budget``...)."""
    config: dict[str, Any]
    """The scenario's own options (validated by its ``Config`` model)."""


def read_config_file(path: Path) -> ConfigFile:
    """A scenario config from YAML: ``scenario: NAME``, run options, and its options (top level or under ``config``).

    Raises:
        ConfigError: If the file is missing, is not YAML, or names no scenario.
    """
    import yaml  # the CLI's dependency; only config files need it

    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("scenario"), str):
        raise ConfigError(f"config file {str(path)!r} must be a mapping with 'scenario: NAME', e.g. 'scenario: debate'")
    nested = data.pop("config", None) or {}
    if not isinstance(nested, dict):
        raise ConfigError(f"'config' in {str(path)!r} must be a mapping of the scenario's options")
    name = data.pop("scenario")
    run = {key: data.pop(key) for key in RUN_OPTIONS if key in data}
    return ConfigFile(scenario=name, run=run, config={**data, **nested})


@dataclass(frozen=True)
class RunOptions:
    """How to run a scenario, beside its own config: each overrides the scenario's default."""

    rounds: int | None = None
    idea: str | None = None
    seed: int | None = None
    """Seeds the environment's random source (``env.rng``)."""
    budget: float | None = None
    """Money budget: the run stops cleanly once the ledger reaches it."""
    checkpoint_every: int | None = None
    """A checkpoint every this many rounds (and where the run stops); default: the scenario's, else 1."""
    log_turns: bool | None = None
    """Log each turn's observe, think and act events; default: the scenario's, else yes."""
