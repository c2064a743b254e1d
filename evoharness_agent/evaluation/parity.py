"""Backend parity: whether a policy decides the same on another inference backend (ONNX, INT8).

At every logged decision of held-out episodes both policies rank the available actions,
FINISH included, with the gold history; parity is the share of decisions whose top choice is
the same. The texts those decisions embed (tasks, steps, tool descriptions) are compared too,
as the cosine of the two backends' embeddings: INT8 moves embeddings, and a policy trained on
fp32 embeddings but served on moved ones is a skew this measures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from evoharness_agent.encoding.state import decisions, step_text
from evoharness_agent.policy import ToolPolicy
from evoharness_agent.schema import FINISH, Episode

__all__ = ["BackendParity", "backend_parity"]


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


def _top_choices(policy: ToolPolicy, episode: Episode) -> tuple[list[str], list[str]]:
    """Return the policy's top action at each logged decision of ``episode``, and the logged actions."""
    points = decisions(episode, policy.history_window)
    prefixes = [i for i, step in enumerate(episode.steps) if step.is_decision]
    names, scores = policy.score_matrix([(episode.task, episode.steps[:i]) for i in prefixes], episode.tools,
                                        available=[point.available for point in points])
    tops = []
    for row, point in zip(scores, points, strict=True):
        available = np.array([name in point.available or name == FINISH for name in names])
        tops.append(names[int(np.argmax(np.where(available, row, -np.inf)))])
    return tops, [point.action for point in points]


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
