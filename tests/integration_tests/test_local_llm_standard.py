"""LangChain's standard chat-model integration suite (langchain-tests) on the real local model.

Qwen2.5-Coder-0.5B runs on CPU through llama.cpp, so this is slow: run with `make test-slow`.
Needs the `local` extra (xllamacpp and the pinned weight-chunk packages); skipped without it.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
from typing import Any

import pytest
from langchain_tests.integration_tests import ChatModelIntegrationTests

from evoharness_agent.local_llm import MODELS, LocalChatModel, ensure_model

MODEL = "qwen2.5-coder-0.5b"
_NEEDED = ("xllamacpp", *MODELS[MODEL].chunk_modules)
_MISSING = [m for m in _NEEDED if importlib.util.find_spec(m) is None]

pytestmark = [
    pytest.mark.slow,
    # The suite's async tests are plain coroutines; anyio's pytest plugin runs them (on asyncio).
    pytest.mark.anyio,
    pytest.mark.skipif(
        bool(_MISSING),
        reason=f"the `local` extra is not installed (missing {_MISSING}): pip install 'evoharness-agent[local]'",
    ),
]


class TestLocalChatModelIntegration(ChatModelIntegrationTests):
    """The standard suite, with the capabilities a local text-only constrained-decoding model has."""

    @property
    def chat_model_class(self) -> type[LocalChatModel]:
        return LocalChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {
            "model_path": str(ensure_model(MODEL)),
            "sha256": MODELS[MODEL].sha256,
            "current_date": dt.date(2025, 3, 10),
        }

    @property
    def supports_model_override(self) -> bool:
        # One model file per instance, loaded in its worker: a per-call ``model=`` cannot switch it.
        return False
