"""Online evaluation and data collection: run tool choosers in executable environments.

Offline metrics say whether a policy imitates the logs; here it acts. At each decision a
*chooser* ranks the available actions (FINISH included), the top one is taken, its
arguments come from an *arguments function* (by default the gold arguments of the env,
which isolates tool choice from argument filling), and the env executes it::

    env = BFCLEnvironment(episodes[0])
    choosers = [PolicyChooser(policy), RandomChooser(), BigramChooser(CountBaselines(train))]
    report = evaluate_online(env, episodes, choosers)
    report.write_markdown("online.md")

Choosers share one interface (:class:`Chooser`): ``chooser.session(task, tools)`` starts a
run, ``session.observe(step)`` sees each logged step, ``session.rank(available)`` returns
action names best first. Besides :class:`PolicyChooser` there are the baselines
:class:`RandomChooser`, :class:`BigramChooser`, :class:`EmbeddingChooser`,
:class:`LLMChooser` ("LLM chooses", any LangChain chat model with ``bind_tools``) and
:class:`EpsilonChooser` (an epsilon mix with random, a behaviour policy for
:func:`collect`, which rolls out a chooser and returns the runs as native episodes).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from rich.console import Console
from rich.table import Table

from evoharness_agent.encoding import StateEncoder
from evoharness_agent.envs import Task, ToolAction, ToolUseEnv
from evoharness_agent.evaluation import CountBaselines
from evoharness_agent.policy import PolicySession, ToolPolicy
from evoharness_agent.schema import FINISH, Episode, Step, ToolSpec

__all__ = [
    "BEHAVIOURS",
    "ENVIRONMENTS",
    "SPLITS",
    "ArgumentsFn",
    "BigramChooser",
    "Chooser",
    "ChooserSession",
    "EmbeddingChooser",
    "EnvSetup",
    "EpisodeResult",
    "EpsilonChooser",
    "LLMChooser",
    "OnlineReport",
    "PolicyChooser",
    "RandomChooser",
    "behaviour_chooser",
    "collect",
    "evaluate_online",
    "gold_arguments",
    "llm_arguments",
    "load_environment",
    "print_online_report",
    "reward_turns",
    "rollout",
    "truncate_at_failed_turn",
]

BEHAVIOURS = ("random", "epsilon-policy", "policy")
ENVIRONMENTS = ("bfcl", "tau-airline")
SPLITS = ("train", "test", "all")

ArgumentsFn = Callable[[ToolUseEnv, str], ToolAction]
"""``arguments(env, tool) -> ToolAction``: the call to make once ``tool`` is chosen (env holds the history)."""


def gold_arguments(env: ToolUseEnv, tool: str) -> ToolAction:
    """Call ``tool`` with the env's gold arguments (``env.gold_action``), isolating tool choice."""
    gold_action = getattr(env, "gold_action", None)
    if gold_action is None:
        raise TypeError(f"{type(env).__name__} has no gold_action(tool): pass another arguments function")
    return gold_action(tool)


def llm_arguments(llm: Any) -> ArgumentsFn:
    """Fill the chosen tool's arguments with a LangChain chat model (``arguments.fill_arguments``)."""
    from langchain_core.exceptions import OutputParserException
    from langchain_core.messages import HumanMessage

    from evoharness_agent.arguments import build_messages, fill_arguments

    def fill(env: ToolUseEnv, tool: str) -> ToolAction:
        if tool == FINISH or tool not in env.tools:
            return ToolAction(tool)
        assert env.task is not None
        # Earlier user turns as history, the current one as the request, every result so far.
        earlier = [HumanMessage(turn) for turn in env.task.turns[:env.turn]]
        steps = [(step.tool or "", step.arguments, step.observation)
                 for step in env.steps if step.kind == "tool_call"]
        messages = build_messages(env.task.turns[env.turn], steps, chat_history=earlier)
        try:
            return ToolAction(tool, fill_arguments(llm, env.tools[tool], messages).arguments)
        except OutputParserException:
            # No usable arguments: make the call anyway, so the failure shows as an invalid call.
            return ToolAction(tool)

    return fill


class ChooserSession(Protocol):
    """A chooser's view of one run."""

    def observe(self, step: Step) -> None:
        """Record a logged step (tool call, reply or user message)."""
        ...

    def rank(self, available: Collection[str]) -> list[str]:
        """Return actions (FINISH included) best first; the first one is taken."""
        ...


class Chooser(Protocol):
    """Anything that picks the next action: a trained policy, a baseline, an LLM."""

    name: str

    def session(self, task: str, tools: Sequence[ToolSpec]) -> ChooserSession:
        """Start a run on ``task`` with every tool the env knows (available or not yet)."""
        ...


# ---------------------------------------------------------------------------- choosers


class _PolicyRun:
    """A :class:`PolicySession` answering with names."""

    def __init__(self, session: PolicySession) -> None:
        self.session = session

    def observe(self, step: Step) -> None:
        self.session.observe(step)

    def rank(self, available: Collection[str]) -> list[str]:
        return [score.tool for score in self.session.rank(available)]


class PolicyChooser:
    """The trained :class:`~evoharness_agent.policy.ToolPolicy`: its top-ranked action."""

    def __init__(self, policy: ToolPolicy, name: str = "policy") -> None:
        self.policy = policy
        self.name = name

    def session(self, task: str, tools: Sequence[ToolSpec]) -> ChooserSession:
        """Start an incremental policy session (each new step is embedded once)."""
        return _PolicyRun(self.policy.session(task, tools))


class _RandomRun:
    """Uniformly random order of the available actions at every decision."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def observe(self, step: Step) -> None:
        """Random choices ignore the history."""

    def rank(self, available: Collection[str]) -> list[str]:
        actions = [*sorted(available), FINISH]
        return [actions[i] for i in self.rng.permutation(len(actions))]


class RandomChooser:
    """Uniformly random among the available tools and FINISH (reproducible from ``seed``)."""

    def __init__(self, seed: int = 0, name: str = "random") -> None:
        self.rng = np.random.default_rng(seed)
        self.name = name

    def session(self, task: str, tools: Sequence[ToolSpec]) -> ChooserSession:
        """Start a run with its own generator, drawn from the chooser's."""
        return _RandomRun(np.random.default_rng(self.rng.integers(2**63)))


class _BigramRun:
    """Follows the previous action of the turn by log counts."""

    def __init__(self, counts: CountBaselines) -> None:
        self.counts = counts
        self.previous: str | None = None

    def observe(self, step: Step) -> None:
        # A user message or a reply starts a new turn: the next action follows nothing.
        self.previous = step.tool if step.kind == "tool_call" else None

    def rank(self, available: Collection[str]) -> list[str]:
        names = [*sorted(available), FINISH]
        scores = self.counts.turn_scores(names, self.previous)
        return [names[i] for i in np.argsort(-scores, kind="stable")]


class BigramChooser:
    """The action (FINISH included) that most often followed the turn's previous action in the logs."""

    def __init__(self, counts: CountBaselines, name: str = "bigram") -> None:
        self.counts = counts
        self.name = name

    def session(self, task: str, tools: Sequence[ToolSpec]) -> ChooserSession:
        """Start a run at a turn start."""
        return _BigramRun(self.counts)


class _EmbeddingRun:
    """Most similar uncalled tool of the turn; FINISH after ``calls_per_turn`` calls."""

    def __init__(self, encoder: StateEncoder, task: str, tools: Sequence[ToolSpec],
                 calls_per_turn: int) -> None:
        self.encoder = encoder
        self.names = [tool.name for tool in tools if tool.name != FINISH]
        self.vectors = encoder.embed([tool.text() for tool in tools if tool.name != FINISH])
        self.calls_per_turn = calls_per_turn
        self.request = task
        self.called: list[str] = []

    def observe(self, step: Step) -> None:
        if step.kind == "user":
            self.request, self.called = step.content, []
        elif step.kind == "tool_call" and step.tool:
            self.called.append(step.tool)

    def rank(self, available: Collection[str]) -> list[str]:
        similarity = self.vectors @ self.encoder.embed([self.request])[0]
        order = [self.names[i] for i in np.argsort(-similarity, kind="stable") if self.names[i] in available]
        fresh = [name for name in order if name not in self.called]
        again = [name for name in order if name in self.called]
        if len(self.called) >= self.calls_per_turn or not fresh:
            return [FINISH, *fresh, *again]
        return [*fresh, FINISH, *again]


class EmbeddingChooser:
    """Tools by cosine similarity to the current user message, each at most once per turn.

    Similarity says nothing about when to stop, so the turn ends after ``calls_per_turn``
    calls (fit it on the logs: :attr:`CountBaselines.calls_per_turn`, rounded).
    """

    def __init__(self, encoder: StateEncoder, calls_per_turn: int = 2,
                 name: str = "embedding_similarity") -> None:
        if calls_per_turn < 1:
            raise ValueError("calls_per_turn must be at least 1")
        self.encoder = encoder
        self.calls_per_turn = calls_per_turn
        self.name = name

    def session(self, task: str, tools: Sequence[ToolSpec]) -> ChooserSession:
        """Embed the tools and start with the task as the request."""
        return _EmbeddingRun(self.encoder, task, tools, self.calls_per_turn)


class _LLMRun:
    """The conversation so far as LangChain messages; the LLM picks from the available tools."""

    def __init__(self, llm: Any, task: str, tools: Sequence[ToolSpec], system: str | None) -> None:
        from langchain_core.messages import HumanMessage, SystemMessage

        self.llm = llm
        self.specs = {tool.name: tool for tool in tools}
        self.messages: list[Any] = [SystemMessage(system)] if system else []
        self.messages.append(HumanMessage(task))

    def observe(self, step: Step) -> None:
        from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

        if step.kind == "user":
            self.messages.append(HumanMessage(step.content))
        elif step.kind == "assistant":
            self.messages.append(AIMessage(step.content))
        else:
            call_id = f"call_{len(self.messages)}"
            self.messages.append(AIMessage("", tool_calls=[
                {"name": step.tool, "args": step.arguments, "id": call_id, "type": "tool_call"}]))
            self.messages.append(ToolMessage(step.observation, tool_call_id=call_id,
                                             status="error" if step.error else "success"))

    def rank(self, available: Collection[str]) -> list[str]:
        tools = [{"type": "function", "function": {"name": spec.name, "description": spec.description,
                                                   "parameters": spec.parameters}}
                 for name, spec in self.specs.items() if name in available]
        reply = self.llm.bind_tools(tools).invoke(self.messages) if tools else None
        calls = getattr(reply, "tool_calls", None) or []
        # Whatever tool it names is taken, even one it was not offered: that is an invalid call.
        return [calls[0]["name"]] if calls else [FINISH]


class LLMChooser:
    """"LLM chooses": a LangChain chat model bound to the available tools; no tool call is FINISH."""

    def __init__(self, llm: Any, name: str = "llm", system: str | None = None) -> None:
        if not hasattr(llm, "bind_tools"):
            raise TypeError(f"{type(llm).__name__} has no bind_tools(): give a LangChain chat model")
        self.llm = llm
        self.name = name
        self.system = system

    def session(self, task: str, tools: Sequence[ToolSpec]) -> ChooserSession:
        """Start the conversation with the task as the first user message."""
        return _LLMRun(self.llm, task, tools, self.system)


class _EpsilonRun:
    """Random ranking with probability epsilon at each decision, else the base chooser's."""

    def __init__(self, base: ChooserSession, explore: ChooserSession, epsilon: float,
                 rng: np.random.Generator) -> None:
        self.base, self.explore, self.epsilon, self.rng = base, explore, epsilon, rng

    def observe(self, step: Step) -> None:
        self.base.observe(step)
        self.explore.observe(step)

    def rank(self, available: Collection[str]) -> list[str]:
        return (self.explore if self.rng.random() < self.epsilon else self.base).rank(available)


class EpsilonChooser:
    """Epsilon-greedy behaviour: a uniformly random action with probability ``epsilon``, else ``base``'s."""

    def __init__(self, base: Chooser, epsilon: float = 0.3, seed: int = 0, name: str | None = None) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError("epsilon must be in [0, 1]")
        self.base = base
        self.epsilon = epsilon
        self.random = RandomChooser(seed)
        self.rng = np.random.default_rng(seed + 1)
        self.name = name or f"epsilon{epsilon:g}-{base.name}"

    def session(self, task: str, tools: Sequence[ToolSpec]) -> ChooserSession:
        """Start the base and the random session side by side."""
        return _EpsilonRun(self.base.session(task, tools), self.random.session(task, tools), self.epsilon,
                           np.random.default_rng(self.rng.integers(2**63)))


def behaviour_chooser(behaviour: str, policy: ToolPolicy | None = None, *, epsilon: float = 0.3,
                      seed: int = 0) -> Chooser:
    """Return the chooser for a ``collect`` behaviour: ``random``, ``epsilon-policy`` or ``policy``."""
    if behaviour not in BEHAVIOURS:
        raise ValueError(f"unknown behaviour {behaviour!r}; expected one of {BEHAVIOURS}")
    if behaviour == "random":
        return RandomChooser(seed)
    if policy is None:
        raise ValueError(f"behaviour {behaviour!r} needs a policy")
    chooser = PolicyChooser(policy)
    return chooser if behaviour == "policy" else EpsilonChooser(chooser, epsilon, seed, name="epsilon-policy")


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


def rollout(env: ToolUseEnv, chooser: Chooser, task: Task | Episode | str | None = None, *,
            arguments: ArgumentsFn = gold_arguments) -> EpisodeResult:
    """Run ``chooser`` on ``task`` (default: the env's) until the episode ends; ``env`` keeps the run."""
    obs, _ = env.reset(task)
    session = chooser.session(obs.task, env.tool_specs())
    seen = 0
    terminated = truncated = False
    while not (terminated or truncated):
        ranked = session.rank(obs.available_tools)
        obs, _, terminated, truncated, _ = env.step(arguments(env, ranked[0] if ranked else FINISH))
        # One decision logs its step, and after FINISH also the next turn's user step.
        for step in env.steps[seen:]:
            session.observe(step)
        seen = len(env.steps)
    calls = [step for step in env.steps if step.kind == "tool_call"]
    assert env.task is not None
    return EpisodeResult(
        task_id=env.task.id, success=env.success, steps=len(env.rewards), calls=len(calls),
        invalid_calls=sum(step.error for step in calls), episode_return=float(sum(env.rewards)),
        turns=len(env.task.turns), turns_succeeded=sum(result is True for result in env.turn_results),
        truncated=env.truncated)


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
        def cell(value: float | int | None, digits: int = 3) -> str:
            return "n/a" if value is None else f"{value:.{digits}f}"

        names = list(self.results)
        lines = [f"## Online evaluation: {self.env}, {self.arguments} arguments", "",
                 "| chooser | tasks | success rate | turn success | avg steps | avg return | invalid-call rate |",
                 "|---|---:|---:|---:|---:|---:|---:|"]
        for name, row in self.summary().items():
            lines.append(f"| {name} | {row['tasks']} | {cell(row['success_rate'])} | "
                         f"{cell(row['turn_success_rate'])} | {cell(row['avg_steps'], 1)} | "
                         f"{cell(row['avg_return'], 2)} | {cell(row['invalid_call_rate'])} |")
        lines += ["", "Per task (✓ success, ✗ failure, ? unchecked; decisions taken):", "",
                  "| task | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        by_task: dict[str, dict[str, EpisodeResult]] = {}
        for name, runs in self.results.items():
            for run in runs:
                by_task.setdefault(run.task_id, {})[name] = run
        marks = {True: "✓", False: "✗", None: "?"}
        for task_id, runs in by_task.items():
            cells = [f"{marks[runs[n].success]} {runs[n].steps}" if n in runs else "" for n in names]
            lines.append(f"| {task_id} | " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"

    def write_markdown(self, path: str | Path) -> None:
        """Write :meth:`to_markdown` to ``path``."""
        Path(path).write_text(self.to_markdown())

    def plot(self, path: str | Path) -> None:
        """Save a PNG: success / turn-success / invalid-call rates, and mean steps and return, per chooser."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        summary = self.summary()
        names = list(summary)
        x = np.arange(len(names))
        fig, (rates, sizes) = plt.subplots(1, 2, figsize=(13, 4.5))
        width = 0.8 / 3
        for k, metric in enumerate(("success_rate", "turn_success_rate", "invalid_call_rate")):
            values = [summary[n][metric] or 0.0 for n in names]
            rates.bar(x + k * width, values, width, label=metric.replace("_", " "))
        rates.set_xticks(x + width, names, rotation=15)
        rates.set_ylim(0, 1)
        rates.legend()
        rates.set_title(f"{self.env}: rates ({self.arguments} arguments)")
        for k, metric in enumerate(("avg_steps", "avg_return")):
            values = [summary[n][metric] or 0.0 for n in names]
            sizes.bar(x + (k - 0.5) * 0.4, values, 0.4, label=metric.replace("_", " "))
        sizes.axhline(0, color="black", linewidth=0.5)
        sizes.set_xticks(x, names, rotation=15)
        sizes.legend()
        sizes.set_title("mean decisions and return per task")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def evaluate_online(env: ToolUseEnv, tasks: Sequence[Task | Episode], choosers: Sequence[Chooser], *,
                    arguments: ArgumentsFn = gold_arguments, env_name: str = "env",
                    arguments_name: str = "gold") -> OnlineReport:
    """Run every chooser on every task in ``env``; return their per-task results."""
    names = [chooser.name for chooser in choosers]
    if len(set(names)) != len(names):
        raise ValueError(f"chooser names must be distinct: {names}")
    report = OnlineReport(env_name, arguments_name)
    for chooser in choosers:
        report.results[chooser.name] = [rollout(env, chooser, task, arguments=arguments) for task in tasks]
    return report


def print_online_report(report: OnlineReport, console: Console | None = None) -> None:
    """Print the summary as a rich table, the policy's row highlighted."""
    console = console or Console()
    table = Table(title=f"online: {report.env}, {report.arguments} arguments")
    columns = ("chooser", "tasks", "success", "turn success", "avg steps", "avg return", "invalid calls")
    for column in columns:
        table.add_column(column, justify="left" if column == "chooser" else "right")
    for name, row in report.summary().items():
        values = [row["success_rate"], row["turn_success_rate"], row["avg_steps"], row["avg_return"],
                  row["invalid_call_rate"]]
        table.add_row(name, str(row["tasks"]),
                      *("n/a" if v is None else f"{v:.3f}" if i != 2 else f"{v:.1f}" for i, v in enumerate(values)),
                      style="bold green" if name.startswith("policy") else None)
    console.print(table)


# ---------------------------------------------------------------------------- bundled environments


@dataclass
class EnvSetup:
    """An environment, the tasks to run in it, and the training logs baselines are fit on."""

    name: str
    env: ToolUseEnv
    tasks: list[Episode]
    train_episodes: list[Episode]


def load_environment(name: str, *, variant: str = "base", split: str = "test",
                     limit: int | None = None) -> EnvSetup:
    """Build a bundled environment with its tasks and training logs.

    ``bfcl``: BFCL multi-turn ``variant`` scenarios, test = scenario % 5 == 0. ``tau-airline``:
    the 50 tau-bench airline tasks with replayed gold calls, test = task index 40-49 (the
    held-out tasks of the gpt-4o logs too); a task succeeds when the database equals the gold
    one and every gold call's result was seen (``check_results``). ``limit`` keeps the first tasks of the split.
    """
    from evoharness_agent.datasets import BFCL_VARIANTS, bfcl_paths, read_native, split_bfcl, tau_airline_test_path

    if name not in ENVIRONMENTS:
        raise ValueError(f"unknown environment {name!r}; expected one of {ENVIRONMENTS}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    if name == "bfcl":
        if variant not in BFCL_VARIANTS:
            raise ValueError(f"unknown BFCL variant {variant!r}; expected one of {BFCL_VARIANTS}")
        from evoharness_agent.bfcl_env import BFCLEnvironment

        episodes = read_native(bfcl_paths([variant])[0])
        train, test = split_bfcl(episodes)
        label, make = f"bfcl-{variant}-{split}", BFCLEnvironment
    else:
        from evoharness_agent.tau_airline_env import TauAirlineEnvironment, tau_airline_split

        episodes = read_native(tau_airline_test_path())
        train, test = tau_airline_split(episodes)
        # Reads count too: with the state check alone, the 20 read-only tasks succeed by
        # answering at once, and a policy that never calls a tool scores 0.7 on the test tasks.
        label, make = f"tau-airline-{split}", partial(TauAirlineEnvironment, check_results=True)
    tasks = {"train": train, "test": test, "all": episodes}[split][:limit]
    if not tasks:
        raise ValueError(f"no {split} tasks in {label}")
    env = make(tasks[0])
    return EnvSetup(label, env, tasks, train)
