"""Tool choosers: what picks the next action in a rollout, a trained policy or a baseline.

At each decision a *chooser* ranks the available actions (FINISH included) and the top one
is taken. Choosers share one interface (:class:`Chooser`): ``chooser.session(task, tools)``
starts a run, ``session.observe(step)`` sees each logged step, ``session.rank(available)``
returns action names best first. Besides :class:`PolicyChooser` there are the baselines
:class:`RandomChooser`, :class:`BigramChooser`, :class:`EmbeddingChooser`,
:class:`LLMChooser` ("LLM chooses", any LangChain chat model with ``bind_tools``) and
:class:`EpsilonChooser` (an epsilon mix with random, a behaviour policy for
:func:`~evoharness_agent.evaluation.online.collect`); :func:`behaviour_chooser` builds the
behaviour named in :data:`BEHAVIOURS`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.evaluation.baselines import CountBaselines
from evoharness_agent.schema import FINISH, Step, ToolSpec

if TYPE_CHECKING:
    # Annotations only: the policy needs torch, and the CLI reads BEHAVIOURS when it starts.
    from evoharness_agent.policy import PolicySession, ToolPolicy

__all__ = [
    "BEHAVIOURS",
    "BigramChooser",
    "Chooser",
    "ChooserSession",
    "ConfidentSession",
    "EmbeddingChooser",
    "EpsilonChooser",
    "LLMChooser",
    "PolicyChooser",
    "RandomChooser",
    "behaviour_chooser",
]

BEHAVIOURS = ("random", "epsilon-policy", "policy")
"""Behaviour policies of :func:`behaviour_chooser` (for collection)."""


class ChooserSession(Protocol):
    """A chooser's view of one run."""

    def observe(self, step: Step) -> None:
        """Record a logged step (tool call, reply or user message)."""
        ...

    def rank(self, available: Collection[str]) -> list[str]:
        """Return actions (FINISH included) best first; the first one is taken."""
        ...


@runtime_checkable
class ConfidentSession(ChooserSession, Protocol):
    """A session that also reports how sure it is of its top choice (a policy's calibrated probability)."""

    def rank_with_confidence(self, available: Collection[str]) -> tuple[list[str], float | None]:
        """Return :meth:`rank`'s actions and the probability of the first (``None`` when nothing is ranked)."""
        ...


class Chooser(Protocol):
    """Anything that picks the next action: a trained policy, a baseline, an LLM."""

    name: str

    def session(self, task: str, tools: Sequence[ToolSpec]) -> ChooserSession:
        """Start a run on ``task`` with every tool the env knows (available or not yet)."""
        ...


class _PolicyRun:
    """A :class:`PolicySession` answering with names (a :class:`ConfidentSession`)."""

    def __init__(self, session: PolicySession) -> None:
        self.session = session

    def observe(self, step: Step) -> None:
        self.session.observe(step)

    def rank(self, available: Collection[str]) -> list[str]:
        return self.rank_with_confidence(available)[0]

    def rank_with_confidence(self, available: Collection[str]) -> tuple[list[str], float | None]:
        scores = self.session.rank(available)
        return [score.tool for score in scores], scores[0].probability if scores else None


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
        from evoharness_agent.agents.llm_calls import invoke_llm

        # A failed call raises LLMCallError: the rollout ends this task as a failure and goes on.
        reply = invoke_llm(self.llm.bind_tools(tools), self.messages, None) if tools else None
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
