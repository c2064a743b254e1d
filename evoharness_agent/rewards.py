"""Reward shaping: turn a logged episode into one reward per decision.

The offline learner needs a reward for every decision step (a tool call, or an assistant
reply, i.e. FINISH). Logs usually carry a single outcome per episode, so it is spread out
as in the idea "success = +10, useless call = -1":

* every tool call costs :attr:`RewardConfig.step_cost`, so shorter solutions are preferred;
* a call that failed (``step.error``) costs :attr:`RewardConfig.error_penalty` more;
* repeating a call (same tool, identical arguments) within one user turn costs
  :attr:`RewardConfig.repeat_penalty` more, since it cannot tell the agent anything new;
* a step's own logged ``reward``, if any, is added as is;
* the last decision receives the outcome: ``success_reward * r`` when the episode reward
  ``r`` reaches :attr:`RewardConfig.success_threshold`, else :attr:`RewardConfig.failure_reward`.

Penalties add up: a failed repeated call pays cost, error and repeat penalties.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from evoharness_agent.schema import Episode, Step

__all__ = ["RewardConfig", "call_key", "decision_reward", "outcome_reward", "shape_rewards"]


@dataclass(frozen=True)
class RewardConfig:
    """The weights of :func:`shape_rewards`; the defaults follow "success +10, useless -1"."""

    success_reward: float = 10.0
    """Outcome bonus of a successful episode, multiplied by its reward (in [0, 1])."""

    failure_reward: float = 0.0
    """Outcome of an episode whose reward is below ``success_threshold`` (e.g. 0)."""

    success_threshold: float = 0.5
    """Episode rewards at or above this count as success."""

    step_cost: float = 0.1
    """Cost of every tool call (subtracted), favouring short solutions."""

    error_penalty: float = 1.0
    """Extra cost of a tool call that failed (``step.error`` is true)."""

    repeat_penalty: float = 1.0
    """Extra cost of calling a tool with the same arguments as earlier in the same turn.

    A turn starts at the episode's start and at every ``user`` step.
    """

    default_episode_reward: float = 1.0
    """Episode reward assumed when the log has none.

    Logs without a reward are treated as successful demonstrations (imitation data), so
    the default 1.0 gives them the full ``success_reward``. Set it to 0.0 to treat them
    as failures instead.
    """


def decision_reward(step: Step, repeated: bool, config: RewardConfig = RewardConfig()) -> float:
    """Return the reward of one decision before the outcome: call cost, error and repeat penalties."""
    reward = 0.0
    if step.kind == "tool_call":
        reward -= config.step_cost
        if step.error:
            reward -= config.error_penalty
        if repeated:
            reward -= config.repeat_penalty
    return reward


def outcome_reward(outcome: float, config: RewardConfig = RewardConfig()) -> float:
    """Return what the last decision earns for an episode whose reward is ``outcome`` (in [0, 1])."""
    return config.success_reward * outcome if outcome >= config.success_threshold else config.failure_reward


def call_key(step: Step) -> tuple[str, str]:
    """Identify a call for the repeat rule: the action and its canonical JSON arguments."""
    # canonical JSON, so argument order and unhashable values do not matter
    return step.action, json.dumps(step.arguments, sort_keys=True, default=str)


def shape_rewards(episode: Episode, config: RewardConfig = RewardConfig()) -> list[float]:
    """Return one shaped reward per decision step of ``episode``, in order.

    An episode without decisions gets an empty list, so its outcome is not used.
    """
    rewards: list[float] = []
    seen: set[tuple[str, str]] = set()  # calls made so far in the current turn
    for step in episode.steps:
        if not step.is_decision:  # a user message opens a new turn
            seen.clear()
            continue
        call = call_key(step)
        reward = decision_reward(step, step.kind == "tool_call" and call in seen, config)
        if step.kind == "tool_call":
            seen.add(call)
        if step.reward is not None:
            reward += step.reward
        rewards.append(reward)
    if rewards:
        outcome = config.default_episode_reward if episode.reward is None else episode.reward
        rewards[-1] += outcome_reward(outcome, config)
    return rewards
