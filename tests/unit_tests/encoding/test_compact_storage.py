"""Compact training sets: a float16 and a memory-mapped text-embedding table, and multi-process encoding."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.encoding.transitions import EMBEDDINGS_FILE, Batch, TransitionDataset, build_dataset
from evoharness_agent.learning.config import load_config
from evoharness_agent.learning.trainer import DATASET_DIR, train_on_episodes
from tests.kit.synthetic_logs import synthetic_episodes

EPISODES = synthetic_episodes(8)


def _all(dataset: TransitionDataset, *, candidates_only: bool) -> Batch:
    """Gather every transition of ``dataset`` into one batch."""
    return dataset.batch(torch.arange(len(dataset)), candidates_only=candidates_only)


def _assert_same_except_states(a: Batch, b: Batch) -> None:
    """Every field of two batches but the (next) states is identical."""
    for name, value in vars(a).items():
        if name not in ("states", "next_states"):
            other = getattr(b, name)
            assert (value is None and other is None) or torch.equal(value, other), name


@pytest.mark.parametrize("candidates_only", [False, True])
def test_a_float16_table_gives_float32_states_within_float16_rounding(encoder: StateEncoder,
                                                                     candidates_only: bool) -> None:
    full = build_dataset(EPISODES, encoder, history_window=2)
    half = build_dataset(EPISODES, encoder, history_window=2, embedding_dtype="float16")
    assert full.text_embeddings.dtype == torch.float32 and half.text_embeddings.dtype == torch.float16
    assert half.text_embeddings.element_size() * 2 == full.text_embeddings.element_size()
    a, b = _all(full, candidates_only=candidates_only), _all(half, candidates_only=candidates_only)
    for name in ("states", "next_states"):
        wide, narrow = getattr(a, name), getattr(b, name)
        assert narrow.dtype == torch.float32
        assert not torch.equal(wide, narrow)  # the table really is rounded to float16 ...
        # ... and only that: half a float16 unit in the last place of values below 1 (unit vectors).
        torch.testing.assert_close(narrow, wide, rtol=0.0, atol=2.0**-12)
    _assert_same_except_states(a, b)


def test_a_memory_mapped_table_gives_identical_batches(encoder: StateEncoder, tmp_path: Path) -> None:
    in_memory = build_dataset(EPISODES, encoder, history_window=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns on a read-only array: the table must not be one
        mapped = build_dataset(EPISODES, encoder, history_window=2, mmap_dir=tmp_path / "ds")
        moved = mapped.to("cpu")
        for candidates_only in (False, True):
            a = _all(in_memory, candidates_only=candidates_only)
            for dataset in (mapped, moved):
                b = _all(dataset, candidates_only=candidates_only)
                assert torch.equal(a.states, b.states) and torch.equal(a.next_states, b.next_states)
                _assert_same_except_states(a, b)
    assert [p.name for p in (tmp_path / "ds").iterdir()] == [EMBEDDINGS_FILE]  # no temporary file left
    on_disk = np.load(tmp_path / "ds" / EMBEDDINGS_FILE)
    assert on_disk.dtype == np.float32 and np.array_equal(on_disk, in_memory.text_embeddings.numpy())
    half = build_dataset(EPISODES, encoder, history_window=2, embedding_dtype="float16", mmap_dir=tmp_path / "h")
    assert np.load(tmp_path / "h" / EMBEDDINGS_FILE).dtype == np.float16
    assert torch.equal(half.text_embeddings, in_memory.text_embeddings.half())


def test_rebuilding_into_the_same_folder_leaves_a_mapped_table_intact(encoder: StateEncoder, tmp_path: Path) -> None:
    first = build_dataset(EPISODES, encoder, history_window=2, mmap_dir=tmp_path)
    expected = first.text_embeddings.clone()
    second = build_dataset(synthetic_episodes(3), encoder, history_window=2, mmap_dir=tmp_path)
    assert second.text_embeddings.shape[0] < expected.shape[0]
    # The new table replaced the file whole (a rename): the first still maps the old one.
    assert torch.equal(first.text_embeddings, expected)


def test_a_second_process_maps_the_table_the_first_wrote(encoder: StateEncoder, tmp_path: Path) -> None:
    """Ranks of a data-parallel run share rank 0's file: no second embedding pass, no second write."""
    written = build_dataset(EPISODES, encoder, history_window=2, embedding_dtype="float16", mmap_dir=tmp_path)
    stamp = (tmp_path / EMBEDDINGS_FILE).stat().st_mtime_ns
    encoded, calls = encoder.n_encoded, []
    real_embed = encoder.embed

    def counting_embed(texts, **options):  # type: ignore[no-untyped-def]
        calls.append(len(texts))
        return real_embed(texts, **options)

    encoder.embed = counting_embed  # type: ignore[method-assign]
    try:
        shared = build_dataset(EPISODES, encoder, history_window=2, embedding_dtype="float16", mmap_dir=tmp_path,
                               mmap_shared=True)
    finally:
        del encoder.embed
    assert torch.equal(shared.text_embeddings, written.text_embeddings)
    assert (tmp_path / EMBEDDINGS_FILE).stat().st_mtime_ns == stamp and encoder.n_encoded == encoded
    n_texts = written.text_embeddings.shape[0] - 1
    assert n_texts not in calls  # the step texts were not embedded again (tools and clauses are)
    with pytest.raises(ValueError, match=r"text_embeddings\.npy.*float16.*needs float32"):
        build_dataset(EPISODES, encoder, history_window=2, mmap_dir=tmp_path, mmap_shared=True)
    with pytest.raises(ValueError, match="needs float16"):
        build_dataset(synthetic_episodes(3), encoder, history_window=2, embedding_dtype="float16",
                      mmap_dir=tmp_path, mmap_shared=True)
    with pytest.raises(FileNotFoundError, match="no shared embedding table"):
        build_dataset(EPISODES, encoder, history_window=2, mmap_dir=tmp_path / "none", mmap_shared=True)


def test_training_runs_on_a_float16_memory_mapped_table(encoder: StateEncoder, tmp_path: Path) -> None:
    config = load_config(None, {
        "training": {"steps": 4, "batch_size": 8, "device": "cpu", "threads": 1, "checkpoint_every": 4,
                     "eval_every": 4},
        "logging": {"tensorboard": False, "log_every": 2},
        "model": {"hidden": 16, "history_window": 2},
        "data": {"embedding_dtype": "float16", "mmap_embeddings": True, "val_fraction": 0.25},
    })
    result = train_on_episodes(EPISODES, config, tmp_path, encoder=encoder, show_progress=False)
    table = np.load(tmp_path / DATASET_DIR / EMBEDDINGS_FILE)
    assert table.dtype == np.float16 and not table[0].any() and table.shape[1] == 384
    losses = [value for key, value in result.items() if key.startswith("loss/")]
    assert losses and all(math.isfinite(value) for value in losses)
    saved = json.loads((tmp_path / "policy.json").read_text())["config"]["data"]
    assert (saved["embedding_dtype"], saved["mmap_embeddings"], saved["encode_processes"]) == ("float16", True, 1)


def test_config_rejects_an_unknown_dtype_and_zero_processes() -> None:
    with pytest.raises(ValueError, match="embedding_dtype"):
        load_config(None, {"data": {"embedding_dtype": "int8"}})
    with pytest.raises(ValueError, match="encode_processes"):
        load_config(None, {"data": {"encode_processes": 0}})


@pytest.mark.slow  # two worker processes each import torch and load the model (~20 s on 2 cores)
def test_multi_process_encoding_equals_one_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    texts = [f"called tool_{i % 7}({{\"id\": {i}}}) -> ok: record {i} of {i * 3}" for i in range(48)]
    pooled = StateEncoder(device="cpu", cache_dir=tmp_path, batch_size=8)
    model = pooled._load()
    started: list[object] = []
    stopped: list[object] = []
    kind = type(model)  # the model travels to the workers pickled: patch its class, not the instance
    start, stop = kind.start_multi_process_pool, kind.stop_multi_process_pool

    def counted_start(self: object, *args: object, **kwargs: object) -> object:
        started.append(start(self, *args, **kwargs))
        return started[-1]

    def counted_stop(pool: object) -> None:
        stopped.append(pool)
        stop(pool)

    monkeypatch.setattr(kind, "start_multi_process_pool", counted_start)
    monkeypatch.setattr(kind, "stop_multi_process_pool", staticmethod(counted_stop))
    vectors = pooled.embed(texts, processes=2)
    assert len(started) == 1 and stopped == started  # the pool did the encoding, and was stopped
    single = StateEncoder(device="cpu", cache_dir=False, batch_size=8).embed(texts)
    assert vectors.dtype == np.float32 and vectors.shape == single.shape
    np.testing.assert_allclose(vectors, single, rtol=0.0, atol=1e-5)
    again = StateEncoder(device="cpu", cache_dir=tmp_path)
    np.testing.assert_array_equal(again.embed(texts), vectors)  # written to the disk cache
    assert again.n_encoded == 0
