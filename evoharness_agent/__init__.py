"""evoharness-agent: learn LangChain tool orchestration from tool-use logs with offline RL."""

from __future__ import annotations

from evoharness_agent.config import TrainConfig, load_config
from evoharness_agent.dataset import TransitionDataset, build_dataset
from evoharness_agent.encoding import StateEncoder
from evoharness_agent.evaluation import OfflineReport, evaluate_offline
from evoharness_agent.executor import PolicyAgentExecutor
from evoharness_agent.guardrails import Guardrails
from evoharness_agent.importers import LoadResult, LogFormatError, detect_format, load_episodes, write_episodes
from evoharness_agent.local_llm import LocalChatModel
from evoharness_agent.policy import PolicySession, ToolPolicy, ToolScore
from evoharness_agent.recorder import EpisodeRecorder, PIIScrubber
from evoharness_agent.rewards import RewardConfig, shape_rewards
from evoharness_agent.schema import FINISH, Episode, Step, ToolSpec
from evoharness_agent.trainer import train, train_on_episodes

__version__ = "0.1.0"

__all__ = [
    "FINISH",
    "Episode",
    "EpisodeRecorder",
    "Guardrails",
    "LoadResult",
    "LocalChatModel",
    "LogFormatError",
    "OfflineReport",
    "PIIScrubber",
    "PolicyAgentExecutor",
    "PolicySession",
    "RewardConfig",
    "StateEncoder",
    "Step",
    "ToolPolicy",
    "ToolScore",
    "ToolSpec",
    "TrainConfig",
    "TransitionDataset",
    "build_dataset",
    "detect_format",
    "evaluate_offline",
    "load_config",
    "load_episodes",
    "shape_rewards",
    "train",
    "train_on_episodes",
    "write_episodes",
]


def __getattr__(name: str) -> object:
    """Import ``PolicyToolSelectorMiddleware`` on first use: it needs the optional ``langchain`` extra."""
    if name == "PolicyToolSelectorMiddleware":
        from evoharness_agent.middleware import PolicyToolSelectorMiddleware

        return PolicyToolSelectorMiddleware
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
