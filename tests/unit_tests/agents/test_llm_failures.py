"""A chat model that fails a call (context overflow, timeout) stops the run with a clear message, never raises."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from evoharness_agent import PolicyAgentExecutor, ToolPolicy
from evoharness_agent.agents.executor import LLM_FAILED_OUTPUT
from evoharness_agent.agents.llm_calls import LLMCallError, build_messages, fill_arguments
from evoharness_agent.local_llm import LocalModelError
from tests.kit.chat_models import fails

WEATHER = "What is the weather like in Tokyo today?"
OVERFLOW = LocalModelError("llama.cpp failed the request: request (4132 tokens) exceeds the available context "
                           "size (4096 tokens)")


def test_llm_calls_wrap_the_model_failure(kit: SimpleNamespace) -> None:
    llm = kit.llm(fails(TimeoutError("read timed out")))
    with pytest.raises(LLMCallError, match="the LLM call failed: TimeoutError: read timed out"):
        fill_arguments(llm, kit.by_name["get_weather"], build_messages(WEATHER, []))


@pytest.mark.parametrize("mode", ["policy", "llm"])
def test_a_failed_decision_stops_the_run_with_the_error(kit: SimpleNamespace, policy: ToolPolicy, mode: str) -> None:
    llm = kit.llm(fails(OVERFLOW))
    executor = PolicyAgentExecutor(llm=llm, tools=kit.tools, policy=policy, mode=mode, return_intermediate_steps=True)
    result = executor.invoke({"input": WEATHER})
    assert result["output"].startswith("Agent stopped: the LLM call failed: LocalModelError:")
    assert "exceeds the available context size" in result["llm_error"]
    assert result["intermediate_steps"] == []


def test_a_failed_answer_after_tool_calls_keeps_the_steps(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    llm = kit.llm(kit.fill, fails(TimeoutError("read timed out")))
    result = PolicyAgentExecutor(llm=llm, tools=kit.tools, policy=policy,
                                 return_intermediate_steps=True).invoke({"input": WEATHER})
    assert result["output"] == LLM_FAILED_OUTPUT.format(error="the LLM call failed: TimeoutError: read timed out")
    assert [action.tool for action, _ in result["intermediate_steps"]] == ["get_weather"]


def test_async_runs_stop_the_same_way(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    llm = kit.llm(fails(OVERFLOW))
    result = asyncio.run(PolicyAgentExecutor(llm=llm, tools=kit.tools, policy=policy).ainvoke({"input": WEATHER}))
    assert result["output"].startswith("Agent stopped: the LLM call failed") and "llm_error" in result
