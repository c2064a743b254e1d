"""Fixtures for the agent tests: real tools, a scripted chat model, and a really trained policy.

The pieces live in :mod:`tests.kit`; the policy is trained with `train_on_episodes` on the
synthetic episodes of :mod:`tests.kit.agent_logs`, with the real sentence encoder, once per session.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from evoharness_agent.encoding.embedder import StateEncoder  # noqa: E402
from evoharness_agent.learning.config import TrainConfig  # noqa: E402
from evoharness_agent.learning.trainer import train_on_episodes  # noqa: E402
from evoharness_agent.policy import ToolPolicy  # noqa: E402
from tests.kit.agent_logs import POLICY_CONFIG, training_episodes  # noqa: E402
from tests.kit.chat_models import EventLog, ScriptedChatModel, call, fill  # noqa: E402
from tests.kit.tools import DELETED, TOOLS  # noqa: E402


@pytest.fixture
def kit() -> SimpleNamespace:
    """The tools, the scripted model and helpers, as one namespace."""
    DELETED.clear()

    def llm(*script: Any, tool_calling: bool = True, delay: float = 0.0) -> ScriptedChatModel:
        return ScriptedChatModel(script=list(script), tool_calling=tool_calling, delay=delay)

    return SimpleNamespace(tools=list(TOOLS), by_name={t.name: t for t in TOOLS}, llm=llm, call=call, fill=fill,
                           deleted=DELETED, events=EventLog)


@pytest.fixture(scope="session")
def agent_encoder(tmp_path_factory: pytest.TempPathFactory) -> StateEncoder:
    """The real all-MiniLM-L6-v2 encoder, loaded once for the agent tests."""
    return StateEncoder(cache_dir=tmp_path_factory.mktemp("agent-embeddings"), device="cpu")


@pytest.fixture(scope="session")
def default_encoder(tmp_path_factory: pytest.TempPathFactory) -> StateEncoder:
    """The shipped default's encoders (MiniLM, and the static model of its history steps), loaded once."""
    return ToolPolicy.load("default", device="cpu", cache_dir=tmp_path_factory.mktemp("default-embeddings")).encoder


@pytest.fixture(scope="session")
def policy_dir(tmp_path_factory: pytest.TempPathFactory, agent_encoder: StateEncoder) -> Path:
    """A policy directory trained on :func:`training_episodes` (about a second of training)."""
    out = tmp_path_factory.mktemp("policy")
    train_on_episodes(training_episodes(), TrainConfig.model_validate(POLICY_CONFIG), out, encoder=agent_encoder,
                      show_progress=False)
    return out


@pytest.fixture(scope="session")
def policy(policy_dir: Path, agent_encoder: StateEncoder) -> ToolPolicy:
    """The trained policy, loaded on the CPU with the shared encoder."""
    return ToolPolicy.load(policy_dir, encoder=agent_encoder, device="cpu")
