"""evoharness-agent: learn LangChain tool orchestration from tool-use logs with offline RL.

The package follows the way data travels::

    logs/        importers, recorder (+ PII scrubber), bundled data       logs in
    encoding/    sentence-transformer + cache, THE state layout, tensors  texts embedded
    learning/    networks, algorithms (bc, cql, iql, bcq), trainer        offline RL
    policy.py    ToolPolicy: ranks the tools available at a step          a policy that ranks
    agents/      PolicyAgentExecutor, middleware, guardrails              an agent that acts
    envs/, evaluation/, local_llm/, cli.py                                measuring and running it

Every name below is imported on first use, so ``import evoharness_agent`` is cheap and
``from evoharness_agent import EpisodeRecorder`` does not load torch.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("evoharness-agent")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0.0.0"

_EXPORTS = {
    "FINISH": "evoharness_agent.schema",
    "Episode": "evoharness_agent.schema",
    "Step": "evoharness_agent.schema",
    "ToolSpec": "evoharness_agent.schema",
    "RewardConfig": "evoharness_agent.rewards",
    "shape_rewards": "evoharness_agent.rewards",
    "LoadResult": "evoharness_agent.logs.importers",
    "LogFormatError": "evoharness_agent.logs.importers",
    "detect_format": "evoharness_agent.logs.importers",
    "load_episodes": "evoharness_agent.logs.importers",
    "write_episodes": "evoharness_agent.logs.importers",
    "EpisodeRecorder": "evoharness_agent.logs.recorder",
    "PIIScrubber": "evoharness_agent.logs.scrubber",
    "StateEncoder": "evoharness_agent.encoding.embedder",
    "TransitionDataset": "evoharness_agent.encoding.transitions",
    "build_dataset": "evoharness_agent.encoding.transitions",
    "TrainConfig": "evoharness_agent.learning.config",
    "load_config": "evoharness_agent.learning.config",
    "train": "evoharness_agent.learning.trainer",
    "train_on_episodes": "evoharness_agent.learning.trainer",
    "PolicySession": "evoharness_agent.policy",
    "ToolPolicy": "evoharness_agent.policy",
    "ToolScore": "evoharness_agent.policy",
    "PolicyAgentExecutor": "evoharness_agent.agents.executor",
    "Approval": "evoharness_agent.agents.guardrails",
    "Guardrails": "evoharness_agent.agents.guardrails",
    # needs the optional ``langchain`` extra
    "PolicyToolSelectorMiddleware": "evoharness_agent.agents.middleware",
    # needs the optional ``server`` extra (httpx)
    "PolicyClient": "evoharness_agent.server.client",
    "OfflineReport": "evoharness_agent.evaluation.offline",
    "evaluate_offline": "evoharness_agent.evaluation.offline",
    "LocalChatModel": "evoharness_agent.local_llm",
}

__all__ = [
    "Approval",
    "Episode",
    "EpisodeRecorder",
    "FINISH",
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
"""``PolicyToolSelectorMiddleware`` and ``PolicyClient`` are importable too, but left out of star
imports: they need the ``langchain`` and ``server`` extras."""

if TYPE_CHECKING:
    from evoharness_agent.agents.executor import PolicyAgentExecutor
    from evoharness_agent.agents.guardrails import Guardrails
    from evoharness_agent.agents.middleware import PolicyToolSelectorMiddleware  # noqa: F401
    from evoharness_agent.encoding.embedder import StateEncoder
    from evoharness_agent.encoding.transitions import TransitionDataset, build_dataset
    from evoharness_agent.evaluation.offline import OfflineReport, evaluate_offline
    from evoharness_agent.learning.config import TrainConfig, load_config
    from evoharness_agent.learning.trainer import train, train_on_episodes
    from evoharness_agent.local_llm import LocalChatModel
    from evoharness_agent.logs.importers import LoadResult, LogFormatError, detect_format, load_episodes, write_episodes
    from evoharness_agent.logs.recorder import EpisodeRecorder
    from evoharness_agent.logs.scrubber import PIIScrubber
    from evoharness_agent.policy import PolicySession, ToolPolicy, ToolScore
    from evoharness_agent.rewards import RewardConfig, shape_rewards
    from evoharness_agent.schema import FINISH, Episode, Step, ToolSpec
    from evoharness_agent.server.client import PolicyClient  # noqa: F401


def __getattr__(name: str) -> Any:
    """Import a public name from the module that defines it, on first use."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """List the public names next to the module's own attributes."""
    return sorted({*globals(), *__all__})
