"""Loading the sentence-transformer is quiet for library use, and shows its progress when asked."""

from __future__ import annotations

import logging

import pytest

from evoharness_agent.encoding.embedder import StateEncoder


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def test_loading_prints_no_progress_bar(capfd: pytest.CaptureFixture[str]) -> None:
    from transformers.utils import logging as transformers_logging

    StateEncoder(cache_dir=False).embed(["hello"])
    assert "Loading weights" not in capfd.readouterr().err
    # The user's own transformers setting is left as it was.
    assert transformers_logging.is_progress_bar_enabled()


def test_info_logging_asks_for_the_progress_bar(capfd: pytest.CaptureFixture[str]) -> None:
    logger = logging.getLogger("evoharness_agent")
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        StateEncoder(cache_dir=False).embed(["hello"])
    finally:
        logger.setLevel(previous)
    assert "Loading weights" in capfd.readouterr().err


def test_the_encode_bar_shows_only_for_more_than_one_batch(capfd: pytest.CaptureFixture[str]) -> None:
    encoder = StateEncoder(cache_dir=False, batch_size=4)
    encoder.embed(["one", "two", "three"], show_progress=True)
    assert "Batches" not in capfd.readouterr().err
    encoder.embed([f"text {i}" for i in range(9)], show_progress=True)
    assert "Batches" in capfd.readouterr().err
