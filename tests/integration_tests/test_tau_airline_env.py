"""tau-bench airline tasks on the bundled database: tools, gold replay, success, online runs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from evoharness_agent.envs.base import ToolAction
from evoharness_agent.envs.registry import load_environment
from evoharness_agent.envs.tau_airline import (
    TauAirlineEnvironment,
    airline_functions,
    db_hash,
    load_airline_db,
    tau_airline_split,
)
from evoharness_agent.evaluation.online import evaluate_online, rollout
from evoharness_agent.logs.bundled import read_native, tau_airline_test_path
from evoharness_agent.schema import FINISH, Episode, Step, ToolSpec

RAW = Path(__file__).resolve().parents[3] / "shared" / "data" / "tau_bench" / "airline_test.jsonl"
INITIAL_HASH = "4587e6b48ad2b2c4f3e1fecb40aabec7bb2286513273b8f8cec3f5865222f290"


@cache
def tasks() -> dict[int, Episode]:
    return {int(e.metadata["task_index"]): e for e in read_native(tau_airline_test_path())}


def replay(env: TauAirlineEnvironment) -> list[str]:
    env.reset()
    for action in env.gold_actions(0):
        env.step(action)
    observations = [s.observation for s in env.steps if s.kind == "tool_call"]
    env.step(ToolAction.finish())
    return observations


def test_database_hash_is_tau_bench_s() -> None:
    # Read-only tasks' gold final hash in the raw data is the hash of the untouched database.
    assert db_hash(load_airline_db()) == INITIAL_HASH
    assert set(load_airline_db()) == {"flights", "reservations", "users"}


def check_gold_replay(indices: Sequence[int]) -> None:
    raw = {}
    if RAW.is_file():
        raw = {row["task_index"]: row["gold_final_db_hash"] for row in map(json.loads, RAW.read_text().splitlines())}
    for index in indices:
        episode = tasks()[index]
        env = TauAirlineEnvironment(episode)
        logged = [s.observation for s in episode.steps if s.kind == "tool_call"]
        assert replay(env) == logged, episode.id
        assert env.success is True, episode.id
        if raw:  # tau-bench's own gold final state
            assert db_hash(env.data) == raw[index], episode.id


def test_gold_replay_of_some_tasks() -> None:
    # A booking, updates of flights (cabin kept, sic), passengers and baggage, a cancellation,
    # a certificate, and a task without gold calls.
    check_gold_replay([0, 2, 4, 26, 45, 49])


def test_a_partial_log_offers_every_tool_online() -> None:
    # Task 0's gold names no look-up, so its log offers only the tools it could record; a live
    # agent on the task still has every tool, the look-ups first of all.
    episode = tasks()[0]
    assert episode.metadata["partial_gold"] and "get_reservation_details" not in episode.availability()[0]
    env = TauAirlineEnvironment(episode)
    obs, _ = env.reset(episode)
    assert set(obs.available_tools) == set(episode.tool_names())


@pytest.mark.slow
def test_gold_replay_of_every_task() -> None:
    assert len(tasks()) == 50
    check_gold_replay(sorted(tasks()))


def test_wrong_or_missing_writes_fail() -> None:
    env = TauAirlineEnvironment(tasks()[43])  # gold: get_reservation_details, update_reservation_passengers
    env.reset()
    _, reward, terminated, _, info = env.step(ToolAction.finish())
    assert terminated and info["success"] is False and reward == 0.0
    env.reset()
    (_, update) = env.gold_actions(0)
    passengers = [dict(p, first_name="Someone") for p in update.arguments["passengers"]]
    env.step(ToolAction("update_reservation_passengers", {**update.arguments, "passengers": passengers}))
    _, _, _, _, info = env.step(ToolAction.finish())
    assert info["success"] is False


def test_read_only_tasks_need_results_only_with_check_results() -> None:
    episode = tasks()[41]  # one look-up, no write
    assert [s.tool for s in episode.steps if s.kind == "tool_call"] == ["get_reservation_details"]
    lenient, strict = TauAirlineEnvironment(episode), TauAirlineEnvironment(episode, check_results=True)
    for env, expected in ((lenient, True), (strict, False)):
        env.reset()
        env.step(ToolAction.finish())
        assert env.success is expected
    assert replay(strict) and strict.success is True


def test_tool_errors_are_error_observations() -> None:
    env = TauAirlineEnvironment(tasks()[0])
    env.reset()
    obs, reward, *_ = env.step(ToolAction("get_reservation_details", {"reservation_id": "NOPE00"}))
    assert obs.last_step is not None and obs.last_step.error
    assert obs.last_step.observation == "Error: user not found"  # tau-bench's wording
    obs, *_ = env.step(ToolAction("cancel_reservation", {}))  # missing argument
    assert obs.last_step is not None and obs.last_step.error
    obs, *_ = env.step(env.gold_action("book_reservation"))
    assert obs.last_step is not None and not obs.last_step.error
    assert json.loads(obs.last_step.observation)["reservation_id"] == "HATHAT"


def test_tools_without_side_effects_and_calculate() -> None:
    data = load_airline_db()
    tools = airline_functions(data)
    assert tools["calculate"]("2 + 3 * (4 - 1) / 2") == "6.5"
    assert tools["calculate"]("__import__('os')").startswith("Error: invalid characters")
    assert tools["calculate"]("1 / 0").startswith("Error:")
    assert tools["think"]("hmm") == "" and tools["transfer_to_human_agents"]("help") == "Transfer successful"
    assert json.loads(tools["list_all_airports"]())["LGA"] == "LaGuardia"
    legs = json.loads(tools["search_onestop_flight"]("JFK", "SEA", "2024-05-20"))
    assert legs and all(first["destination"] == second["origin"] for first, second in legs)
    assert db_hash(data) == INITIAL_HASH
    assert tools["send_certificate"]("mia_li_3668", 100).startswith("Certificate certificate_3221322 added")
    assert db_hash(data) != INITIAL_HASH


class Gold:
    """An oracle chooser: each task's gold decisions in order."""

    name = "gold"

    def __init__(self, episodes: Sequence[Episode]) -> None:
        self.plans = {e.task: [s.action for s in e.steps if s.is_decision] for e in episodes}

    def session(self, task: str, tools: Sequence[ToolSpec]) -> Gold:
        self.plan = iter(self.plans[task])
        return self

    def observe(self, step: Step) -> None:
        pass

    def rank(self, available: Any) -> list[str]:
        return [next(self.plan, FINISH)]


def test_online_environment_split_and_report() -> None:
    setup = load_environment("tau-airline", split="test")
    assert [int(e.metadata["task_index"]) for e in setup.tasks] == list(range(40, 50))
    assert len(setup.train_episodes) == 40
    train, test = tau_airline_split(list(tasks().values()))
    assert (len(train), len(test)) == (40, 10)
    report = evaluate_online(setup.env, setup.tasks, [Gold(setup.tasks)], env_name=setup.name)
    assert report.summary()["gold"]["success_rate"] == 1.0
    assert report.summary()["gold"]["invalid_call_rate"] == 0.0
    result = rollout(setup.env, Gold(setup.tasks), setup.tasks[3])
    assert result.success is True and setup.env.to_episode().reward == 1.0
