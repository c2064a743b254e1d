"""Synthetic logs over the tools of :mod:`tests.kit.tools`, and the config a test policy trains with."""

from __future__ import annotations

from evoharness_agent.schema import Episode, Step, as_tool_spec
from tests.kit.tools import TOOLS

CITIES = ["Paris", "Lyon", "Berlin", "Madrid", "Rome", "Oslo", "Vienna", "Prague", "Lisbon", "Dublin"]
TIME_TASKS = ["What time is it?", "Tell me the current time.", "What's the date and time now?",
              "Which time is it right now?", "Current time please."]


def training_episodes() -> list[Episode]:
    """Synthetic logs: weather → answer, search → calculator → answer, polling a job four times, …"""
    specs = [as_tool_spec(t) for t in TOOLS]
    episodes = []

    def add(kind: str, i: int, task: str, *steps: Step) -> None:
        episodes.append(Episode(id=f"{kind}{i}", task=task, tools=specs, steps=list(steps), reward=1.0))

    for i, city in enumerate(CITIES):
        add("weather", i, f"What is the weather like in {city} today?",
            Step(tool="get_weather", arguments={"city": city}, observation=f"Sunny, 21 C in {city}"),
            Step(kind="assistant", content=f"Sunny in {city}."))
        add("calc", i, f"Compute {i + 3} * {i + 7}.",
            Step(tool="calculator", arguments={"expression": f"{i + 3} * {i + 7}"},
                 observation=str((i + 3) * (i + 7))),
            Step(kind="assistant", content=str((i + 3) * (i + 7))))
        add("search", i, f"Find the population of {city} and double it.",
            Step(tool="search_web", arguments={"query": f"population of {city}"},
                 observation=f"{city} has {1000 * (i + 1)} people"),
            Step(tool="calculator", arguments={"expression": f"{1000 * (i + 1)} * 2"},
                 observation=str(2000 * (i + 1))),
            Step(kind="assistant", content=str(2000 * (i + 1))))
        add("delete", i, f"Delete the file /tmp/{city.lower()}.txt",
            Step(tool="delete_file", arguments={"path": f"/tmp/{city.lower()}.txt"}, observation="deleted"),
            Step(kind="assistant", content="Done."))
        add("time", i, TIME_TASKS[i % len(TIME_TASKS)],
            Step(tool="get_time", observation="2025-01-01 12:00"), Step(kind="assistant", content="It is noon."))
        polls = [Step(tool="check_job", arguments={"job_id": str(i)}, observation=f"job {i} is still running")
                 for _ in range(3)]
        add("poll", i, f"Wait until job {i} has finished.", *polls,
            Step(tool="check_job", arguments={"job_id": str(i)}, observation=f"job {i} has finished"),
            Step(kind="assistant", content=f"Job {i} has finished."))
    return episodes


POLICY_CONFIG = {
    "algorithm": {"name": "bc"},
    "model": {"hidden": 64},
    # The agents' tests take the policy's probabilities as they are: no validation split, so T = 1
    # (cross-fitting, "auto" with a validation split this small, is tested in test_cross_fit).
    "training": {"steps": 150, "batch_size": 64, "device": "cpu", "eval_every": 1000, "checkpoint_every": 1000,
                 "calibration_folds": 0},
    "logging": {"tensorboard": False},
    "data": {"val_fraction": 0.0},
}
