"""`PolicyToolSelectorMiddleware`: a trained policy narrows the tools of each `create_agent` model call.

For LangChain v1 agents (``langchain.agents.create_agent``), where the model keeps choosing
the tools: before each model call the policy ranks the offered tools and FINISH from the
conversation so far, and

* when FINISH is best and confident (``finish_threshold``), the model gets no tools at all, so
  it answers;
* when a tool is best and confident (``force_threshold``), that tool is forced with
  ``tool_choice``, never twice in a row (a model forced to call a tool on every step cannot
  answer, and loops until the recursion limit);
* when the call just made worked, another tool is best and answering now is unlikely
  (FINISH's probability at most ``continue_threshold``, or the best tool ``continue_ratio``
  times as likely as FINISH or more), the model sees the ``top_k`` best tools
  and must call one of them (``tool_choice="any"``): small models answer after the first result
  ("18 C") when the request still asks for a conversion;
* otherwise the model sees only the ``top_k`` best tools, and decides (``tool_choice`` unset:
  it may call one or answer).

The thresholds compare with the policy's probabilities, which are calibrated: a threshold of
0.9 acts only on choices of which about 90% are right.

Needs the ``langchain`` extra (``pip install 'evoharness-agent[langchain]'``); the rest of
the package does not.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.tools import BaseTool

from evoharness_agent.learning.checkpoints import DEFAULT_POLICY
from evoharness_agent.logs.importers import LogFormatError, episode_from_messages
from evoharness_agent.policy import (
    CONTINUE_RATIO,
    CONTINUE_THRESHOLD,
    RankingPolicy,
    ToolPolicy,
    ToolScore,
    call_is_due,
)
from evoharness_agent.schema import FINISH, Step

try:
    from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("PolicyToolSelectorMiddleware needs LangChain v1: "
                      "pip install 'evoharness-agent[langchain]'") from error

__all__ = ["PolicyToolSelectorMiddleware", "conversation_state"]


def conversation_state(messages: Sequence[BaseMessage]) -> tuple[str, list[Step]] | None:
    """Return the (task, steps) the policy sees in a conversation, or ``None`` when it has none yet."""
    try:
        episode = episode_from_messages(messages)
    except LogFormatError:  # no user message yet, or a tool result without its call
        return None
    return episode.task, episode.steps


class PolicyToolSelectorMiddleware(AgentMiddleware):
    """Show the model only the policy's best tools, force the best one or let it answer when the policy is sure.

    Args:
        policy: a trained :class:`ToolPolicy` or its directory (default: the shipped general policy),
            or a ``PolicyClient`` of a policy server.
        top_k: how many of the policy's best tools the model sees.
        force_threshold: the policy probability from which its best tool is forced
            (``None``: never force). Probabilities are calibrated: 0.8 forces only choices of
            which about 80% are right.
        finish_threshold: the policy probability of FINISH, ranked best, from which the model
            call gets no tools at all (not even ``always_include``) and so answers (``None``:
            never). 0.8 stops only where about 80% of such stops are right.
        continue_threshold: the policy probability of FINISH at or under which, right after a call
            that worked and with another tool ranked best, the model must call one of the tools
            it sees (``None``: never). 0.15 holds back only answers of which about 15 in 100 or fewer
            would be right. Never when the best tool is the one just called (a poll or a retry:
            the model decides when to stop).
        continue_ratio: a call is due too (as with ``continue_threshold``) while the best tool is
            at least this many times as likely as FINISH (``None``: the threshold alone): 2.5
            holds back answers that about 1 in 10 of such validation decisions give.
        always_include: tool names the model always sees, ranked or not (unless it answers).

    Example:
        .. code-block:: python

            agent = create_agent(model, tools, middleware=[PolicyToolSelectorMiddleware("trained/")])

    """

    def __init__(self, policy: RankingPolicy | str | Path = DEFAULT_POLICY, *, top_k: int = 3,
                 force_threshold: float | None = 0.8, finish_threshold: float | None = 0.8,
                 continue_threshold: float | None = CONTINUE_THRESHOLD, continue_ratio: float | None = CONTINUE_RATIO,
                 always_include: Sequence[str] = ()) -> None:
        super().__init__()
        if top_k < 1:
            raise ValueError("top_k must be at least 1")
        for name, threshold in (("force_threshold", force_threshold), ("finish_threshold", finish_threshold),
                                ("continue_threshold", continue_threshold)):
            if threshold is not None and not 0.0 <= threshold <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1] or None, got {threshold}")
        if continue_ratio is not None and continue_ratio <= 0:
            raise ValueError(f"continue_ratio must be positive or None, got {continue_ratio}")
        self.policy = ToolPolicy.load(policy) if isinstance(policy, (str, Path)) else policy
        self.top_k = top_k
        self.force_threshold = force_threshold
        self.finish_threshold = finish_threshold
        self.continue_threshold = continue_threshold
        self.continue_ratio = continue_ratio
        self.always_include = frozenset(always_include)
        self.last_ranking: list[ToolScore] = []
        """The ranking behind the latest model call (for inspection and tests)."""

    def select(self, request: ModelRequest) -> ModelRequest:
        """Return the request without tools (confident FINISH), with the best tool forced, or narrowed."""
        tools = [tool for tool in request.tools if not isinstance(tool, dict)]
        state = conversation_state(request.messages)
        if not tools or state is None or request.tool_choice is not None:
            return request  # nothing to rank, or someone else already decided the tool choice
        task, steps = state
        ranking = self.policy.rank(task, steps, tools, available={tool.name for tool in tools})
        self.last_ranking = ranking
        top = ranking[0]
        if top.tool == FINISH and self.finish_threshold is not None and top.probability >= self.finish_threshold:
            return request.override(tools=[], tool_choice=None)  # no tool to call: the model answers
        provider_tools = [tool for tool in request.tools if isinstance(tool, dict)]
        previous = steps[-1].tool if steps and steps[-1].kind == "tool_call" else None
        must_call = call_is_due(ranking, previous if previous and not steps[-1].error else None,
                                self.continue_threshold, self.continue_ratio)
        # A model that must call is not shown the tool that just worked: it would call it again.
        skip = {FINISH, previous} if must_call else {FINISH}
        best = [score.tool for score in ranking if score.tool not in skip][: self.top_k]
        keep: list[BaseTool | dict[str, Any]] = [tool for tool in tools
                                                 if tool.name in best or tool.name in self.always_include]
        force = (self.force_threshold is not None and top.tool not in (FINISH, previous)
                 and top.probability >= self.force_threshold)
        return request.override(tools=[*keep, *provider_tools],
                                tool_choice=top.tool if force else "any" if must_call else None)

    def wrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]) -> Any:
        """Call the model with the policy's selection of tools."""
        return handler(self.select(request))

    async def awrap_model_call(self, request: ModelRequest,
                               handler: Callable[[ModelRequest], Awaitable[ModelResponse]]) -> Any:
        """Async :meth:`wrap_model_call`."""
        return await handler(self.select(request))
