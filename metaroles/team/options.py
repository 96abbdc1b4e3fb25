"""How to run a scenario: run options, and scenario configs read from YAML files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from metaroles.core.exceptions import ConfigError, InvalidValueError

MAX_ROUNDS = 1_000_000
"""The most rounds a run may ask for (``metaroles run --rounds``)."""

RUN_OPTIONS = ("rounds", "idea", "llm", "model", "base_url", "seed", "budget", "mcp", "permissions", "a2a")
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
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"config file {str(path)!r} is over {MAX_CONFIG_BYTES // 1024} KB; a scenario config is small"
        )
    data = _load_yaml(path)
    if _depth(data) > MAX_DEPTH:
        raise ConfigError(f"config file {str(path)!r} nests deeper than {MAX_DEPTH} levels")
    if not isinstance(data, dict) or not isinstance(data.get("scenario"), str):
        raise ConfigError(f"config file {str(path)!r} must be a mapping with 'scenario: NAME', e.g. 'scenario: debate'")
    nested = data.pop("config", None) or {}
    if not isinstance(nested, dict):
        raise ConfigError(f"'config' in {str(path)!r} must be a mapping of the scenario's options")
    name = data.pop("scenario")
    run = {key: data.pop(key) for key in RUN_OPTIONS if key in data}
    return ConfigFile(scenario=name, run=run, config={**data, **nested})


MAX_CONFIG_BYTES = 256 * 1024
MAX_DEPTH = 20


def _load_yaml(path: Path) -> Any:
    """The YAML data of ``path``, refusing aliases (no "billion laughs") and anything but UTF-8 text.

    Raises:
        ConfigError: If the file is not UTF-8 YAML, uses an alias, or nests past the parser's limit.
    """
    import yaml  # the CLI's dependency; only config files need it

    class NoAliases(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise ConfigError(
                    f"config file {str(path)!r} uses an alias (*name) at line {mark.line + 1}; "
                    "write the value out instead (aliases are refused)"
                )
            return super().compose_node(parent, index)

    try:
        text = path.read_bytes().decode("utf-8")
        return yaml.load(text, Loader=NoAliases)
    except UnicodeDecodeError:
        raise ConfigError(f"config file {str(path)!r} is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise ConfigError(f"config file {str(path)!r} nests deeper than {MAX_DEPTH} levels") from None


def _depth(value: Any, level: int = 0) -> int:
    if level > MAX_DEPTH:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level + 1)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level + 1)
    return level


LogTurns = bool | Literal["folded"]


def checked_log_turns(value: object) -> LogTurns:
    """``True``, ``False`` or ``"folded"`` (format 1 folded turns; round lines fold them: ``True``).

    Raises:
        InvalidValueError: For anything else.
    """
    if value is True or value is False or value == "folded":
        return value
    raise InvalidValueError(f"log_turns={value!r} must be True, False or 'folded' (the same as True)")


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
    log_turns: LogTurns | None = None
    """Log each turn's observe, think and act events (``"folded"``: see :func:`checked_log_turns`); default: the
    scenario's, else yes."""
    prices: dict[str, tuple[float, float]] | None = None
    """Model → (prompt, completion) USD per 1,000 tokens, beside the ledger's table (recorded in the manifest)."""
    backend: Any = None
    """Where the roles run (a ``sharding.driver.Backend``); one process by default. Not part of the run."""
    otel: bool = False
    """Trace the run with OpenTelemetry (extra ``otel``; see ``telemetry.tracing``). Not part of the run."""
    transcript: bool | None = None
    """Write ``transcript.md``: yes, no, or (``None``) when the run holds at most 10,000 messages."""
    durability: str = "round"
    """Wait for the disk after each checkpoint (``"round"``) or once, at the end (``"run"``: ``record.durability``)."""
    concurrency: int | None = None
    """Roles mid-turn at once (the environment's 32 by default); ``--batch``: a whole round's calls wait together."""
    zstd: bool = False
    """Write the event log compressed, ``events.jsonl.zst`` (extra ``zstd``): for big runs; recorded in the manifest."""
