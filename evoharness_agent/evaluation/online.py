"""Online evaluation and data collection: roll choosers out in executable environments.

Offline metrics say whether a policy imitates the logs; here it acts. At each decision a
chooser (:mod:`~evoharness_agent.evaluation.choosers`) ranks the available actions (FINISH
included), the top one is taken, its arguments come from an *arguments function* (by
default the gold arguments of the env, which isolates tool choice from argument filling),
and the env executes it::

    env = BFCLEnvironment(episodes[0])
    choosers = [PolicyChooser(policy), RandomChooser(), BigramChooser(CountBaselines(train))]
    report = evaluate_online(env, episodes, choosers)
    report.write_markdown("online.md")

:func:`rollout` runs one chooser on one task, :func:`evaluate_online` every chooser on every
task into an :class:`OnlineReport`, and :func:`collect` rolls out a behaviour chooser and
returns the runs as native episodes (for offline RL).

A failed LLM call (a prompt over the context, a timeout, a provider error; see
:class:`~evoharness_agent.agents.llm_calls.LLMCallError`) costs one decision when it fills
arguments (the call is made without them) and one task when it chooses (the task ends as a
failure); both are counted in the results, and the run goes on. :func:`evaluate_online` can
append each task's result to a JSONL file as it finishes and show progress.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from evoharness_agent.agents.llm_calls import LLMCallError
from evoharness_agent.envs.base import Task, ToolAction, ToolUseEnv
from evoharness_agent.evaluation.choosers import Chooser
from evoharness_agent.evaluation.reports import online_markdown, plot_online_report
from evoharness_agent.runtime import append_line
from evoharness_agent.schema import FINISH, Episode

__all__ = [
    "ArgumentsFn",
    "EpisodeResult",
    "LLMArguments",
    "OnlineReport",
    "collect",
    "evaluate_online",
    "gold_arguments",
    "llm_arguments",
    "reward_turns",
    "rollout",
    "truncate_at_failed_turn",
]

ArgumentsFn = Callable[[ToolUseEnv, str], ToolAction]
"""``arguments(env, tool) -> ToolAction``: the call to make once ``tool`` is chosen (env holds the history)."""


def gold_arguments(env: ToolUseEnv, tool: str) -> ToolAction:
    """Call ``tool`` with the env's gold arguments (``env.gold_action``), isolating tool choice."""
    gold_action = getattr(env, "gold_action", None)
    if gold_action is None:
        raise TypeError(f"{type(env).__name__} has no gold_action(tool): pass another arguments function")
    return gold_action(tool)


class LLMArguments:
    """Fill the chosen tool's arguments with a LangChain chat model (``agents.llm_calls.fill_arguments``).

    A reply with no usable arguments, or a failed LLM call, costs that decision only: the call
    is made without arguments, so it shows as an invalid call. Failed calls are counted in
    :attr:`failures` (``rollout`` reports them per task as ``llm_failures``).
    """

    def __init__(self, llm: Any) -> None:
        """Use ``llm`` (a LangChain chat model) for every argument filling."""
        self.llm = llm
        self.failures = 0
        """LLM calls that failed so far (context overflow, timeout, provider error)."""
        self.last_error: str | None = None

    def __call__(self, env: ToolUseEnv, tool: str) -> ToolAction:
        """Return the call of ``tool`` with the LLM's arguments (none when the LLM gave none)."""
        from langchain_core.exceptions import OutputParserException
        from langchain_core.messages import HumanMessage

        from evoharness_agent.agents.llm_calls import build_messages, fill_arguments

        if tool == FINISH or tool not in env.tools:
            return ToolAction(tool)
        assert env.task is not None
        # Earlier user turns as history, the current one as the request, every result so far.
        earlier = [HumanMessage(turn) for turn in env.task.turns[:env.turn]]
        steps = [(step.tool or "", step.arguments, step.observation)
                 for step in env.steps if step.kind == "tool_call"]
        messages = build_messages(env.task.turns[env.turn], steps, chat_history=earlier)
        try:
            return ToolAction(tool, fill_arguments(self.llm, env.tools[tool], messages).arguments)
        except OutputParserException:
            # No usable arguments: make the call anyway, so the failure shows as an invalid call.
            return ToolAction(tool)
        except LLMCallError as error:
            self.failures += 1
            self.last_error = str(error)
            return ToolAction(tool)


def llm_arguments(llm: Any) -> LLMArguments:
    """Fill the chosen tool's arguments with a LangChain chat model (see :class:`LLMArguments`)."""
    return LLMArguments(llm)


# ---------------------------------------------------------------------------- rollouts


@dataclass
class EpisodeResult:
    """What one run of a chooser on one task did."""

    task_id: str
    success: bool | None
    """Every turn succeeded (``None``: the env has no success check)."""
    steps: int
    """Decisions taken (tool calls and FINISH)."""
    calls: int
    invalid_calls: int
    """Tool calls whose observation is an error (unknown or unavailable tool, bad arguments, failure)."""
    episode_return: float
    turns: int
    turns_succeeded: int
    truncated: bool
    llm_failures: int = 0
    """LLM calls that failed (context overflow, timeout, provider error); each cost its decision."""
    error: str | None = None
    """Why the task ended before the env ended it (a failed LLM choice); such a run is a failure."""


def _result(env: ToolUseEnv, *, llm_failures: int = 0, error: str | None = None) -> EpisodeResult:
    """Summarise the run ``env`` holds; a run ended by ``error`` is a failure."""
    calls = [step for step in env.steps if step.kind == "tool_call"]
    assert env.task is not None
    return EpisodeResult(
        task_id=env.task.id, success=False if error is not None else env.success, steps=len(env.rewards),
        calls=len(calls), invalid_calls=sum(step.error for step in calls), episode_return=float(sum(env.rewards)),
        turns=len(env.task.turns), turns_succeeded=sum(result is True for result in env.turn_results),
        truncated=env.truncated, llm_failures=llm_failures, error=error)


def rollout(env: ToolUseEnv, chooser: Chooser, task: Task | Episode | str | None = None, *,
            arguments: ArgumentsFn = gold_arguments) -> EpisodeResult:
    """Run ``chooser`` on ``task`` (default: the env's) until the episode ends; ``env`` keeps the run.

    A failed LLM call of the chooser (:class:`~evoharness_agent.agents.llm_calls.LLMCallError`)
    ends the task as a failure, with the error in :attr:`EpisodeResult.error`.
    """
    obs, _ = env.reset(task)
    failures_before = getattr(arguments, "failures", 0)  # counted by LLMArguments
    session = chooser.session(obs.task, env.tool_specs())
    seen = 0
    terminated = truncated = False
    while not (terminated or truncated):
        try:
            ranked = session.rank(obs.available_tools)
        except LLMCallError as error:
            failures = getattr(arguments, "failures", 0) - failures_before + 1
            return _result(env, llm_failures=failures, error=str(error))
        obs, _, terminated, truncated, _ = env.step(arguments(env, ranked[0] if ranked else FINISH))
        # One decision logs its step, and after FINISH also the next turn's user step.
        for step in env.steps[seen:]:
            session.observe(step)
        seen = len(env.steps)
    return _result(env, llm_failures=getattr(arguments, "failures", 0) - failures_before)


def reward_turns(episode: Episode, turn_reward: float) -> Episode:
    """Return a copy whose FINISH steps that closed a successful turn carry ``turn_reward`` as ``Step.reward``.

    Turn outcomes come from a rollout's ``metadata["rollout"]["turn_success"]``; a log without
    them (a gold demonstration) counts every turn as successful when its reward is 1.0.
    :func:`~evoharness_agent.rewards.shape_rewards` adds step rewards to its shaping, so
    offline RL then credits partial progress, not only whole-episode success.
    """
    episode = episode.model_copy(deep=True)
    finishes = [step for step in episode.steps if step.kind == "assistant"]
    outcomes = episode.metadata.get("rollout", {}).get("turn_success")
    if outcomes is None:
        outcomes = [episode.reward == 1.0] * len(finishes)
    for step, success in zip(finishes, outcomes, strict=False):
        if success:
            step.reward = (step.reward or 0.0) + turn_reward
    return episode


def truncate_at_failed_turn(episode: Episode) -> Episode:
    """Return a copy of a rollout that ends with the FINISH of its first failed turn.

    In multi-turn environments whose state carries over (BFCL), a failed turn leaves the
    state off the gold path, so every later turn fails whatever the agent does: keeping those
    steps would teach offline RL that right calls are worthless. The cut run is a failure.
    """
    outcomes = episode.metadata.get("rollout", {}).get("turn_success") or []
    if False not in outcomes:  # every turn succeeded, or the env does not judge turns (None)
        return episode
    episode = episode.model_copy(deep=True)
    failed_turn = outcomes.index(False)
    finishes = [index for index, step in enumerate(episode.steps) if step.kind == "assistant"]
    episode.steps = episode.steps[: finishes[failed_turn] + 1]
    episode.final_answer = episode.steps[-1].content or ""
    episode.metadata["rollout"]["turn_success"] = outcomes[: failed_turn + 1]
    episode.metadata["truncated_at_failed_turn"] = failed_turn
    episode.reward = 0.0
    return episode


def collect(env: ToolUseEnv, tasks: Iterable[Task | Episode], chooser: Chooser, *,
            arguments: ArgumentsFn = gold_arguments, repeats: int = 1, turn_reward: float = 0.0,
            until_failure: bool = False) -> list[Episode]:
    """Roll ``chooser`` out ``repeats`` times per task; return the runs as native episodes with env rewards.

    ``turn_reward`` > 0 also rewards each successful turn (see :func:`reward_turns`);
    ``until_failure`` cuts each run after its first failed turn (see :func:`truncate_at_failed_turn`).
    """
    episodes = []
    for task in tasks:
        for repeat in range(repeats):
            rollout(env, chooser, task, arguments=arguments)
            episode = env.to_episode()
            # Distinct ids per run, so several runs of one task are distinct log lines.
            episode.id = f"{episode.id}:{chooser.name}:{repeat}"
            episode.metadata["behaviour"] = chooser.name
            if until_failure:
                episode = truncate_at_failed_turn(episode)
            episodes.append(reward_turns(episode, turn_reward) if turn_reward else episode)
    return episodes


# ---------------------------------------------------------------------------- the report


def _mean(values: Sequence[float]) -> float | None:
    """Mean, or None for no values."""
    return float(np.mean(values)) if len(values) else None


@dataclass
class OnlineReport:
    """Per-task results of several choosers in one environment, with summaries and renderings."""

    env: str
    arguments: str
    results: dict[str, list[EpisodeResult]] = field(default_factory=dict)

    def summary(self) -> dict[str, dict[str, float | int | None]]:
        """Per chooser: tasks, success rate, turn success rate, mean steps and return, invalid-call rate."""
        out: dict[str, dict[str, float | int | None]] = {}
        for name, runs in self.results.items():
            judged = [run.success for run in runs if run.success is not None]
            calls = sum(run.calls for run in runs)
            out[name] = {
                "tasks": len(runs),
                "success_rate": _mean([float(s) for s in judged]),
                "turn_success_rate": (sum(r.turns_succeeded for r in runs) / sum(r.turns for r in runs)
                                      if judged else None),
                "avg_steps": _mean([run.steps for run in runs]),
                "avg_return": _mean([run.episode_return for run in runs]),
                "invalid_call_rate": sum(run.invalid_calls for run in runs) / calls if calls else 0.0,
                "llm_failures": sum(run.llm_failures for run in runs),
            }
        return out

    def to_json(self) -> dict[str, Any]:
        """Return the JSON document: env, arguments, summary and per-task results."""
        return {"env": self.env, "arguments": self.arguments, "summary": self.summary(),
                "per_task": {name: [asdict(run) for run in runs] for name, runs in self.results.items()}}

    def write_json(self, path: str | Path) -> None:
        """Write :meth:`to_json` to ``path``."""
        Path(path).write_text(json.dumps(self.to_json(), indent=2))

    def to_markdown(self) -> str:
        """Return a summary table and a per-task table (✓/✗ and steps per chooser)."""
        return online_markdown(self)

    def write_markdown(self, path: str | Path) -> None:
        """Write :meth:`to_markdown` to ``path``."""
        Path(path).write_text(self.to_markdown())

    def plot(self, path: str | Path) -> None:
        """Save a PNG: success / turn-success / invalid-call rates, and mean steps and return, per chooser."""
        plot_online_report(self, path)


def evaluate_online(env: ToolUseEnv, tasks: Sequence[Task | Episode], choosers: Sequence[Chooser], *,
                    arguments: ArgumentsFn = gold_arguments, env_name: str = "env",
                    arguments_name: str = "gold", results_path: str | Path | None = None,
                    show_progress: bool = False, console: Console | None = None) -> OnlineReport:
    """Run every chooser on every task in ``env``; return their per-task results.

    ``results_path``: append each task's result, as it finishes, to this JSONL file (one
    ``{"run", "chooser", ...EpisodeResult}`` line, written whole), so an interrupted run keeps
    what it measured. ``show_progress``: a progress bar with the tasks done, the successes so
    far and the time left (on ``console``).
    """
    names = [chooser.name for chooser in choosers]
    if len(set(names)) != len(names):
        raise ValueError(f"chooser names must be distinct: {names}")
    report = OnlineReport(env_name, arguments_name)
    run_id = time.strftime("%Y-%m-%dT%H:%M:%S")
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[successes]} succeeded"), TimeElapsedColumn(), TimeRemainingColumn(),
                        console=console, disable=not show_progress)
    with progress:
        for chooser in choosers:
            bar = progress.add_task(f"{env_name} {chooser.name}", total=len(tasks), successes=0)
            runs = report.results[chooser.name] = []
            for task in tasks:
                result = rollout(env, chooser, task, arguments=arguments)
                runs.append(result)
                if results_path is not None:
                    append_line(results_path, json.dumps({"run": run_id, "env": env_name, "chooser": chooser.name,
                                                          **asdict(result)}))
                progress.update(bar, advance=1, successes=sum(run.success is True for run in runs))
                if show_progress and not progress.console.is_terminal:
                    _log_progress(progress, bar)
    return report


def _log_progress(progress: Progress, bar: TaskID) -> None:
    """Print one line of progress: a bar is not redrawn when the output is a file or a pipe (a log)."""
    task = progress.tasks[bar]
    left = f", about {task.time_remaining / 60:.0f} min left" if task.time_remaining else ""
    progress.console.print(f"{task.description}: {task.completed:.0f}/{task.total:.0f} tasks, "
                           f"{task.fields['successes']} succeeded{left}", highlight=False)
