"""Cross-fitted calibration: folds of whole tasks, out-of-fold scores, resumable folds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.learning import trainer
from evoharness_agent.learning.algorithms import make_algorithm
from evoharness_agent.learning.algorithms.base import ScoredDecisions
from evoharness_agent.learning.calibration import FEW_DECISIONS, fit_temperature
from evoharness_agent.learning.config import AUTO_FOLDS, TrainConfig, load_config
from evoharness_agent.learning.cross_fit import CROSS_FIT_DIR
from evoharness_agent.learning.trainer import (
    domain_folds,
    split_episodes,
    task_folds,
    task_group,
    train_on_episodes,
    validation_episodes,
)
from evoharness_agent.policy import ToolPolicy
from tests.kit.synthetic_logs import synthetic_episodes

EPISODES = synthetic_episodes(12)


def _config(folds: int | str):
    """The tiny CPU run of test_calibration, with ``folds`` cross-fitting folds."""
    return load_config(None, {
        "training": {"steps": 40, "batch_size": 16, "device": "cpu", "threads": 1, "checkpoint_every": 40,
                     "eval_every": 40, "seed": 3, "calibration_folds": folds},
        "logging": {"tensorboard": False, "log_every": 20},
        "algorithm": {"name": "cql", "params": {}},
        "model": {"hidden": 16, "history_window": 2},
        "data": {"val_fraction": 0.25},
    })


def test_task_folds_hold_whole_tasks_out() -> None:
    # Two runs of each of 6 tasks: a task's runs must land in one fold.
    episodes = [episode.model_copy(update={"metadata": {"task_id": i // 2}}) for i, episode in enumerate(EPISODES)]
    ids = list(range(len(episodes)))
    folds = task_folds(episodes, ids, 3, seed=0)
    assert sorted(i for fold in folds for i in fold) == ids and all(folds)
    for fold in folds:
        tasks = {task_group(episodes[i], i) for i in fold}
        assert all(task_group(episodes[i], i) not in tasks for other in folds if other is not fold for i in other)
    assert folds == task_folds(episodes, ids, 3, seed=0) != task_folds(episodes, ids, 3, seed=1)
    with pytest.raises(ValueError, match="calibration_folds is 7, but the training split has 6 task"):
        task_folds(episodes, ids, 7, seed=0)


def _in_domains(domains: list[str]) -> list:
    """EPISODES, each in the domain at its position (cycling through ``domains``)."""
    return [ep.model_copy(update={"metadata": {**ep.metadata, "domain": domains[i % len(domains)]}})
            for i, ep in enumerate(EPISODES)]


def test_domain_folds_hold_whole_domains_out_with_their_siblings() -> None:
    episodes = _in_domains(["bfcl", "tau_retail", "tau2_retail", "metatool"])
    ids = list(range(len(episodes)))
    folds = domain_folds(episodes, ids)
    assert sorted(i for fold in folds for i in fold) == ids and len(folds) == 3
    in_fold = [{episodes[i].metadata["domain"] for i in fold} for fold in folds]
    assert {"tau_retail", "tau2_retail"} in in_fold  # they share users: never scored by a model that saw the other
    with pytest.raises(ValueError, match="calibration_folds is 'domain', but the training split has 1 domain"):
        domain_folds(_in_domains(["bfcl"]), ids)


def test_domain_folds_fit_the_temperature_on_decisions_about_unseen_domains(
        tmp_path: Path, encoder: StateEncoder) -> None:
    episodes = _in_domains(["bfcl", "metatool"])
    result = train_on_episodes(episodes, _config("domain"), tmp_path, encoder=encoder, show_progress=False)
    meta = json.loads((tmp_path / "policy.json").read_text())["calibration"]
    assert sorted(p.name for p in (tmp_path / CROSS_FIT_DIR).glob("fold_*.pt")) == ["fold_0.pt", "fold_1.pt"]
    _, val_ids = split_episodes(episodes, 0.25, 3)
    assert meta["n_out_of_fold"] == result["n_out_of_fold"] > 0
    assert meta["n_decisions"] == meta["n_out_of_fold"] + sum(
        sum(step.is_decision for step in episodes[i].steps) for i in val_ids)


def test_one_fold_is_refused() -> None:
    with pytest.raises(ValueError, match="1 fold cannot hold a task out"):
        _config(1)
    with pytest.raises(ValueError, match="folds must be 0, 2 or more, 'auto' or 'domain'"):
        _config(-2)
    assert _config("domain").training.calibration_folds == "domain" and _config("4").training.calibration_folds == 4


def test_auto_folds_cross_fit_only_where_the_validation_split_is_small() -> None:
    auto = _config("auto").training
    assert auto.with_folds(FEW_DECISIONS - 1, n_tasks=40).calibration_folds == AUTO_FOLDS
    assert auto.with_folds(FEW_DECISIONS - 1, n_tasks=3).calibration_folds == 3  # a fold per task at most
    assert auto.with_folds(FEW_DECISIONS, n_tasks=40).calibration_folds == 0
    assert auto.with_folds(5, n_tasks=1).calibration_folds == 0  # one task: no fold could hold it out
    assert _config(0).training.with_folds(5, n_tasks=40).calibration_folds == 0
    assert _config("domain").training.with_folds(5, n_tasks=40).calibration_folds == "domain"
    assert load_config(None, {}).training.calibration_folds == "auto"


def test_data_parallel_runs_refuse_folds_they_were_given_and_resolve_auto_to_none() -> None:
    for folds in (4, "domain"):
        _config(folds).training.check_folds(1)
        with pytest.raises(ValueError, match="cross-fitting is for logs of a few tasks"):
            _config(folds).training.check_folds(2)
    for folds in (0, "auto"):
        _config(folds).training.check_folds(2)
    assert _config("auto").training.with_folds(5, n_tasks=40, world_size=2).calibration_folds == 0


def test_scored_decisions_concat_pads_the_narrower_parts() -> None:
    wide = ScoredDecisions(scores=torch.ones(2, 3), masks=torch.ones(2, 3, dtype=torch.bool),
                           actions=torch.tensor([0, 2]), is_finish=torch.zeros(2, 3, dtype=torch.bool))
    narrow = ScoredDecisions(scores=torch.ones(1, 1), masks=torch.ones(1, 1, dtype=torch.bool),
                             actions=torch.tensor([0]), is_finish=torch.ones(1, 1, dtype=torch.bool))
    both = ScoredDecisions.concat([wide, narrow])
    assert both.scores.shape == both.masks.shape == both.is_finish.shape == (3, 3)
    assert both.actions.tolist() == [0, 2, 0]
    assert both.masks[2].tolist() == [True, False, False] and both.is_finish[2].tolist() == [True, False, False]
    assert (both.scores[2, 1:] < -1e8).all()  # padding is unavailable, far below any score


def test_task_folds_train_on_every_task_and_fit_the_temperature_out_of_fold(
        tmp_path: Path, encoder: StateEncoder) -> None:
    result = train_on_episodes(EPISODES, _config(3), tmp_path, encoder=encoder, show_progress=False)
    meta = json.loads((tmp_path / "policy.json").read_text())
    calibration = meta["calibration"]
    folds = sorted((tmp_path / CROSS_FIT_DIR).glob("fold_*.pt"))
    assert [path.name for path in folds] == ["fold_0.pt", "fold_1.pt", "fold_2.pt"]
    out_of_fold = ScoredDecisions.concat([ScoredDecisions(**torch.load(p, weights_only=True)) for p in folds])
    # The config's validation quarter is trained on too: every decision is scored once, out of fold.
    assert split_episodes(EPISODES, 0.25, 3)[1]
    assert meta["config"]["data"]["val_fraction"] == 0.0
    assert validation_episodes(EPISODES, TrainConfig.model_validate(meta["config"])) == []
    assert calibration["n_out_of_fold"] == calibration["n_decisions"] == len(out_of_fold.actions)
    assert len(out_of_fold.actions) == result["n_transitions"]
    assert "temperature_validation" not in calibration  # no validation split to compare with
    policy = ToolPolicy.load(tmp_path, encoder=encoder, device="cpu")
    assert policy.temperature == pytest.approx(
        fit_temperature(out_of_fold.scores, out_of_fold.actions, out_of_fold.masks), rel=0.02)


def test_auto_folds_train_on_a_small_validation_split_and_keep_a_large_one(
        tmp_path: Path, encoder: StateEncoder) -> None:
    small = train_on_episodes(EPISODES, _config("auto"), tmp_path / "small", encoder=encoder, show_progress=False)
    meta = json.loads((tmp_path / "small" / "policy.json").read_text())
    assert meta["config"]["training"]["calibration_folds"] == AUTO_FOLDS
    assert meta["config"]["data"]["val_fraction"] == 0.0
    assert meta["calibration"]["n_out_of_fold"] == small["n_transitions"]
    # Domain folds (the shipped default's) keep the validation split: in-domain decisions for the temperature.
    train_on_episodes(_in_domains(["bfcl", "metatool"]), _config("domain"), tmp_path / "domain", encoder=encoder,
                      show_progress=False)
    by_domain = json.loads((tmp_path / "domain" / "policy.json").read_text())
    assert by_domain["config"]["data"]["val_fraction"] == 0.25 and "temperature_validation" in by_domain["calibration"]


def test_a_resumed_run_keeps_its_finished_folds(tmp_path: Path, encoder: StateEncoder) -> None:
    train_on_episodes(EPISODES, _config(2), tmp_path, encoder=encoder, show_progress=False)
    first = json.loads((tmp_path / "policy.json").read_text())["calibration"]
    kept, redone = tmp_path / CROSS_FIT_DIR / "fold_0.pt", tmp_path / CROSS_FIT_DIR / "fold_1.pt"
    scores = torch.load(redone, weights_only=True)["scores"]
    # A crash after the first fold: its scores stay, the second fold's are gone.
    redone.unlink()
    stamp = kept.stat().st_mtime_ns
    train_on_episodes(EPISODES, _config(2), tmp_path, encoder=encoder, resume=True, show_progress=False)
    assert kept.stat().st_mtime_ns == stamp and redone.exists()
    # The fold's own seeds train it again as the first run did (the main run's training, skipped
    # now, drew from torch's generator then): the same scores, the same temperature.
    assert torch.equal(torch.load(redone, weights_only=True)["scores"], scores)
    assert json.loads((tmp_path / "policy.json").read_text())["calibration"]["temperature"] == pytest.approx(
        first["temperature"], rel=1e-6)
    # A fresh run (no resume) starts its folds afresh.
    train_on_episodes(EPISODES, _config(2), tmp_path, encoder=encoder, show_progress=False)
    assert kept.stat().st_mtime_ns != stamp


def test_each_model_takes_its_calls_shares_from_the_transitions_it_trains_on(
        tmp_path: Path, encoder: StateEncoder, monkeypatch: pytest.MonkeyPatch) -> None:
    made = []

    def recording(name, params, dims, network, tools):  # noqa: ANN001, ANN202
        made.append(tools.calls.clone())
        return make_algorithm(name, params, dims, network, tools)

    monkeypatch.setattr(trainer, "make_algorithm", recording)
    result = train_on_episodes(EPISODES, _config(2), tmp_path, encoder=encoder, show_progress=False)
    run, *folds = made
    n_train = result["n_transitions"]  # task folds: every task is trained on
    assert len(folds) == 2 and int(run.sum()) == n_train
    # A fold model counts the calls of the tasks it trains on, not those it scores for the temperature.
    for k, calls in enumerate(folds):
        held_out = torch.load(tmp_path / CROSS_FIT_DIR / f"fold_{k}.pt", weights_only=True)["actions"]
        assert int(calls.sum()) == n_train - len(held_out)
    assert torch.equal(folds[0] + folds[1], run)
