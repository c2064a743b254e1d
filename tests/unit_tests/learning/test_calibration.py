"""Temperature scaling and the calibration measures, on data whose answer is known."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.encoding.state import decisions
from evoharness_agent.evaluation.parity import backend_calibration
from evoharness_agent.learning.calibration import (
    accuracy_coverage_curve,
    calibrated_ece,
    calibration_report,
    coverage_at_accuracy,
    cross_fitted,
    expected_calibration_error,
    fit_temperature,
    softmax_with_temperature,
)
from evoharness_agent.learning.config import TrainConfig, load_config
from evoharness_agent.learning.trainer import split_episodes, train_on_episodes, validation_episodes
from evoharness_agent.policy import ToolPolicy
from tests.kit.synthetic_logs import synthetic_episodes


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


def test_a_few_decisions_all_right_do_not_make_the_policy_certain() -> None:
    # 44 decisions, the logged action always the top score: a plain NLL fit puts T on its floor.
    scores = torch.randn(44, 5, generator=torch.Generator().manual_seed(4))
    scores[:, 0] = scores.max(1).values + 0.5
    actions, mask = torch.zeros(44, dtype=torch.long), torch.ones_like(scores, dtype=torch.bool)
    temperature = fit_temperature(scores, actions, mask)
    logged = torch.softmax(scores / temperature, 1)[:, 0].mean().item()
    assert temperature > 0.1 and 0.95 < logged < 0.99  # the floor is 0.05; (n + 1) / (n + 2) = 0.978
    # A decision with one action available has nothing to spread its target over: it leaves T alone.
    alone = torch.zeros_like(mask)
    alone[:, 0] = True
    assert fit_temperature(torch.cat([scores, scores]), torch.cat([actions, actions]),
                           torch.cat([mask, alone])) == pytest.approx(temperature, rel=0.05)


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


def test_a_calibrated_policys_ece_is_the_noise_of_few_decisions() -> None:
    rng = np.random.default_rng(3)
    few, many = rng.beta(4, 2, size=100), rng.beta(4, 2, size=5000)
    # What an ECE of outcomes drawn at the stated confidences averages to, measured the slow way.
    drawn = [expected_calibration_error(few, rng.random(few.size) < few) for _ in range(400)]
    mean, high = calibrated_ece(few)
    assert mean == pytest.approx(float(np.mean(drawn)), abs=0.01)
    assert 0.07 < mean < high < 0.2  # a hundred decisions: a calibrated policy's ECE is far above 0.05
    assert calibrated_ece(many)[0] < 0.03 and calibrated_ece(few) == (mean, high)  # seeded
    assert calibrated_ece([]) == (0.0, 0.0) and calibrated_ece([1.0, 1.0, 0.0]) == (0.0, 0.0)  # certain outcomes
    report = calibration_report(list(few), list(rng.random(few.size) < few))
    assert (report.ece_if_calibrated, report.ece_if_calibrated_95) == (mean, high)


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


def test_softmax_with_temperature() -> None:
    scores = np.array([[2.0, 0.0, -np.inf], [1.0, 1.0, 1.0]])
    p = softmax_with_temperature(scores, 2.0)
    np.testing.assert_allclose(p[0], [np.e / (np.e + 1), 1 / (np.e + 1), 0.0])
    np.testing.assert_allclose(p[1], [1 / 3] * 3)


def test_cross_fitted_reads_whether_out_of_fold_decisions_were_fit_on() -> None:
    assert cross_fitted({"temperature": 0.9, "n_decisions": 1200, "n_out_of_fold": 1000})
    assert not cross_fitted({"temperature": 0.9, "n_decisions": 200})
    assert not cross_fitted({"n_out_of_fold": 0})
    assert not cross_fitted(None)


# --------------------------------------------------------------------------- training writes T, the policy uses it


def _config(val_fraction: float, folds: int | str = 0) -> TrainConfig:
    """A tiny CQL run on the CPU; the temperature fit on the validation split alone unless ``folds``."""
    return load_config(None, {
        "training": {"steps": 40, "batch_size": 16, "device": "cpu", "threads": 1, "checkpoint_every": 40,
                     "eval_every": 40, "seed": 3, "calibration_folds": folds},
        "logging": {"tensorboard": False, "log_every": 20},
        "algorithm": {"name": "cql", "params": {}},
        "model": {"hidden": 16, "history_window": 2},
        "data": {"val_fraction": val_fraction},
    })


EPISODES = synthetic_episodes(12)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory, encoder: StateEncoder) -> ToolPolicy:
    out = tmp_path_factory.mktemp("calibrated")
    train_on_episodes(EPISODES, _config(0.25), out, encoder=encoder, show_progress=False)
    return ToolPolicy.load(out, encoder=encoder, device="cpu")


def _val_decisions(policy: ToolPolicy) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(scores, logged actions, masks) of the validation decisions, scored as a live policy scores them."""
    _, val_ids = split_episodes(EPISODES, 0.25, 3)
    scores, actions, masks = [], [], []
    for episode in (EPISODES[i] for i in val_ids):
        points = decisions(episode, policy.history_window)
        prefixes = [i for i, step in enumerate(episode.steps) if step.is_decision]
        names, matrix = policy.score_matrix([(episode.task, episode.steps[:i]) for i in prefixes], episode.tools)
        scores.append(torch.from_numpy(matrix))
        actions += [names.index(point.action) for point in points]
        masks += [[name in point.available for name in names] for point in points]
    return torch.cat(scores), torch.tensor(actions), torch.tensor(masks)


def test_training_writes_the_calibration_metadata(calibrated: ToolPolicy) -> None:
    meta = calibrated.meta["calibration"]
    assert set(meta) == {"temperature", "n_decisions", "accuracy", "ece_before", "ece_after", "coverage_at_95"}
    scores, actions, masks = _val_decisions(calibrated)
    # Three validation episodes: their decisions, as many as the training transitions of them.
    assert meta["n_decisions"] == len(actions) > 0
    # T fit on the training-time scores is the T a live policy's scores call for.
    assert meta["temperature"] == pytest.approx(fit_temperature(scores, actions, masks), rel=0.02)
    assert calibrated.temperature == meta["temperature"] != 1.0
    for key in ("accuracy", "ece_before", "ece_after", "coverage_at_95"):
        assert 0.0 <= meta[key] <= 1.0


def test_a_backend_refits_t_on_the_same_validation_split(calibrated: ToolPolicy) -> None:
    # What an INT8 export does, on the torch backend itself: the run's validation split, rebuilt
    # from its config, scored as the policy acts, gives back the temperature training fit.
    meta = calibrated.meta["calibration"]
    held_out = validation_episodes(EPISODES, TrainConfig.model_validate(calibrated.meta["config"]))
    refit = backend_calibration(calibrated, held_out)
    assert refit["n_decisions"] == meta["n_decisions"]
    assert refit["temperature"] == pytest.approx(meta["temperature"], rel=0.02)
    assert refit["ece_after"] == pytest.approx(meta["ece_after"], abs=0.02)
    assert refit["ece_before"] == pytest.approx(meta["ece_after"], abs=0.02)  # "before" is the policy's own T
    with pytest.raises(ValueError, match="no logged decision"):
        backend_calibration(calibrated, [EPISODES[0].model_copy(update={"steps": []})])


def test_no_validation_split_means_no_calibration_unless_cross_fitted(tmp_path: Path, encoder: StateEncoder) -> None:
    train_on_episodes(EPISODES, _config(0.0), tmp_path / "alone", encoder=encoder, show_progress=False)
    meta = json.loads((tmp_path / "alone" / "policy.json").read_text())["calibration"]
    assert meta["temperature"] == 1.0 and meta["n_decisions"] == 0
    assert "val_fraction 0" in meta["note"]
    assert ToolPolicy.load(tmp_path / "alone", encoder=encoder, device="cpu").temperature == 1.0
    # "auto" (the default) cross-fits an empty validation split: every decision is scored out of fold.
    train_on_episodes(EPISODES, _config(0.0, "auto"), tmp_path / "auto", encoder=encoder, show_progress=False)
    meta = json.loads((tmp_path / "auto" / "policy.json").read_text())["calibration"]
    assert meta["n_decisions"] == meta["n_out_of_fold"] == sum(step.is_decision for ep in EPISODES for step in ep.steps)
    assert meta["temperature"] != 1.0 and "note" not in meta


def test_policy_probabilities_are_the_softmax_of_scores_over_t(calibrated: ToolPolicy, encoder: StateEncoder) -> None:
    episode = EPISODES[0]
    history = episode.steps[:1]
    meta = {key: value for key, value in calibrated.meta.items() if key != "calibration"}
    old = ToolPolicy(calibrated.algorithm, meta, encoder)  # a policy.json written before calibration
    assert old.temperature == 1.0
    for policy in (calibrated, old, ToolPolicy(calibrated.algorithm, {**meta, "calibration": {"temperature": 3.0}},
                                               encoder)):
        ranked = policy.rank(episode.task, history, episode.tools, available={"calculator", "read_file"})
        scores = np.array([r.score for r in ranked])
        expected = np.exp((scores - scores.max()) / policy.temperature)
        np.testing.assert_allclose([r.probability for r in ranked], expected / expected.sum(), rtol=1e-6)
        # scores stay raw: the same whatever the temperature
        raw = {r.tool: r.score for r in old.rank(episode.task, history, episode.tools,
                                                 available={"calculator", "read_file"})}
        assert {r.tool: r.score for r in ranked} == pytest.approx(raw)
