"""The zero-shot validation suite: well formed like the reported one, and disjoint from it and from the data."""

from __future__ import annotations

import io
import re
from collections.abc import Collection, Iterator, Sequence
from typing import Any

from rich.console import Console

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.evaluation.choosers import ChooserSession, EmbeddingChooser
from evoharness_agent.evaluation.zero_shot import (
    ZERO_SHOT_TASKS,
    ZERO_SHOT_TOOLSETS,
    evaluate_zero_shot,
    print_zero_shot,
    random_expectation,
)
from evoharness_agent.evaluation.zero_shot_validation import (
    VALIDATION_FIRST_REQUESTS,
    VALIDATION_TASKS,
    VALIDATION_TOOLSETS,
)
from evoharness_agent.schema import FINISH, Episode, Step, ToolSpec

BY_TASK = {task.task: task for task in VALIDATION_TASKS}
N_DECISIONS = sum(step.is_decision for task in VALIDATION_TASKS for step in task.steps)
FINISH_ONLY = [task for task in VALIDATION_TASKS if not any(step.kind == "tool_call" for step in task.steps)]
OURS = {tool.name for tools in VALIDATION_TOOLSETS.values() for tool in tools}


def calls(task: Episode) -> list[Step]:
    return [step for step in task.steps if step.kind == "tool_call"]


def id_arguments(arguments: Any) -> Iterator[tuple[str, str]]:
    """Every ``*_id`` argument, nested ones (a routine's actions) included."""
    if isinstance(arguments, dict):
        for key, value in arguments.items():
            if key.endswith("_id") and isinstance(value, str):
                yield key, value
            yield from id_arguments(value)
    elif isinstance(arguments, list):
        for value in arguments:
            yield from id_arguments(value)


# --------------------------------------------------------------------------- the suite


def test_the_reported_suite_keeps_its_ids() -> None:
    assert all(task.metadata["suite"] == "zero_shot" for task in ZERO_SHOT_TASKS)
    assert ZERO_SHOT_TASKS[0].id == "zero_shot_weather_units_email_paris_fahrenheit"


def test_gold_paths() -> None:
    for task in VALIDATION_TASKS:
        toolset = set(task.tool_names())
        assert [step.kind for step in task.steps[:-1]] == ["tool_call"] * (len(task.steps) - 1), task.id
        assert task.steps[-1].kind == "assistant" and task.steps[-1].content == task.final_answer
        assert 0 <= len(calls(task)) <= 4, task.id
        for step in calls(task):
            assert step.tool in toolset, (task.id, step.tool)
            assert step.observation, (task.id, step.tool)
        # No gold path calls a tool again right after it succeeded: every repeat counted is a mistake.
        for before, step in zip(task.steps, task.steps[1:], strict=False):
            if before.kind == "tool_call" and not before.error:
                assert step.action != before.tool, task.id
    assert 2 <= len(FINISH_ONLY) <= 3
    failed = [task.id for task in VALIDATION_TASKS if any(step.error for step in task.steps)]
    assert 1 <= len(failed) <= 2, "one or two calls fail and are retried"
    multi_step = [task for task in VALIDATION_TASKS if len(calls(task)) >= 2]
    assert len(multi_step) > len(VALIDATION_TASKS) / 2, "most tasks are multi-step"


def test_id_parameters_say_which_tool_returns_them() -> None:
    for tools in VALIDATION_TOOLSETS.values():
        names = {tool.name for tool in tools}
        for tool in tools:
            for key, prop in tool.parameters.get("properties", {}).items():
                if key.endswith("_id"):
                    sources = set(re.findall(r"\b[a-z]+(?:_[a-z]+)+\b", prop["description"]))
                    assert sources & names, (tool.name, key)


def test_ids_flow_from_observations_or_the_request() -> None:
    chained = 0
    for task in VALIDATION_TASKS:
        seen = ""
        for step in calls(task):
            for key, value in id_arguments(step.arguments):
                from_observation = f'"{value}"' in seen
                assert from_observation or value in task.task, (task.id, step.tool, key, value)
                chained += from_observation and value not in task.task
            seen += step.observation
    assert chained >= 15, "most calls need an id that an earlier call returned"
    naming = [task.id for task in VALIDATION_TASKS if any(name in task.task for name in task.tool_names())]
    assert len(naming) >= 2, "some requests name the tool they want"


def test_names_are_disjoint_from_the_reported_suite_and_the_bundled_data() -> None:
    from evoharness_agent.logs.bundled import all_domain_episodes

    reported = {tool.name for tools in ZERO_SHOT_TOOLSETS.values() for tool in tools}
    assert not OURS & reported
    assert not set(VALIDATION_TOOLSETS) & set(ZERO_SHOT_TOOLSETS)
    assert not {task.task for task in VALIDATION_TASKS} & {task.task for task in ZERO_SHOT_TASKS}
    bundled: set[str] = set()
    for episodes in all_domain_episodes().values():
        for episode in episodes:
            bundled.update(episode.tool_names())
            bundled.update(step.tool for step in episode.steps if step.tool)
    assert len(bundled) > 1000, "the bundled data were read"
    assert not OURS & bundled


# --------------------------------------------------------------------------- first requests


def test_first_requests_are_one_decision_each_over_the_validation_toolsets() -> None:
    by_toolset: dict[str, list[Episode]] = {}
    for item in VALIDATION_FIRST_REQUESTS:
        by_toolset.setdefault(item.metadata["toolset"], []).append(item)
        assert len(item.steps) == 1 and item.steps[0].is_decision, item.id
        assert item.tool_names() == [tool.name for tool in VALIDATION_TOOLSETS[item.metadata["toolset"]]]
    assert {name: len(items) for name, items in by_toolset.items()} == {name: 10 for name in VALIDATION_TOOLSETS}
    for name, items in by_toolset.items():
        assert sum(item.steps[0].action == FINISH for item in items) == 3, name
    requests = [item.task for item in VALIDATION_FIRST_REQUESTS]
    assert len(set(requests)) == len(requests) and len({item.id for item in VALIDATION_FIRST_REQUESTS}) == 50
    assert not set(requests) & ({task.task for task in VALIDATION_TASKS} | {task.task for task in ZERO_SHOT_TASKS})


def test_a_first_request_calls_a_tool_that_needs_an_id_only_when_the_request_gives_it() -> None:
    for item in VALIDATION_FIRST_REQUESTS:
        step = item.steps[0]
        if step.kind != "tool_call":
            continue
        tool = next(tool for tool in item.tools if tool.name == step.tool)
        required = set(tool.parameters.get("required") or [])
        assert required <= set(step.arguments), (item.id, required - set(step.arguments))
        for key, value in id_arguments(step.arguments):
            assert value in item.task, (item.id, key, value)


def test_scoring_first_requests(encoder: StateEncoder) -> None:
    report = evaluate_zero_shot(EmbeddingChooser(encoder, calls_per_turn=2), VALIDATION_FIRST_REQUESTS)
    assert report.overall.n_decisions == report.overall.n_tasks == 50
    # Similarity calls a tool first whatever the request: never right where the answer is due.
    assert all(decision.chosen != FINISH for decision in report.decisions)
    answers = [decision for decision in report.decisions if decision.gold == FINISH]
    assert len(answers) == 15 and not any(decision.correct for decision in answers)
    assert 0.0 < report.overall.step_accuracy <= 35 / 50


# --------------------------------------------------------------------------- scoring it


class _Gold:
    """A session that answers from the gold path."""

    def __init__(self, task: Episode) -> None:
        self.gold = [step.action for step in task.steps if step.is_decision]
        self.done = 0

    def observe(self, step: Step) -> None:
        self.done += step.is_decision

    def rank(self, available: Collection[str]) -> list[str]:
        first = self.gold[self.done]
        return [first, *sorted({*available, FINISH} - {first})]


class GoldChooser:
    name: str = "gold"

    def session(self, task: str, tools: Sequence[ToolSpec]) -> ChooserSession:
        assert [tool.name for tool in tools] == BY_TASK[task].tool_names()
        return _Gold(BY_TASK[task])


def test_the_gold_chooser_is_perfect_and_random_is_not() -> None:
    report = evaluate_zero_shot(GoldChooser(), VALIDATION_TASKS)
    overall = report.overall
    assert (overall.step_accuracy, overall.task_exact, overall.repeat_rate) == (1.0, 1.0, 0.0)
    assert overall.n_tasks == len(VALIDATION_TASKS) and overall.n_decisions == N_DECISIONS
    assert set(report.per_toolset) == set(VALIDATION_TOOLSETS)
    chance = random_expectation(VALIDATION_TASKS).overall
    assert chance.n_decisions == N_DECISIONS
    assert 0.0 < chance.step_accuracy < 0.2 and 0.0 < chance.task_exact < chance.step_accuracy
    out = io.StringIO()
    print_zero_shot([report, random_expectation(VALIDATION_TASKS)], Console(file=out, width=140))
    assert all(name in out.getvalue() for name in VALIDATION_TOOLSETS)


def test_embedding_similarity_on_the_validation_suite(encoder: StateEncoder) -> None:
    report = evaluate_zero_shot(EmbeddingChooser(encoder, calls_per_turn=2), VALIDATION_TASKS)
    overall = report.overall
    assert overall.n_tasks == len(VALIDATION_TASKS) and overall.n_decisions == N_DECISIONS
    assert 0.0 <= overall.step_accuracy <= 1.0 and 0.0 <= overall.task_exact <= 1.0
    assert overall.repeat_rate == 0.0  # it calls each tool at most once per turn
    assert all(0.0 <= scores.step_accuracy <= 1.0 for scores in report.per_toolset.values())
    assert {decision.chosen for decision in report.decisions} <= OURS | {FINISH}
