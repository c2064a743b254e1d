"""Cross-fitted calibration on real data: fine-tuning the shipped default on ten tau2-bench retail tasks.

Ten tasks leave the validation split one task (2 decisions); the temperature fit on them alone
gave an ECE of 0.45 on the 14 held-out tasks, the cross-fitted one 0.15
(``benchmarks/fine_tune.py``, 2026-12-03). Both temperatures come from the same run: the
policy records what its validation split alone would have fit (``temperature_validation``).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from evoharness_agent.evaluation.offline import evaluate_offline
from evoharness_agent.learning.config import TrainConfig
from evoharness_agent.learning.trainer import task_group, train_on_episodes
from evoharness_agent.logs.bundled import domain_episodes, tau2_retail_split
from evoharness_agent.policy import ToolPolicy
from evoharness_agent.schema import Episode

# Slow: six 1,500-step fine-tunes (~20 s each on 2 cores) and two evaluations.
pytestmark = pytest.mark.slow


def test_cross_fitting_calibrates_a_fine_tune_on_ten_tasks(tmp_path: Path) -> None:
    train, test = tau2_retail_split(domain_episodes("tau2_retail"))
    # The first ten tasks in benchmarks/fine_tune.py's seeded order, in that order.
    groups: dict[str, list[Episode]] = {}
    for position, episode in enumerate(train):
        groups.setdefault(task_group(episode, position), []).append(episode)
    order = sorted(groups)
    random.Random(0).shuffle(order)
    subset = [episode for key in order[:10] for episode in groups[key]]
    encoder = ToolPolicy.load("default").encoder
    config = TrainConfig.model_validate({"training": {"steps": 1500, "calibration_folds": 5},
                                         "logging": {"tensorboard": False}})
    train_on_episodes(subset, config, tmp_path, encoder=encoder, init="default", show_progress=False)
    tuned = ToolPolicy.load(tmp_path, encoder=encoder)
    fit = tuned.meta["calibration"]
    assert fit["n_out_of_fold"] > 10 * (fit["n_decisions"] - fit["n_out_of_fold"])  # the validation split: a few
    alone = ToolPolicy(tuned.algorithm, {**tuned.meta, "calibration": {"temperature": fit["temperature_validation"]}},
                       encoder)
    crossed_ece = evaluate_offline(tuned, test, subset, encoder=encoder).calibration.ece
    alone_ece = evaluate_offline(alone, test, subset, encoder=encoder).calibration.ece
    assert crossed_ece < 0.25 < alone_ece
