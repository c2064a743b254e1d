"""A damaged embedding cache is detected, named and rebuilt, never a traceback (issue 9)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from evoharness_agent.encoding import embedder
from evoharness_agent.encoding.embedder import EmbeddingCache, StateEncoder


def vectors(n: int, dim: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {f"key{i}": rng.standard_normal(dim).astype(np.float32) for i in range(n)}


def aside_files(path: Path) -> list[Path]:
    """The damaged database files moved aside (without their -wal and -shm companions)."""
    return sorted(p for p in path.parent.glob(f"{path.name}.corrupt-*") if not p.name.endswith(("-wal", "-shm")))


def test_a_file_that_is_not_a_database_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "embeddings.sqlite"
    path.write_bytes(b"not a database, " * 200)
    with pytest.warns(RuntimeWarning, match=f"the embedding cache {path} is corrupt .*file is not a database"):
        cache = EmbeddingCache(path)
    (aside,) = aside_files(path)
    assert aside.read_bytes() == b"not a database, " * 200  # kept for inspection, not deleted
    items = vectors(3)
    cache.put_many(items)
    np.testing.assert_array_equal(cache.get_many(["key1"])["key1"], items["key1"])
    cache.close()


def test_malformed_pages_found_mid_run_start_a_fresh_cache(tmp_path: Path) -> None:
    path = tmp_path / "embeddings.sqlite"
    items = vectors(2000, dim=384)
    cache = EmbeddingCache(path)
    cache.put_many(items)
    cache.close()
    with sqlite3.connect(path) as db:  # fold the WAL into the file, so that the damage below hits rows
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = path.stat().st_size
    with path.open("r+b") as raw:
        raw.seek(size // 2)
        raw.write(b"\xff" * 16384)
    cache = EmbeddingCache(path)  # the first page is intact: opening works
    with pytest.warns(RuntimeWarning, match=f"{path} is corrupt .*malformed"):
        found = cache.get_many(list(items))
    assert len(found) < len(items)
    assert len(aside_files(path)) == 1
    assert cache.get_many(list(items)) == {}  # a fresh, empty cache
    cache.put_many({"key0": items["key0"]})
    np.testing.assert_array_equal(cache.get_many(["key0"])["key0"], items["key0"])
    cache.close()


def test_a_locked_database_is_not_mistaken_for_a_corrupt_one(tmp_path: Path) -> None:
    path = tmp_path / "embeddings.sqlite"
    EmbeddingCache(path).close()
    holder = sqlite3.connect(path)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        cache = EmbeddingCache(path)
        cache._db.execute("PRAGMA busy_timeout = 50")
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            cache.put_many(vectors(1))
    finally:
        holder.rollback()
        holder.close()
    assert aside_files(path) == []


def _on_cache(encoder: StateEncoder, cache: Path) -> StateEncoder:
    """A fresh encoder on ``cache`` with ``encoder``'s loaded weights (loading them again only costs time)."""
    fresh = StateEncoder(cache_dir=cache, device="cpu")
    fresh._model = encoder._load()
    return fresh


def test_a_truncated_vector_is_encoded_again_and_overwritten(encoder: StateEncoder, tmp_path: Path) -> None:
    texts = ["the weather in Paris", "a cheap flight to Rome"]
    first = _on_cache(encoder, tmp_path)
    expected = first.embed(texts)
    dim = expected.shape[1]
    path = tmp_path / "embeddings.sqlite"
    with sqlite3.connect(path) as db:  # one row cut short by whole floats, one mid-float
        db.execute("UPDATE emb SET vec = substr(vec, 1, 100) WHERE key = ?", (first._key(texts[0]),))
        db.execute("UPDATE emb SET vec = substr(vec, 1, 101) WHERE key = ?", (first._key(texts[1]),))
    second = _on_cache(encoder, tmp_path)
    with pytest.warns(RuntimeWarning, match=f"the embedding cache {path} has 1 damaged vector"):
        got = second.embed(texts)
    assert got.shape == (2, dim)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert second.n_encoded == 2
    with sqlite3.connect(path) as db:
        lengths = {len(blob) for (blob,) in db.execute("SELECT vec FROM emb")}
    assert lengths == {4 * dim}  # both rows rebuilt


def test_token_rows_cut_short_are_encoded_again_and_overwritten(encoder: StateEncoder, tmp_path: Path) -> None:
    texts = ["convert the temperature to Fahrenheit", "a cheap flight to Rome"]
    first = _on_cache(encoder, tmp_path)
    expected = first.embed_tokens(texts)
    path = tmp_path / "embeddings.sqlite"
    with sqlite3.connect(path) as db:  # one text's rows cut by a whole row, one mid-number
        db.execute("UPDATE tokens SET vec = substr(vec, 1, length(vec) - 768) WHERE key = ?", (first._key(texts[0]),))
        db.execute("UPDATE tokens SET vec = substr(vec, 1, 101) WHERE key = ?", (first._key(texts[1]),))
    second = _on_cache(encoder, tmp_path)
    with pytest.warns(RuntimeWarning, match=f"the embedding cache {path} has 2 damaged vector"):
        got = second.embed_tokens(texts)
    for rows, want in zip(got, expected, strict=True):
        np.testing.assert_allclose(rows.astype(np.float32), want.astype(np.float32), atol=2e-3)
    assert second.n_encoded == 2
    third = StateEncoder(cache_dir=tmp_path, device="cpu")  # both rebuilt on disk: nothing to encode
    assert [rows.shape for rows in third.embed_tokens(texts)] == [rows.shape for rows in expected]
    assert third.n_encoded == 0 and third._model is None


def test_what_an_encoder_keeps_in_memory_is_bounded_and_read_back_from_disk(encoder: StateEncoder, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # A server meets new requests for ever: only the newest texts' vectors stay in memory.
    monkeypatch.setattr(embedder, "TOKEN_TEXTS_KEPT", 2)
    monkeypatch.setattr(embedder, "TEXTS_KEPT", 2)
    fresh = _on_cache(encoder, tmp_path)
    texts = ["the weather in Paris", "in Fahrenheit", "email it to Ray"]
    first = fresh.embed_tokens(texts)
    match = fresh.match_tokens(texts[:1], texts[1:])
    assert len(fresh._token_memory) == len(fresh._codes) == len(fresh._memory) == 2 and fresh.n_encoded == 3
    again = fresh.embed_tokens(texts)  # the oldest one from the disk cache, not the model
    assert fresh.n_encoded == 3 and all((a == b).all() for a, b in zip(first, again, strict=True))
    fresh._matches.clear()
    np.testing.assert_array_equal(fresh.match_tokens(texts[:1], texts[1:]), match)
    # A batch of embeddings larger than the bound still comes back whole and in order.
    vectors = fresh.embed(texts[::-1])
    assert fresh.n_encoded == 3 and len(fresh._memory) == 2
    np.testing.assert_allclose(vectors, encoder.embed(texts[::-1]), atol=1e-6)
