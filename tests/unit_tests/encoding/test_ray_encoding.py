"""Encoding on Ray Data actors (the ``ray`` extra): same vectors, in order, as one process."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.encoding.ray_encoding import RayEncoding, ray_encode
from evoharness_agent.encoding.transitions import build_dataset
from evoharness_agent.learning.config import load_config
from tests.kit.synthetic_logs import synthetic_episodes


def test_the_config_names_the_ray_encoding() -> None:
    assert load_config(None, {}).data.ray_encoding() is None
    data = load_config(None, {"data": {"encode_ray_workers": 3, "ray_address": "auto"}}).data
    assert data.ray_encoding() == RayEncoding(3, "auto")
    with pytest.raises(ValueError, match="encode_ray_workers"):
        load_config(None, {"data": {"encode_ray_workers": -1}})


def test_without_the_extra_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what an environment without ray gives on import
    with pytest.raises(ImportError, match=r"evoharness-agent\[ray\]"):
        ray_encode(["a"], RayEncoding(1), model_name="all-MiniLM-L6-v2", max_seq_length=128, batch_size=8,
                   device="cpu")


def test_few_texts_are_encoded_here_without_starting_ray(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import evoharness_agent.encoding.embedder as embedder

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("Ray was started for fewer texts than one batch per worker")

    monkeypatch.setattr(embedder, "ray_encode", refuse)
    encoder = StateEncoder(device="cpu", cache_dir=False, batch_size=8)
    assert encoder.embed([f"text {i}" for i in range(15)], ray=RayEncoding(2)).shape == (15, 384)


@pytest.mark.slow  # starts a local Ray cluster and two actors that each load the model (~1 min on 2 cores)
def test_ray_actors_encode_like_one_process(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray", reason="the ray extra (make test-slow installs it)")
    texts = [f"called tool_{i % 7}({{\"id\": {i}}}) -> ok: record {i} of {i * 3}" for i in range(40)]
    try:
        sharded = StateEncoder(device="cpu", cache_dir=tmp_path / "cache", batch_size=8)
        vectors = sharded.embed(texts, ray=RayEncoding(2))
        assert ray.is_initialized() and sharded._model is None  # the actors encoded, not this process
        single = StateEncoder(device="cpu", cache_dir=False, batch_size=8).embed(texts)
        assert vectors.dtype == np.float32 and vectors.shape == single.shape
        np.testing.assert_allclose(vectors, single, rtol=0.0, atol=1e-5)  # and in the texts' order
        again = StateEncoder(device="cpu", cache_dir=tmp_path / "cache")
        np.testing.assert_array_equal(again.embed(texts), vectors)  # cached by the driver like any other
        assert again.n_encoded == 0
        # A whole data set built through Ray equals one built here.
        episodes = synthetic_episodes(6)
        on_ray = build_dataset(episodes, StateEncoder(device="cpu", cache_dir=tmp_path / "fresh", batch_size=8),
                               history_window=2, encode_ray=RayEncoding(2))
        here = build_dataset(episodes, StateEncoder(device="cpu", cache_dir=False, batch_size=8), history_window=2)
        torch.testing.assert_close(on_ray.text_embeddings, here.text_embeddings, rtol=0.0, atol=1e-5)
        everything = torch.arange(len(here))
        a, b = on_ray.batch(everything, candidates_only=True), here.batch(everything, candidates_only=True)
        torch.testing.assert_close(a.states, b.states, rtol=0.0, atol=1e-5)
        assert torch.equal(a.actions, b.actions) and torch.equal(a.candidates, b.candidates)
    finally:
        ray.shutdown()
