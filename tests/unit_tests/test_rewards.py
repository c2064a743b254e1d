from __future__ import annotations

import dataclasses

import pytest

from evoharness_agent.rewards import RewardConfig, shape_rewards
from evoharness_agent.schema import Episode, Step


def call(tool: str = "search", error: bool = False, reward: float | None = None,
         **arguments: object) -> Step:
    return Step(kind="tool_call", tool=tool, arguments=arguments, error=error, reward=reward)


def answer(reward: float | None = None) -> Step:
    return Step(kind="assistant", content="done", reward=reward)


def user() -> Step:
    return Step(kind="user", content="and now?")


def episode(*steps: Step, reward: float | None = 1.0) -> Episode:
    return Episode(task="t", steps=list(steps), reward=reward)


def test_success_bonus_on_last_decision() -> None:
    rewards = shape_rewards(episode(call(q="a"), answer()))
    assert rewards == pytest.approx([-0.1, 10.0])


def test_partial_success_scales_the_bonus() -> None:
    assert shape_rewards(episode(answer(), reward=0.6)) == pytest.approx([6.0])


def test_failure_below_threshold() -> None:
    config = RewardConfig(failure_reward=-5.0)
    assert shape_rewards(episode(call(), reward=0.4), config) == pytest.approx([-5.1])
    assert shape_rewards(episode(call(), reward=0.0)) == pytest.approx([-0.1])


def test_missing_reward_uses_default() -> None:
    assert shape_rewards(episode(answer(), reward=None)) == pytest.approx([10.0])
    config = RewardConfig(default_episode_reward=0.0, failure_reward=-1.0)
    assert shape_rewards(episode(answer(), reward=None), config) == pytest.approx([-1.0])


def test_error_and_repeat_penalties_add_up() -> None:
    steps = [call(q="a"), call(q="a", error=True), call(q="b"), answer()]
    rewards = shape_rewards(episode(*steps, reward=0.0))
    assert rewards == pytest.approx([-0.1, -2.1, -0.1, 0.0])


def test_repeats_are_counted_per_turn_and_by_exact_arguments() -> None:
    steps = [call(a=1, b=2), call(b=2, a=1), call("other", a=1, b=2), user(),
             call(a=1, b=2), answer()]
    rewards = shape_rewards(episode(*steps, reward=0.0))
    assert rewards == pytest.approx([-0.1, -1.1, -0.1, -0.1, 0.0])


def test_step_rewards_are_added_and_user_steps_skipped() -> None:
    steps = [user(), call(reward=0.5), user(), answer(reward=-2.0)]
    rewards = shape_rewards(episode(*steps))
    assert rewards == pytest.approx([0.4, 8.0])
    assert len(rewards) == sum(step.is_decision for step in steps)


def test_no_decisions_no_rewards() -> None:
    assert shape_rewards(episode(user())) == []
    assert shape_rewards(episode()) == []


def test_custom_weights() -> None:
    config = RewardConfig(success_reward=1.0, step_cost=0.0, error_penalty=0.5,
                          repeat_penalty=0.0, success_threshold=0.9)
    steps = [call(error=True), call(error=True), answer()]
    assert shape_rewards(episode(*steps, reward=0.95), config) == pytest.approx(
        [-0.5, -0.5, 0.95])
    assert shape_rewards(episode(*steps, reward=0.8), config) == pytest.approx(
        [-0.5, -0.5, 0.0])


def test_config_is_frozen_and_documented() -> None:
    config = RewardConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.step_cost = 1.0  # type: ignore[misc]
    assert [f.name for f in dataclasses.fields(RewardConfig)] == [
        "success_reward", "failure_reward", "success_threshold", "step_cost",
        "error_penalty", "repeat_penalty", "default_episode_reward"]
