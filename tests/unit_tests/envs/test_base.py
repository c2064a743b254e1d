from __future__ import annotations

import pytest
from langchain_core.tools import BaseTool, ToolException, tool

from evoharness_agent.envs.base import (
    EnvReward,
    Observation,
    Task,
    ToolAction,
    ToolUseEnv,
    Transition,
    output_has_error,
)
from evoharness_agent.rewards import RewardConfig, shape_rewards
from evoharness_agent.schema import FINISH, Episode, Step


class Counter:
    """A tiny stateful backend the tools act on, so success can be checked on real state."""

    def __init__(self) -> None:
        self.value = 0


def make_tools(counter: Counter) -> list[BaseTool]:
    @tool
    def add(amount: int) -> dict:
        """Add amount to the counter."""
        counter.value += amount
        return {"value": counter.value}

    @tool
    def read() -> int:
        """Read the counter."""
        return counter.value

    @tool
    def explode(reason: str) -> str:
        """Always fail."""
        raise ValueError(f"boom: {reason}")

    @tool
    def refuse() -> dict:
        """Report an error the way many APIs do."""
        return {"error": "not allowed"}

    @tool
    def strict(x: int) -> str:
        """Fail with a ToolException."""
        raise ToolException(f"bad x {x}")

    return [add, read, explode, refuse, strict]


@pytest.fixture
def counter() -> Counter:
    return Counter()


@pytest.fixture
def env(counter: Counter) -> ToolUseEnv:
    return ToolUseEnv(make_tools(counter), "Add 5 to the counter.",
                      success_fn=lambda env, turn: counter.value == 5, max_steps=5)


def test_reset_returns_observation_and_info(env: ToolUseEnv) -> None:
    obs, info = env.reset()
    assert isinstance(obs, Observation)
    assert obs.task == obs.user_message == "Add 5 to the counter."
    assert obs.turn == 0 and obs.num_turns == 1
    assert obs.available_tools == ("add", "read", "explode", "refuse", "strict")
    assert obs.last_step is None
    assert info == {"task_id": "", "num_turns": 1}


def test_successful_episode_rewards(env: ToolUseEnv, counter: Counter) -> None:
    env.reset()
    obs, reward, terminated, truncated, info = env.step(ToolAction("add", {"amount": 5}))
    assert obs.last_step == Step(kind="tool_call", tool="add", arguments={"amount": 5},
                                 observation='{"value": 5}')
    assert reward == pytest.approx(-0.1)
    assert not terminated and not truncated and info["error"] is False
    obs, reward, terminated, truncated, info = env.step(ToolAction.finish("Done."))
    assert terminated and not truncated
    assert reward == pytest.approx(10.0)
    assert info["turn_success"] is True and info["success"] is True and env.success is True
    assert obs.last_step is not None and obs.last_step.kind == "assistant"
    with pytest.raises(RuntimeError, match="over"):
        env.step(ToolAction.finish())


def test_failed_episode_gets_no_bonus(env: ToolUseEnv) -> None:
    env.reset()
    env.step(ToolAction("add", {"amount": 4}))
    _, reward, terminated, _, info = env.step(FINISH)  # a bare string action is a tool name
    assert terminated and reward == 0.0
    assert info["success"] is False and env.success is False


def test_tool_exception_becomes_error_observation(env: ToolUseEnv) -> None:
    env.reset()
    obs, reward, *_, info = env.step(ToolAction("explode", {"reason": "test"}))
    assert obs.last_step is not None and obs.last_step.error
    assert obs.last_step.observation == "Error: ValueError: boom: test"
    assert info["error"] is True
    assert reward == pytest.approx(-1.1)
    obs, *_ = env.step(ToolAction("strict", {"x": 3}))
    assert obs.last_step is not None and obs.last_step.error
    assert "ToolException: bad x 3" in obs.last_step.observation


@pytest.mark.parametrize("arguments", [{}, {"amount": "five"}, {"amount": [1]}])
def test_invalid_arguments_become_error_observation(
    counter: Counter, arguments: dict
) -> None:
    env = ToolUseEnv(make_tools(counter), "x")
    env.reset()
    obs, reward, terminated, truncated, _ = env.step(ToolAction("add", arguments))
    step = obs.last_step
    assert step is not None and step.error and step.arguments == arguments
    assert step.observation.startswith("Error: invalid arguments for 'add'")
    assert counter.value == 0 and reward == pytest.approx(-1.1)
    assert not terminated and not truncated


def test_extra_argument_is_ignored_by_langchain_validation(counter: Counter) -> None:
    env = ToolUseEnv(make_tools(counter), "x")
    env.reset()
    obs, *_ = env.step(ToolAction("add", {"amount": 1, "extra": 2}))
    # LangChain validates with the tool's pydantic schema, which drops unknown keys.
    assert obs.last_step is not None and obs.last_step.observation == '{"value": 1}'


def test_unknown_tool_and_error_dict(env: ToolUseEnv) -> None:
    env.reset()
    obs, reward, *_ = env.step(ToolAction("delete_everything"))
    assert obs.last_step is not None and obs.last_step.error
    assert "unknown tool 'delete_everything'" in obs.last_step.observation
    assert "add, read" in obs.last_step.observation
    assert reward == pytest.approx(-1.1)
    obs, *_ = env.step(ToolAction("refuse"))
    assert obs.last_step is not None and obs.last_step.error
    assert obs.last_step.observation == '{"error": "not allowed"}'


def test_error_check_is_pluggable(counter: Counter) -> None:
    env = ToolUseEnv(make_tools(counter), "x", is_error=lambda output: output == 0)
    env.reset()
    obs, *_ = env.step(ToolAction("read"))
    assert obs.last_step is not None and obs.last_step.error
    obs, *_ = env.step(ToolAction("refuse"))
    assert obs.last_step is not None and not obs.last_step.error
    assert output_has_error({"error": "x"}) and not output_has_error({"error": None})


def test_max_steps_truncates_with_timeout_penalty(counter: Counter) -> None:
    env = ToolUseEnv(make_tools(counter), "x", success_fn=lambda env, turn: True, max_steps=3)
    env.reset()
    for _ in range(2):
        _, _, terminated, truncated, _ = env.step(ToolAction("read"))
        assert not terminated and not truncated
    _, reward, terminated, truncated, info = env.step(ToolAction("add", {"amount": 1}))
    assert truncated and not terminated
    # step cost + timeout penalty + failure outcome (0 by default)
    assert reward == pytest.approx(-0.1 - 1.0)
    assert info["success"] is False and env.success is False
    with pytest.raises(RuntimeError):
        env.step(ToolAction.finish())
    episode = env.to_episode()
    assert episode.reward == 0.0 and episode.metadata["rollout"]["truncated"] is True


def test_truncation_without_success_check_has_unknown_outcome(counter: Counter) -> None:
    env = ToolUseEnv(make_tools(counter), "x", max_steps=1)
    env.reset()
    _, reward, _, truncated, info = env.step(ToolAction("read"))
    assert truncated and info["success"] is None and env.to_episode().reward is None
    assert reward == pytest.approx(-1.1)


def test_repeated_call_is_penalised(env: ToolUseEnv) -> None:
    env.reset()
    rewards = [env.step(ToolAction("read"))[1] for _ in range(2)]
    assert rewards == pytest.approx([-0.1, -1.1])


def test_multi_turn_with_tools_added(counter: Counter) -> None:
    judged: list[int] = []

    def check(env: ToolUseEnv, turn: int) -> bool:
        judged.append(turn)
        return counter.value == [2, 5][turn]

    task = Task(turns=["Add 2.", "Now add 3."], id="t1", available_at_start=["add"],
                tools_added=[[], ["read"]], metadata={"source": "unit"})
    env = ToolUseEnv(make_tools(counter), success_fn=check)
    obs, info = env.reset(task)
    assert obs.available_tools == ("add",) and info["num_turns"] == 2
    obs, *_ = env.step(ToolAction("read"))
    assert obs.last_step is not None and obs.last_step.error
    assert "not available" in obs.last_step.observation
    env.step(ToolAction("add", {"amount": 2}))
    obs, reward, terminated, truncated, info = env.step(ToolAction.finish("Added 2."))
    assert not terminated and not truncated
    assert info["turn_success"] is True and info["success"] is None and info["turn"] == 1
    assert obs.turn == 1 and obs.user_message == "Now add 3." and obs.task == "Add 2."
    assert obs.available_tools == ("add", "read")
    assert obs.last_step == Step(kind="user", content="Now add 3.", tools_added=["read"])
    # a repeat penalty only applies within a turn
    _, reward, *_ = env.step(ToolAction("add", {"amount": 2}))
    assert reward == pytest.approx(-0.1)
    env.step(ToolAction("add", {"amount": 1}))
    assert [s.action for s in env.turn_steps(0)] == ["read", "add", FINISH]
    assert [s.action for s in env.turn_steps()] == ["add", "add"]
    _, reward, terminated, _, info = env.step(ToolAction.finish())
    assert terminated and judged == [0, 1]
    assert info["success"] is True and reward == pytest.approx(10.0)


def test_one_failed_turn_fails_the_episode(counter: Counter) -> None:
    env = ToolUseEnv(make_tools(counter), Task(turns=["a", "b"]),
                     success_fn=lambda env, turn: turn == 1)
    env.reset()
    env.step(ToolAction.finish())
    _, reward, terminated, _, info = env.step(ToolAction.finish())
    assert terminated and env.turn_results == [False, True]
    assert info["success"] is False and reward == 0.0


def test_to_episode_round_trip(counter: Counter) -> None:
    task = Task(turns=["Add 2.", "Add 3 more."], id="ep-7", available_at_start=["add"],
                tools_added=[[], ["read", "explode"]], metadata={"source": "unit"})
    env = ToolUseEnv(make_tools(counter),
                     success_fn=lambda env, turn: counter.value == [2, 5][turn])
    env.reset(task)
    actions = [ToolAction("add", {"amount": 2}), ToolAction("read"), ToolAction.finish("ok"),
               ToolAction("explode", {"reason": "r"}), ToolAction("add", {"amount": 3}),
               ToolAction("read"), ToolAction("read"), ToolAction.finish("Five.")]
    for action in actions:
        env.step(action)
    episode = env.to_episode()

    assert Episode.model_validate_json(episode.model_dump_json()) == episode
    assert episode.id == "ep-7" and episode.task == "Add 2." and episode.final_answer == "Five."
    assert episode.reward == 1.0
    assert episode.available_at_start == ["add"]
    assert [t.name for t in episode.tools] == ["add", "read", "explode", "refuse", "strict"]
    assert episode.tools[0].parameters["properties"]["amount"]["type"] == "integer"
    assert [s.kind for s in episode.steps] == ["tool_call", "tool_call", "assistant", "user",
                                              "tool_call", "tool_call", "tool_call",
                                              "tool_call", "assistant"]
    assert episode.steps[1].error  # read was not available in the first turn
    assert episode.metadata["source"] == "unit"
    assert episode.metadata["rollout"]["turn_success"] == [True, True]
    assert all(step.reward is None for step in episode.steps)
    # The exported log describes the same task, and offline shaping reproduces the
    # online rewards (success -> +10 at the end, 0.1 per call, +1 per error or repeat).
    assert Task.from_episode(episode) == Task(
        turns=task.turns, id="ep-7", available_at_start=["add"], tools_added=task.tools_added,
        metadata={**task.metadata, "rollout": episode.metadata["rollout"]})
    assert shape_rewards(episode) == pytest.approx(env.rewards)
    assert sum(env.rewards) == pytest.approx(episode.metadata["rollout"]["return"])

    # Replaying the logged decisions on a fresh backend reproduces the log.
    fresh = Counter()
    replay = ToolUseEnv(make_tools(fresh), episode)
    replay.reset()
    for step in episode.steps:
        if step.is_decision:
            replay.step(ToolAction(step.action, step.arguments, step.content))
    assert replay.steps == episode.steps and fresh.value == 5


def test_reset_accepts_episode(counter: Counter) -> None:
    episode = Episode(task="first", steps=[
        Step(kind="tool_call", tool="read"), Step(kind="assistant"),
        Step(kind="user", content="second", tools_added=["add"])],
        available_at_start=["read"])
    env = ToolUseEnv(make_tools(counter))
    obs, info = env.reset(episode)
    assert info["num_turns"] == 2 and obs.available_tools == ("read",)
    obs, *_ = env.step(ToolAction.finish())
    assert obs.user_message == "second" and obs.available_tools == ("add", "read")


def test_custom_reward_function_sees_transitions(counter: Counter) -> None:
    seen: list[Transition] = []

    def reward_fn(transition: Transition) -> float:
        seen.append(transition)
        return 1.0

    env = ToolUseEnv(make_tools(counter), "x", reward_fn=reward_fn,
                     success_fn=lambda env, turn: False)
    env.reset()
    env.step(ToolAction("read"))
    env.step(ToolAction("read"))
    _, reward, *_ = env.step(ToolAction.finish())
    assert reward == 1.0 and env.rewards == [1.0, 1.0, 1.0]
    assert [t.repeated for t in seen] == [False, True, False]
    assert seen[-1].terminated and seen[-1].success is False and seen[-1].turn_success is False


def test_env_reward_mirrors_reward_config() -> None:
    config = RewardConfig(success_reward=3.0, step_cost=0.5, error_penalty=2.0)
    reward = EnvReward(config, timeout_penalty=4.0)
    call = Step(kind="tool_call", tool="t", error=True)
    assert reward(Transition(call, True, None, None, False, False)) == pytest.approx(-3.5)
    finish = Step(kind="assistant")
    assert reward(Transition(finish, False, True, True, True, False)) == pytest.approx(3.0)
    assert reward(Transition(call, False, None, False, False, True)) == pytest.approx(-6.5)


def test_misuse_raises(counter: Counter) -> None:
    tools = make_tools(counter)
    with pytest.raises(ValueError, match="two tools"):
        ToolUseEnv([*tools, tools[0]])
    with pytest.raises(ValueError, match="max_steps"):
        ToolUseEnv(tools, max_steps=0)
    env = ToolUseEnv(tools)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(ToolAction.finish())
    with pytest.raises(ValueError, match="no task"):
        env.reset()
    with pytest.raises(ValueError, match="at least one"):
        Task(turns=[])
    with pytest.raises(TypeError):
        Task.coerce(3)  # type: ignore[arg-type]
