"""Discrete conservative Q-learning (Kumar et al., 2020) over tool-conditioned Q-values.

The TD loss (double-DQN target from a Polyak-averaged target network) is regularised by
``alpha * (logsumexp_a Q(s, a) - Q(s, a_logged))``, both over available tools only: Q-values
of tools the logs never chose at a state are pushed down, so the greedy policy stays where
the data says something.

That softmax also ranks tools by how often the logs call them: a tool a user's few logs never call
is pushed down at every state that offers it, though their next task may need it. So the penalty's
softmax sees each tool's Q-value plus ``prior_adjustment`` times its log share of the logged calls
(logit adjustment, Menon et al., 2021): a tool is pushed down for losing to the logged one, not for
being rare. The adjustment reranks tools only; the tools' softmax mass against FINISH is kept, so
when to answer is learned as without it. Off by default: it helps where the logs call a minority of
the tools they offer (BFCL), and costs where a few tools do most of the work in every task (tau2-bench
retail); ``docs/experiments.md``, thirty-fourth stop.
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

__all__ = ["CQL", "CQLConfig", "cql_penalty", "log_call_shares", "prior_adjustment", "td_loss"]


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
    prior_adjustment: float = 0.0
    """Weight of each tool's log share of the logged calls in the penalty's softmax (0: plain CQL)."""
    prior_pseudo_count: float = 1.0
    """Calls added to every tool's count before its share is taken (a tool never called is not infinitely rare)."""

    def __post_init__(self) -> None:
        """Reject a negative adjustment and a pseudo-count that leaves a share at 0 (its log is -inf)."""
        if self.prior_adjustment < 0 or self.prior_pseudo_count <= 0:
            raise ValueError(f"cql needs prior_adjustment >= 0 and prior_pseudo_count > 0, got "
                             f"{self.prior_adjustment} and {self.prior_pseudo_count}")


def td_loss(q_taken: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Huber loss between Q(s, a) and its target (robust to the +10 success bonus)."""
    return F.smooth_l1_loss(q_taken, target)


def log_call_shares(calls: torch.Tensor, pseudo_count: float) -> torch.Tensor:
    """Return each tool-table row's log share of the logged tool calls (row 0, FINISH, is no call: share 0)."""
    counts = calls.float() + pseudo_count
    counts[0] = 0.0
    return torch.log(counts / counts.sum())


def prior_adjustment(q_all: torch.Tensor, tools: torch.Tensor, log_shares: torch.Tensor,
                     weight: float) -> torch.Tensor:
    """Return what logit adjustment adds to each Q-value: ``weight`` x each available tool's log share, 0 elsewhere.

    Shifted per state so the available tools' softmax mass against FINISH stays as it was: on the
    validation fine-tunes, letting the adjustment move it cost the live top-1 (BFCL 0.686 -> 0.636).
    """
    adjustment = torch.where(tools, weight * log_shares, 0.0)
    with torch.no_grad():
        q_tools = masked_scores(q_all.detach(), tools)
        shift = (torch.logsumexp(q_tools + adjustment, dim=1, keepdim=True)
                 - torch.logsumexp(q_tools, dim=1, keepdim=True))
    return torch.where(tools, adjustment - shift, 0.0)


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
        penalised = q_all
        if cfg.prior_adjustment and self.tools.calls is not None:
            rows = (batch.candidates if batch.candidates is not None
                    else torch.arange(q_all.shape[1], device=q_all.device).expand_as(q_all))
            shares = log_call_shares(self.tools.calls, cfg.prior_pseudo_count)[rows]
            penalised = q_all + prior_adjustment(q_all, batch.masks & (rows != 0), shares, cfg.prior_adjustment)
        penalty = cql_penalty(penalised, penalised.gather(1, batch.actions[:, None]).squeeze(1), batch.masks)
        self.step(loss_td + cfg.alpha * penalty)
        polyak(self.modules["q_target"], self.modules["q"], cfg.tau)
        return {"loss/td": loss_td.detach(), "loss/cql": penalty.detach(), "q/mean": q_taken.detach().mean()}

    def scores(self, states: torch.Tensor, pairs: torch.Tensor | None = None,
               candidates: torch.Tensor | None = None) -> torch.Tensor:
        """Q-values."""
        return self.score("q", states, pairs, candidates, acting=True)
