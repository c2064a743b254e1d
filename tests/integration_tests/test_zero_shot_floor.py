"""The shipped policy on the zero-shot suite: a floor just under today's figures, so a regression shows.

The suite's tools occur in no log (:mod:`evoharness_agent.evaluation.zero_shot`), so this is the
shipped policy's generalisation, not its memory of BFCL. Raise the floors when a better policy ships.
"""

from __future__ import annotations

from evoharness_agent.demo import SHIPPED_POLICY
from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.evaluation.choosers import EmbeddingChooser
from evoharness_agent.evaluation.zero_shot import ZERO_SHOT_TASKS, evaluate_zero_shot, random_expectation
from evoharness_agent.policy import ToolPolicy

# Measured on 2026-12-03 (thirteenth stop) with the shipped general default (CQL on every bundled domain's
# training split plus two-part requests composed from its one-call logs, state layout 8 and the
# prerequisite, open-part, asked-action and retry decision rules, the towers ranking tools at 0.25,
# history steps on the static step model, scripts/train_default.py; a tool waiting for its lookup
# ranks below it; a composed request validated with its parts; a request's late clauses read after
# a call), CPU, 34 tasks / 107 decisions / 72 right after a successful call: step accuracy 0.673
# (72/107), task exact 0.235 (8/34), repeat rate 0.000 (0/72) (twelfth stop: 0.664, 0.235, 0.000;
# sixth stop, MiniLM for every text: 0.682, 0.235, 0.000).
# Embedding similarity (calls_per_turn=2) got 0.551 / 0.118 / 0.000 in the same run, random 0.136 / 0.014 / 0.136.
# The targets (0.90 / 0.75 / <= 0.02) are still far off: see the model card.
STEP_ACCURACY_FLOOR = 0.62
TASK_EXACT_FLOOR = 0.2  # at least 7 tasks right end to end (today's 8: one to spare)
REPEAT_RATE_CEILING = 0.05  # at most 3 of the 72 decisions after a successful call


def test_shipped_policy_stays_above_the_zero_shot_floor(default_encoder: StateEncoder) -> None:
    policy = ToolPolicy.load(SHIPPED_POLICY, encoder=default_encoder, device="cpu")
    report = evaluate_zero_shot(policy, ZERO_SHOT_TASKS)
    overall = report.overall
    assert overall.n_tasks == len(ZERO_SHOT_TASKS)
    figures = (f"step accuracy {overall.step_accuracy:.3f}, task exact {overall.task_exact:.3f}, "
               f"repeat rate {overall.repeat_rate}")
    assert overall.step_accuracy >= STEP_ACCURACY_FLOOR, figures
    assert overall.task_exact >= TASK_EXACT_FLOOR, figures
    assert overall.repeat_rate is not None and overall.repeat_rate <= REPEAT_RATE_CEILING, figures
    assert overall.step_accuracy > random_expectation(ZERO_SHOT_TASKS).overall.step_accuracy
    similarity = evaluate_zero_shot(EmbeddingChooser(default_encoder, calls_per_turn=2), ZERO_SHOT_TASKS).overall
    assert overall.step_accuracy > similarity.step_accuracy, (figures, similarity)
