"""MemoryStorage: a role's long-term memory, a llama-index ``VectorStoreIndex`` over Faiss.

Fixes to MetaGPT's version (seed 004) and to llama-index's traps:

- Cosine, not distance: an inner-product Faiss index over normalised vectors, so a score is a
  similarity (higher is closer) and ``threshold`` means "at least this similar".
- The embedding is passed in and given to llama-index explicitly; its global ``Settings`` is
  never consulted (it would build an OpenAI embedding).
- Vectors are computed here, in batches, from the message text only (metadata is not embedded),
  and adds are buffered: ``insert_nodes`` re-serialises the whole index on every call.
- Deletes are tombstones until :meth:`clean` rebuilds; Faiss ids are never reused, so one
  message never shadows another. Filters on ``cause_by``/``sent_from`` over-fetch and filter here.
- The messages themselves are the source of truth (``messages.jsonl``): a damaged or half-written
  index is rebuilt from them on load, with a warning. Persisting is atomic (temp dir, rename).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from warnings import warn

import faiss
from llama_index.core import StorageContext, VectorStoreIndex, load_index_from_storage
from llama_index.core.embeddings import BaseEmbedding
from llama_index.core.schema import TextNode
from llama_index.vector_stores.faiss import FaissVectorStore
from pydantic import PrivateAttr

from metaroles.core.exceptions import ConfigError
from metaroles.core.text import jsonl_lines
from metaroles.longterm.embedding import Embedding
from metaroles.messages.message import Message

MANIFEST = "manifest.json"
MESSAGES = "messages.jsonl"


class _Adapter(BaseEmbedding):
    """Our embedding, as llama-index wants it (only queries go through here)."""

    _inner: Any = PrivateAttr()

    def __init__(self, inner: Embedding) -> None:
        super().__init__(model_name=inner.name, embed_batch_size=64)
        self._inner = inner

    def _get_query_embedding(self, query: str) -> list[float]:
        result: list[float] = self._inner.embed([query])[0]
        return result

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._get_query_embedding(text)

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        result: list[list[float]] = self._inner.embed(texts)
        return result


class MemoryStorage:
    """Long-term memory of one role: messages persisted with a vector index for recall.

    Args:
        embedding: The embedding (required: nothing global is consulted).
        root: Folder under which each role's memory lives (``root/role_id``); required for
            :meth:`recover_memory` and :meth:`persist` — never the package or the current folder.
        batch_size: Adds buffered before they go into the index.
    """

    def __init__(self, embedding: Embedding, *, root: str | Path | None = None, batch_size: int = 256) -> None:
        """Create an empty storage; :meth:`recover_memory` loads a role's saved one."""
        if not isinstance(embedding, Embedding):
            raise ConfigError(f"embedding={embedding!r} is not an Embedding (it needs name, dim and embed())")
        faiss.omp_set_num_threads(1)
        self.embedding = embedding
        self.root = Path(root) if root is not None else None
        self.batch_size = batch_size
        self.role_id = ""
        self.messages: dict[str, Message] = {}
        self.deleted: set[str] = set()
        self._pending: list[Message] = []
        self.observer: Callable[[str, int, float], None] | None = None
        """Told ``(operation, count, seconds)`` of each ``embeddings`` and ``retrieval`` (telemetry)."""
        self._adapter = _Adapter(embedding)
        self._index = self._empty_index()

    # -- building ------------------------------------------------------------------------------

    def _empty_index(self) -> VectorStoreIndex:
        store = FaissVectorStore(faiss_index=faiss.IndexFlatIP(self.embedding.dim))
        context = StorageContext.from_defaults(vector_store=store)
        return VectorStoreIndex(nodes=[], storage_context=context, embed_model=self._adapter)

    def _nodes(self, messages: list[Message]) -> list[TextNode]:
        vectors = self.embedding.embed([m.content or "" for m in messages])
        return [
            TextNode(
                id_=m.id,
                text=m.content,
                embedding=vector,
                metadata={"message_id": m.id, "cause_by": m.cause_by, "sent_from": m.sent_from},
                excluded_embed_metadata_keys=["message_id", "cause_by", "sent_from"],
                excluded_llm_metadata_keys=["message_id", "cause_by", "sent_from"],
            )
            for m, vector in zip(messages, vectors, strict=True)
        ]

    def add(self, message: Message) -> bool:
        """Remember ``message`` (idempotent by id); return whether it was new."""
        if message.id in self.messages:
            return False
        self.messages[message.id] = message
        self._pending.append(message)
        if len(self._pending) >= self.batch_size:
            self.flush()
        return True

    def add_batch(self, messages: Iterable[Message]) -> None:
        """Remember each of ``messages``; they enter the index together (one insert, not one per batch)."""
        for message in messages:
            if message.id not in self.messages:
                self.messages[message.id] = message
                self._pending.append(message)
        if len(self._pending) >= self.batch_size:
            self.flush()

    def flush(self) -> None:
        """Put buffered adds into the vector index.

        ``VectorStoreIndex.insert_nodes`` re-serialises the whole index struct into its index
        store on every call (~1 s at 100k nodes); here nodes go in through ``_insert`` and the
        struct is written to the index store once, in :meth:`persist`.
        """
        if self._pending:
            pending, self._pending = self._pending, []
            start = time.perf_counter()
            self._index._insert(self._nodes(pending))
            if self.observer is not None:
                self.observer("embeddings", len(pending), time.perf_counter() - start)

    # -- recall --------------------------------------------------------------------------------

    async def search_similar(self, message: Message | str, k: int = 4, *, threshold: float = 0.0) -> list[Message]:
        """The ``k`` remembered messages most similar to ``message``, best first (MetaGPT's coroutine).

        :meth:`search_scored` gives their scores too, and filters by sender or action; ``threshold``
        is a cosine similarity (higher is closer), not MetaGPT's distance.
        """
        return [found for found, _ in self.search_scored(message, k, threshold=threshold)]

    def search_scored(
        self,
        message: Message | str,
        k: int = 4,
        *,
        threshold: float = 0.0,
        cause_by: str | None = None,
        sent_from: str | None = None,
    ) -> list[tuple[Message, float]]:
        """The ``k`` remembered messages most similar to ``message``, with cosine scores.

        Only those with a score of at least ``threshold`` (and, if given, the ``cause_by`` and
        ``sent_from``) are returned, best first.
        """
        self.flush()
        live = len(self.messages) - len(self.deleted)
        if live <= 0 or k <= 0:
            return []
        text = message if isinstance(message, str) else message.content
        filtered = cause_by is not None or sent_from is not None
        fetch = min(len(self.messages), (k * 4 if filtered else k) + len(self.deleted))
        start = time.perf_counter()
        hits = self._index.as_retriever(similarity_top_k=fetch).retrieve(text)
        if self.observer is not None:
            self.observer("retrieval", len(hits), time.perf_counter() - start)
        found: list[tuple[Message, float]] = []
        for hit in hits:
            stored = self.messages.get(str(hit.node.metadata.get("message_id")))
            score = float(hit.score or 0.0)
            if stored is None or stored.id in self.deleted or score < threshold:
                continue
            if (cause_by is not None and stored.cause_by != cause_by) or (
                sent_from is not None and stored.sent_from != sent_from
            ):
                continue
            found.append((stored, score))
        return found[:k]

    def delete(self, message: Message | str) -> bool:
        """Forget a message (a tombstone until :meth:`clean`); return whether it was remembered."""
        message_id = message if isinstance(message, str) else message.id
        if message_id not in self.messages or message_id in self.deleted:
            return False
        self.deleted.add(message_id)
        return True

    def clean(self) -> None:
        """Drop deleted messages for good and rebuild the index from what remains."""
        for message_id in self.deleted:
            self.messages.pop(message_id, None)
        self.deleted.clear()
        self._rebuild()

    def _rebuild(self) -> None:
        self._index = self._empty_index()
        self._pending = list(self.messages.values())
        self.flush()

    # -- persistence ---------------------------------------------------------------------------

    def _role_dir(self, role_id: str) -> Path:
        if self.root is None:
            raise ConfigError("this MemoryStorage has no root folder; pass root=... (e.g. the run directory)")
        if not role_id or "/" in role_id or role_id.startswith("."):
            raise ConfigError(f"role_id={role_id!r} must be a plain folder name")
        return self.root / role_id

    def persist(self) -> Path:
        """Write messages and index for :attr:`role_id`, atomically (temp folder, then rename)."""
        target = self._role_dir(self.role_id)
        if self.deleted:
            self.clean()
        self.flush()
        self._index.storage_context.index_store.add_index_struct(self._index.index_struct)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{self.role_id}.", dir=target.parent))
        lines = [m.model_dump_json() for m in self.messages.values()]
        (staging / MESSAGES).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        self._index.storage_context.persist(persist_dir=str(staging))
        manifest = {"embedding": self.embedding.name, "dim": self.embedding.dim, "vectors": len(self.messages)}
        (staging / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
        old = target.with_name(f".{self.role_id}.old")
        if target.exists():
            target.rename(old)
        staging.rename(target)
        shutil.rmtree(old, ignore_errors=True)
        return target

    def recover_memory(self, role_id: str) -> list[Message]:
        """Load ``role_id``'s saved memory (empty if none); rebuild the index if it is damaged."""
        folder = self._role_dir(role_id)
        self.role_id = role_id
        self.messages, self.deleted, self._pending = {}, set(), []
        if not (folder / MESSAGES).exists():
            self._index = self._empty_index()
            return []
        for line in jsonl_lines((folder / MESSAGES).read_text(encoding="utf-8")):
            if line.strip():
                message = Message.model_validate_json(line)
                self.messages[message.id] = message
        try:
            self._index = self._load_index(folder)
        except Exception as exc:  # any damage: the messages are the truth
            warn(f"long-term memory of {role_id!r}: index damaged ({exc}); rebuilt from its messages", stacklevel=2)
            self._rebuild()
        return list(self.messages.values())

    def _load_index(self, folder: Path) -> VectorStoreIndex:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        if manifest.get("dim") != self.embedding.dim or manifest.get("embedding") != self.embedding.name:
            raise ValueError(f"saved with {manifest.get('embedding')!r}, now {self.embedding.name!r}")
        store = FaissVectorStore.from_persist_dir(str(folder))
        context = StorageContext.from_defaults(vector_store=store, persist_dir=str(folder))
        index = load_index_from_storage(context, embed_model=self._adapter)
        if not isinstance(index, VectorStoreIndex) or store.client.ntotal != len(self.messages):
            raise ValueError(f"{store.client.ntotal} vectors for {len(self.messages)} messages")
        return index
