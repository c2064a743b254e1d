"""Count statistics of logged decisions that the frequency and bigram baselines rank by.

Offline evaluation scores the ``most_frequent`` and ``bigram`` baselines with them, and the
online :class:`~evoharness_agent.evaluation.choosers.BigramChooser` acts on them; both fit
one :class:`CountBaselines` on the baseline logs.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

import numpy as np

from evoharness_agent.schema import FINISH, Episode

__all__ = ["START", "CountBaselines"]

START = "<start>"
"""The previous action at a turn's start (and, for tool-only bigrams, at an episode's start)."""


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
