"""Discrete conservative Q-learning (Kumar et al., 2020) over tool-conditioned Q-values.

The TD loss (double-DQN target from a Polyak-averaged target network) is regularised by
``alpha * (logsumexp_a Q(s, a) - Q(s, a_logged))``, both over available tools only: Q-values
of tools the logs never chose at a state are pushed down, so the greedy policy stays where
the data says something.
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
from evoharness_agent.learning.networks import NetworkConfig, masked_scores

__all__ = ["CQL", "CQLConfig", "cql_penalty", "td_loss"]


@dataclass(frozen=True)
class CQLConfig:
    """Discrete CQL settings."""

    lr: float = 3e-4
    """Adam learning rate."""
    gamma: float = 0.99
    """Discount per decision."""
    alpha: float = 1.0
    """Weight of the conservative penalty."""
    tau: float = 0.005
    """Polyak rate of the target network."""


def td_loss(q_taken: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Huber loss between Q(s, a) and its target (robust to the +10 success bonus)."""
    return F.smooth_l1_loss(q_taken, target)


def cql_penalty(q_all: torch.Tensor, q_taken: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``logsumexp`` over available tools minus the logged tool's Q-value."""
    return (torch.logsumexp(masked_scores(q_all, mask), dim=1) - q_taken).mean()


class CQL(AlgorithmBase):
    """Discrete CQL with a double-DQN target."""

    name = "cql"
    acting = ("q",)

    def __init__(self, config: CQLConfig, dims: Dims, network: NetworkConfig, tools: ToolInputs) -> None:
        """Build the Q-network, its target copy and the optimiser."""
        super().__init__(tools)
        self.config = config
        self.modules["q"] = dims.scorer(network)
        self.modules["q_target"] = copy.deepcopy(self.modules["q"]).requires_grad_(False)
        self._finish_init(["q"], config.lr)

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One gradient step: TD + conservative penalty, then Polyak."""
        cfg = self.config
        q_all = self.score_states("q", batch)
        # s' only selects the double-DQN action: no graph, so backward covers B rows, not 2B.
        with torch.no_grad():
            target = double_dqn_target(self.score_next_states("q", batch),
                                       self.score_next_states("q_target", batch),
                                       batch.next_masks, batch.rewards, batch.dones, cfg.gamma)
        q_taken = q_all.gather(1, batch.actions[:, None]).squeeze(1)
        loss_td = td_loss(q_taken, target)
        penalty = cql_penalty(q_all, q_taken, batch.masks)
        self.step(loss_td + cfg.alpha * penalty)
        polyak(self.modules["q_target"], self.modules["q"], cfg.tau)
        return {"loss/td": loss_td.detach(), "loss/cql": penalty.detach(), "q/mean": q_taken.detach().mean()}

    def scores(self, states: torch.Tensor, pairs: torch.Tensor | None = None,
               candidates: torch.Tensor | None = None) -> torch.Tensor:
        """Q-values."""
        return self.score("q", states, pairs, candidates, acting=True)
