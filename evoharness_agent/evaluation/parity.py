"""Backend parity: whether a policy decides the same on another inference backend (ONNX, INT8).

At every logged decision of held-out episodes both policies rank the available actions,
FINISH included, with the gold history; parity is the share of decisions whose top choice is
the same. The texts those decisions embed (tasks, steps, tool descriptions) are compared too,
as the cosine of the two backends' embeddings: INT8 moves embeddings, and a policy trained on
fp32 embeddings but served on moved ones is a skew this measures.

:func:`backend_calibration` removes the part of that skew that touches the reported
probabilities: it fits the temperature again on the backend's own scores of some episodes
(the policy's validation split), so a threshold keeps its meaning on the backend that serves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from evoharness_agent.encoding.state import decisions, step_text
from evoharness_agent.learning.calibration import calibration_entry
from evoharness_agent.learning.networks import NEG_INF
from evoharness_agent.policy import ToolPolicy
from evoharness_agent.schema import FINISH, Episode

__all__ = ["BackendParity", "backend_calibration", "backend_parity"]


@dataclass(frozen=True)
class BackendParity:
    """How far a candidate backend's decisions and embeddings are from the reference's."""

    n_decisions: int
    top1_agreement: float
    """Share of decisions where both pick the same action (FINISH included)."""
    reference_accuracy: float
    """Share of decisions where the reference picks the logged action."""
    candidate_accuracy: float
    """Share of decisions where the candidate picks the logged action."""
    n_texts: int
    embedding_cosine_mean: float
    embedding_cosine_min: float

    def as_dict(self) -> dict[str, float]:
        """Return the figures as a JSON-ready dict."""
        return asdict(self)


def _live_scores(policy: ToolPolicy, episode: Episode) -> tuple[list[str], np.ndarray, np.ndarray, list[str]]:
    """Return action names, ``(n, N)`` scores and availability at each logged decision, and the logged actions."""
    points = decisions(episode, policy.history_window)
    if not points:  # nothing to score (a log of user messages only)
        return [], np.zeros((0, 0), dtype=np.float32), np.zeros((0, 0), dtype=bool), []
    prefixes = [i for i, step in enumerate(episode.steps) if step.is_decision]
    names, scores = policy.score_matrix([(episode.task, episode.steps[:i]) for i in prefixes], episode.tools,
                                        available=[point.available for point in points])
    available = np.array([[name in point.available or name == FINISH for name in names] for point in points],
                         dtype=bool).reshape(len(points), len(names))
    return names, scores, available, [point.action for point in points]


def _top_choices(policy: ToolPolicy, episode: Episode) -> tuple[list[str], list[str]]:
    """Return the policy's top action at each logged decision of ``episode``, and the logged actions."""
    names, scores, available, actions = _live_scores(policy, episode)
    tops = [names[int(np.argmax(np.where(mask, row, -np.inf)))] for row, mask in zip(scores, available, strict=True)]
    return tops, actions


def _texts(episode: Episode) -> list[str]:
    """Return the texts a policy embeds for ``episode``: task, steps and tool descriptions."""
    steps = [step.content if step.kind == "user" else step_text(step) for step in episode.steps]
    return [episode.task, *steps, *(spec.text() for spec in episode.tools)]


def backend_parity(reference: ToolPolicy, candidate: ToolPolicy, episodes: Sequence[Episode]) -> BackendParity:
    """Compare ``candidate``'s decisions and embeddings with ``reference``'s on ``episodes``.

    Raises:
        ValueError: the episodes have no decision to compare.

    """
    same = right_reference = right_candidate = n = 0
    texts: dict[str, None] = {}
    for episode in episodes:
        reference_tops, actions = _top_choices(reference, episode)
        candidate_tops, _ = _top_choices(candidate, episode)
        n += len(actions)
        same += sum(a == b for a, b in zip(reference_tops, candidate_tops, strict=True))
        right_reference += sum(a == b for a, b in zip(reference_tops, actions, strict=True))
        right_candidate += sum(a == b for a, b in zip(candidate_tops, actions, strict=True))
        texts.update(dict.fromkeys(_texts(episode)))
    if n == 0:
        raise ValueError("no logged decision in the episodes: parity needs tool calls or replies to compare")
    unique = list(texts)
    cosine = np.sum(reference.encoder.embed(unique) * candidate.encoder.embed(unique), axis=1)
    return BackendParity(n, same / n, right_reference / n, right_candidate / n, len(unique),
                         float(cosine.mean()), float(cosine.min()))


def backend_calibration(policy: ToolPolicy, episodes: Sequence[Episode]) -> dict[str, Any]:
    """Fit the temperature on ``policy``'s own scores of every logged decision; return the policy's "calibration" entry.

    As training's fit (:func:`~evoharness_agent.learning.calibration.calibration_entry`): every
    decision is live, over the available actions and FINISH; ``ece_before`` is the ECE with the
    temperature the policy had, ``ece_after`` and ``coverage_at_95`` those with the new one.

    Raises:
        ValueError: the episodes have no decision to fit on.

    """
    rows: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    actions: list[int] = []
    width = 0
    for episode in episodes:
        names, scores, available, logged = _live_scores(policy, episode)
        for row, mask, action in zip(scores, available, logged, strict=True):
            if action in names:  # a logged tool missing from the episode's tool list is not scored
                rows.append(row)
                masks.append(mask)
                actions.append(names.index(action))
                width = max(width, len(names))
    if not actions:
        raise ValueError("no logged decision in the episodes: calibration needs tool calls or replies")
    score_tensor = torch.full((len(rows), width), NEG_INF)
    mask_tensor = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, (row, mask) in enumerate(zip(rows, masks, strict=True)):
        score_tensor[i, : len(row)] = torch.from_numpy(np.asarray(row, dtype=np.float32))
        mask_tensor[i, : len(mask)] = torch.from_numpy(mask)
    return calibration_entry(score_tensor, torch.tensor(actions), mask_tensor, before=policy.temperature)
