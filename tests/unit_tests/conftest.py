"""Shared fixtures: the real (offline) sentence encoder, loaded once per test module."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from evoharness_agent.encoding.embedder import STATIC_STEP_MODEL, StateEncoder  # noqa: E402

# Tiny models on a shared 2-core machine: extra intra-op threads only contend.
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> StateEncoder:
    """The real all-MiniLM-L6-v2 encoder, caching under a temp dir (never the user's cache)."""
    return StateEncoder(cache_dir=tmp_path_factory.mktemp("embeddings"), device="cpu")


@pytest.fixture(scope="session")
def static_step_model() -> str:
    """The static step model shipped in the package (64 dimensions, distilled from MiniLM)."""
    return STATIC_STEP_MODEL
