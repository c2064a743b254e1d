"""A tiny simulated tool environment with a known optimal tool order, for learning tests.

Each task belongs to a :class:`TaskFamily` that must call its tools in a fixed order (for a
refund: ``lookup_user`` → ``get_order`` → ``refund_order``) and then FINISH. Calling a
required tool before its predecessors fails with an error observation; distractor tools
either waste a step or always fail; FINISH before the order is complete fails the task.
Observations are a few fixed strings, so a whole data set has only a handful of distinct
texts and encoding it costs seconds.

Logged data comes from :func:`generate_logs` with a mixture of noisy scripted agents (some
careful, some sloppy, some random); trained policies are evaluated with
:func:`greedy_rollout` and :func:`episode_return`, which uses the same reward shaping as
training (:func:`evoharness_agent.rewards.shape_rewards`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from evoharness_agent.rewards import RewardConfig, shape_rewards
from evoharness_agent.schema import FINISH, Episode, Step, ToolSpec

__all__ = [
    "CUSTOMER_SUPPORT_FAMILIES",
    "CUSTOMER_SUPPORT_TOOLS",
    "NoisyScriptAgent",
    "RankingChooser",
    "SequentialToolSim",
    "SimTool",
    "TaskFamily",
    "actions_of",
    "customer_support_sim",
    "episode_return",
    "generate_logs",
    "greedy_rollout",
]

FINISH_REPLY = "I have handled your request."


@dataclass(frozen=True)
class SimTool:
    """A simulated tool: what it returns when it works, or the error it always gives."""

    name: str
    description: str
    observation: str
    """Observation of a successful call."""
    always_fails: str | None = None
    """If set, every call fails with this observation (a broken distractor)."""

    def spec(self) -> ToolSpec:
        """Return the tool's :class:`ToolSpec` (no parameters: calls take no arguments)."""
        return ToolSpec(name=self.name, description=self.description)


@dataclass(frozen=True)
class TaskFamily:
    """Tasks that all need the same tools in the same order, phrased in several ways."""

    name: str
    order: tuple[str, ...]
    """Required tools, in the only order that works."""
    phrasings: tuple[str, ...]
    """Task texts of this family."""


CUSTOMER_SUPPORT_TOOLS: tuple[SimTool, ...] = (
    SimTool("lookup_user", "Find the customer's account and return their user id.",
            "user U-17 found"),
    SimTool("get_order", "Fetch the customer's most recent order; needs a user id.",
            "order O-42 found, delivered"),
    SimTool("refund_order", "Refund an order; needs an order id.", "refund issued for O-42"),
    SimTool("update_address", "Change the customer's shipping address; needs a user id.",
            "address updated"),
    SimTool("search_faq", "Search the help-centre FAQ articles.", "FAQ: refunds take 5 days"),
    SimTool("get_weather", "Get today's weather forecast.", "sunny, 21C"),
    SimTool("send_email", "Send an email to the customer.", "",
            always_fails="error: email service unavailable"),
)
"""Three chained tools, one for another family, two wasteful and one broken distractor."""

CUSTOMER_SUPPORT_FAMILIES: tuple[TaskFamily, ...] = (
    TaskFamily("refund", ("lookup_user", "get_order", "refund_order"), (
        "I want a refund for my last order.",
        "Please refund my most recent purchase.",
        "My order arrived broken, give me my money back.",
        "Can I get a refund on the thing I just bought?",
    )),
    TaskFamily("address", ("lookup_user", "update_address"), (
        "Please change my shipping address.",
        "I moved, update my delivery address.",
        "Ship my future orders to my new home address.",
        "My address is wrong on my account, fix it.",
    )),
)


class SequentialToolSim:
    """Simulates tasks whose tools must be called in a fixed order, then FINISH."""

    def __init__(self, tools: Sequence[SimTool], families: Sequence[TaskFamily], max_steps: int = 8) -> None:
        """Index the tools and families; episodes stop after ``max_steps`` decisions."""
        self.sim_tools = {tool.name: tool for tool in tools}
        self.families = list(families)
        self.max_steps = max_steps
        self._family_of = {text: family for family in self.families for text in family.phrasings}
        for family in self.families:
            missing = set(family.order) - set(self.sim_tools)
            if missing:
                raise ValueError(f"family {family.name!r} needs unknown tools {sorted(missing)}")

    @property
    def tools(self) -> list[ToolSpec]:
        """The tool specs an agent is offered (FINISH is implicit)."""
        return [tool.spec() for tool in self.sim_tools.values()]

    @property
    def actions(self) -> list[str]:
        """Every action: the tools, then FINISH."""
        return [*self.sim_tools, FINISH]

    def family(self, task: str) -> TaskFamily:
        """Return the family of a task text."""
        if task not in self._family_of:
            raise KeyError(f"unknown task {task!r}: add it to a family's phrasings")
        return self._family_of[task]

    def tasks(self, phrasings_per_family: int | None = None) -> list[str]:
        """Return task texts: the first ``phrasings_per_family`` of each family (all if None)."""
        return [text for family in self.families for text in family.phrasings[:phrasings_per_family]]

    def optimal_actions(self, task: str) -> list[str]:
        """Return the shortest successful action sequence of ``task``."""
        return [*self.family(task).order, FINISH]

    def call(self, task: str, progress: int, tool: str) -> tuple[Step, int]:
        """Execute ``tool`` when ``progress`` required tools are done; return the step and new progress."""
        order = self.family(task).order
        sim_tool = self.sim_tools.get(tool)
        if sim_tool is None:
            return Step(tool=tool, observation=f"error: no tool named {tool}", error=True), progress
        if sim_tool.always_fails is not None:
            return Step(tool=tool, observation=sim_tool.always_fails, error=True), progress
        if tool in order:
            position = order.index(tool)
            if position > progress:  # a precondition is missing: this is the out-of-order failure
                needed = order[position - 1]
                return Step(tool=tool, observation=f"error: call {needed} first", error=True), progress
            return Step(tool=tool, observation=sim_tool.observation), max(progress, position + 1)
        if any(tool in family.order for family in self.families):  # another family's tool
            return Step(tool=tool, observation="error: not applicable to this request", error=True), progress
        return Step(tool=tool, observation=sim_tool.observation), progress  # a harmless waste of a step

    def run(self, task: str, choose: Callable[[str, list[Step]], str], episode_id: str = "") -> Episode:
        """Roll out ``choose(task, history) -> action`` until FINISH or ``max_steps`` decisions."""
        order = self.family(task).order
        steps: list[Step] = []
        progress, success = 0, False
        while len(steps) < self.max_steps:
            action = choose(task, list(steps))
            if action == FINISH:
                steps.append(Step(kind="assistant", content=FINISH_REPLY))
                success = progress == len(order)
                break
            step, progress = self.call(task, progress, action)
            steps.append(step)
        return Episode(id=episode_id, task=task, tools=self.tools, steps=steps,
                       final_answer=FINISH_REPLY if steps and steps[-1].kind == "assistant" else "",
                       reward=1.0 if success else 0.0,
                       metadata={"family": self.family(task).name, "success": success})


def customer_support_sim(max_steps: int = 8) -> SequentialToolSim:
    """Return the default simulator: refund and address-change tasks with distractors."""
    return SequentialToolSim(CUSTOMER_SUPPORT_TOOLS, CUSTOMER_SUPPORT_FAMILIES, max_steps=max_steps)


@dataclass(frozen=True)
class NoisyScriptAgent:
    """Follows a per-family script of actions; with probability ``epsilon`` acts uniformly at random.

    A random action does not advance the script, so the agent resumes it afterwards. With
    ``epsilon=1`` it is a uniformly random agent. A family without a script uses its
    optimal order.
    """

    name: str
    scripts: dict[str, tuple[str, ...]]
    epsilon: float = 0.1

    def chooser(self, sim: SequentialToolSim, rng: random.Random) -> Callable[[str, list[Step]], str]:
        """Return a stateful ``choose(task, history)`` for one episode."""
        cursor = 0

        def choose(task: str, history: list[Step]) -> str:
            nonlocal cursor
            family = sim.family(task)
            script = self.scripts.get(family.name, sim.optimal_actions(task))
            if cursor >= len(script) or rng.random() < self.epsilon:
                return rng.choice(sim.actions)
            cursor += 1
            return script[cursor - 1]

        return choose


def generate_logs(sim: SequentialToolSim, agents: Sequence[tuple[float, NoisyScriptAgent]], n_episodes: int,
                  tasks: Sequence[str], seed: int = 0) -> list[Episode]:
    """Log ``n_episodes`` runs; each picks an agent by weight and a task uniformly from ``tasks``."""
    rng = random.Random(seed)
    weights = [weight for weight, _ in agents]
    episodes = []
    for index in range(n_episodes):
        (_, agent), = rng.choices(agents, weights=weights)
        task = rng.choice(list(tasks))
        episode = sim.run(task, agent.chooser(sim, rng), episode_id=f"sim-{seed}-{index}")
        episode.metadata["agent"] = agent.name
        episodes.append(episode)
    return episodes


class RankingChooser(Protocol):
    """A chooser that ranks tools from the whole history, like :meth:`evoharness_agent.policy.ToolPolicy.rank`."""

    def rank(self, task: str, history: Sequence[Step] = (), tools: Sequence[Any] = ()) -> list[Any]:
        """Return ranked entries with a ``.tool`` name, best first."""
        ...


def greedy_rollout(sim: SequentialToolSim, policy: RankingChooser, task: str) -> Episode:
    """Run ``policy`` greedily: at each step execute its top-ranked tool (FINISH ends the run)."""
    tools = sim.tools
    return sim.run(task, lambda task_, history: policy.rank(task_, history, tools)[0].tool,
                   episode_id=f"greedy:{task}")


def episode_return(episode: Episode, config: RewardConfig | None = None) -> float:
    """Return the undiscounted sum of the episode's shaped rewards (the training rewards)."""
    return float(sum(shape_rewards(episode, config or RewardConfig())))


def actions_of(episode: Episode) -> list[str]:
    """Return the actions an episode took, FINISH included."""
    return [step.action for step in episode.steps if step.is_decision]
