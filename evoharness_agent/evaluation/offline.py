"""Offline evaluation: next-tool prediction with gold history, policy vs baselines, one run.

At every logged tool call each chooser sees the gold history so far and ranks the tools
available there (FINISH excluded: that decision is scored separately as FINISH accuracy).
Ties are ranked pessimistically: the gold tool's rank is one plus the number of *other*
candidates scoring at least as high, so a chooser that scores everything equal gets no credit.

Baselines, fit on ``baseline_episodes`` (by default the policy's training logs):

* ``random``: the expected metrics of a uniformly random order (exact, not sampled);
* ``most_frequent``: how often each tool was called;
* ``bigram``: how often a tool followed the previous tool call (ties broken by frequency);
* ``embedding_similarity``: cosine of the current user message and the tool's name+description.

Calibration is measured on live decisions: at every logged decision (tool calls and
replies), the policy's top choice among every available action, FINISH included, its
probability (with the policy's temperature, as :class:`~evoharness_agent.policy.ToolScore`
has it) and whether it is the logged action.

The counts live in :mod:`~evoharness_agent.evaluation.baselines`, the renderings (table, plot) in
:mod:`~evoharness_agent.evaluation.reports`.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.encoding.state import Decision, decisions
from evoharness_agent.evaluation.baselines import CountBaselines
from evoharness_agent.learning.calibration import CalibrationReport, calibration_report, softmax_with_temperature
from evoharness_agent.policy import ToolPolicy
from evoharness_agent.schema import FINISH, Episode

__all__ = ["BASELINES", "OfflineReport", "evaluate_offline", "pessimistic_rank"]

BASELINES = ("random", "most_frequent", "bigram", "embedding_similarity")


def pessimistic_rank(scores: np.ndarray, candidates: np.ndarray, gold: int) -> int:
    """Rank of ``gold`` among ``candidates`` (bool mask), ties counted against it."""
    if not candidates[gold]:
        return 10**9  # the gold tool was not offered: no chooser can find it
    others = candidates.copy()
    others[gold] = False
    return 1 + int(np.sum(scores[others] >= scores[gold]))


@dataclass
class _Tally:
    """Running top-1 / top-3 / MRR sums for one chooser."""

    top1: float = 0.0
    top3: float = 0.0
    mrr: float = 0.0
    n: int = 0

    def add(self, rank: float) -> None:
        """Count one decision whose gold tool got ``rank``."""
        self.top1 += rank <= 1
        self.top3 += rank <= 3
        self.mrr += 1.0 / rank
        self.n += 1

    def add_expected(self, n_candidates: int) -> None:
        """Count the expectation of a uniformly random ranking over ``n_candidates``."""
        self.top1 += 1.0 / n_candidates
        self.top3 += min(3, n_candidates) / n_candidates
        self.mrr += sum(1.0 / k for k in range(1, n_candidates + 1)) / n_candidates
        self.n += 1

    def result(self) -> dict[str, float]:
        """Return the averaged metrics."""
        n = max(self.n, 1)
        return {"top1": self.top1 / n, "top3": self.top3 / n, "mrr": self.mrr / n}


@dataclass
class OfflineReport:
    """What :func:`evaluate_offline` measured."""

    n_decisions: int
    metrics: dict[str, dict[str, float]]
    finish_accuracy: float
    n_finish_decisions: int
    calibration: CalibrationReport
    """The policy's top choice at every decision (FINISH among the candidates), as live."""
    confusion: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Return the JSON document written by ``evaluate --json``."""
        return {"n_decisions": self.n_decisions, "metrics": self.metrics,
                "finish_accuracy": self.finish_accuracy, "n_finish_decisions": self.n_finish_decisions,
                "confusion": self.confusion, "calibration": self.calibration.to_json()}

    def write_json(self, path: str | Path) -> None:
        """Write :meth:`to_json` to ``path``."""
        Path(path).write_text(json.dumps(self.to_json(), indent=2))


def evaluate_offline(
    policy: ToolPolicy,
    episodes: Sequence[Episode],
    baseline_episodes: Sequence[Episode],
    *,
    encoder: StateEncoder | None = None,
) -> OfflineReport:
    """Score the policy and the baselines on every logged decision of ``episodes``.

    Raises:
        ValueError: ``episodes`` hold no decision (no tool call and no reply): there is
            nothing to measure, and an all-zero report would pass for a result.

    """
    encoder = encoder or policy.encoder
    counts = CountBaselines(baseline_episodes)
    tallies = {name: _Tally() for name in ("policy", *BASELINES)}
    confusion: dict[str, Counter[str]] = defaultdict(Counter)
    finish_hits = finish_n = 0
    confidence: list[float] = []
    correct: list[bool] = []
    for episode in episodes:
        points: list[Decision] = decisions(episode, policy.history_window)
        if not points:
            continue
        prefixes = [i for i, step in enumerate(episode.steps) if step.is_decision]
        names, policy_scores = policy.score_matrix(
            [(episode.task, episode.steps[:i]) for i in prefixes], episode.tools,
            available=[point.available for point in points])
        tool_vectors = encoder.embed([spec.text() for spec in episode.tools])
        request_vectors = encoder.embed([p.request for p in points])
        finish = names.index(FINISH)
        for row, point in enumerate(points):
            available = np.array([n in point.available for n in names])
            probabilities = softmax_with_temperature(np.where(available, policy_scores[row], -np.inf),
                                                     policy.temperature)
            top = int(np.argmax(probabilities))
            finish_n += 1
            finish_hits += (names[top] == FINISH) == (point.action == FINISH)
            if point.action in names:  # a logged tool outside the tool list cannot be chosen
                confidence.append(float(probabilities[top]))
                correct.append(names[top] == point.action)
            if point.action == FINISH:
                continue
            candidates = available.copy()
            candidates[finish] = False
            gold = names.index(point.action) if point.action in names else None
            if gold is None:
                continue
            ranks = {"policy": pessimistic_rank(policy_scores[row], candidates, gold)}
            for baseline, scores in counts.scores(names, point.previous_tool).items():
                ranks[baseline] = pessimistic_rank(scores, candidates, gold)
            similarity = np.append(tool_vectors @ request_vectors[row], -np.inf)  # FINISH is last
            ranks["embedding_similarity"] = pessimistic_rank(similarity, candidates, gold)
            for name, rank in ranks.items():
                tallies[name].add(rank)
            tallies["random"].add_expected(int(candidates.sum()))
            best = np.where(candidates, policy_scores[row], -np.inf)
            confusion[point.action][names[int(np.argmax(best))]] += 1
    if not finish_n:
        raise ValueError(f"nothing to evaluate: the {len(episodes)} episodes given hold no logged "
                         "decision (tool call or reply)")
    return OfflineReport(
        n_decisions=tallies["policy"].n,
        metrics={name: tally.result() for name, tally in tallies.items()},
        finish_accuracy=finish_hits / max(finish_n, 1),
        n_finish_decisions=finish_n,
        confusion={gold: dict(pred.most_common()) for gold, pred in sorted(confusion.items())},
        calibration=calibration_report(confidence, correct),
    )
