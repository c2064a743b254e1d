"""The fine-tuning steps sweep: validation tasks drawn from the training tasks only, and a short run end to end."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from evoharness_agent.learning.checkpoints import shipped_policy_dir
from evoharness_agent.logs.bundled import domain_episodes, tau2_retail_split
from tests.kit.scripts import load_script

steps_sweep = load_script("fine_tune_steps", "benchmarks")


def test_the_validation_tasks_are_a_fifth_of_the_training_tasks_and_never_the_held_out_ones() -> None:
    inner, validation = steps_sweep.validation_split("tau2_retail")
    train, test = tau2_retail_split(domain_episodes("tau2_retail"))
    assert {e.id for e in inner} | {e.id for e in validation} == {e.id for e in train}
    assert not {e.id for e in inner} & {e.id for e in validation}
    assert not {e.id for e in validation} & {e.id for e in test}
    assert len(validation) == len(train) // 5


def test_a_short_sweep_reports_each_size_and_number_of_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    start_dir = tmp_path / "transfer"
    shutil.copytree(shipped_policy_dir(), start_dir / "tau_retail")  # any policy with the default's encoders will do
    train, _ = tau2_retail_split(domain_episodes("tau2_retail"))
    monkeypatch.setattr(steps_sweep, "validation_split", lambda domain: (train[:6], train[6:9]))
    out = tmp_path / "sweep.json"
    steps_sweep.main(["--domains", "tau2_retail", "--sizes", "2,all", "--steps", "2,3", "--seeds", "1",
                      "--start-dir", str(start_dir), "--out", str(tmp_path / "runs"), "--json", str(out)])
    rows = json.loads(out.read_text())["domains"]["tau2_retail"]
    assert [(row["tasks"], row["steps"]) for row in rows] == [(2, 2), (2, 3), ("all", 2), ("all", 3)]
    assert all(0.0 <= row["top1"] <= row["top3"] <= 1.0 for row in rows)
    assert rows[-1]["decisions"] == sum(step.is_decision for episode in train[:6] for step in episode.steps)
