"""Discrete batch-constrained Q-learning (Fujimoto et al., 2019).

An imitation head G(a|s) learns which tools the logs use at a state; Q-learning then only
bootstraps from, and acts with, tools whose probability is at least ``threshold`` times the
most likely one's. The agent stays near the logged behaviour and picks the best of it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from evoharness_agent.encoding.transitions import Batch
from evoharness_agent.learning.algorithms.base import (
    AlgorithmBase,
    Dims,
    ToolInputs,
    double_dqn_target,
    polyak,
)
from evoharness_agent.learning.algorithms.bc import bc_loss
from evoharness_agent.learning.networks import NEG_INF, NetworkConfig, masked_log_softmax

__all__ = ["BCQ", "BCQConfig", "allowed_actions"]


@dataclass(frozen=True)
class BCQConfig:
    """Discrete BCQ settings."""

    lr: float = 3e-4
    """Adam learning rate."""
    gamma: float = 0.99
    """Discount per decision."""
    tau: float = 0.005
    """Polyak rate of the target Q-network."""
    threshold: float = 0.3
    """Keep tools with ``G(a|s) / max_a G(a|s) >= threshold``; 0 is DQN, 1 is BC."""


def allowed_actions(imitation_logits: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """Return the available tools whose imitation probability clears the relative threshold."""
    log_probs = masked_log_softmax(imitation_logits, mask)
    best = log_probs.max(dim=1, keepdim=True).values
    return mask & (log_probs - best >= torch.log(torch.tensor(threshold)).item())


class BCQ(AlgorithmBase):
    """Q-network plus imitation network; Q acts within the imitation's support."""

    name = "bcq"
    acting = ("q", "imitation")

    def __init__(self, config: BCQConfig, dims: Dims, network: NetworkConfig, tools: ToolInputs) -> None:
        """Build Q, its target and the imitation network."""
        super().__init__(tools)
        self.config = config
        self.modules["q"] = dims.scorer(network)
        self.modules["imitation"] = dims.scorer(network)
        self.modules["q_target"] = copy.deepcopy(self.modules["q"]).requires_grad_(False)
        self._finish_init(["q", "imitation"], config.lr)

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One gradient step on TD + imitation losses, then Polyak."""
        cfg = self.config
        q_all = self.score_states("q", batch)
        imitation = self.score_states("imitation", batch)
        # s' only picks the bootstrap action: no graph, so backward covers B rows, not 2B.
        with torch.no_grad():
            allowed = allowed_actions(self.score_next_states("imitation", batch),
                                      batch.next_masks, cfg.threshold)
            target = double_dqn_target(self.score_next_states("q", batch),
                                       self.score_next_states("q_target", batch),
                                       allowed, batch.rewards, batch.dones, cfg.gamma)
        q_taken = q_all.gather(1, batch.actions[:, None]).squeeze(1)
        loss_td = F.smooth_l1_loss(q_taken, target)
        loss_imitation = bc_loss(imitation, batch.actions, batch.masks)
        self.step(loss_td + loss_imitation)
        polyak(self.modules["q_target"], self.modules["q"], cfg.tau)
        return {"loss/td": loss_td.detach(), "loss/imitation": loss_imitation.detach(),
                "q/mean": q_taken.detach().mean()}

    def scores(self, states: torch.Tensor, pairs: torch.Tensor | None = None,
               candidates: torch.Tensor | None = None) -> torch.Tensor:
        """Q-values, with tools outside the imitation support ranked below all others."""
        q = self.score("q", states, pairs, candidates, acting=True)
        full = torch.ones_like(q, dtype=torch.bool)
        allowed = allowed_actions(self.score("imitation", states, pairs, candidates), full, self.config.threshold)
        return torch.where(allowed, q, q + NEG_INF / 1e3)
