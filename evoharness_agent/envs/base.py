"""Gymnasium-style environments over LangChain tools whose rollouts are native episodes.

:class:`ToolUseEnv` runs an agent's decisions against real :class:`~langchain_core.tools.BaseTool`
objects. An action is a :class:`ToolAction`: a tool name plus arguments, or :data:`FINISH`
("answer the user now"). The API mirrors gymnasium without depending on it::

    env = ToolUseEnv(tools, success_fn=my_check, max_steps=20)
    obs, info = env.reset("Cancel reservation EHGLP3")
    obs, reward, terminated, truncated, info = env.step(ToolAction("get_reservation", {...}))
    ...
    episode = env.to_episode()  # the rollout as a training log

Nothing the agent does raises: an unknown tool, a tool that is not available yet, arguments
the tool rejects and exceptions inside the tool all come back as an observation whose
step has ``error=True``.

A task is a list of user turns (:class:`Task`). FINISH ends the current turn; the env then
logs the next user message as a ``user`` step and continues, and is terminated after the
last turn's FINISH. A turn may make more tools available (BFCL's missing functions).

Rewards default to :class:`EnvReward`, the online twin of
:func:`evoharness_agent.rewards.shape_rewards` (same :class:`~evoharness_agent.rewards.RewardConfig`
values: +10 for success at the end, -0.1 per tool call, -1 more per erroring call and per
repeated call) plus a penalty for running out of steps.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.tools import BaseTool
from pydantic import ValidationError

from evoharness_agent.rewards import RewardConfig, call_key, decision_reward, outcome_reward
from evoharness_agent.schema import (
    FINISH,
    Episode,
    Step,
    ToolSpec,
    as_tool_spec,
    invalid_arguments_text,
    tool_error_text,
    unavailable_tool_text,
    unknown_tool_text,
)

__all__ = [
    "EnvReward",
    "Observation",
    "RewardFn",
    "SuccessCheck",
    "Task",
    "ToolAction",
    "ToolUseEnv",
    "Transition",
    "output_has_error",
]


@dataclass(frozen=True)
class ToolAction:
    """One decision: call ``tool`` with ``arguments``, or FINISH the turn with ``content``."""

    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)
    content: str = ""
    """The reply to the user; only used by a FINISH action."""

    @classmethod
    def finish(cls, content: str = "") -> ToolAction:
        """Return the FINISH action ("reply to the user now") with an optional reply."""
        return cls(FINISH, content=content)

    @property
    def is_finish(self) -> bool:
        """Whether this action ends the current turn."""
        return self.tool == FINISH


@dataclass
class Task:
    """A task: one user message per turn, and which tools are available when."""

    turns: list[str]
    id: str = ""
    available_at_start: list[str] | None = None
    """Tools available in the first turn; ``None`` means every tool of the env."""
    tools_added: list[list[str]] = field(default_factory=list)
    """``tools_added[i]``: tools that become available when turn ``i`` starts."""
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Check there is a turn and align ``tools_added`` with the turns."""
        if not self.turns:
            raise ValueError("a task needs at least one user turn")
        if not self.tools_added:
            self.tools_added = [[] for _ in self.turns]
        if len(self.tools_added) != len(self.turns):
            raise ValueError(f"tools_added has {len(self.tools_added)} entries for "
                             f"{len(self.turns)} turns")

    @classmethod
    def from_episode(cls, episode: Episode) -> Task:
        """Build the task an episode was solving: its first message plus each user step."""
        users = [step for step in episode.steps if step.kind == "user"]
        return cls(
            turns=[episode.task] + [step.content for step in users],
            id=episode.id,
            available_at_start=(None if episode.available_at_start is None
                                else list(episode.available_at_start)),
            tools_added=[[]] + [list(step.tools_added) for step in users],
            metadata=copy.deepcopy(episode.metadata),
        )

    @classmethod
    def coerce(cls, task: Task | Episode | str) -> Task:
        """Return ``task`` as a :class:`Task` (a string is a one-turn task)."""
        if isinstance(task, Task):
            return task
        if isinstance(task, Episode):
            return cls.from_episode(task)
        if isinstance(task, str):
            return cls(turns=[task])
        raise TypeError(f"expected a Task, Episode or str, got {type(task).__name__}")


@dataclass(frozen=True)
class Observation:
    """What the agent sees before each decision."""

    task: str
    """The task text (the first user message)."""
    user_message: str
    """The user message of the current turn."""
    turn: int
    num_turns: int
    available_tools: tuple[str, ...]
    """Tools callable now (FINISH is always allowed and not listed)."""
    last_step: Step | None = None
    """The latest logged step: a tool call, or the ``user`` step that opened this turn."""


@dataclass(frozen=True)
class Transition:
    """What a reward function sees about one decision."""

    step: Step
    """The logged step: ``tool_call`` (with ``error``) or ``assistant`` (FINISH)."""
    repeated: bool
    """Same tool with identical arguments was already called in this turn."""
    turn_success: bool | None
    """Outcome of the turn this decision closed (FINISH only; ``None`` if unchecked)."""
    success: bool | None
    """Outcome of the episode, once it is over (``None`` if unchecked or not over)."""
    terminated: bool
    truncated: bool


SuccessCheck = Callable[["ToolUseEnv", int], bool]
"""``check(env, turn) -> bool``: did ``turn`` succeed? Called when the turn is FINISHed."""

RewardFn = Callable[[Transition], float]
"""``reward_fn(transition) -> float``: the reward of one decision."""


@dataclass(frozen=True)
class EnvReward:
    """The default reward: :func:`~evoharness_agent.rewards.shape_rewards` online, plus timeouts."""

    config: RewardConfig = field(default_factory=RewardConfig)
    timeout_penalty: float = 1.0
    """Extra cost of the decision at which the episode runs out of steps."""

    def __call__(self, transition: Transition) -> float:
        """Return the reward of one decision."""
        # The rules of shape_rewards, so a rollout's online rewards equal the shaped rewards
        # of its exported episode (up to the timeout penalty, which logs do not record).
        reward = decision_reward(transition.step, transition.repeated, self.config)
        over = transition.terminated or transition.truncated
        if over and transition.success is not None:
            reward += outcome_reward(float(transition.success), self.config)
        if transition.truncated:
            reward -= self.timeout_penalty
        return reward


def output_has_error(output: Any) -> bool:
    """Whether a tool's return value reports a failure (a dict with a truthy ``"error"``)."""
    return isinstance(output, dict) and bool(output.get("error"))


class ToolUseEnv:
    """A gymnasium-style environment over LangChain tools (see the module docstring)."""

    def __init__(
        self,
        tools: Sequence[BaseTool],
        task: Task | Episode | str | None = None,
        *,
        success_fn: SuccessCheck | None = None,
        reward_fn: RewardFn | None = None,
        max_steps: int = 30,
        is_error: Callable[[Any], bool] = output_has_error,
    ) -> None:
        """Create the env; ``task`` is the default for :meth:`reset`, ``max_steps`` counts decisions."""
        if max_steps < 1:
            raise ValueError("max_steps must be at least 1")
        self.tools: dict[str, BaseTool] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            if tool.name == FINISH:
                raise ValueError(f"{FINISH!r} is reserved for the answer-now action")
            self.tools[tool.name] = tool
        self.default_task = None if task is None else Task.coerce(task)
        self.success_fn = success_fn
        self.reward_fn: RewardFn = reward_fn or EnvReward()
        self.max_steps = max_steps
        self.is_error = is_error
        self.task: Task | None = None
        self.steps: list[Step] = []
        self.rewards: list[float] = []
        self.turn_results: list[bool | None] = []
        self.turn = 0
        self.terminated = False
        self.truncated = False
        self._turn_starts: list[int] = []
        self._available: set[str] = set()
        self._seen: set[tuple[str, str]] = set()

    # ------------------------------------------------------------------ gym API

    def reset(self, task: Task | Episode | str | None = None) -> tuple[Observation, dict[str, Any]]:
        """Start ``task`` (default: the one given at construction); return (obs, info)."""
        current = self.default_task if task is None else Task.coerce(task)
        if current is None:
            raise ValueError("no task: pass one to reset() or to the constructor")
        self.task = current
        self.steps = []
        self.rewards = []
        self.turn_results = []
        self.turn = 0
        self.terminated = False
        self.truncated = False
        self._turn_starts = [0]
        start = self.task.available_at_start
        self._available = set(self.tools if start is None else start)
        self._available |= set(self.task.tools_added[0])
        self._seen = set()
        return self._observation(), {"task_id": self.task.id, "num_turns": len(self.task.turns)}

    def step(
        self, action: ToolAction | str
    ) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        """Take one decision; return (obs, reward, terminated, truncated, info)."""
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        if self.terminated or self.truncated:
            raise RuntimeError("the episode is over; call reset()")
        if isinstance(action, str):
            action = ToolAction(action)
        repeated = False
        turn_success: bool | None = None
        if action.is_finish:
            step = Step(kind="assistant", content=action.content)
            self.steps.append(step)
            turn_success = None if self.success_fn is None else bool(self.success_fn(self, self.turn))
            self.turn_results.append(turn_success)
            self.terminated = self.turn == len(self.task.turns) - 1
        else:
            step = self._call(action)
            key = call_key(step)  # the repeat rule of rewards.shape_rewards
            repeated = key in self._seen
            self._seen.add(key)
            self.steps.append(step)
        self.truncated = not self.terminated and len(self.rewards) + 1 >= self.max_steps
        if action.is_finish and not self.terminated and not self.truncated:
            self._next_turn()
        success = self.success if (self.terminated or self.truncated) else None
        reward = float(self.reward_fn(Transition(step, repeated, turn_success, success,
                                                 self.terminated, self.truncated)))
        self.rewards.append(reward)
        info = {"turn": self.turn, "error": step.error, "turn_success": turn_success,
                "success": success, "decisions": len(self.rewards)}
        return self._observation(), reward, self.terminated, self.truncated, info

    # ------------------------------------------------------------------ queries

    @property
    def success(self) -> bool | None:
        """Episode outcome: every turn succeeded; ``None`` if unchecked or still running."""
        if self.truncated:
            return None if self.success_fn is None else False
        if not self.terminated or any(result is None for result in self.turn_results):
            return None
        return all(self.turn_results)

    def available_tools(self) -> list[str]:
        """Return the names of the tools the agent may call now, in the env's order."""
        return [name for name in self.tools if name in self._available]

    def turn_steps(self, turn: int | None = None) -> list[Step]:
        """Return the decisions (tool calls and FINISH) logged so far in ``turn`` (default: now)."""
        turn = self.turn if turn is None else turn
        if not 0 <= turn < len(self._turn_starts):
            raise IndexError(f"turn {turn} has not started")
        end = self._turn_starts[turn + 1] if turn + 1 < len(self._turn_starts) else len(self.steps)
        return [step for step in self.steps[self._turn_starts[turn]:end] if step.is_decision]

    def tool_specs(self) -> list[ToolSpec]:
        """Describe every tool of the env as a native :class:`ToolSpec`."""
        return [as_tool_spec(tool) for tool in self.tools.values()]

    def to_episode(self) -> Episode:
        """Export the rollout so far as a native :class:`Episode` (a training log).

        ``reward`` is the outcome (1.0 success, 0.0 failure, ``None`` if unknown), as in the
        benchmark logs; the env's per-decision rewards go to ``metadata["rollout"]`` rather
        than ``Step.reward``, which :func:`~evoharness_agent.rewards.shape_rewards` would add
        on top of its own shaping.
        """
        if self.task is None:
            raise RuntimeError("call reset() before to_episode()")
        start = self.task.available_at_start
        available = None if start is None else list(dict.fromkeys(start + self.task.tools_added[0]))
        answers = [step.content for step in self.steps if step.kind == "assistant"]
        success = self.success
        metadata = copy.deepcopy(self.task.metadata)
        metadata["rollout"] = {
            "rewards": list(self.rewards),
            "return": sum(self.rewards),
            "turn_success": list(self.turn_results),
            "terminated": self.terminated,
            "truncated": self.truncated,
        }
        return Episode(
            id=self.task.id,
            task=self.task.turns[0],
            tools=self.tool_specs(),
            available_at_start=available,
            steps=[step.model_copy(deep=True) for step in self.steps],
            final_answer=answers[-1] if answers else "",
            reward=None if success is None else float(success),
            metadata=metadata,
        )

    # ------------------------------------------------------------------ tool execution

    def execute(self, tool: BaseTool, arguments: dict[str, Any]) -> tuple[str, bool]:
        """Run ``tool`` on a copy of ``arguments``; return (observation text, error flag)."""
        try:
            # A copy, so a tool that mutates its input cannot change the logged arguments.
            output = tool.invoke(copy.deepcopy(arguments))
        except ValidationError as exc:
            return invalid_arguments_text(tool.name, exc), True
        except Exception as exc:  # any failure inside a tool is an observation, by contract
            return self.format_exception(exc), True
        return self.format_output(output), self.is_error(output)

    def format_output(self, output: Any) -> str:
        """Render a tool's return value as observation text (dicts and lists as JSON)."""
        if isinstance(output, str):
            return output
        if isinstance(output, (dict, list)):
            try:
                return json.dumps(output)
            except (TypeError, ValueError):  # e.g. objects or circular references inside
                return str(output)
        return str(output)

    def format_exception(self, exc: Exception) -> str:
        """Render an exception raised by a tool as observation text."""
        return tool_error_text(exc)

    # ------------------------------------------------------------------ internals

    def _call(self, action: ToolAction) -> Step:
        """Execute a tool call (or explain why it cannot run) and return its logged step."""
        arguments = copy.deepcopy(action.arguments)
        tool = self.tools.get(action.tool)
        if tool is None:
            text = unknown_tool_text(action.tool, self.available_tools())
            error = True
        elif action.tool not in self._available:
            text = unavailable_tool_text(action.tool)
            error = True
        else:
            text, error = self.execute(tool, arguments)
        return Step(kind="tool_call", tool=action.tool, arguments=arguments,
                    observation=text, error=error)

    def _next_turn(self) -> None:
        """Open the next turn: log its user message and make its new tools available."""
        assert self.task is not None
        self.turn += 1
        added = list(self.task.tools_added[self.turn])
        self._turn_starts.append(len(self.steps))
        self.steps.append(Step(kind="user", content=self.task.turns[self.turn], tools_added=added))
        self._available |= set(added)
        self._seen = set()

    def _observation(self) -> Observation:
        """Build the observation of the current state."""
        assert self.task is not None
        return Observation(
            task=self.task.turns[0],
            user_message=self.task.turns[self.turn],
            turn=self.turn,
            num_turns=len(self.task.turns),
            available_tools=tuple(self.available_tools()),
            last_step=self.steps[-1] if self.steps else None,
        )
