"""Confidence that means what it says: temperature scaling, and the measures of calibration.

A policy's scores (Q-values, logits) rank tools well but their softmax is no probability: CQL's
Q-values are on the scale of the rewards (~10), so the top tool often gets p > 0.9 while being
right half the time. When training ends, one temperature ``T`` is fit on the validation
episodes (never trained on) by minimising the negative log-likelihood of the logged action
under ``softmax(scores / T)`` over the available actions (FINISH included, as live). The
policy reports those probabilities, so a threshold reads as an accuracy: of the choices made
with probability about 0.9, about 90% are right.

* :func:`expected_calibration_error`: the mean gap between confidence and accuracy, over
  equal-width confidence bins, weighted by how many decisions fall in each;
* :func:`coverage_at_accuracy`: the largest share of decisions, most confident first, whose
  accuracy is still at least the target (0.95: the share the policy can take at <= 5% error);
* :func:`calibrated_ece`: the ECE a perfectly calibrated policy would show on the same
  confidences: on a hundred decisions binned 15 ways it is about 0.1, so an ECE is read against it.

:func:`fit_calibration` is what training calls: it fits ``T`` on the validation transitions (and,
with ``training.calibration_folds``, every training decision scored out of fold) and returns the
``"calibration"`` entry of the policy metadata, which ``ToolPolicy`` reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from evoharness_agent.encoding.transitions import TransitionDataset
from evoharness_agent.learning.algorithms import Algorithm
from evoharness_agent.learning.algorithms.base import ScoredDecisions, score_decisions
from evoharness_agent.learning.networks import masked_scores

__all__ = [
    "FEW_DECISIONS",
    "CalibrationReport",
    "accuracy_coverage_curve",
    "calibrated_ece",
    "calibration_entry",
    "calibration_report",
    "coverage_at_accuracy",
    "cross_fitted",
    "expected_calibration_error",
    "fit_calibration",
    "fit_temperature",
    "reliability_bins",
    "softmax_with_temperature",
]

N_BINS = 15
CALIBRATED_DRAWS = 1000
"""How many outcomes :func:`calibrated_ece` draws: its mean moves by about 0.001 between seeds."""
FEW_DECISIONS = 200
"""Below this many validation decisions ``train`` cross-fits the temperature (``training.calibration_folds:
auto``): fit on fewer it is mostly noise (tau2-bench retail, 10 training tasks: 2 validation decisions,
ECE 0.45 on the held-out tasks)."""
MIN_TEMPERATURE, MAX_TEMPERATURE = 0.05, 100.0


def fit_temperature(scores: torch.Tensor, actions: torch.Tensor, mask: torch.Tensor) -> float:
    """Return the ``T`` minimising the NLL of ``actions`` under ``softmax(scores / T)`` over ``mask``.

    The logged action's target is ``(n + 1) / (n + 2)`` for ``n`` decisions with a choice, not 1, and
    the rest goes to the other available actions together (Platt's correction of the targets, 1999):
    on a few decisions that are all right, a plain NLL drives ``T`` to its floor and every
    probability to 1.000 (12 made-up clinic conversations, fine-tuned from the default: 44
    decisions, T = 0.045), while 44 right of 44 is no proof of a 0% error rate. On hundreds of
    decisions it changes ``T`` by a fraction of a percent.

    Args:
        scores: ``(n, N)`` raw scores of every action.
        actions: ``(n,)`` the logged actions' columns.
        mask: ``(n, N)`` the available actions (the logged one among them).

    """
    n = scores.shape[0]
    if n == 0:
        return 1.0
    scores = scores.detach().float().cpu()
    mask = mask.cpu()
    actions = actions.cpu()
    others = mask.clone()
    others[torch.arange(n), actions] = False
    choice = others.any(1)  # a lone available action keeps its target of 1, and is not counted in n
    spread = torch.where(choice, 1.0 / (int(choice.sum()) + 2), 0.0)

    # One parameter: a grid in log T, then a finer grid around the best point, is exact enough
    # and cannot diverge (LBFGS on a few hundred decisions can).
    def nll(log_t: float) -> float:
        log_p = torch.log_softmax((scores / float(np.exp(log_t))).masked_fill(~mask, -torch.inf), dim=-1)
        logged = log_p.gather(1, actions[:, None]).squeeze(1)
        # log(1 - p): -inf for a lone action, clamped so that its weight of 0 gives 0, not NaN.
        rest = torch.logsumexp(log_p.masked_fill(~others, -torch.inf), dim=1).clamp(min=-1e4)
        return float(-((1.0 - spread) * logged + spread * rest).mean())

    grid = np.linspace(np.log(MIN_TEMPERATURE), np.log(MAX_TEMPERATURE), 81)
    best = float(grid[int(np.argmin([nll(x) for x in grid]))])
    step = float(grid[1] - grid[0])
    fine = np.linspace(best - step, best + step, 41)
    return float(np.exp(fine[int(np.argmin([nll(x) for x in fine]))]))


def _bins(conf: np.ndarray, n_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Return the ``n_bins + 1`` equal-width edges over [0, 1] and each confidence's bin (upper edges inclusive)."""
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    return edges, np.clip(np.digitize(conf, edges[1:-1], right=True), 0, n_bins - 1)


def reliability_bins(confidence: Sequence[float], correct: Sequence[bool],
                     n_bins: int = N_BINS) -> list[dict[str, float]]:
    """Return per confidence bin: its range, the number of decisions, mean confidence and accuracy."""
    conf = np.asarray(confidence, dtype=np.float64)
    hits = np.asarray(correct, dtype=np.float64)
    edges, which = _bins(conf, n_bins)
    out = []
    for b in range(n_bins):
        inside = which == b
        n = int(inside.sum())
        out.append({"low": float(edges[b]), "high": float(edges[b + 1]), "n": n,
                    "confidence": float(conf[inside].mean()) if n else 0.0,
                    "accuracy": float(hits[inside].mean()) if n else 0.0})
    return out


def expected_calibration_error(confidence: Sequence[float], correct: Sequence[bool], n_bins: int = N_BINS) -> float:
    """Return ``sum_b (n_b / n) * |accuracy_b - confidence_b|`` over equal-width bins (0 when empty)."""
    total = len(confidence)
    if total == 0:
        return 0.0
    return float(sum(b["n"] / total * abs(b["accuracy"] - b["confidence"])
                     for b in reliability_bins(confidence, correct, n_bins)))


def calibrated_ece(confidence: Sequence[float], n_bins: int = N_BINS, draws: int = CALIBRATED_DRAWS,
                   seed: int = 0) -> tuple[float, float]:
    """Return the mean and 95th percentile of the ECE a perfectly calibrated policy shows with ``confidence``.

    Each draw makes every decision right with its own probability, as a calibrated policy's are,
    and measures the ECE of that outcome. With few decisions per bin the bins' accuracies scatter
    around their confidences by chance alone: a calibrated policy's ECE is about 0.1 on 100
    decisions and 0.04 on 1,000 (confidences spread as a policy's are). An ECE below the
    percentile is no evidence of miscalibration (a one-sided test at 5%).
    """
    conf = np.asarray(confidence, dtype=np.float64)
    if conf.size == 0:
        return 0.0, 0.0
    _, which = _bins(conf, n_bins)  # binned as expected_calibration_error bins them
    counts = np.bincount(which, minlength=n_bins)
    mean_confidence = np.bincount(which, weights=conf, minlength=n_bins) / np.maximum(counts, 1)
    one_hot = np.eye(n_bins)[which]  # (n, n_bins)
    rng = np.random.default_rng(seed)
    per_chunk = max(1, 10_000_000 // conf.size)  # outcomes drawn at once: ~10 M, whatever the decisions
    right = np.concatenate([(rng.random((min(per_chunk, draws - start), conf.size)) < conf) @ one_hot
                            for start in range(0, draws, per_chunk)])  # (draws, n_bins): right per bin
    ece = (np.abs(right - counts * mean_confidence) / conf.size).sum(axis=1)
    return float(ece.mean()), float(np.quantile(ece, 0.95))


def accuracy_coverage_curve(confidence: Sequence[float], correct: Sequence[bool]) -> tuple[np.ndarray, np.ndarray]:
    """Return (coverage, accuracy) when the policy takes only its most confident decisions.

    Point ``k`` keeps the ``k + 1`` most confident decisions. Decisions of equal confidence
    are kept or dropped together (a threshold cannot split them), so a point stands for the
    last decision of each group of ties.
    """
    conf = np.asarray(confidence, dtype=np.float64)
    hits = np.asarray(correct, dtype=np.float64)
    if conf.size == 0:
        return np.zeros(0), np.zeros(0)
    order = np.argsort(-conf, kind="stable")
    conf, hits = conf[order], hits[order]
    accuracy = np.cumsum(hits) / np.arange(1, conf.size + 1)
    last_of_ties = np.append(conf[1:] != conf[:-1], True)
    coverage = np.arange(1, conf.size + 1) / conf.size
    return coverage[last_of_ties], accuracy[last_of_ties]


def coverage_at_accuracy(confidence: Sequence[float], correct: Sequence[bool], target: float = 0.95) -> float:
    """Return the largest share of decisions, most confident first, whose accuracy is at least ``target``."""
    coverage, accuracy = accuracy_coverage_curve(confidence, correct)
    reach = coverage[accuracy >= target]
    return float(reach.max()) if reach.size else 0.0


@dataclass
class CalibrationReport:
    """How well the top choice's probability matches how often it is right."""

    n_decisions: int
    accuracy: float
    """Top-1 accuracy of these decisions (FINISH among the candidates, as live)."""
    mean_confidence: float
    ece: float
    ece_if_calibrated: float
    """The ECE a perfectly calibrated policy would show on these confidences, on average (:func:`calibrated_ece`)."""
    ece_if_calibrated_95: float
    """... and at its 95th percentile: an ECE above it is evidence of miscalibration."""
    coverage_at_95: float
    """Largest share of decisions (most confident first) that is still >= 95% right."""
    bins: list[dict[str, float]]
    curve: list[dict[str, float]]
    """Points of :func:`accuracy_coverage_curve` ({"coverage", "accuracy"}), at most ~100 of them."""

    def to_json(self) -> dict[str, object]:
        """Return the report as JSON-ready data."""
        return asdict(self)


def calibration_report(confidence: Sequence[float], correct: Sequence[bool]) -> CalibrationReport:
    """Measure the calibration of top choices made with ``confidence`` and right when ``correct``."""
    n = len(confidence)
    if_calibrated, if_calibrated_95 = calibrated_ece(confidence)
    return CalibrationReport(
        n_decisions=n,
        accuracy=float(np.mean(correct)) if n else 0.0,
        mean_confidence=float(np.mean(confidence)) if n else 0.0,
        ece=expected_calibration_error(confidence, correct),
        ece_if_calibrated=if_calibrated,
        ece_if_calibrated_95=if_calibrated_95,
        coverage_at_95=coverage_at_accuracy(confidence, correct, 0.95),
        bins=reliability_bins(confidence, correct),
        curve=[{"coverage": float(c), "accuracy": float(a)} for c, a in zip(*_thin(confidence, correct), strict=True)],
    )


def _thin(confidence: Sequence[float], correct: Sequence[bool], points: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """Return the accuracy-coverage curve, thinned to its first point at or past each of ``points`` coverages."""
    coverage, accuracy = accuracy_coverage_curve(confidence, correct)
    if coverage.size == 0:
        return coverage, accuracy
    keep = np.unique(np.searchsorted(coverage, np.linspace(0.0, 1.0, points + 1)[1:] - 1e-12))
    return coverage[keep], accuracy[keep]


def softmax_with_temperature(scores: np.ndarray, temperature: float) -> np.ndarray:
    """Return ``softmax(scores / temperature)`` along the last axis (``-inf`` scores get 0)."""
    scaled = np.asarray(scores, dtype=np.float64) / temperature
    weights = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True)


@torch.no_grad()
def fit_calibration(algorithm: Algorithm, dataset: TransitionDataset, index: torch.Tensor,
                    out_of_fold: ScoredDecisions | None = None) -> dict[str, Any]:
    """Fit ``T`` on the transitions ``index`` (the validation split); return the policy's "calibration" metadata.

    Every transition is a live decision: the scores cover every available action, FINISH
    included. ``out_of_fold``: training decisions scored by models that did not train on their
    tasks (:mod:`~evoharness_agent.learning.cross_fit`), fit on with the validation split's.
    Leaves the algorithm in eval mode (dropout off), as a policy acts.
    """
    algorithm.set_training(False)
    validation = score_decisions(algorithm, dataset, index) if index.numel() else None
    if validation is None and out_of_fold is None:
        return {"temperature": 1.0, "n_decisions": 0, "accuracy": None, "ece_before": None, "ece_after": None,
                "coverage_at_95": None,
                "note": "no validation episodes (val_fraction 0): not calibrated, probabilities are softmax(scores)"}
    decided = ScoredDecisions.concat([part for part in (validation, out_of_fold) if part is not None])
    entry = calibration_entry(decided.scores, decided.actions, decided.masks)
    if out_of_fold is not None:
        entry["n_out_of_fold"] = len(out_of_fold.actions)  # of the n_decisions fit on
        if validation is not None:  # what the validation split alone would have fit, for comparison
            entry["temperature_validation"] = fit_temperature(validation.scores, validation.actions, validation.masks)
    return entry


def cross_fitted(calibration: Mapping[str, Any] | None) -> bool:
    """Return whether a policy's "calibration" metadata (or a training result) says ``T`` was cross-fitted too."""
    return bool((calibration or {}).get("n_out_of_fold"))


def calibration_entry(scores: torch.Tensor, actions: torch.Tensor, mask: torch.Tensor,
                      before: float = 1.0) -> dict[str, Any]:
    """Fit ``T`` on live decisions' ``(n, N)`` scores; return the "calibration" metadata of a policy.

    ``accuracy`` is the top choice's, ``ece_before`` the ECE of ``softmax(scores / before)``,
    ``ece_after`` and ``coverage_at_95`` those of ``softmax(scores / T)``, all on these decisions.
    """
    temperature = fit_temperature(scores, actions, mask)

    def top_choices(t: float) -> tuple[list[float], list[bool]]:
        confidence, choice = torch.softmax(masked_scores(scores / t, mask), dim=-1).max(1)
        return confidence.tolist(), (choice == actions).tolist()

    earlier, after = top_choices(before), top_choices(temperature)
    return {"temperature": temperature, "n_decisions": len(actions), "accuracy": float(np.mean(after[1])),
            "ece_before": expected_calibration_error(*earlier), "ece_after": expected_calibration_error(*after),
            "coverage_at_95": coverage_at_accuracy(*after, 0.95)}
