"""Long-term memory on real llama-index + Faiss."""

import json
import subprocess
import sys
import textwrap

import pytest

from metaroles import Message
from metaroles.core.exceptions import ConfigError
from metaroles.longterm.embedding import HashingEmbedding, MiniLMEmbedding, semantic_available
from metaroles.longterm.storage import MemoryStorage

pytest.importorskip("llama_index.vector_stores.faiss", reason="needs metaroles[memory]")

TOPICS = [
    "The budget for the bridge project doubled last quarter.",
    "Our cat refuses to eat anything but tuna.",
    "The database migration failed because of a missing index.",
    "Tickets for the concert sold out in ten minutes.",
    "The river flooded the lower town after three days of rain.",
    "She finished the marathon in under four hours.",
]


def filled(tmp_path, n_extra: int = 0) -> tuple[MemoryStorage, list[Message]]:
    storage = MemoryStorage(HashingEmbedding(), root=tmp_path, batch_size=4)
    storage.role_id = "alice"
    messages = [
        Message(t, cause_by="x.Speak" if i % 2 else "x.Write", sent_from=f"s{i % 3}") for i, t in enumerate(TOPICS)
    ]
    messages += [Message(f"filler note number {i}") for i in range(n_extra)]
    storage.add_batch(messages)
    return storage, messages


def test_add_and_search_returns_messages_with_cosine_scores(tmp_path):
    storage, messages = filled(tmp_path)
    (best, score), *rest = storage.search_scored("the database migration failed", k=3)
    assert best is messages[2]
    assert 0 < score <= 1.0 and all(score >= s for _, s in rest)
    assert storage.search_scored(messages[1], k=1)[0][1] == pytest.approx(1.0)
    assert storage.search_scored("database migration", k=5, threshold=0.99) == []


def test_a_message_holding_unicode_line_separators_comes_back_whole(tmp_path):
    storage = MemoryStorage(HashingEmbedding(), root=tmp_path, batch_size=4)
    storage.role_id = "alice"
    said = Message("one\u2028two\u2029three\x85four")
    storage.add_batch([said, Message("another")])
    storage.persist()
    again = MemoryStorage(HashingEmbedding(), root=tmp_path, batch_size=4)
    assert [m.content for m in again.recover_memory("alice")] == [said.content, "another"]


def test_add_is_idempotent_and_buffered(tmp_path):
    storage, messages = filled(tmp_path)
    assert not storage.add(messages[0])
    assert len(storage.messages) == len(TOPICS)
    storage.add(Message("a brand new note about tuna"))
    assert storage._pending, "adds are buffered until a batch fills or a search needs them"
    assert storage.search_scored("note about tuna", k=1)[0][0].content == "a brand new note about tuna"


def test_filters_on_cause_by_and_sender_over_fetch(tmp_path):
    storage, messages = filled(tmp_path, n_extra=30)
    hits = storage.search_scored("the cat and the tuna", k=2, cause_by="x.Speak")
    assert hits and all(m.cause_by == "x.Speak" for m, _ in hits)
    assert storage.search_scored("tuna", k=3, sent_from="s1")[0][0] is messages[1]


def test_delete_is_never_shadowed_and_clean_rebuilds(tmp_path):
    storage, messages = filled(tmp_path)
    assert storage.delete(messages[2]) and not storage.delete(messages[2])
    assert all(m is not messages[2] for m, _ in storage.search_scored("database migration failed", k=6))
    newcomer = Message("The database migration succeeded after adding the index.")
    storage.add(newcomer)
    assert storage.search_scored("database migration", k=1)[0][0] is newcomer
    storage.clean()
    assert messages[2].id not in storage.messages and len(storage.messages) == len(TOPICS)
    assert storage.search_scored("database migration", k=1)[0][0] is newcomer


SEARCH_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from metaroles.longterm.embedding import HashingEmbedding
    from metaroles.longterm.storage import MemoryStorage
    storage = MemoryStorage(HashingEmbedding(), root=sys.argv[1])
    storage.recover_memory("alice")
    hits = storage.search_scored(sys.argv[2], k=3)
    print(json.dumps([[m.id, round(s, 6)] for m, s in hits]))
    """
)


def test_persist_and_reload_in_a_fresh_process_give_identical_results(tmp_path):
    storage, _ = filled(tmp_path, n_extra=10)
    folder = storage.persist()
    assert folder == tmp_path / "alice" and not list(tmp_path.glob(".alice.*")), "no temp dir left"
    query = "tickets for the concert"
    here = [[m.id, round(s, 6)] for m, s in storage.search_scored(query, k=3)]
    out = subprocess.run([sys.executable, "-c", SEARCH_SCRIPT, str(tmp_path), query], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == here


def test_a_damaged_index_is_rebuilt_from_the_messages_with_a_warning(tmp_path):
    storage, messages = filled(tmp_path)
    folder = storage.persist()
    (folder / "default__vector_store.json").write_bytes(b"\x00garbage")
    fresh = MemoryStorage(HashingEmbedding(), root=tmp_path)
    with pytest.warns(UserWarning, match="index damaged .* rebuilt from its messages"):
        recovered = fresh.recover_memory("alice")
    assert [m.id for m in recovered] == [m.id for m in messages]
    assert fresh.search_scored("river flooded the town", k=1)[0][0].id == messages[4].id


def test_a_missing_memory_recovers_empty_and_a_root_is_required(tmp_path):
    assert MemoryStorage(HashingEmbedding(), root=tmp_path).recover_memory("nobody") == []
    with pytest.raises(ConfigError, match="has no root folder"):
        MemoryStorage(HashingEmbedding()).persist()
    with pytest.raises(ConfigError, match="is not an Embedding"):
        MemoryStorage("minilm")  # type: ignore[arg-type]


def test_llama_index_global_settings_are_never_consulted(tmp_path):
    from llama_index.core import Settings

    storage, _ = filled(tmp_path)
    storage.search_scored("cat", k=2)
    storage.persist()
    MemoryStorage(HashingEmbedding(), root=tmp_path).recover_memory("alice")
    assert Settings._embed_model is None, "llama-index built its global (OpenAI) embedding"


def test_hashing_embedding_is_the_same_in_every_process():
    imports = "from metaroles.longterm.embedding import HashingEmbedding"
    code = f"{imports}; print(HashingEmbedding().embed(['same text'])[0][:8])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(HashingEmbedding().embed(["same text"])[0][:8])


PARAPHRASES = [
    ("The meeting was moved to Thursday afternoon.", "They rescheduled the gathering for Thursday after lunch."),
    ("I can't find my car keys anywhere.", "My automobile key seems to be lost."),
    ("The stock market fell sharply today.", "Shares plunged on the exchange this session."),
    ("She is learning to play the violin.", "She takes lessons on a string instrument played with a bow."),
    ("The restaurant was too noisy to talk.", "It was so loud in the diner that conversation was impossible."),
    ("Our flight was delayed by three hours.", "The plane left three hours behind schedule."),
    ("He fixed the leaking kitchen faucet.", "He repaired the dripping tap in the kitchen."),
    ("The children built a snowman in the yard.", "The kids made a figure out of snow in the garden."),
    ("The doctor said I need more sleep.", "My physician told me to rest more at night."),
    ("Prices at the grocery store keep rising.", "Food shopping gets more expensive every week."),
    ("The laptop battery dies after an hour.", "My notebook computer runs out of charge quickly."),
    ("We hiked to the top of the mountain.", "We climbed the peak on foot."),
    ("The museum is closed on Mondays.", "You cannot visit the gallery at the start of the week."),
    ("He apologised for being late.", "He said sorry for not arriving on time."),
    ("The printer is out of paper again.", "There are no more sheets in the printing machine."),
    ("It rained all weekend.", "Saturday and Sunday were wet the whole time."),
]


def paraphrase_hits(storage: MemoryStorage) -> int:
    originals = [Message(a) for a, _ in PARAPHRASES]
    storage.add_batch(originals)
    hits = 0
    for original, (_, paraphrase) in zip(originals, PARAPHRASES, strict=True):
        top = storage.search_scored(paraphrase, k=1)
        hits += bool(top) and top[0][0] is original
    return hits


@pytest.mark.skipif(not semantic_available(), reason="needs metaroles[semantic]")
def test_minilm_recalls_paraphrases_that_hashing_misses(tmp_path):
    semantic = paraphrase_hits(MemoryStorage(MiniLMEmbedding(), root=tmp_path))
    hashing = paraphrase_hits(MemoryStorage(HashingEmbedding(), root=tmp_path))
    print(f"paraphrase top hits: MiniLM {semantic}/16, hashing {hashing}/16")
    assert semantic >= 10
    assert hashing < semantic
