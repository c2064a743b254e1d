"""The fine-tuning ceilings benchmark: its turn and state helpers, and a short run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evoharness_agent.logs.bundled import domain_episodes, tau2_retail_split
from evoharness_agent.schema import Episode, Step, ToolSpec
from tests.kit.scripts import load_script

ceiling = load_script("fine_tune_ceiling", "benchmarks")


def _call(tool: str) -> Step:
    return Step(tool=tool, observation="ok")


def test_later_in_turn_stops_at_the_next_user_message() -> None:
    episode = Episode(task="t", steps=[_call("a"), _call("b"), Step(kind="user", content="more"), _call("c")])
    assert ceiling.later_in_turn(episode, 1) == {"b"}
    assert ceiling.later_in_turn(episode, 2) == set()
    assert ceiling.later_in_turn(episode, 3) == {"c"}


def test_consistent_states_is_the_majority_vote_over_identical_states() -> None:
    # Three logs of one state: two call "a" first, one "b"; a majority vote gets two of the three first calls.
    tools = [ToolSpec(name="a"), ToolSpec(name="b")]
    episodes = [Episode(task="same", tools=tools, steps=[_call(first)]) for first in ("a", "a", "b")]
    points = ceiling.logged_decisions(episodes, history_window=4)
    assert ceiling.consistent_states(points) == pytest.approx(2 / 3)


def test_a_short_run_reports_every_row_and_counts_every_live_decision(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    train, test = tau2_retail_split(domain_episodes("tau2_retail"))
    monkeypatch.setattr(ceiling, "splits", lambda domain: (train[:6], test[:3]))
    out = tmp_path / "ceiling.json"
    ceiling.main(["--domains", "tau2_retail", "--steps", "3", "--seeds", "2", "--out", str(tmp_path / "runs"),
                  "--json", str(out)])
    result = json.loads(out.read_text())["domains"]["tau2_retail"]
    for row in ("held_out", "memorised", "training_fit"):
        assert 0.0 <= result[row]["top1"] <= result[row]["top3"] <= 1.0
    spread = result["held_out_seeds"]["top1"]
    assert spread["min"] <= result["held_out"]["top1"] <= spread["max"]  # seed 0 is one of the seeds
    assert spread["min"] <= spread["mean"] <= spread["max"] and spread["sd"] >= 0.0
    assert 0.0 <= result["logistic_regression_top1"] <= 1.0
    assert result["consistent_states_top1"] == 1.0  # tau2 retail's tasks share no state
    everything = result["errors"]["most_confident"]["100%"]
    n_live = sum(len([s for s in ep.steps if s.is_decision]) for ep in test[:3])
    assert sum(v for k, v in everything.items() if k not in ("min_confidence", "accuracy")) == n_live
    assert everything["accuracy"] == pytest.approx(everything.get("right", 0) / n_live)
