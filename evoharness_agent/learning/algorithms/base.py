"""What every algorithm is (the :class:`Algorithm` protocol) and shares: sizes, optimiser, targets, Polyak."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

import torch
from torch import nn

from evoharness_agent.encoding.transitions import Batch, TransitionDataset
from evoharness_agent.learning.networks import NEG_INF, NetworkConfig, StateValue, ToolScorer, masked_scores
from evoharness_agent.schema import FINISH

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is Python 3.11+

__all__ = [
    "Algorithm",
    "AlgorithmBase",
    "Dims",
    "ToolInputs",
    "adam",
    "double_dqn_target",
    "greedy",
    "ScoredDecisions",
    "polyak",
    "score_decisions",
    "td_target",
]


@dataclass(frozen=True)
class Dims:
    """Input sizes of the networks."""

    state_dim: int
    """Size of a gathered state vector."""
    tool_dim: int
    """Size of a tool's text embedding."""
    n_tools: int
    """Tools known at training time (rows of the per-tool bias table)."""

    def scorer(self, network: NetworkConfig) -> ToolScorer:
        """Build a fresh :class:`ToolScorer` of these sizes."""
        return ToolScorer(self.state_dim, self.tool_dim, self.n_tools, network)

    def value(self, network: NetworkConfig) -> StateValue:
        """Build a fresh :class:`StateValue` of these sizes."""
        return StateValue(self.state_dim, network)


@dataclass
class ToolInputs:
    """The tool table every score is computed against: embeddings and bias ids."""

    embeddings: torch.Tensor
    ids: torch.Tensor | None
    calls: torch.Tensor | None = None
    """How many training decisions logged each tool-table row (row 0, FINISH: the answers); ``None`` at inference."""
    variants: torch.Tensor | None = None
    """``(V, N, E)``: each row's tool embedded by ``V`` other texts of itself
    (:func:`~evoharness_agent.learning.augment.tool_text_variants`); ``None``: no text augmentation."""
    variant_share: float = 0.0
    """Chance that a training pass sees a real tool by one of its ``variants`` instead of its full text."""

    def to(self, device: torch.device | str) -> ToolInputs:
        """Return the table on ``device``."""
        def moved(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor.to(device)

        return ToolInputs(self.embeddings.to(device), moved(self.ids), moved(self.calls), moved(self.variants),
                          self.variant_share)

    def shown_in_training(self) -> torch.Tensor:
        """Return the embeddings a training pass scores against: some real tools' rows swapped for a variant.

        Each real tool's row is, with chance ``variant_share``, one of its ``variants`` instead
        (FINISH, row 0, is always itself). A tool known by one exact text lets the scorer learn it
        by heart; a user's tools are written in other words (a bare name, one terse sentence, a
        description with no name).
        """
        if self.variants is None or self.variant_share <= 0.0:
            return self.embeddings
        n = self.embeddings.shape[0]
        device = self.embeddings.device
        pick = torch.randint(0, self.variants.shape[0], (n,), device=device)
        shown = torch.rand(n, device=device) < self.variant_share
        shown[0] = False
        variant_rows = self.variants[pick, torch.arange(n, device=device)].to(self.embeddings.dtype)
        return torch.where(shown[:, None], variant_rows, self.embeddings)


def adam(modules: list[nn.Module], lr: float, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """One Adam over all ``modules``, fused (a single kernel per step) where supported."""
    params = [p for module in modules for p in module.parameters()]
    try:
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, foreach=True)


@torch.no_grad()
def polyak(target: nn.Module, source: nn.Module, tau: float) -> None:
    """Move ``target`` towards ``source`` by ``tau`` with one foreach op."""
    torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)


def td_target(rewards: torch.Tensor, dones: torch.Tensor, next_values: torch.Tensor,
              gamma: float) -> torch.Tensor:
    """Return the one-step target ``r + gamma * (1 - done) * V(s')``."""
    return rewards + gamma * (1.0 - dones) * next_values.float()


def greedy(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Return the best available action of each row."""
    return masked_scores(scores, mask).argmax(dim=1)


def double_dqn_target(online_next: torch.Tensor, target_next: torch.Tensor, next_allowed: torch.Tensor,
                      rewards: torch.Tensor, dones: torch.Tensor, gamma: float) -> torch.Tensor:
    """Return ``r + gamma * Q_target(s', argmax_{a allowed} Q(s', a))``: the online net picks, the target values."""
    next_actions = greedy(online_next, next_allowed)
    return td_target(rewards, dones, target_next.gather(1, next_actions[:, None]).squeeze(1), gamma)


@runtime_checkable
class Algorithm(Protocol):
    """What the trainer, the checkpoints and the policy use of an algorithm."""

    name: ClassVar[str]
    modules: dict[str, nn.Module]
    tools: ToolInputs

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The one optimiser over the trained modules (data-parallel runs hook their gradient all-reduce on it)."""
        ...

    @property
    def acting(self) -> tuple[str, ...]:
        """Names of the modules a policy needs at inference (read-only: classes set a fixed-length tuple)."""
        ...

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """Take one gradient step on ``batch``; return scalar logs."""
        ...

    def scores(self, states: torch.Tensor, pairs: torch.Tensor | None = None,
               candidates: torch.Tensor | None = None) -> torch.Tensor:
        """Return the ``(B, N)`` scores the algorithm acts on (higher is better); ``(B, K)`` for ``candidates``."""
        ...

    def set_training(self, training: bool) -> None:
        """Switch the trained modules between train and eval mode."""
        ...

    def compile_training(self) -> None:
        """Compile the scorers' passes in training (``torch.compile``); acting and evaluation stay eager."""
        ...

    def acting_modules(self) -> dict[str, nn.Module]:
        """Return the modules a policy needs at inference."""
        ...

    def to(self, device: torch.device | str) -> Self:
        """Move every module and the tool table to ``device``."""
        ...

    def state_dict(self) -> dict[str, dict]:
        """Return module and optimiser state for a checkpoint."""
        ...

    def load_state_dict(self, state: dict[str, dict]) -> None:
        """Restore what :meth:`state_dict` returned."""
        ...


class AlgorithmBase:
    """Shared plumbing of the algorithms: named modules, one optimiser, checkpoint state."""

    name: ClassVar[str] = "base"
    acting: ClassVar[tuple[str, ...]] = ()
    """Names of the modules a policy needs at inference."""

    def __init__(self, tools: ToolInputs) -> None:
        """Remember the tool table; subclasses add modules, then call :meth:`_finish_init`."""
        self.tools = tools
        self.modules: dict[str, nn.Module] = {}
        self.trainable: tuple[str, ...] = ()
        self._adam_settings = (0.0, 0.0)
        self._optimizer: torch.optim.Optimizer | None = None
        self._compiled: dict[str, Callable[..., torch.Tensor]] = {}
        self._training = False

    def _finish_init(self, trainable: list[str], lr: float, weight_decay: float = 0.0) -> None:
        """Name the ``trainable`` modules (their optimiser is made when first used) and enter training mode."""
        self.trainable = tuple(trainable)
        self._adam_settings = (lr, weight_decay)
        self.set_training(True)

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The one Adam over the trainable modules, made on first use (``None`` when nothing is trainable).

        A policy that only acts never uses it: making the first optimiser of a process imports
        ``torch.optim``'s compiler machinery, about 2 s of every ``ToolPolicy.load``.
        """
        if self._optimizer is None and self.trainable:
            self._optimizer = adam([self.modules[n] for n in self.trainable], *self._adam_settings)
        return self._optimizer

    def set_training(self, training: bool) -> None:
        """Put trained modules in train or eval mode; target copies always stay in eval mode.

        A target network is a slow average used to compute TD targets: dropout noise in it
        would only add variance to the targets (and to IQL's advantages).
        """
        for name, module in self.modules.items():
            module.train(training and name in self.trainable)
        self._training = training

    def compile_training(self) -> None:
        """Compile the scorers' passes in training with ``torch.compile`` (inductor); acting and evaluation stay eager.

        A loss's or target's pass over a batch's candidates is a few products among dozens of
        element-wise steps (context features, pair terms, casts), each a kernel and a trip through
        memory: fused, a CQL step at batch 131,072 on an H200 took 21 ms against 39 eager
        (``benchmarks/gpu.py``). The wrappers run only in training mode (:meth:`set_training`) and
        not for acting scores; they share the modules' parameters, so checkpoints and policies hold
        the plain modules. Compiling takes tens of seconds, and on 2 CPU cores it gained nothing.
        """
        self._compiled = {name: torch.compile(module) for name, module in self.modules.items()
                          if isinstance(module, ToolScorer)}

    def step(self, loss: torch.Tensor) -> None:
        """Apply one gradient step."""
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def score(self, module: str, states: torch.Tensor, pairs: torch.Tensor | None = None,
              candidates: torch.Tensor | None = None, *, acting: bool = False) -> torch.Tensor:
        """Score tools of the table with one scorer: all of them, or each state's ``(B, K)`` candidate rows.

        ``acting``: the scores the algorithm acts on (:meth:`ToolScorer.forward`), not a loss's.
        """
        scorer: Callable[..., torch.Tensor] = self.modules[module]
        if self._training and not acting:
            scorer = self._compiled.get(module, scorer)
        embeddings = self.tools.shown_in_training() if self._training else self.tools.embeddings
        return scorer(states, embeddings, self.tools.ids, pairs, candidates, acting=acting).float()

    def score_states(self, module: str, batch: Batch) -> torch.Tensor:
        """Score the candidates of a batch's states (its columns) with one scorer."""
        return self.score(module, batch.states, batch.pairs, batch.candidates)

    def score_next_states(self, module: str, batch: Batch) -> torch.Tensor:
        """Score the candidates of a batch's next states (its next columns) with one scorer."""
        return self.score(module, batch.next_states, batch.next_pairs, batch.next_candidates)

    def acting_modules(self) -> dict[str, nn.Module]:
        """Return the modules a policy needs at inference."""
        return {name: self.modules[name] for name in self.acting}

    def to(self, device: torch.device | str) -> Self:
        """Move every module (and the tool table) to ``device``."""
        for module in self.modules.values():
            module.to(device)
        self.tools = self.tools.to(device)
        return self

    def state_dict(self) -> dict[str, dict]:
        """Return module and optimiser state for a checkpoint."""
        state = {name: module.state_dict() for name, module in self.modules.items()}
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, dict]) -> None:
        """Restore what :meth:`state_dict` returned."""
        for name, module in self.modules.items():
            module.load_state_dict(state[name])
        if "optimizer" in state and self.optimizer is not None:  # in this order: a policy's state has none
            self.optimizer.load_state_dict(state["optimizer"])


@dataclass
class ScoredDecisions:
    """The acting scores of logged decisions over each one's available tools (:func:`score_decisions`)."""

    scores: torch.Tensor
    """``(n, K)`` scores, unavailable columns set to a large negative number."""
    masks: torch.Tensor
    """``(n, K)`` which columns are available tools."""
    actions: torch.Tensor
    """``(n,)`` the column of the logged action."""
    is_finish: torch.Tensor
    """``(n, K)`` which column is FINISH."""

    @classmethod
    def concat(cls, parts: Sequence[ScoredDecisions]) -> ScoredDecisions:
        """Return the decisions of ``parts`` (at least one) in order, in rows as wide as the widest part's."""
        width = max(part.scores.shape[1] for part in parts)

        def padded(tensor: torch.Tensor, fill: float | bool) -> torch.Tensor:
            extra = torch.full((tensor.shape[0], width - tensor.shape[1]), fill, dtype=tensor.dtype,
                               device=tensor.device)
            return torch.cat([tensor, extra], dim=1)

        return cls(scores=torch.cat([padded(p.scores, NEG_INF) for p in parts]),
                   masks=torch.cat([padded(p.masks, False) for p in parts]),
                   actions=torch.cat([p.actions for p in parts]),
                   is_finish=torch.cat([padded(p.is_finish, False) for p in parts]))


@torch.no_grad()
def score_decisions(algorithm: Algorithm, dataset: TransitionDataset, index: torch.Tensor,
                    chunk_size: int = 4096) -> ScoredDecisions:
    """Score the transitions at ``index`` as the algorithm acts, each over its own candidates, ``chunk_size`` at a time.

    Only the tools available at a decision are scored (tens, where the table has thousands), and
    the states are gathered a chunk at a time, so validating a large split needs no
    decisions x tools tensors. Results are on the CPU.
    """
    device = dataset.tensors["actions"].device
    offsets = dataset.tensors["pair_offsets"].cpu()
    width = max(int((offsets[1:] - offsets[:-1])[index.cpu()].max()) if index.numel() else 0, 1)
    n = index.numel()
    # Chunks differ in their widest candidate list: each fills the left of these full-width rows.
    out = ScoredDecisions(scores=torch.full((n, width), NEG_INF), masks=torch.zeros((n, width), dtype=torch.bool),
                          actions=torch.zeros(n, dtype=torch.long), is_finish=torch.zeros((n, width), dtype=torch.bool))
    finish = dataset.tools.index[FINISH]
    for start in range(0, n, chunk_size):
        batch = dataset.batch(index[start : start + chunk_size].to(device), candidates_only=True)
        assert batch.candidates is not None  # candidates_only batches always carry them
        rows, k = slice(start, start + batch.masks.shape[0]), batch.masks.shape[1]
        scores = algorithm.scores(batch.states, batch.pairs, batch.candidates).float()
        out.scores[rows, :k] = masked_scores(scores, batch.masks).cpu()
        out.masks[rows, :k] = batch.masks.cpu()
        out.actions[rows] = batch.actions.cpu()
        out.is_finish[rows, :k] = ((batch.candidates == finish) & batch.masks).cpu()  # padding points at FINISH's row
    return out
