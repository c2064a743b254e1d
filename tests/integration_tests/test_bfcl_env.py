"""End-to-end BFCL multi-turn scenarios on bfcl-eval's real API classes."""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path

import pytest

from evoharness_agent.envs.base import ToolAction
from evoharness_agent.envs.bfcl import (
    BFCL_INSTALL_HINT,
    BFCLEnvironment,
    bfcl_available,
    load_bfcl_instances,
    replay_gold,
)
from evoharness_agent.logs.bundled import bfcl_paths, read_native
from evoharness_agent.rewards import shape_rewards
from evoharness_agent.schema import FINISH, Episode

pytestmark = pytest.mark.skipif(not bfcl_available(),
                                reason=f"bfcl_eval is not installed ({BFCL_INSTALL_HINT})")

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"

# The first base scenario using each API class (all eight classes are covered).
ONE_PER_CLASS = ["multi_turn_base_1", "multi_turn_base_2", "multi_turn_base_5",
                 "multi_turn_base_14", "multi_turn_base_15", "multi_turn_base_50",
                 "multi_turn_base_101", "multi_turn_base_150"]

# Upstream flaw: miss_func_49's gold calls `tail` two turns before the function is added,
# so an env that enforces availability cannot replay it (the converter flags it too).
KNOWN_UNREPLAYABLE = {"multi_turn_miss_func_49"}


@cache
def episodes(variant: str) -> dict[str, Episode]:
    """Load a BFCL variant: the converted data/ file, else convert the shared raw file."""
    (path,) = bfcl_paths([variant])
    if path.is_file():
        loaded = read_native(path)
    else:
        raw = SHARED / "bfcl" / f"multi_turn_{variant}.jsonl"
        if not raw.is_file():
            pytest.skip(f"neither {path} nor {raw} exists")
        spec = importlib.util.spec_from_file_location(
            "convert_shared_data", ROOT / "scripts" / "convert_shared_data.py")
        assert spec is not None and spec.loader is not None
        convert = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(convert)
        docs = convert.bfcl_tool_docs(SHARED)
        loaded = [convert.bfcl_episode(row, variant, docs) for row in convert.read_jsonl(raw)]
    return {episode.id: episode for episode in loaded}


def base(scenario_id: str) -> Episode:
    return episodes("base")[scenario_id]


def test_one_per_class_covers_every_api_class() -> None:
    classes = {c for sid in ONE_PER_CLASS for c in base(sid).metadata["involved_classes"]}
    assert classes == {"GorillaFileSystem", "MathAPI", "MessageAPI", "TwitterAPI", "TicketAPI",
                       "TradingBot", "TravelAPI", "VehicleControlAPI"}


@pytest.mark.parametrize("scenario_id", ONE_PER_CLASS)
def test_gold_calls_succeed_on_every_turn(scenario_id: str) -> None:
    episode = base(scenario_id)
    env = BFCLEnvironment(episode)
    obs, info = env.reset()
    assert obs.task == episode.task and info["num_turns"] == len(env.gold)
    assert set(obs.available_tools) <= set(episode.tool_names())
    total = 0.0
    for turn in range(len(env.gold)):
        for action in env.gold_actions(turn):
            obs, reward, terminated, truncated, info = env.step(action)
            assert not info["error"], obs.last_step
            total += reward
        obs, reward, terminated, truncated, info = env.step(ToolAction.finish())
        total += reward
        assert info["turn_success"] is True, env.turn_checks[-1]
    assert terminated and not truncated and env.success is True
    # Our execution reproduces the observations BFCL's own replay logged, call by call.
    logged = [s.observation for s in episode.steps if s.kind == "tool_call"]
    assert [s.observation for s in env.steps if s.kind == "tool_call"] == logged
    rollout = env.to_episode()
    assert rollout.reward == 1.0 and rollout.steps == episode.steps
    assert shape_rewards(rollout) == pytest.approx(env.rewards)
    assert total == pytest.approx(sum(env.rewards))


def test_rollout_episode_is_a_valid_scenario() -> None:
    env = BFCLEnvironment(base("multi_turn_base_14"))
    assert replay_gold(env) is True
    again = BFCLEnvironment(Episode.model_validate_json(env.to_episode().model_dump_json()))
    assert replay_gold(again) is True


@pytest.mark.parametrize("variant", ["base", "miss_func", "miss_param", "long_context"])
def test_gold_replay_success_fraction(variant: str) -> None:
    scenarios = episodes(variant)
    failed = sorted(sid for sid, episode in scenarios.items()
                    if not replay_gold(BFCLEnvironment(episode)))
    print(f"\n{variant}: gold replay succeeds on {len(scenarios) - len(failed)}/"
          f"{len(scenarios)}; failures: {failed}")
    assert len(scenarios) == 150
    assert set(failed) == KNOWN_UNREPLAYABLE & set(scenarios)


def test_wrong_tool_order_fails_the_turn() -> None:
    env = BFCLEnvironment(base("multi_turn_base_1"))
    env.reset()
    for action in env.gold_actions(0):
        env.step(action)
    env.step(ToolAction.finish())
    cd, mv = env.gold_actions(1)
    assert (cd.tool, mv.tool) == ("cd", "mv")
    obs, *_ = env.step(mv)  # moving before entering the directory: no such file here
    assert obs.last_step is not None and obs.last_step.error
    env.step(cd)
    _, reward, terminated, _, info = env.step(ToolAction.finish())
    assert info["turn_success"] is False and not terminated
    assert env.turn_checks[-1]["error_type"] == "multi_turn:instance_state_mismatch"


def test_skipping_a_turn_fails_and_so_does_the_episode() -> None:
    env = BFCLEnvironment(base("multi_turn_base_1"))
    env.reset()
    _, _, _, _, info = env.step(ToolAction.finish())
    assert info["turn_success"] is False
    assert env.turn_checks[0]["error_type"] == "multi_turn:empty_turn_model_response"
    for turn in range(1, len(env.gold)):
        for action in env.gold_actions(turn):
            env.step(action)
        _, reward, terminated, _, info = env.step(ToolAction.finish())
    assert terminated and info["success"] is False and reward == 0.0
    assert env.to_episode().reward == 0.0


def test_missing_result_fails_the_response_check() -> None:
    # base_1 turn 2 is cd + a read-only grep: grepping another pattern leaves the state
    # equal to the gold one, but the gold grep result is missing.
    env = BFCLEnvironment(base("multi_turn_base_1"))
    env.reset()
    for turn in range(2):
        for action in env.gold_actions(turn):
            env.step(action)
        env.step(ToolAction.finish())
    cd, grep = env.gold_actions()
    env.step(cd)
    env.step(ToolAction("grep", {**grep.arguments, "pattern": "no such text"}))
    _, _, _, _, info = env.step(ToolAction.finish())
    assert info["turn_success"] is False
    assert env.turn_checks[-1]["error_type"] == "multi_turn:execution_response_mismatch"


def test_gold_action_isolates_tool_choice() -> None:
    env = BFCLEnvironment(base("multi_turn_base_1"))
    env.reset()
    env.step(env.gold_action("ls"))
    env.step(ToolAction.finish())
    assert env.gold_action("cd") == ToolAction("cd", {"folder": "workspace"})
    wrong = env.gold_action("rmdir")  # not a gold tool of this turn: empty arguments
    assert wrong == ToolAction("rmdir")
    obs, *_ = env.step(wrong)
    assert obs.last_step is not None and obs.last_step.error
    assert obs.last_step.observation.startswith("Error during execution:")
    env.step(env.gold_action("cd"))
    # cd was used once: a second cd has no gold call left
    assert env.gold_action("cd") == ToolAction("cd")
    env.step(env.gold_action("mv"))
    assert env.gold_action(FINISH) == ToolAction.finish()
    _, _, _, _, info = env.step(env.gold_action(FINISH))
    assert info["turn_success"] is True  # the failed rmdir changed nothing


def test_a_failed_call_keeps_its_gold_arguments_for_the_retry() -> None:
    env = BFCLEnvironment(base("multi_turn_base_1"))
    env.reset()
    env.step(env.gold_action("ls"))
    env.step(ToolAction.finish())
    move = env.gold_action("mv")
    obs, *_ = env.step(move)  # before the cd: log.txt is not in this directory
    assert obs.last_step is not None and obs.last_step.error
    assert env.gold_action("mv") == move  # the retry gets them again, as an LLM would give them again
    env.step(env.gold_action("cd"))
    obs, *_ = env.step(env.gold_action("mv"))
    assert obs.last_step is not None and not obs.last_step.error
    assert env.gold_action("mv") == ToolAction("mv")  # a call that worked used them up
    _, _, _, _, info = env.step(ToolAction.finish())
    assert info["turn_success"] is True


def test_missing_function_becomes_available_later() -> None:
    episode = episodes("miss_func")["multi_turn_miss_func_1"]
    (added_turn, names), = episode.metadata["missed_function"].items()
    missing = names[0]
    env = BFCLEnvironment(episode)
    obs, _ = env.reset()
    assert missing in env.tools and missing not in obs.available_tools
    obs, *_ = env.step(ToolAction(missing, {}))
    assert obs.last_step is not None and obs.last_step.error
    assert "not available" in obs.last_step.observation
    assert replay_gold(env) is True
    user_steps = [s for s in env.steps if s.kind == "user"]
    assert user_steps[int(added_turn) - 1].tools_added == [missing]


def test_empty_gold_turn_requires_no_call() -> None:
    episode = base("multi_turn_base_167")
    last = len(BFCLEnvironment(episode).gold) - 1

    def play(env: BFCLEnvironment) -> bool | None:
        env.reset()
        for turn in range(last):
            for action in env.gold_actions(turn):
                env.step(action)
            env.step(ToolAction.finish())
        assert env.gold_actions() == []
        env.step(ToolAction("get_budget_fiscal_year", {}))
        env.step(ToolAction.finish())
        return env.success

    assert play(BFCLEnvironment(episode)) is False
    assert play(BFCLEnvironment(episode, strict_empty_turns=False)) is True


def test_long_context_loads_long_state() -> None:
    long_env = BFCLEnvironment(episodes("long_context")["multi_turn_long_context_1"])
    short_env = BFCLEnvironment(base("multi_turn_base_1"))
    assert long_env.long_context and not short_env.long_context
    listings = []
    for env in (long_env, short_env):
        env.reset()
        env.step(ToolAction("cd", {"folder": "workspace"}))
        env.step(ToolAction("cd", {"folder": "archive"}))
        obs, *_ = env.step(ToolAction("ls", {}))
        assert obs.last_step is not None and not obs.last_step.error
        listings.append(obs.last_step.observation)
    # BFCL's long-context mode fills the innermost directories with many files.
    assert listings[1] == '{"current_directory_content": []}'
    assert len(listings[0]) > 1000


def test_max_steps_truncates() -> None:
    env = BFCLEnvironment(base("multi_turn_base_1"), max_steps=2)
    env.reset()
    env.step(ToolAction("pwd"))
    _, reward, terminated, truncated, info = env.step(ToolAction("pwd"))
    assert truncated and not terminated and info["success"] is False
    assert replay_gold(env) is False


def test_reset_switches_scenario_and_restores_state() -> None:
    env = BFCLEnvironment(base("multi_turn_base_1"))
    assert replay_gold(env) is True
    obs, _ = env.reset(base("multi_turn_base_2"))
    assert env.involved_classes == base("multi_turn_base_2").metadata["involved_classes"]
    assert obs.task == base("multi_turn_base_2").task
    with pytest.raises(TypeError):
        env.reset("a plain string is not a scenario")
    # Fresh instances each reset: replaying twice gives the same verdict.
    assert replay_gold(env) is True and replay_gold(env) is True


def test_instances_do_not_share_the_config() -> None:
    episode = base("multi_turn_base_1")
    config = episode.metadata["initial_config"]
    before = repr(config)
    instances = load_bfcl_instances(["GorillaFileSystem"], config)
    instances["GorillaFileSystem"].mkdir(dir_name="new_dir")
    assert repr(config) == before
