"""Parity with langchain-classic's AgentExecutor: same scripted scenarios, same results and callbacks.

Both executors get the same real tools and the same scripted chat-model replies. In
`AgentExecutor` the LLM picks each tool (the script says which); in ours the trained policy
picks it and the LLM only fills its arguments: the scenarios are ones the policy learned, so
both runs take the same steps and must look the same from outside.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("langchain_classic")

from langchain_classic.agents import AgentExecutor, create_tool_calling_agent  # noqa: E402
from langchain_core.prompts import ChatPromptTemplate  # noqa: E402

from evoharness_agent import EpisodeRecorder, PolicyAgentExecutor, ToolPolicy, load_episodes  # noqa: E402

WEATHER = "What is the weather like in Tokyo today?"
DOUBLE = "Find the population of Tokyo and double it."
PROMPT = ChatPromptTemplate.from_messages([("system", "You are a helpful assistant."), ("human", "{input}"),
                                           ("placeholder", "{agent_scratchpad}")])


def both(kit: SimpleNamespace, policy: ToolPolicy, script: Callable[[], list[Any]], tools: list | None = None,
         delay: float = 0.0, **settings: Any) -> tuple[AgentExecutor, PolicyAgentExecutor]:
    """Build AgentExecutor and PolicyAgentExecutor over the same tools, each with a fresh copy of the script."""
    tools = tools or kit.tools
    classic_llm = kit.llm(*script(), delay=delay)
    classic = AgentExecutor(agent=create_tool_calling_agent(classic_llm, tools, PROMPT), tools=tools, **settings)
    ours = PolicyAgentExecutor(llm=kit.llm(*script(), delay=delay), tools=tools, policy=policy, **settings)
    return classic, ours


def steps(result: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    return [(a.tool, a.tool_input, o) for a, o in result.get("intermediate_steps", [])]


def run(executor: Any, kit: SimpleNamespace, task: str) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    events = kit.events()
    result = executor.invoke({"input": task}, {"callbacks": [events]})
    return result, events.events


SCENARIOS = {
    "one tool": (WEATHER, lambda kit: [kit.call("get_weather", city="Tokyo"), "It is sunny in Tokyo."], {}),
    "two tools": (DOUBLE, lambda kit: [kit.call("search_web", query="population of Tokyo"),
                                       kit.call("calculator", expression="1000 * 2"), "2000 people."], {}),
    "handled tool error": ("Compute 2 ** 3.", lambda kit: [kit.call("calculator", expression="2 ** 3"),
                                                           "I cannot compute powers."], {}),
    "max_iterations": (DOUBLE, lambda kit: [kit.call("search_web", query="population of Tokyo")],
                       {"max_iterations": 1}),
    "no intermediate steps": (WEATHER, lambda kit: [kit.call("get_weather", city="Tokyo"), "Sunny."],
                              {"return_intermediate_steps": False}),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_same_output_steps_and_callbacks(kit: SimpleNamespace, policy: ToolPolicy, name: str) -> None:
    task, script, settings = SCENARIOS[name]
    classic, ours = both(kit, policy, lambda: script(kit), **{"return_intermediate_steps": True, **settings})
    (expected, expected_events), (got, got_events) = run(classic, kit, task), run(ours, kit, task)
    assert set(got) == set(expected)
    assert got["output"] == expected["output"]
    assert steps(got) == steps(expected)
    assert got_events == expected_events


def test_same_stop_on_max_execution_time(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    def script() -> list[Any]:
        return [kit.call("search_web", query="population of Tokyo"), kit.call("calculator", expression="1000 * 2")]

    classic, ours = both(kit, policy, script, delay=0.15, max_execution_time=0.1, return_intermediate_steps=True)
    expected, got = classic.invoke({"input": DOUBLE}), ours.invoke({"input": DOUBLE})
    assert got["output"] == expected["output"] == "Agent stopped due to max iterations."
    assert steps(got) == steps(expected) and len(steps(got)) == 1


def test_same_return_direct_behaviour(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    weather = kit.by_name["get_weather"].model_copy(update={"return_direct": True})
    tools = [weather, *(t for t in kit.tools if t.name != "get_weather")]
    classic, ours = both(kit, policy, lambda: [kit.call("get_weather", city="Tokyo")], tools=tools)
    (expected, expected_events), (got, got_events) = run(classic, kit, WEATHER), run(ours, kit, WEATHER)
    assert got == expected == {"input": WEATHER, "output": "Sunny, 21 C in Tokyo"}
    assert got_events == expected_events


def test_same_stream_chunks_sync_and_async(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    def script() -> list[Any]:
        return [kit.call("get_weather", city="Tokyo"), "Sunny."]

    def shape(chunks: list[dict[str, Any]]) -> list[tuple[list[str], Any]]:
        return [(sorted(c), [a.tool for a in c.get("actions", [])] or [s.observation for s in c.get("steps", [])]
                 or c.get("output")) for c in chunks]

    classic, ours = both(kit, policy, script)
    assert shape(list(ours.stream({"input": WEATHER}))) == shape(list(classic.stream({"input": WEATHER})))

    async def collect(executor: Any) -> list[dict[str, Any]]:
        return [chunk async for chunk in executor.astream({"input": WEATHER})]

    classic, ours = both(kit, policy, script)
    assert shape(asyncio.run(collect(ours))) == shape(asyncio.run(collect(classic)))


def test_same_async_and_batch_results(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    def script() -> list[Any]:
        return [kit.call("get_weather", city="Tokyo"), "Sunny.", kit.call("get_weather", city="Tokyo"), "Sunny."]

    classic, ours = both(kit, policy, script)
    expected = asyncio.run(classic.abatch([{"input": WEATHER}, {"input": WEATHER}], {"max_concurrency": 1}))
    assert asyncio.run(ours.abatch([{"input": WEATHER}, {"input": WEATHER}], {"max_concurrency": 1})) == expected
    classic, ours = both(kit, policy, script)
    assert asyncio.run(ours.ainvoke({"input": WEATHER})) == asyncio.run(classic.ainvoke({"input": WEATHER}))


def test_recorder_writes_the_same_episode_for_both(kit: SimpleNamespace, policy: ToolPolicy, tmp_path: Path) -> None:
    def script() -> list[Any]:
        return [kit.call("search_web", query="population of Tokyo"), kit.call("calculator", expression="1000 * 2"),
                "2000 people."]

    classic, ours = both(kit, policy, script)
    classic.invoke({"input": DOUBLE}, {"callbacks": [EpisodeRecorder(tmp_path / "classic.jsonl")]})
    ours.invoke({"input": DOUBLE}, {"callbacks": [EpisodeRecorder(tmp_path / "ours.jsonl")]})
    (expected,) = load_episodes([tmp_path / "classic.jsonl"]).episodes
    (got,) = load_episodes([tmp_path / "ours.jsonl"]).episodes

    def essence(episode: Any) -> tuple[Any, ...]:
        return (episode.task, [(s.kind, s.tool, s.arguments, s.observation, s.error) for s in episode.steps],
                episode.final_answer, sorted(episode.tool_names()))

    assert essence(got) == essence(expected)
    assert expected.metadata["source"] == "AgentExecutor" and got.metadata["source"] == "PolicyAgentExecutor"
