"""Temperature scaling and the calibration measures, on data whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from evoharness_agent.learning.calibration import (
    accuracy_coverage_curve,
    calibration_report,
    coverage_at_accuracy,
    expected_calibration_error,
    fit_temperature,
)


def _labels(logits: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Actions drawn from softmax(logits): these logits are calibrated by construction."""
    return torch.multinomial(torch.softmax(logits, 1), 1, generator=torch.Generator().manual_seed(seed)).squeeze(1)


def test_fit_temperature_recovers_the_scale_of_overconfident_scores() -> None:
    logits = torch.randn(4000, 6, generator=torch.Generator().manual_seed(1)) * 1.5
    actions = _labels(logits)
    mask = torch.ones_like(logits, dtype=torch.bool)
    assert fit_temperature(5.0 * logits, actions, mask) == pytest.approx(5.0, rel=0.1)
    assert fit_temperature(0.5 * logits, actions, mask) == pytest.approx(0.5, rel=0.1)
    assert fit_temperature(logits[:0], actions[:0], mask[:0]) == 1.0


def test_fit_temperature_ignores_unavailable_actions() -> None:
    logits = torch.randn(2000, 4, generator=torch.Generator().manual_seed(2))
    actions = _labels(logits)
    # A huge score on a masked-out action must not change the fit.
    extra = torch.full((2000, 1), 50.0)
    mask = torch.cat([torch.ones_like(logits, dtype=torch.bool), torch.zeros((2000, 1), dtype=torch.bool)], 1)
    plain = fit_temperature(3.0 * logits, actions, torch.ones_like(logits, dtype=torch.bool))
    assert fit_temperature(torch.cat([3.0 * logits, extra], 1), actions, mask) == pytest.approx(plain, rel=1e-6)


def test_ece_is_small_when_calibrated_and_large_when_not() -> None:
    logits = torch.randn(5000, 5, generator=torch.Generator().manual_seed(3)) * 2
    actions = _labels(logits)
    for scale, low, high in ((1.0, 0.0, 0.03), (6.0, 0.2, 1.0)):
        p = torch.softmax(scale * logits, 1)
        conf, correct = p.max(1).values.tolist(), (p.argmax(1) == actions).tolist()
        assert low <= expected_calibration_error(conf, correct) <= high


def test_coverage_at_accuracy_takes_the_confident_head() -> None:
    # 60 decisions at 0.99 that are right, then 40 at 0.5 of which half are right.
    conf = [0.99] * 60 + [0.5] * 40
    correct = [True] * 60 + [True, False] * 20
    assert coverage_at_accuracy(conf, correct, 0.95) == pytest.approx(0.6)
    assert coverage_at_accuracy(conf, correct, 0.8) == pytest.approx(1.0)  # 80/100 right overall
    assert coverage_at_accuracy([0.9, 0.9], [False, False]) == 0.0
    coverage, accuracy = accuracy_coverage_curve(conf, correct)
    assert coverage.tolist() == [0.6, 1.0]  # ties are kept or dropped together
    assert accuracy.tolist() == pytest.approx([1.0, 0.8])


def test_report_counts_and_bins() -> None:
    report = calibration_report([0.95, 0.95, 0.15, 0.45], [True, False, False, True])
    assert report.n_decisions == 4 and report.accuracy == 0.5
    assert sum(b["n"] for b in report.bins) == 4
    top = next(b for b in report.bins if b["low"] < 0.95 <= b["high"])
    assert top["n"] == 2 and top["accuracy"] == 0.5
    assert report.ece == pytest.approx((2 * 0.45 + 0.15 + 0.55) / 4)
    assert np.isfinite(report.to_json()["ece"])  # type: ignore[arg-type]
