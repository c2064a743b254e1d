"""Discrete implicit Q-learning (Kostrikov et al., 2021).

IQL never queries Q at tools the logs did not choose: V(s) is fit by expectile regression
to the logged Q(s, a) (an in-sample "max"), Q(s, a) to ``r + gamma * V(s')``, and the policy
by advantage-weighted, masked cross-entropy on the logged tools. The agent acts from the
policy, so a bad logged run teaches it what to avoid and a good one what to repeat.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from evoharness_agent.encoding.transitions import Batch
from evoharness_agent.learning.algorithms.base import AlgorithmBase, Dims, ToolInputs, polyak, td_target
from evoharness_agent.learning.algorithms.bc import bc_loss
from evoharness_agent.learning.distributed import batch_mean
from evoharness_agent.learning.networks import NetworkConfig

__all__ = ["IQL", "IQLConfig", "advantage_weights", "expectile_loss"]


@dataclass(frozen=True)
class IQLConfig:
    """Discrete IQL settings."""

    lr: float = 3e-4
    """Adam learning rate (all networks)."""
    gamma: float = 0.99
    """Discount per decision."""
    tau: float = 0.005
    """Polyak rate of the target Q-networks."""
    expectile: float = 0.7
    """Expectile of V's regression onto Q: 0.5 is the mean (SARSA), near 1 the max."""
    beta: float = 1.0
    """Inverse temperature of the advantage weights (0 = behaviour cloning). Rewards here are
    on a scale of ~10 (the success bonus), so 1.0 already separates good and bad actions."""
    max_weight: float = 100.0
    """Clip of ``exp(beta * advantage)``, for stability."""
    weight_decay: float = 1e-4
    """L2 penalty on all networks."""


def expectile_loss(diff: torch.Tensor, expectile: float) -> torch.Tensor:
    """Asymmetric squared loss ``|tau - 1(diff < 0)| * diff^2`` averaged over the batch."""
    weight = torch.where(diff < 0, 1.0 - expectile, expectile)
    return (weight * diff.pow(2)).mean()


def advantage_weights(advantage: torch.Tensor, beta: float, max_weight: float) -> torch.Tensor:
    """Return ``min(exp(beta * A), max_weight)``, the AWR weights, scaled to a batch mean of 1.

    The scaling keeps the policy's effective learning rate that of BC whatever the size of
    the advantages (large and noisy while Q and V are still young); only the relative
    weighting of logged actions changes. In a data-parallel run the mean is the global
    batch's (:func:`~evoharness_agent.learning.distributed.batch_mean`), not one rank's slice.
    """
    weights = torch.exp(beta * advantage).clamp(max=max_weight)
    return weights / batch_mean(weights).clamp(min=1e-8)


class IQL(AlgorithmBase):
    """Twin Q, value and policy networks trained together by one fused optimiser."""

    name = "iql"
    acting = ("policy",)

    def __init__(self, config: IQLConfig, dims: Dims, network: NetworkConfig, tools: ToolInputs) -> None:
        """Build Q1, Q2 (and targets), V and the policy."""
        super().__init__(tools)
        self.config = config
        for name in ("q1", "q2", "policy"):
            self.modules[name] = dims.scorer(network)
        self.modules["value"] = dims.value(network)
        for name in ("q1", "q2"):
            self.modules[f"{name}_target"] = copy.deepcopy(self.modules[name]).requires_grad_(False)
        # The three losses touch disjoint parameters (targets are detached), so one Adam
        # over their sum is exactly three Adams, in one fused kernel.
        self._finish_init(["q1", "q2", "value", "policy"], config.lr, config.weight_decay)

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One gradient step on the value, Q and policy losses, then Polyak."""
        cfg = self.config
        take = batch.actions[:, None]
        with torch.no_grad():
            q_target = torch.minimum(self.score_states("q1_target", batch).gather(1, take),
                                     self.score_states("q2_target", batch).gather(1, take)).squeeze(1)
        value = self.modules["value"](batch.states).float()
        with torch.no_grad():
            next_value = self.modules["value"](batch.next_states).float()
        loss_value = expectile_loss(q_target - value, cfg.expectile)

        target = td_target(batch.rewards, batch.dones, next_value, cfg.gamma)
        q1 = self.score_states("q1", batch).gather(1, take).squeeze(1)
        q2 = self.score_states("q2", batch).gather(1, take).squeeze(1)
        loss_q = (q1 - target).pow(2).mean() + (q2 - target).pow(2).mean()

        weights = advantage_weights(q_target - value.detach(), cfg.beta, cfg.max_weight)
        loss_policy = bc_loss(self.score_states("policy", batch), batch.actions, batch.masks, weights)

        self.step(loss_value + loss_q + loss_policy)
        polyak(self.modules["q1_target"], self.modules["q1"], cfg.tau)
        polyak(self.modules["q2_target"], self.modules["q2"], cfg.tau)
        return {"loss/value": loss_value.detach(), "loss/q": loss_q.detach(),
                "loss/policy": loss_policy.detach(), "adv/mean": (q_target - value.detach()).mean()}

    def scores(self, states: torch.Tensor, pairs: torch.Tensor | None = None,
               candidates: torch.Tensor | None = None) -> torch.Tensor:
        """Policy logits."""
        return self.score("policy", states, pairs, candidates, acting=True)
