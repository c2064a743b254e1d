from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.evaluation.offline import BASELINES, OfflineReport, evaluate_offline, pessimistic_rank
from evoharness_agent.evaluation.reports import plot_report, print_report
from evoharness_agent.learning.calibration import calibration_report
from evoharness_agent.schema import FINISH, Episode, Step, ToolSpec

TOOLS = [ToolSpec(name="a", description="Search for flights between two cities."),
         ToolSpec(name="b", description="Book a flight ticket for a passenger."),
         ToolSpec(name="c", description="Get the weather forecast for a city."),
         ToolSpec(name="d", description="Translate a text into another language.")]


def calls(*names: str) -> list[Step]:
    return [Step(tool=name) for name in names] + [Step(kind="assistant", content="done")]


# Baseline logs: unigram a=3, b=2, c=2; bigram <start>→a 3, <start>→c 1, a→b 2, a→c 1.
BASELINE_LOGS = [Episode(task="t", tools=TOOLS, steps=calls(*names))
                 for names in (("a", "b"), ("a", "c"), ("a", "b"), ("c",))]

EVAL_LOGS = [
    Episode(task="Find a flight from Paris to Rome and book it", tools=TOOLS, steps=calls("a", "b")),
    Episode(task="Weather in Rome, in French please", tools=TOOLS, available_at_start=["c", "d"],
            steps=calls("d", "c")),
    Episode(task="nothing happened", tools=TOOLS, steps=[Step(kind="user", content="hello")]),
]

FIXED_SCORES = {"a": 1.0, "b": 3.0, "c": 2.0, "d": 0.0, FINISH: -1.0}


class FixedPolicy:
    """A stand-in policy whose scores ignore the state: every number below is hand-checkable."""

    history_window = 2

    def __init__(self, encoder: StateEncoder, temperature: float = 1.0) -> None:
        self.encoder = encoder
        self.temperature = temperature
        self.calls: list[int] = []

    def score_matrix(self, states: Sequence[tuple[str, Sequence[Step]]], tools: Sequence[Any], *,
                     include_finish: bool = True, available: Any = None) -> tuple[list[str], np.ndarray]:
        self.calls.append(len(states))
        names = [tool.name for tool in tools] + [FINISH]
        return names, np.tile([FIXED_SCORES[name] for name in names], (len(states), 1))


def test_pessimistic_rank_counts_ties_against_gold() -> None:
    everything = np.ones(3, dtype=bool)
    assert pessimistic_rank(np.array([1.0, 1.0, 1.0]), everything, 0) == 3
    assert pessimistic_rank(np.array([2.0, 1.0, 1.0]), everything, 0) == 1
    assert pessimistic_rank(np.array([2.0, 1.0, 1.0]), everything, 1) == 3
    assert pessimistic_rank(np.array([2.0, 1.0, 0.5]), everything, 2) == 3
    # non-candidates do not count, however high they score
    assert pessimistic_rank(np.array([9.0, 1.0, 0.0]), np.array([False, True, True]), 1) == 1
    # a gold tool that was not offered cannot be found
    assert pessimistic_rank(np.array([9.0, 1.0]), np.array([True, False]), 1) >= 10**6


@pytest.fixture(scope="module")
def report(encoder: StateEncoder) -> OfflineReport:
    return evaluate_offline(FixedPolicy(encoder), EVAL_LOGS, BASELINE_LOGS)


def test_counts_and_json_shape(report: OfflineReport, tmp_path: Path) -> None:
    assert report.n_decisions == 4  # tool calls only; FINISH decisions are scored separately
    assert report.n_finish_decisions == 6
    report.write_json(tmp_path / "report.json")
    document = json.loads((tmp_path / "report.json").read_text())
    assert document["n_decisions"] == 4
    assert set(document["metrics"]) == {"policy", *BASELINES}
    for metrics in document["metrics"].values():
        assert set(metrics) == {"top1", "top3", "mrr"}
        assert all(0.0 <= value <= 1.0 for value in metrics.values())
    assert {"n_decisions", "metrics", "finish_accuracy", "n_finish_decisions", "confusion", "calibration"} == set(
        document)
    assert document["calibration"]["n_decisions"] == 6
    assert document == report.to_json()


def test_random_baseline_is_the_exact_expectation(report: OfflineReport) -> None:
    # candidates per decision: 4, 4 (episode 1), 2, 2 (episode 2 only offers c and d)
    harmonic4 = (1 + 1 / 2 + 1 / 3 + 1 / 4) / 4
    assert report.metrics["random"] == pytest.approx(
        {"top1": (1 / 4 + 1 / 4 + 1 / 2 + 1 / 2) / 4, "top3": (3 / 4 + 3 / 4 + 1 + 1) / 4,
         "mrr": (2 * harmonic4 + 2 * 0.75) / 4})


def test_count_baselines_by_hand(report: OfflineReport) -> None:
    # most_frequent: a (3) rank 1; b ties c (2) behind a: rank 3; d (0) behind c: rank 2; c rank 1
    assert report.metrics["most_frequent"] == pytest.approx(
        {"top1": 0.5, "top3": 1.0, "mrr": (1 + 1 / 3 + 1 / 2 + 1) / 4})
    # bigram: <start>→a rank 1; a→b rank 1; <start>: c (1) beats d: rank 2; d→? none, frequency: c rank 1
    assert report.metrics["bigram"] == pytest.approx({"top1": 0.75, "top3": 1.0, "mrr": (1 + 1 + 1 / 2 + 1) / 4})


def test_policy_metrics_finish_accuracy_and_confusion(report: OfflineReport) -> None:
    # fixed scores b > c > a > d: gold a rank 3, b rank 1, d rank 2 (of c, d), c rank 1
    assert report.metrics["policy"] == pytest.approx({"top1": 0.5, "top3": 1.0, "mrr": (1 / 3 + 1 + 1 / 2 + 1) / 4})
    # FINISH scores lowest, so the policy never answers: right on the 4 tool calls, wrong on the 2 replies
    assert report.finish_accuracy == pytest.approx(4 / 6)
    assert report.confusion == {"a": {"b": 1}, "b": {"b": 1}, "c": {"c": 1}, "d": {"c": 1}}


def _softmax_top(names: Sequence[str], temperature: float) -> float:
    """The top probability of softmax(FIXED_SCORES / T) over ``names``."""
    weights = np.exp(np.array([FIXED_SCORES[n] for n in names]) / temperature)
    return float(weights.max() / weights.sum())


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_calibration_of_live_decisions_by_hand(encoder: StateEncoder, temperature: float) -> None:
    report = evaluate_offline(FixedPolicy(encoder, temperature), EVAL_LOGS, BASELINE_LOGS).calibration
    # Every decision, FINISH included among the candidates and as a logged action: episode 1
    # (a, b, reply) offers everything, so b on top; episode 2 (d, c, reply) offers c, d, FINISH: c on top.
    everything, offered = _softmax_top(["a", "b", "c", "d", FINISH], temperature), _softmax_top(
        ["c", "d", FINISH], temperature)
    confidence = [everything] * 3 + [offered] * 3
    correct = [False, True, False, False, True, False]
    expected = calibration_report(confidence, correct)
    assert report.n_decisions == 6 and report.accuracy == pytest.approx(1 / 3)
    assert report.mean_confidence == pytest.approx(np.mean(confidence))
    assert report.ece == pytest.approx(expected.ece)
    assert [b["n"] for b in report.bins] == [b["n"] for b in expected.bins]
    assert report.coverage_at_95 == expected.coverage_at_95 == 0.0


def test_embedding_similarity_baseline(report: OfflineReport, encoder: StateEncoder) -> None:
    tool_vectors = encoder.embed([tool.text() for tool in TOOLS])
    expected = []
    for episode, golds, offered in ((EVAL_LOGS[0], "ab", "abcd"), (EVAL_LOGS[1], "dc", "cd")):
        similarity = tool_vectors @ encoder.embed([episode.task])[0]
        for gold in golds:
            g = "abcd".index(gold)
            expected.append(1 + sum(similarity["abcd".index(o)] >= similarity[g] for o in offered if o != gold))
    ranks = np.array(expected, dtype=float)
    assert report.metrics["embedding_similarity"] == pytest.approx(
        {"top1": float(np.mean(ranks <= 1)), "top3": float(np.mean(ranks <= 3)), "mrr": float(np.mean(1 / ranks))})


def test_policy_is_queried_once_per_episode_with_decisions(encoder: StateEncoder) -> None:
    policy = FixedPolicy(encoder)
    evaluate_offline(policy, EVAL_LOGS, BASELINE_LOGS)
    assert policy.calls == [3, 3]  # one batched call per episode, one state per decision


def test_gold_tool_outside_the_tool_list_is_skipped(encoder: StateEncoder) -> None:
    odd = Episode(task="t", tools=TOOLS[:2], steps=calls("a", "zzz"))
    report = evaluate_offline(FixedPolicy(encoder), [odd], BASELINE_LOGS)
    assert report.n_decisions == 1
    assert report.metrics["random"]["top1"] == pytest.approx(1 / 2)
    assert report.calibration.n_decisions == 2  # a and the reply: zzz could not be chosen


@pytest.mark.parametrize("episodes", [[], [Episode(task="t", tools=TOOLS, steps=[Step(kind="user", content="hi")])]],
                         ids=["no-episode", "no-decision"])
def test_nothing_to_evaluate_is_an_error(encoder: StateEncoder, episodes: list[Episode]) -> None:
    with pytest.raises(ValueError, match="nothing to evaluate"):
        evaluate_offline(FixedPolicy(encoder), episodes, BASELINE_LOGS)


def test_print_and_plot_report(report: OfflineReport, tmp_path: Path) -> None:
    buffer = io.StringIO()
    print_report(report, "unit", Console(file=buffer, width=120))
    text = buffer.getvalue()
    assert "4 tool-call decisions" in text and "most_frequent" in text and "0.667" in text
    path = tmp_path / "report.png"
    plot_report(report, path)
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000
