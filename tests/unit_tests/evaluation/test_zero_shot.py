"""The zero-shot suite: its tasks are well formed, its metrics are computed right, its names are new."""

from __future__ import annotations

import io
import json
from collections.abc import Collection, Sequence
from pathlib import Path

import pytest
from rich.console import Console

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.evaluation.choosers import ChooserSession, EmbeddingChooser
from evoharness_agent.evaluation.zero_shot import (
    ZERO_SHOT_TASKS,
    ZERO_SHOT_TOOLSETS,
    ZeroShotReport,
    evaluate_zero_shot,
    print_zero_shot,
    random_expectation,
)
from evoharness_agent.evaluation.zero_shot_validation import VALIDATION_TASKS, VALIDATION_TOOLSETS
from evoharness_agent.policy import ToolPolicy
from evoharness_agent.schema import FINISH, Episode, Step, ToolSpec

BY_TASK = {task.task: task for task in ZERO_SHOT_TASKS}
N_DECISIONS = sum(step.is_decision for task in ZERO_SHOT_TASKS for step in task.steps)
FINISH_ONLY = [task for task in ZERO_SHOT_TASKS if not any(step.kind == "tool_call" for step in task.steps)]

ALLOWED_OVERLAP = {"send_email"}
"""The one bundled-data name the suite uses: the weather case is specified over get_weather,
convert_temperature and send_email, and two bfcl_single episodes offer a send_email. No log calls
any other tool of the suite's, or offers it."""


def calls(task: Episode) -> list[Step]:
    return [step for step in task.steps if step.kind == "tool_call"]


def after_success(task: Episode) -> int:
    """Decisions of ``task`` right after a successful call."""
    return sum(1 for before, step in zip(task.steps, task.steps[1:], strict=False)
               if step.is_decision and before.kind == "tool_call" and not before.error)


# --------------------------------------------------------------------------- the suite


@pytest.mark.parametrize(("tasks", "toolsets", "suite", "min_tasks", "min_tools"), [
    (ZERO_SHOT_TASKS, ZERO_SHOT_TOOLSETS, "zero_shot", 20, 4),
    (VALIDATION_TASKS, VALIDATION_TOOLSETS, "zero_shot_validation", 24, 5),
], ids=["reported", "validation"])
def test_suite_size_and_shape(tasks: Sequence[Episode], toolsets: dict[str, tuple[ToolSpec, ...]], suite: str,
                              min_tasks: int, min_tools: int) -> None:
    assert len(toolsets) >= 5
    assert len(tasks) >= min_tasks
    assert len({task.task for task in tasks}) == len(tasks), "task texts are unique"
    assert len({task.id for task in tasks}) == len(tasks)
    for name, tools in toolsets.items():
        assert min_tools <= len(tools) <= 8, name
        assert all(tool.description and tool.name != FINISH for tool in tools)
    every_name = [tool.name for tools in toolsets.values() for tool in tools]
    assert len(every_name) == len(set(every_name)), "a tool name belongs to one toolset"
    assert {task.metadata["toolset"] for task in tasks} == set(toolsets)
    for task in tasks:
        assert task.id.startswith(f"{suite}_") and task.metadata["suite"] == suite
        assert task.tools == list(toolsets[task.metadata["toolset"]])
        assert task.available_at_start is None


def test_gold_paths() -> None:
    for task in ZERO_SHOT_TASKS:
        toolset = set(task.tool_names())
        assert [step.kind for step in task.steps[:-1]] == ["tool_call"] * (len(task.steps) - 1), task.id
        assert task.steps[-1].kind == "assistant" and task.steps[-1].content == task.final_answer
        assert len(calls(task)) in (0, 2, 3, 4), task.id
        for step in calls(task):
            assert step.tool in toolset, (task.id, step.tool)
            assert step.observation, (task.id, step.tool)
        # No gold path calls a tool again right after it succeeded: every repeat counted is a mistake.
        for before, step in zip(task.steps, task.steps[1:], strict=False):
            if before.kind == "tool_call" and not before.error:
                assert step.action != before.tool, task.id
    assert 1 <= len(FINISH_ONLY) <= 5
    assert any(step.error for task in ZERO_SHOT_TASKS for step in task.steps), "one call fails and is retried"


def test_the_paris_fahrenheit_case() -> None:
    task = BY_TASK["What is the weather in Paris right now, in Fahrenheit?"]
    assert {"get_weather", "convert_temperature", "send_email"} <= set(task.tool_names())
    assert [step.action for step in task.steps] == ["get_weather", "convert_temperature", FINISH]


SUITES = [(ZERO_SHOT_TASKS, ZERO_SHOT_TOOLSETS), (VALIDATION_TASKS, VALIDATION_TOOLSETS)]
"""The reported suite and the validation suite (for choosing settings): both are checked alike."""


@pytest.mark.parametrize(("tasks", "toolsets"), SUITES, ids=["reported", "validation"])
def test_arguments_satisfy_the_schemas(tasks: list[Episode], toolsets: dict[str, tuple[ToolSpec, ...]]) -> None:
    for task in tasks:
        specs = {tool.name: tool for tool in task.tools}
        for step in calls(task):
            schema = specs[str(step.tool)].parameters
            assert set(schema.get("required", [])) <= set(step.arguments), (task.id, step.tool)
            assert set(step.arguments) <= set(schema.get("properties", {})), (task.id, step.tool)
    assert sum(bool(tool.parameters.get("required")) for tools in toolsets.values() for tool in tools) >= 25


@pytest.mark.parametrize("tasks", [tasks for tasks, _ in SUITES], ids=["reported", "validation"])
def test_arguments_validate_against_the_full_json_schemas(tasks: list[Episode]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    for task in tasks:
        specs = {tool.name: tool for tool in task.tools}
        for step in calls(task):
            schema = specs[str(step.tool)].parameters
            jsonschema.Draft202012Validator.check_schema(schema)
            jsonschema.validate(step.arguments, schema)


def test_ids_flow_from_observations_and_requests_name_tools() -> None:
    chained = 0
    for task in ZERO_SHOT_TASKS:
        seen = ""
        for step in calls(task):
            values = [value for value in step.arguments.values() if isinstance(value, str)]
            chained += any(value in seen and value not in task.task for value in values)
            seen += step.observation
    assert chained >= 15, "several calls need an id that an earlier call returned"
    naming = [task.id for task in ZERO_SHOT_TASKS if any(name in task.task for name in task.tool_names())]
    assert len(naming) >= 2, "some requests name the tool they want"


def test_no_toolset_name_occurs_in_the_bundled_data() -> None:
    from evoharness_agent.logs.bundled import all_domain_episodes

    bundled: set[str] = set()
    for episodes in all_domain_episodes().values():
        for episode in episodes:
            bundled.update(episode.tool_names())
            bundled.update(step.tool for step in episode.steps if step.tool)
    assert len(bundled) > 1000, "the bundled data were read"
    ours = {tool.name for tools in ZERO_SHOT_TOOLSETS.values() for tool in tools}
    assert ours & bundled == ALLOWED_OVERLAP
    gold = {str(step.tool) for task in ZERO_SHOT_TASKS for step in calls(task)}
    assert gold & bundled <= ALLOWED_OVERLAP


# --------------------------------------------------------------------------- the metrics


class _Scripted:
    """A session that answers from the gold path; ``repeat`` puts the last successful call first."""

    def __init__(self, task: Episode, mode: str) -> None:
        self.gold = [step.action for step in task.steps if step.is_decision]
        self.mode = mode
        self.done = 0
        self.last: Step | None = None

    def observe(self, step: Step) -> None:
        self.done += step.is_decision
        self.last = step

    def rank(self, available: Collection[str]) -> list[str]:
        gold = self.gold[self.done]
        last = self.last
        if self.mode == "finish":  # answers at once, though it ranks the gold tool first among the tools
            return [FINISH, *([gold] if gold != FINISH else []), *sorted(set(available) - {gold})]
        if self.mode == "repeat" and last is not None and last.kind == "tool_call" and not last.error:
            first = str(last.tool)
        else:
            first = gold
        return [first, *sorted(set(available) - {first}), *([FINISH] if first != FINISH else [])]


class ScriptedChooser:
    """``gold``: always right; ``repeat``: the previous successful call again, else right; ``finish``."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.name = f"scripted-{mode}"

    def session(self, task: str, tools: Sequence[ToolSpec]) -> ChooserSession:
        assert [tool.name for tool in tools] == BY_TASK[task].tool_names()
        return _Scripted(BY_TASK[task], self.mode)


def test_the_gold_chooser_is_perfect() -> None:
    report = evaluate_zero_shot(ScriptedChooser("gold"))
    assert report.chooser == "scripted-gold"
    overall = report.overall
    assert (overall.step_accuracy, overall.task_exact, overall.repeat_rate) == (1.0, 1.0, 0.0)
    assert overall.tool_accuracy == 1.0
    assert overall.n_tasks == len(ZERO_SHOT_TASKS) and overall.n_decisions == N_DECISIONS
    assert overall.n_after_success == sum(after_success(task) for task in ZERO_SHOT_TASKS)
    assert set(report.per_toolset) == set(ZERO_SHOT_TOOLSETS)
    assert all(scores.step_accuracy == 1.0 for scores in report.per_toolset.values())
    assert len(report.decisions) == N_DECISIONS and all(d.chosen == d.gold for d in report.decisions)


def test_the_repeating_chooser_repeats_every_time() -> None:
    overall = evaluate_zero_shot(ScriptedChooser("repeat")).overall
    n_after = sum(after_success(task) for task in ZERO_SHOT_TASKS)
    assert overall.repeat_rate == 1.0
    assert overall.step_accuracy == pytest.approx((N_DECISIONS - n_after) / N_DECISIONS)
    # Only tasks with no decision after a successful call stay exact: those answered at once.
    assert overall.task_exact == pytest.approx(len(FINISH_ONLY) / len(ZERO_SHOT_TASKS))


def test_always_finish() -> None:
    report = evaluate_zero_shot(ScriptedChooser("finish"), name="finish")
    assert report.chooser == "finish"
    overall = report.overall
    assert overall.step_accuracy == pytest.approx(len(ZERO_SHOT_TASKS) / N_DECISIONS)  # each task's last
    assert overall.task_exact == pytest.approx(len(FINISH_ONLY) / len(ZERO_SHOT_TASKS))
    assert overall.repeat_rate == 0.0
    assert overall.tool_accuracy == 1.0  # the choice of tool is apart from when to answer
    assert all((d.tool_correct is None) == (d.gold == FINISH) for d in report.decisions)


def test_per_toolset_scores_add_up() -> None:
    report = evaluate_zero_shot(ScriptedChooser("repeat"))
    parts = report.per_toolset.values()
    assert sum(p.n_decisions for p in parts) == report.overall.n_decisions
    assert sum(p.n_tasks for p in parts) == report.overall.n_tasks
    assert sum(p.step_accuracy * p.n_decisions for p in parts) == pytest.approx(
        report.overall.step_accuracy * report.overall.n_decisions)
    for name, scores in report.per_toolset.items():
        tasks = [task for task in ZERO_SHOT_TASKS if task.metadata["toolset"] == name]
        assert scores.n_tasks == len(tasks)
        assert scores.n_after_success == sum(after_success(task) for task in tasks)


def test_random_expectation_is_exact() -> None:
    report = random_expectation()
    per_decision = [1.0 / (len(task.tools) + 1) for task in ZERO_SHOT_TASKS for step in task.steps
                    if step.is_decision]
    assert report.overall.step_accuracy == pytest.approx(sum(per_decision) / len(per_decision))
    exact = [(1.0 / (len(task.tools) + 1)) ** sum(step.is_decision for step in task.steps)
             for task in ZERO_SHOT_TASKS]
    assert report.overall.task_exact == pytest.approx(sum(exact) / len(exact))
    n_after = sum(after_success(task) for task in ZERO_SHOT_TASKS)
    repeat = sum(after_success(task) / (len(task.tools) + 1) for task in ZERO_SHOT_TASKS) / n_after
    assert report.overall.repeat_rate == pytest.approx(repeat)
    tools = [1.0 / len(task.tools) for task in ZERO_SHOT_TASKS for step in calls(task)]
    assert report.overall.tool_accuracy == pytest.approx(sum(tools) / len(tools))
    assert all(decision.chosen is None for decision in report.decisions)


def test_a_subset_without_calls_has_no_repeat_rate() -> None:
    report = evaluate_zero_shot(ScriptedChooser("gold"), FINISH_ONLY)
    assert report.overall.repeat_rate is None and report.overall.n_after_success == 0
    assert report.overall.n_decisions == len(FINISH_ONLY)


def test_json_and_table() -> None:
    reports = [evaluate_zero_shot(ScriptedChooser("gold")), random_expectation()]
    document = json.loads(json.dumps(reports[0].to_json()))
    assert document["chooser"] == "scripted-gold"
    assert document["overall"]["step_accuracy"] == 1.0
    assert set(document["per_toolset"]) == set(ZERO_SHOT_TOOLSETS)
    assert len(document["decisions"]) == N_DECISIONS
    assert {"task_id", "toolset", "step", "gold", "chosen", "correct", "tool_correct", "repeat"} <= set(
        document["decisions"][0])
    assert document["calibration"] is None  # a scripted chooser reports no probability
    out = io.StringIO()
    print_zero_shot(reports, Console(file=out, width=140))
    text = out.getvalue()
    assert "scripted-gold" in text and "random (expected)" in text and "1.000" in text
    assert all(name in text for name in ZERO_SHOT_TOOLSETS)


def test_write_json(tmp_path: Path) -> None:
    report: ZeroShotReport = random_expectation()
    path = tmp_path / "zero_shot.json"
    report.write_json(path)
    assert json.loads(path.read_text())["chooser"] == "random (expected)"


# --------------------------------------------------------------------------- real choosers


def test_embedding_similarity_through_the_chooser_interface(encoder: StateEncoder) -> None:
    report = evaluate_zero_shot(EmbeddingChooser(encoder, calls_per_turn=2))
    assert report.chooser == "embedding_similarity"
    assert report.overall.n_decisions == N_DECISIONS
    assert report.overall.repeat_rate == 0.0  # it calls each tool at most once per turn
    assert report.overall.step_accuracy > random_expectation().overall.step_accuracy


def test_a_tool_policy_is_wrapped(policy: ToolPolicy) -> None:
    tasks = [task for task in ZERO_SHOT_TASKS if task.metadata["toolset"] == "weather_units_email"]
    report = evaluate_zero_shot(policy, tasks)
    assert report.chooser == "policy"
    assert report.overall.n_decisions == sum(step.is_decision for task in tasks for step in task.steps)
    assert list(report.per_toolset) == ["weather_units_email"]
    for decision in report.decisions:
        assert decision.chosen in {*(tool.name for tool in ZERO_SHOT_TOOLSETS[decision.toolset]), FINISH}


def test_a_policy_report_measures_the_calibration_of_its_probabilities(policy: ToolPolicy) -> None:
    tasks = [task for task in ZERO_SHOT_TASKS if task.metadata["toolset"] == "crm"]
    report = evaluate_zero_shot(policy, tasks)
    calibration = report.calibration
    assert calibration is not None and calibration.n_decisions == report.overall.n_decisions
    assert calibration.accuracy == pytest.approx(report.overall.step_accuracy)
    confidences = [decision.confidence for decision in report.decisions]
    assert calibration.mean_confidence == pytest.approx(sum(c for c in confidences if c is not None) / len(confidences))
    # Each is the probability the policy itself reports for its top choice at that state.
    task = tasks[0]
    first = next(d for d in report.decisions if d.task_id == task.id and d.step > 0)
    ranking = policy.rank(task.task, task.steps[:first.step], task.tools, available=task.availability()[first.step])
    assert (first.chosen, first.confidence) == (ranking[0].tool, pytest.approx(ranking[0].probability))
    assert json.loads(json.dumps(report.to_json()))["calibration"]["ece"] == pytest.approx(calibration.ece)
