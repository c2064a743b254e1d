"""Offline evaluation: next-tool prediction with gold history, policy vs baselines, one run.

At every logged tool call the ranker sees the gold history so far and ranks the tools
available there (FINISH excluded: that decision is scored separately as FINISH accuracy).
Ties are ranked pessimistically: the gold tool's rank is one plus the number of *other*
candidates scoring at least as high, so a ranker that scores everything equal gets no credit.

Baselines, fit on ``baseline_episodes`` (by default the policy's training logs):

* ``random``: the expected metrics of a uniformly random order (exact, not sampled);
* ``most_frequent``: how often each tool was called;
* ``bigram``: how often a tool followed the previous tool call (ties broken by frequency);
* ``embedding_similarity``: cosine of the current user message and the tool's name+description.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from evoharness_agent.dataset import Decision, decisions
from evoharness_agent.encoding import StateEncoder
from evoharness_agent.policy import ToolPolicy
from evoharness_agent.schema import FINISH, Episode

__all__ = ["BASELINES", "CountBaselines", "OfflineReport", "evaluate_offline", "pessimistic_rank", "plot_report",
           "print_report"]

BASELINES = ("random", "most_frequent", "bigram", "embedding_similarity")
START = "<start>"


def pessimistic_rank(scores: np.ndarray, candidates: np.ndarray, gold: int) -> int:
    """Rank of ``gold`` among ``candidates`` (bool mask), ties counted against it."""
    if not candidates[gold]:
        return 10**9  # the gold tool was not offered: no ranker can find it
    others = candidates.copy()
    others[gold] = False
    return 1 + int(np.sum(scores[others] >= scores[gold]))


@dataclass
class _Tally:
    """Running top-1 / top-3 / MRR sums for one ranker."""

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
    confusion: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Return the JSON document written by ``evaluate --json``."""
        return {"n_decisions": self.n_decisions, "metrics": self.metrics,
                "finish_accuracy": self.finish_accuracy, "n_finish_decisions": self.n_finish_decisions,
                "confusion": self.confusion}

    def write_json(self, path: str | Path) -> None:
        """Write :meth:`to_json` to ``path``."""
        Path(path).write_text(json.dumps(self.to_json(), indent=2))


class CountBaselines:
    """Frequency and bigram statistics of tool calls (and of FINISH) in the baseline logs."""

    def __init__(self, episodes: Sequence[Episode]) -> None:
        self.unigram: Counter[str] = Counter()
        self.bigram: dict[str, Counter[str]] = defaultdict(Counter)
        # Decisions including FINISH, keyed by the previous decision of the same turn (START
        # at a turn's start): online choosers must also decide when to stop.
        self.actions: Counter[str] = Counter()
        self.turn_bigram: dict[str, Counter[str]] = defaultdict(Counter)
        for episode in episodes:
            previous = in_turn = START
            for step in episode.steps:
                if not step.is_decision:
                    in_turn = START
                    continue
                self.actions[step.action] += 1
                self.turn_bigram[in_turn][step.action] += 1
                in_turn = START if step.action == FINISH else step.action
                if step.kind == "tool_call" and step.tool:
                    self.unigram[step.tool] += 1
                    self.bigram[previous][step.tool] += 1
                    previous = step.tool

    @property
    def calls_per_turn(self) -> float:
        """Mean number of tool calls before each FINISH in the logs (0 without FINISH)."""
        finishes = self.actions[FINISH]
        return sum(self.unigram.values()) / finishes if finishes else 0.0

    def scores(self, names: list[str], previous: str | None) -> dict[str, np.ndarray]:
        """Scores of ``names`` for the frequency and bigram baselines."""
        unigram = np.array([self.unigram[n] for n in names], dtype=np.float64)
        following = self.bigram.get(previous or START, Counter())
        total = max(unigram.sum(), 1.0)
        bigram = np.array([following[n] for n in names], dtype=np.float64) + unigram / (total + 1.0)
        return {"most_frequent": unigram, "bigram": bigram}

    def turn_scores(self, names: list[str], previous: str | None) -> np.ndarray:
        """Bigram scores of actions (FINISH included) after ``previous`` in the turn (None: turn start)."""
        following = self.turn_bigram.get(previous or START, Counter())
        total = max(sum(self.actions.values()), 1)
        # Ties (unseen pairs) fall back to overall frequency, as in the tool-only bigram.
        return np.array([following[n] + self.actions[n] / (total + 1.0) for n in names], dtype=np.float64)


def evaluate_offline(
    policy: ToolPolicy,
    episodes: Sequence[Episode],
    baseline_episodes: Sequence[Episode],
    *,
    encoder: StateEncoder | None = None,
) -> OfflineReport:
    """Score the policy and the baselines on every logged decision of ``episodes``."""
    encoder = encoder or policy.encoder
    counts = CountBaselines(baseline_episodes)
    tallies = {name: _Tally() for name in ("policy", *BASELINES)}
    confusion: dict[str, Counter[str]] = defaultdict(Counter)
    finish_hits = finish_n = 0
    for episode in episodes:
        points: list[Decision] = decisions(episode, policy.history_window)
        if not points:
            continue
        prefixes = [i for i, step in enumerate(episode.steps) if step.is_decision]
        names, policy_scores = policy.score_matrix(
            [(episode.task, episode.steps[:i]) for i in prefixes], episode.tools)
        tool_vectors = encoder.embed([spec.text() for spec in episode.tools])
        request_vectors = encoder.embed([p.request for p in points])
        finish = names.index(FINISH)
        for row, point in enumerate(points):
            available = np.array([n in point.available for n in names])
            finish_n += 1
            finish_hits += (names[int(np.argmax(np.where(available, policy_scores[row], -np.inf)))] == FINISH) == (
                point.action == FINISH)
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
    return OfflineReport(
        n_decisions=tallies["policy"].n,
        metrics={name: tally.result() for name, tally in tallies.items()},
        finish_accuracy=finish_hits / max(finish_n, 1),
        n_finish_decisions=finish_n,
        confusion={gold: dict(pred.most_common()) for gold, pred in sorted(confusion.items())},
    )


def print_report(report: OfflineReport, title: str, console: Console | None = None) -> None:
    """Print an offline report as a rich table, the policy's row highlighted."""
    console = console or Console()
    table = Table(title=f"{title}: {report.n_decisions} tool-call decisions")
    for column in ("ranker", "top-1", "top-3", "MRR"):
        table.add_column(column, justify="left" if column == "ranker" else "right")
    for name, metrics in report.metrics.items():
        table.add_row(name, f"{metrics['top1']:.3f}", f"{metrics['top3']:.3f}", f"{metrics['mrr']:.3f}",
                      style="bold green" if name == "policy" else None)
    console.print(table)
    console.print(f"policy FINISH accuracy: {report.finish_accuracy:.3f} over {report.n_finish_decisions} decisions")


def plot_report(report: OfflineReport, path: str | Path, title: str = "next-tool prediction") -> None:
    """Save a PNG: top-1 / top-3 / MRR bars per ranker, and the policy's most confused tools."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rankers = list(report.metrics)
    fig, (bars, confused) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    width = 0.8 / 3
    for k, metric in enumerate(("top1", "top3", "mrr")):
        values = [report.metrics[r][metric] for r in rankers]
        bars.bar(np.arange(len(rankers)) + k * width, values, width, label=metric)
    bars.set_xticks(np.arange(len(rankers)) + width, rankers, rotation=15)
    bars.set_ylim(0, 1)
    bars.legend()
    bars.set_title(f"{title} ({report.n_decisions} decisions)")
    errors = sorted(((n, gold, pred) for gold, row in report.confusion.items()
                     for pred, n in row.items() if pred != gold), reverse=True)[:10]
    confused.barh([f"{gold} → {pred}" for _, gold, pred in errors][::-1], [n for n, _, _ in errors][::-1])
    confused.set_title("policy: most frequent confusions (gold → top-1)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
