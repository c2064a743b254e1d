"""Behaviour cloning: imitate the logged tool choices (the baseline every RL method must beat)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from evoharness_agent.encoding.transitions import Batch
from evoharness_agent.learning.algorithms.base import AlgorithmBase, Dims, ToolInputs
from evoharness_agent.learning.networks import NetworkConfig, masked_log_softmax

__all__ = ["BC", "BCConfig", "bc_loss"]


@dataclass(frozen=True)
class BCConfig:
    """Behaviour cloning settings."""

    lr: float = 3e-4
    """Adam learning rate."""
    weight_decay: float = 1e-4
    """L2 penalty: logs are small, so the policy overfits easily."""


def bc_loss(logits: torch.Tensor, actions: torch.Tensor, mask: torch.Tensor,
            weights: torch.Tensor | None = None) -> torch.Tensor:
    """Masked cross-entropy of the logged actions, optionally weighted per sample."""
    log_probs = masked_log_softmax(logits, mask).gather(1, actions[:, None]).squeeze(1)
    return -(log_probs if weights is None else weights * log_probs).mean()


class BC(AlgorithmBase):
    """Behaviour cloning over the tool-conditioned scorer."""

    name = "bc"
    acting = ("policy",)

    def __init__(self, config: BCConfig, dims: Dims, network: NetworkConfig, tools: ToolInputs) -> None:
        """Build the policy network and its optimiser."""
        super().__init__(tools)
        self.config = config
        self.modules["policy"] = dims.scorer(network)
        self._finish_init(["policy"], config.lr, config.weight_decay)

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One gradient step on the masked cross-entropy."""
        loss = bc_loss(self.score_states("policy", batch), batch.actions, batch.masks)
        self.step(loss)
        return {"loss/bc": loss.detach()}

    def scores(self, states: torch.Tensor, pairs: torch.Tensor | None = None,
               candidates: torch.Tensor | None = None) -> torch.Tensor:
        """Policy logits."""
        return self.score("policy", states, pairs, candidates, acting=True)
