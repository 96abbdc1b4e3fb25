"""Long-term memory benchmarks (llama-index + Faiss): one JSON line per figure.

- add: 100k messages through ``add_batch`` (amortised per message) and single-message adds at
  100k stored (each one goes into the index on its own);
- search p50 at 1k / 10k / 100k stored, against raw ``faiss.search`` on the same vectors;
- persist and load time and size at 100k;
- MiniLM embedding speed, when installed.

Index figures use the hashing embedding, so that they measure the index, not the model.
Run: ``python bench/memory.py`` (``--quick`` stops at 10k).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import anyio
import faiss
import numpy as np

from metaroles import Message
from metaroles.longterm.embedding import HashingEmbedding, MiniLMEmbedding, semantic_available
from metaroles.longterm.storage import MemoryStorage

WORDS = "river bridge budget tuna concert marathon database index flood ticket rain quarter cat town".split()


def emit(figure: str, value: float, unit: str, **params: object) -> None:
    print(json.dumps({"figure": figure, "value": round(value, 6), "unit": unit, "params": params}), flush=True)


def corpus(n: int) -> list[Message]:
    return [Message(f"{WORDS[i % 14]} {WORDS[(i * 7) % 14]} {WORDS[(i * 3) % 14]} note {i}") for i in range(n)]


def p50(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def search_figures(storage: MemoryStorage, embedding: HashingEmbedding, size: int) -> None:
    queries = [f"{WORDS[i % 14]} {WORDS[(i * 5) % 14]} note" for i in range(50)]

    async def searched() -> list[float]:  # awaited, as a role's turn awaits it (a coroutine not awaited does no work)
        times = []
        for query in queries:
            start = time.perf_counter()
            found = await storage.search_similar(query, k=4)
            times.append(time.perf_counter() - start)
            assert len(found) == 4, "the search found what it was asked for"
        return times

    ours = anyio.run(searched)
    vectors = np.array(embedding.embed([m.content for m in storage.messages.values()]), dtype="float32")
    raw_index = faiss.IndexFlatIP(embedding.dim)
    raw_index.add(vectors)
    raw = []
    for query in queries:
        start = time.perf_counter()
        vector = np.array(embedding.embed([query]), dtype="float32")
        raw_index.search(vector, 4)
        raw.append(time.perf_counter() - start)
    emit(
        "search_p50",
        p50(ours),
        "ms",
        stored=size,
        raw_faiss_ms=round(p50(raw), 4),
        ratio=round(p50(ours) / p50(raw), 2),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    sizes = [1_000, 10_000] if parser.parse_args().quick else [1_000, 10_000, 100_000]
    embedding = HashingEmbedding()
    for size in sizes:
        root = Path(tempfile.mkdtemp())
        storage = MemoryStorage(embedding, root=root)
        storage.role_id = "bench"
        messages = corpus(size)
        start = time.perf_counter()
        storage.add_batch(messages)
        storage.flush()
        emit("add_batch_per_message", (time.perf_counter() - start) / size * 1e6, "us", stored=size)
        singles = []
        for message in corpus(5):
            start = time.perf_counter()
            storage.add(message)
            storage.flush()
            singles.append(time.perf_counter() - start)
        emit("single_add_latency", p50(singles), "ms", stored=size)
        search_figures(storage, embedding, size)
        if size == sizes[-1]:
            start = time.perf_counter()
            folder = storage.persist()
            emit("persist", time.perf_counter() - start, "s", stored=size)
            size_mb = sum(p.stat().st_size for p in folder.iterdir()) / 2**20
            emit("persisted_size", size_mb, "MiB", stored=size)
            start = time.perf_counter()
            MemoryStorage(embedding, root=root).recover_memory("bench")
            emit("load", time.perf_counter() - start, "s", stored=size)
    if semantic_available():
        minilm = MiniLMEmbedding()
        start = time.perf_counter()
        minilm.load()
        emit("minilm_load", time.perf_counter() - start, "s")
        texts = [m.content for m in corpus(1000)]
        start = time.perf_counter()
        minilm.embed(texts)
        emit("minilm_sentences_per_s", 1000 / (time.perf_counter() - start), "sentences/s")


if __name__ == "__main__":
    main()
