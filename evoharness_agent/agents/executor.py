"""`PolicyAgentExecutor`: LangChain's `AgentExecutor` loop, with a learned policy choosing the tools.

Replace ``AgentExecutor(agent=..., tools=...)`` with
``PolicyAgentExecutor(llm=..., tools=..., policy="trained/")`` and keep the rest: the same
``invoke({"input": ...})`` result, ``stream`` chunks, callbacks, stop behaviour and loop settings.

Each step the policy ranks the available tools (and FINISH) from the run so far, embedding each
new step once. The best tool is called with arguments the LLM fills for that tool alone; on
FINISH the LLM writes the answer. ``mode="hybrid"`` hands the choice to the LLM, among the
policy's top-k tools or answering now (FINISH), when the policy's top probability is under
``confidence_threshold``; ``mode="llm"`` always lets the LLM choose (a plain tool-calling
agent, for comparison). The policy's probabilities are calibrated: at 0.5, about half of the
choices it makes are right.

Nothing a tool or the LLM does crashes the run: tool errors, invalid arguments, unknown tools
and guardrail refusals all become the step's observation, which the next step can act on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from langchain_core.agents import AgentAction, AgentActionMessageLog, AgentFinish, AgentStep
from langchain_core.callbacks import (
    AsyncCallbackManager,
    AsyncCallbackManagerForChainRun,
    CallbackManager,
    CallbackManagerForChainRun,
    Callbacks,
)
from langchain_core.exceptions import OutputParserException
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import Runnable, RunnableConfig, RunnableSerializable, ensure_config
from langchain_core.runnables.utils import AddableDict
from langchain_core.tools import BaseTool, StructuredTool, Tool
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from evoharness_agent.agents.guardrails import GuardedRun, Guardrails
from evoharness_agent.agents.llm_calls import (
    LLMCallError,
    LLMChoice,
    ToolArguments,
    achoose_tool,
    afill_arguments,
    awrite_answer,
    build_messages,
    choose_tool,
    fill_arguments,
    write_answer,
)
from evoharness_agent.learning.checkpoints import DEFAULT_POLICY
from evoharness_agent.logs.events import RANK_EVENT, RUN_EVENT, STEP_EVENT
from evoharness_agent.policy import (
    CONTINUE_RATIO,
    CONTINUE_THRESHOLD,
    RankingPolicy,
    RankingSession,
    ToolPolicy,
    ToolScore,
    call_is_due,
)
from evoharness_agent.schema import (
    FINISH,
    Step,
    as_tool_spec,
    invalid_arguments_text,
    refused_text,
    tool_error_text,
)

__all__ = ["LLM_FAILED_OUTPUT", "STOPPED_OUTPUT", "PolicyAgentAction", "PolicyAgentExecutor"]

STOPPED_OUTPUT = "Agent stopped due to max iterations."
"""The answer when a run hits ``max_iterations`` or ``max_execution_time``: `AgentExecutor`'s
with a tool-calling agent (``create_tool_calling_agent``), for either limit."""
LLM_FAILED_OUTPUT = "Agent stopped: {error}."
"""The answer when the chat model itself fails a call (a prompt over its context, a timeout, a
provider error): the run stops there, and its outputs hold the error under ``llm_error``."""

_NO_GUARDRAILS = Guardrails()
_T = TypeVar("_T")

_THREAD_FALLBACKS = (BaseTool._arun, StructuredTool._arun, Tool._arun)
"""LangChain's ``_arun`` of tools without a coroutine: they run the sync code in a worker thread."""
_STILL_RUNNING: set[asyncio.Future[Any]] = set()
"""Tool calls that outlived their run, kept referenced (the loop holds tasks weakly) until their outcome."""

IntermediateSteps = list[tuple[AgentAction, Any]]


class PolicyAgentAction(AgentActionMessageLog):
    """A tool call of a :class:`PolicyAgentExecutor` run, and who chose it."""

    tool_call_id: str = ""
    decided_by: Literal["policy", "llm"] = "policy"
    """``policy`` when the learned policy chose the tool, ``llm`` in hybrid/llm decisions."""
    probability: float | None = None
    """The policy's probability for the tool (``None`` when no policy ranked it)."""


@dataclass
class _Run:
    """The state of one run."""

    inputs: dict[str, Any]
    guard: GuardedRun
    session: RankingSession | None
    started: float = field(default_factory=time.monotonic)
    steps: IntermediateSteps = field(default_factory=list)
    failed: list[bool] = field(default_factory=list)
    """Whether each of ``steps`` failed (tool error, invalid arguments, refusal)."""
    iterations: int = 0
    ranking: list[ToolScore] = field(default_factory=list)
    """The policy's latest ranking, best first."""
    still_running: list[str] = field(default_factory=list)
    """Tools still running in their worker thread when an async run stopped."""
    llm_error: str | None = None
    """Why the chat model failed the call that stopped the run, if one did."""

    @property
    def task(self) -> str:
        """The user's request."""
        return str(self.inputs["input"])

    def elapsed(self) -> float:
        """Seconds since the run started."""
        return time.monotonic() - self.started


@dataclass
class _Finish:
    """The decision to answer: with the LLM's own text, or (``None``) a text still to write."""

    answer: str | None = None


@dataclass
class _Act:
    """The decision to act, and the observation already known when the tool cannot run."""

    action: PolicyAgentAction
    problem: str | None = None


class _OutOfTime(Exception):
    """``max_execution_time`` ran out inside an async step."""


class PolicyAgentExecutor(RunnableSerializable[dict[str, Any], dict[str, Any]]):
    """A drop-in for `AgentExecutor` whose tool choices come from a trained :class:`ToolPolicy`.

    Example:
        .. code-block:: python

            agent = PolicyAgentExecutor(llm=llm, tools=[search, calculator], policy="trained/bfcl")
            agent.invoke({"input": "What is 12% of the population of Lyon?"})

    """

    llm: BaseChatModel
    """Fills the chosen tool's arguments and writes the final answer."""
    tools: Sequence[BaseTool]
    """The tools the agent may call."""
    policy: RankingPolicy | None = None
    """The trained policy (or a path to its directory, or a ``PolicyClient`` of a policy server);
    none means the shipped general policy (``"default"``), except in ``llm`` mode, which needs none."""
    mode: Literal["policy", "hybrid", "llm"] = "policy"
    """Who chooses the tool: the policy, the LLM when the policy is unsure, or always the LLM.

    The LLM may always answer instead (FINISH). In hybrid mode, an LLM choice that repeats a call
    of the run that succeeded (same tool, same arguments) is taken as answering: small models copy
    their last call instead of answering from its result (a booking made twice)."""
    confidence_threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    """In hybrid mode, the LLM decides when the policy's top probability is below this. The
    probability is calibrated: 0.9 hands over every choice of which fewer than about 90% are right."""
    top_k: int = Field(default=3, ge=1)
    """In hybrid mode, how many of the policy's best options (FINISH included) the LLM sees as tools;
    answering now is one of its options too, unless a call is due (``continue_threshold``)."""
    continue_threshold: float | None = Field(default=CONTINUE_THRESHOLD, ge=0.0, le=1.0)
    """In hybrid mode, the policy probability of FINISH at or under which, right after a call that
    worked and with another tool ranked best, the LLM must call one of the top tools (not the one
    just called) rather than answer (``None``: it may always answer). 0.15 holds back only answers
    of which about 15 in 100 or fewer would be right; :class:`PolicyToolSelectorMiddleware` does the same."""
    continue_ratio: float | None = Field(default=CONTINUE_RATIO, gt=0.0)
    """In hybrid mode, a call is due too (as with ``continue_threshold``) while the best tool is at least
    this many times as likely as FINISH (``None``: the threshold alone)."""
    guardrails: Guardrails | None = None
    """Allow-list, call budgets, confirmation of high-risk tools and the audit log."""
    system_prompt: str | None = None
    """Instructions added to every LLM call (persona, answer style)."""
    return_intermediate_steps: bool = False
    """Whether the result includes ``intermediate_steps``: ``(AgentAction, observation)`` pairs."""
    max_iterations: int | None = 15
    """The most tool calls before the run stops (``None``: no limit)."""
    max_execution_time: float | None = None
    """The most wall-clock seconds before the run stops (async runs stop mid-step: a sync tool,
    which cannot be stopped, runs on in its thread, the result lists it under ``still_running``,
    and its outcome goes to the audit log when it comes)."""
    early_stopping_method: Literal["force", "generate"] = "force"
    """On a stop: ``force`` answers :data:`STOPPED_OUTPUT`, ``generate`` has the LLM answer."""
    handle_parsing_errors: bool | str | Callable[[OutputParserException], str] = True
    """What an unusable LLM reply becomes: its error (``True``), this text, or the callable's
    result; ``False`` raises as `AgentExecutor` does (the default differs: runs never crash)."""
    trim_intermediate_steps: int | Callable[[IntermediateSteps], IntermediateSteps] = -1
    """How many recent steps the LLM sees (``-1``: all), or a function that selects them."""
    callbacks: Callbacks = Field(default=None, exclude=True)
    """Callback handlers for every run."""
    tags: list[str] | None = None
    """Tags for every run."""
    metadata: dict[str, Any] | None = None
    """Metadata for every run."""
    verbose: bool = False
    """Whether to print the run's progress."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    @field_validator("policy", mode="before")
    @classmethod
    def _load_policy(cls, value: Any) -> Any:
        """Accept a policy directory for ``policy``."""
        return ToolPolicy.load(value) if isinstance(value, (str, Path)) else value

    @model_validator(mode="after")
    def _check(self) -> PolicyAgentExecutor:
        """Give the policy modes the shipped policy when none was given; check that tool names are unique."""
        if self.mode != "llm" and self.policy is None:
            self.policy = ToolPolicy.load(DEFAULT_POLICY)
        names = [tool.name for tool in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique, got {names}")
        if FINISH in names:
            raise ValueError(f"{FINISH!r} is reserved for the answer action; rename that tool")
        return self

    @classmethod
    def from_agent_and_tools(cls, agent: Runnable, tools: Sequence[BaseTool], *,
                             policy: RankingPolicy | str | Path | None = None, llm: BaseChatModel | None = None,
                             callbacks: Callbacks = None, **kwargs: Any) -> PolicyAgentExecutor:
        """Build from what `AgentExecutor.from_agent_and_tools` takes; the chat model comes from ``agent``."""
        model = llm or _find_chat_model(agent)
        if model is None:
            raise ValueError("no chat model found inside the agent; pass llm=")
        # A policy directory is accepted: the "before" validator _load_policy loads it.
        return cls(llm=model, tools=tools, policy=policy, callbacks=callbacks, **kwargs)  # type: ignore[arg-type]

    @property
    def input_keys(self) -> list[str]:
        """The input keys (as in `AgentExecutor`)."""
        return ["input"]

    @property
    def output_keys(self) -> list[str]:
        """The output keys (as in `AgentExecutor`)."""
        return ["output", "intermediate_steps"] if self.return_intermediate_steps else ["output"]

    def lookup_tool(self, name: str) -> BaseTool:
        """Return the tool called ``name``."""
        return {tool.name: tool for tool in self.tools}[name]

    # -- the public Runnable surface -------------------------------------------------------------

    def invoke(self, input: dict[str, Any] | str, config: RunnableConfig | None = None,
               **kwargs: Any) -> dict[str, Any]:
        """Run the agent on ``{"input": ...}`` and return ``{"input", "output"[, "intermediate_steps"]}``."""
        inputs = _prep_inputs(input)
        run_manager = self._start(inputs, config)
        try:
            run = self._new_run(inputs, run_manager)
            for event in self._iterate(run, run_manager):
                finish = event
            assert isinstance(finish, AgentFinish)  # _iterate always ends with the finish
            outputs = self._return(run, finish, run_manager)
        except BaseException as error:
            run_manager.on_chain_error(error)
            raise
        run_manager.on_chain_end(outputs)
        return {**inputs, **outputs}

    async def ainvoke(self, input: dict[str, Any] | str, config: RunnableConfig | None = None,
                      **kwargs: Any) -> dict[str, Any]:
        """Async :meth:`invoke`."""
        inputs = _prep_inputs(input)
        run_manager = await self._astart(inputs, config)
        try:
            run = await self._anew_run(inputs, run_manager)
            async for event in self._aiterate(run, run_manager):
                finish = event
            assert isinstance(finish, AgentFinish)  # _aiterate always ends with the finish
            outputs = await self._areturn(run, finish, run_manager)
        except BaseException as error:
            await run_manager.on_chain_error(error)
            raise
        await run_manager.on_chain_end(outputs)
        return {**inputs, **outputs}

    def stream(self, input: dict[str, Any] | str, config: RunnableConfig | None = None,
               **kwargs: Any) -> Iterator[AddableDict]:
        """Yield ``{"actions"}`` and ``{"steps"}`` chunks as the run goes, then ``{"output"}``."""
        inputs = _prep_inputs(input)
        run_manager = self._start(inputs, config)
        try:
            run = self._new_run(inputs, run_manager)
            for event in self._iterate(run, run_manager):
                if isinstance(event, AgentFinish):
                    outputs = {**self._return(run, event, run_manager), "messages": event.messages}
                else:
                    yield _chunk(event)
        except BaseException as error:
            run_manager.on_chain_error(error)
            raise
        run_manager.on_chain_end(outputs)
        yield AddableDict(outputs)

    async def astream(self, input: dict[str, Any] | str, config: RunnableConfig | None = None,
                      **kwargs: Any) -> AsyncIterator[AddableDict]:
        """Async :meth:`stream`."""
        inputs = _prep_inputs(input)
        run_manager = await self._astart(inputs, config)
        try:
            run = await self._anew_run(inputs, run_manager)
            async for event in self._aiterate(run, run_manager):
                if isinstance(event, AgentFinish):
                    outputs = {**await self._areturn(run, event, run_manager), "messages": event.messages}
                else:
                    yield _chunk(event)
        except BaseException as error:
            await run_manager.on_chain_error(error)
            raise
        await run_manager.on_chain_end(outputs)
        yield AddableDict(outputs)

    # -- the loop, sync ---------------------------------------------------------------------------

    def _start(self, inputs: dict[str, Any], config: RunnableConfig | None) -> CallbackManagerForChainRun:
        """Fire ``on_chain_start`` for a run."""
        config = ensure_config(config)
        manager = CallbackManager.configure(config.get("callbacks"), self.callbacks, self.verbose,
                                            config.get("tags"), self.tags, config.get("metadata"), self.metadata)
        return manager.on_chain_start(None, inputs, run_id=config.get("run_id"),
                                      name=config.get("run_name") or self.get_name())

    def _new_run(self, inputs: dict[str, Any], run_manager: CallbackManagerForChainRun) -> _Run:
        """Start the policy session and the guard of a run, and announce its tools."""
        session = None
        if self.mode != "llm":
            assert self.policy is not None  # _check: the policy modes have a policy
            session = self.policy.session(str(inputs["input"]), self.tools)
        run_manager.get_child().on_custom_event(RUN_EVENT, self._run_event(), run_id=run_manager.run_id)
        return _Run(inputs, (self.guardrails or _NO_GUARDRAILS).start_run(str(run_manager.run_id)), session)

    def _iterate(self, run: _Run, run_manager: CallbackManagerForChainRun) -> Iterator[
            AgentAction | AgentStep | AgentFinish]:
        """Run the loop, yielding each action, each step, and the finish last."""
        while self._should_continue(run):
            decision = self._decide(run, run_manager)
            if isinstance(decision, _Finish):
                yield _answered(decision.answer or self._answer(run, run_manager))
                return
            yield decision.action
            run_manager.on_agent_action(decision.action, color="green")
            observation, error, ran = self._act(run, decision, run_manager)
            yield self._observe(run, decision.action, observation, error, ran, run_manager.get_child())
            run.iterations += 1
            if ran and self.lookup_tool(decision.action.tool).return_direct:
                yield AgentFinish({"output": observation}, "")
                return
        yield AgentFinish({"output": self._answer(run, run_manager) if self.early_stopping_method == "generate"
                           else STOPPED_OUTPUT}, "")

    def _decide(self, run: _Run, run_manager: CallbackManagerForChainRun) -> _Finish | _Act:
        """Choose the next action: rank with the policy, or let the LLM choose when it should."""
        callbacks = run_manager.get_child()
        config: RunnableConfig = {"callbacks": callbacks}
        available = run.guard.available(tool.name for tool in self.tools)
        candidates = self._llm_candidates(run, available)
        if run.ranking:
            callbacks.on_custom_event(RANK_EVENT, self._rank_event(run), run_id=run_manager.run_id)
        if candidates is not None:
            tools, may_answer = candidates
            try:
                return self._from_choice(run, choose_tool(self.llm, tools, self._messages(run), config,
                                                          may_answer=may_answer), available)
            except OutputParserException as error:
                return self._unusable("_Exception", error, "llm")
            except LLMCallError as error:
                return _Finish(_llm_failed(run, error))
        top = run.ranking[0]
        if top.tool == FINISH:
            return _Finish()
        try:
            filled = fill_arguments(self.llm, self.lookup_tool(top.tool), self._messages(run), config)
        except OutputParserException as error:
            return self._unusable(top.tool, error, "policy", top.probability)
        except LLMCallError as error:
            return _Finish(_llm_failed(run, error))
        return _Act(_action(filled, "policy", top.probability))

    def _act(self, run: _Run, decision: _Act, run_manager: CallbackManagerForChainRun) -> tuple[Any, bool, bool]:
        """Run the action's tool if it may run; return (observation, error, ran)."""
        if decision.problem is not None:
            return decision.problem, True, False
        action, tool = decision.action, self.lookup_tool(decision.action.tool)
        refusal = run.guard.check(tool, action.tool_input)
        if refusal is not None:
            return refused_text(refusal), True, False
        try:
            output = tool.run(action.tool_input, verbose=self.verbose, callbacks=run_manager.get_child(),
                              tool_call_id=action.tool_call_id)
            observation, error = _unwrap(output)
        except Exception as exc:  # noqa: BLE001 - a failing tool is an observation, never a crash
            observation, error = _tool_failure(tool, exc), True
        run.guard.record(tool.name, action.tool_input, error=error)
        return observation, error, True

    def _answer(self, run: _Run, run_manager: CallbackManagerForChainRun) -> str:
        """Have the LLM write the final answer from the request and the observations."""
        try:
            return write_answer(self.llm, self._messages(run), {"callbacks": run_manager.get_child()},
                                called_tools=bool(run.steps))
        except LLMCallError as error:
            return _llm_failed(run, error)

    def _return(self, run: _Run, finish: AgentFinish, run_manager: CallbackManagerForChainRun) -> dict[str, Any]:
        """Fire ``on_agent_finish`` and build the outputs."""
        run_manager.on_agent_finish(finish, color="green", verbose=self.verbose)
        return self._outputs(run, finish)

    # -- the loop, async --------------------------------------------------------------------------

    async def _astart(self, inputs: dict[str, Any], config: RunnableConfig | None) -> AsyncCallbackManagerForChainRun:
        """Async :meth:`_start`."""
        config = ensure_config(config)
        manager = AsyncCallbackManager.configure(config.get("callbacks"), self.callbacks, self.verbose,
                                                 config.get("tags"), self.tags, config.get("metadata"),
                                                 self.metadata)
        return await manager.on_chain_start(None, inputs, run_id=config.get("run_id"),
                                            name=config.get("run_name") or self.get_name())

    async def _anew_run(self, inputs: dict[str, Any], run_manager: AsyncCallbackManagerForChainRun) -> _Run:
        """Async :meth:`_new_run`.

        Policy calls run inline: they take milliseconds (the policy and its encoder lock what they
        share, so concurrent runs are safe).
        """
        session = None
        if self.mode != "llm":
            assert self.policy is not None  # _check: the policy modes have a policy
            session = self.policy.session(str(inputs["input"]), self.tools)
        await run_manager.get_child().on_custom_event(RUN_EVENT, self._run_event(), run_id=run_manager.run_id)
        return _Run(inputs, (self.guardrails or _NO_GUARDRAILS).start_run(str(run_manager.run_id)), session)

    async def _aiterate(self, run: _Run, run_manager: AsyncCallbackManagerForChainRun) -> AsyncIterator[
            AgentAction | AgentStep | AgentFinish]:
        """Async :meth:`_iterate`; ``max_execution_time`` also interrupts a step in progress."""
        try:
            while self._should_continue(run):
                decision = await self._bounded(run, self._adecide(run, run_manager))
                if isinstance(decision, _Finish):
                    answer = decision.answer
                    if not answer:  # spelled out: in ``answer or await ...`` mypy infers the await as ``str | None``
                        answer = await self._bounded(run, self._aanswer(run, run_manager))
                    yield _answered(answer)
                    return
                yield decision.action
                await run_manager.on_agent_action(decision.action, color="green")
                observation, error, ran = await self._bounded(run, self._aact(run, decision, run_manager))
                yield await self._aobserve(run, decision.action, observation, error, ran, run_manager.get_child())
                run.iterations += 1
                if ran and self.lookup_tool(decision.action.tool).return_direct:
                    yield AgentFinish({"output": observation}, "")
                    return
        except _OutOfTime:
            pass  # stop like an exhausted loop, below
        yield AgentFinish({"output": await self._aanswer(run, run_manager)
                           if self.early_stopping_method == "generate" else STOPPED_OUTPUT}, "")

    async def _bounded(self, run: _Run, step: Awaitable[_T]) -> _T:
        """Await ``step`` within what is left of ``max_execution_time``."""
        if self.max_execution_time is None:
            return await step
        try:
            return await asyncio.wait_for(step, max(0.0, self.max_execution_time - run.elapsed()))
        except (TimeoutError, asyncio.TimeoutError):
            if run.elapsed() >= self.max_execution_time:
                raise _OutOfTime from None
            raise  # a timeout of the tool or model itself, not ours

    async def _adecide(self, run: _Run, run_manager: AsyncCallbackManagerForChainRun) -> _Finish | _Act:
        """Async :meth:`_decide`."""
        callbacks = run_manager.get_child()
        config: RunnableConfig = {"callbacks": callbacks}
        available = run.guard.available(tool.name for tool in self.tools)
        candidates = self._llm_candidates(run, available)
        if run.ranking:
            await callbacks.on_custom_event(RANK_EVENT, self._rank_event(run), run_id=run_manager.run_id)
        if candidates is not None:
            tools, may_answer = candidates
            try:
                choice = await achoose_tool(self.llm, tools, self._messages(run), config, may_answer=may_answer)
                return self._from_choice(run, choice, available)
            except OutputParserException as error:
                return self._unusable("_Exception", error, "llm")
            except LLMCallError as error:
                return _Finish(_llm_failed(run, error))
        top = run.ranking[0]
        if top.tool == FINISH:
            return _Finish()
        try:
            filled = await afill_arguments(self.llm, self.lookup_tool(top.tool), self._messages(run), config)
        except OutputParserException as error:
            return self._unusable(top.tool, error, "policy", top.probability)
        except LLMCallError as error:
            return _Finish(_llm_failed(run, error))
        return _Act(_action(filled, "policy", top.probability))

    async def _aact(self, run: _Run, decision: _Act, run_manager: AsyncCallbackManagerForChainRun) -> tuple[
            Any, bool, bool]:
        """Async :meth:`_act`."""
        if decision.problem is not None:
            return decision.problem, True, False
        action, tool = decision.action, self.lookup_tool(decision.action.tool)
        refusal = await run.guard.acheck(tool, action.tool_input)
        if refusal is not None:
            return refused_text(refusal), True, False
        call = asyncio.ensure_future(self._arun_tool(tool, action, run_manager))
        in_thread = getattr(tool, "coroutine", None) is None and type(tool)._arun in _THREAD_FALLBACKS
        try:
            # A thread cannot be stopped: shielded, the call outlives a stop of the run and reports its outcome.
            observation, error = await (asyncio.shield(call) if in_thread else call)
        except asyncio.CancelledError:
            _stopped_during(run, tool.name, action.tool_input, call, in_thread=in_thread)
            raise
        run.guard.record(tool.name, action.tool_input, error=error)
        return observation, error, True

    async def _arun_tool(self, tool: BaseTool, action: PolicyAgentAction,
                         run_manager: AsyncCallbackManagerForChainRun) -> tuple[Any, bool]:
        """Run the tool asynchronously; return (observation, error)."""
        try:
            output = await tool.arun(action.tool_input, verbose=self.verbose, callbacks=run_manager.get_child(),
                                     tool_call_id=action.tool_call_id)
            return _unwrap(output)
        except Exception as exc:  # noqa: BLE001 - a failing tool is an observation, never a crash
            return _tool_failure(tool, exc), True

    async def _aanswer(self, run: _Run, run_manager: AsyncCallbackManagerForChainRun) -> str:
        """Async :meth:`_answer`."""
        try:
            return await awrite_answer(self.llm, self._messages(run), {"callbacks": run_manager.get_child()},
                                      called_tools=bool(run.steps))
        except LLMCallError as error:
            return _llm_failed(run, error)

    async def _areturn(self, run: _Run, finish: AgentFinish,
                       run_manager: AsyncCallbackManagerForChainRun) -> dict[str, Any]:
        """Async :meth:`_return`."""
        await run_manager.on_agent_finish(finish, color="green", verbose=self.verbose)
        return self._outputs(run, finish)

    # -- shared by both loops ---------------------------------------------------------------------

    def _should_continue(self, run: _Run) -> bool:
        """Whether the run may take another step (as `AgentExecutor` decides)."""
        if self.max_iterations is not None and run.iterations >= self.max_iterations:
            return False
        return self.max_execution_time is None or run.elapsed() < self.max_execution_time

    def _llm_candidates(self, run: _Run, available: set[str]) -> tuple[list[BaseTool], bool] | None:
        """Return the tools the LLM chooses among and whether it may answer; ``None`` when the policy decides.

        Ranks with the policy first (kept in ``run.ranking`` for :meth:`_decide`).
        """
        if self.mode == "llm":
            return [tool for tool in self.tools if tool.name in available], True
        assert run.session is not None  # _new_run opens one outside llm mode
        run.ranking = run.session.rank(available)
        if self.mode != "hybrid" or run.ranking[0].probability >= self.confidence_threshold:
            return None
        just_worked = run.steps[-1][0].tool if run.steps and not run.failed[-1] else None
        must_call = call_is_due(run.ranking, just_worked, self.continue_threshold, self.continue_ratio)
        # A model that must call is not offered the call that just worked: it would make it again.
        skip = {FINISH, just_worked} if must_call else {FINISH}
        return [self.lookup_tool(s.tool) for s in run.ranking[: self.top_k] if s.tool not in skip], not must_call

    def _from_choice(self, run: _Run, choice: LLMChoice, available: set[str]) -> _Finish | _Act:
        """Turn the LLM's choice into a decision; an unknown tool is answered like `AgentExecutor` does.

        In hybrid mode, a successful call of the run chosen again with the same arguments is an answer.
        """
        if choice.call is None:
            return _Finish(choice.answer or None)
        if self.mode == "hybrid" and any(
                not failed and action.tool == choice.call.tool and action.tool_input == choice.call.arguments
                for (action, _), failed in zip(run.steps, run.failed, strict=True)):
            return _Finish()  # its result is known already: answer from it
        known = {tool.name for tool in self.tools}
        probability = next((s.probability for s in run.ranking if s.tool == choice.call.tool), None)
        action = _action(choice.call, "llm", probability)
        if choice.call.tool not in known:
            names = ", ".join(sorted(available))
            return _Act(action, f"{choice.call.tool} is not a valid tool, try one of [{names}].")
        return _Act(action)

    def _unusable(self, tool: str, error: OutputParserException, decided_by: Literal["policy", "llm"],
                  probability: float | None = None) -> _Act:
        """Turn an unusable LLM reply into an action whose observation is the error."""
        if self.handle_parsing_errors is False:
            raise ValueError(
                "An output parsing error occurred. In order to pass this error back to the agent and have it "
                f"try again, pass `handle_parsing_errors=True` to the PolicyAgentExecutor. This is the error: "
                f"{error!s}") from error
        if self.handle_parsing_errors is True:
            observation = str(error.observation) if error.send_to_llm else "Invalid or incomplete response"
        elif isinstance(self.handle_parsing_errors, str):
            observation = self.handle_parsing_errors
        else:
            observation = self.handle_parsing_errors(error)
        # The chosen tool's call is shown with no arguments; a reply without any tool is an
        # "_Exception" action whose input is the observation, as in `AgentExecutor`.
        tool_input: Any = {} if tool != "_Exception" else observation
        action = PolicyAgentAction(tool=tool, tool_input=tool_input, log=str(error),
                                   message_log=[AIMessage(error.llm_output or "")], decided_by=decided_by,
                                   probability=probability)
        return _Act(action, observation)

    def _observe(self, run: _Run, action: AgentAction, observation: Any, error: bool, ran: bool,
                 callbacks: CallbackManager) -> AgentStep:
        """Record a step in the run and the policy session; announce it when its tool did not run."""
        step = self._record(run, action, observation, error)
        if step is not None and not ran:
            callbacks.on_custom_event(STEP_EVENT, {"step": step.model_dump(mode="json")},
                                      run_id=callbacks.parent_run_id)
        return AgentStep(action=action, observation=observation)

    async def _aobserve(self, run: _Run, action: AgentAction, observation: Any, error: bool, ran: bool,
                        callbacks: AsyncCallbackManager) -> AgentStep:
        """Async :meth:`_observe`."""
        step = self._record(run, action, observation, error)
        if step is not None and not ran:
            await callbacks.on_custom_event(STEP_EVENT, {"step": step.model_dump(mode="json")},
                                            run_id=callbacks.parent_run_id)
        return AgentStep(action=action, observation=observation)

    def _record(self, run: _Run, action: AgentAction, observation: Any, error: bool) -> Step | None:
        """Add the step to the run; return it as a native Step when its tool is one of ours."""
        run.steps.append((action, observation))
        run.failed.append(error)
        if action.tool not in {tool.name for tool in self.tools}:
            return None  # "_Exception" or a name the LLM made up: not a choice the policy can learn
        arguments = action.tool_input if isinstance(action.tool_input, Mapping) else {"input": action.tool_input}
        step = Step(tool=action.tool, arguments=dict(arguments), observation=observation, error=error)
        if run.session is not None:
            run.session.observe(step)
        return step

    def _messages(self, run: _Run) -> list[BaseMessage]:
        """Return what the LLM sees: the request and the (trimmed) steps so far."""
        steps = run.steps
        if isinstance(self.trim_intermediate_steps, int) and self.trim_intermediate_steps > 0:
            steps = steps[-self.trim_intermediate_steps:]
        elif callable(self.trim_intermediate_steps):
            steps = self.trim_intermediate_steps(steps)
        return build_messages(run.task, [(a.tool, a.tool_input, obs) for a, obs in steps],
                              system_prompt=self.system_prompt, chat_history=run.inputs.get("chat_history", ()))

    def _outputs(self, run: _Run, finish: AgentFinish) -> dict[str, Any]:
        """Build the run's outputs from its finish."""
        outputs = dict(finish.return_values)
        if run.still_running:
            outputs["still_running"] = run.still_running
        if run.llm_error is not None:
            outputs["llm_error"] = run.llm_error
        if self.return_intermediate_steps:
            outputs["intermediate_steps"] = run.steps
        return outputs

    @staticmethod
    def _rank_event(run: _Run) -> dict[str, Any]:
        """Return the data of :data:`RANK_EVENT`: the policy's ranking of this step."""
        return {"iteration": run.iterations, "ranking": [asdict(score) for score in run.ranking]}

    def _run_event(self) -> dict[str, Any]:
        """Return the data of :data:`RUN_EVENT`: the tools (for the recorder) and the mode."""
        return {"tools": [as_tool_spec(tool).model_dump(mode="json") for tool in self.tools], "mode": self.mode}


def _stopped_during(run: _Run, tool: str, arguments: Any, call: asyncio.Future[tuple[Any, bool]], *,
                    in_thread: bool) -> None:
    """Audit a call its run stopped during: cancelled, or (a sync tool's thread) its outcome when it comes."""
    if call.done() and not call.cancelled():  # it finished as the run stopped
        run.guard.record(tool, arguments, error=call.result()[1])
        return
    if not in_thread:  # an async tool is cancelled with its run
        run.guard.stopped(tool, arguments, still_running=False)
        return
    run.still_running.append(tool)
    run.guard.stopped(tool, arguments, still_running=True)
    _STILL_RUNNING.add(call)

    def outcome(done: asyncio.Future[tuple[Any, bool]]) -> None:
        _STILL_RUNNING.discard(done)
        if not done.cancelled():  # cancelled: the event loop closed first; the "abandoned" line stands
            run.guard.record(tool, arguments, error=done.result()[1], after_stop=True)

    call.add_done_callback(outcome)


def _prep_inputs(input: dict[str, Any] | str) -> dict[str, Any]:
    """Accept ``{"input": ...}`` or a bare request, as `AgentExecutor` does."""
    inputs = dict(input) if isinstance(input, Mapping) else {"input": input}
    if "input" not in inputs:
        raise ValueError("Missing some input keys: {'input'}")
    return inputs


def _llm_failed(run: _Run, error: LLMCallError) -> str:
    """Record a failed LLM call in the run (its outputs keep the error); return the answer that says so."""
    run.llm_error = str(error)
    return LLM_FAILED_OUTPUT.format(error=error)


def _answered(answer: str) -> AgentFinish:
    """Return the finish of a run that chose to answer (its log is the answer, as in `AgentExecutor`).

    A stop or a ``return_direct`` tool ends with an empty log instead: nothing chose to answer.
    """
    return AgentFinish({"output": answer}, answer)


def _chunk(event: AgentAction | AgentStep) -> AddableDict:
    """Return the stream chunk of an action or a step (the shapes `AgentExecutor` streams)."""
    if isinstance(event, AgentStep):
        return AddableDict(steps=[event], messages=event.messages)
    return AddableDict(actions=[event], messages=event.messages)


def _action(call: ToolArguments, decided_by: Literal["policy", "llm"], probability: float | None) -> PolicyAgentAction:
    """Build the action for filled arguments (its message log is the equivalent tool call)."""
    message = AIMessage("", tool_calls=[{"name": call.tool, "args": call.arguments, "id": call.tool_call_id}])
    return PolicyAgentAction(tool=call.tool, tool_input=call.arguments, log=f"\nInvoking: `{call.tool}` with "
                             f"`{call.arguments}`\n\n\n", message_log=[message], tool_call_id=call.tool_call_id,
                             decided_by=decided_by, probability=probability)


def _unwrap(output: Any) -> tuple[Any, bool]:
    """Return (observation, error) from a tool's output; tools called with an id return a ToolMessage."""
    if isinstance(output, ToolMessage):
        return output.content, output.status == "error"
    return output, False


def _tool_failure(tool: BaseTool, error: Exception) -> str:
    """Describe an exception the tool did not handle itself, as its observation."""
    if isinstance(error, ValidationError):
        return invalid_arguments_text(tool.name, error)
    return tool_error_text(error)


def _find_chat_model(runnable: Any) -> BaseChatModel | None:
    """Find the chat model inside an agent runnable (a sequence, a binding, a classic agent)."""
    seen, queue = set(), [runnable]
    while queue:
        item = queue.pop(0)
        if isinstance(item, BaseChatModel):
            return item
        if id(item) in seen:
            continue
        seen.add(id(item))
        for name in ("runnable", "bound", "steps", "first", "middle", "last", "llm", "steps__"):
            value = getattr(item, name, None)
            if isinstance(value, Mapping):
                queue.extend(value.values())
            elif isinstance(value, (list, tuple)):
                queue.extend(value)
            elif value is not None:
                queue.append(value)
    return None
