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
from langchain_core.callbacks import AsyncCallbackHandler  # noqa: E402
from langchain_core.prompts import ChatPromptTemplate  # noqa: E402

from evoharness_agent import EpisodeRecorder, PolicyAgentExecutor, ToolPolicy, load_episodes  # noqa: E402
from evoharness_agent.logs.events import RANK_EVENT  # noqa: E402
from tests.kit.chat_models import CONFIG, ConfigLog  # noqa: E402

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
    classic.invoke({"input": DOUBLE}, {"callbacks": [EpisodeRecorder(tmp_path / "classic.jsonl", background=False)]})
    ours.invoke({"input": DOUBLE}, {"callbacks": [EpisodeRecorder(tmp_path / "ours.jsonl", background=False)]})
    (expected,) = load_episodes([tmp_path / "classic.jsonl"]).episodes
    (got,) = load_episodes([tmp_path / "ours.jsonl"]).episodes

    def essence(episode: Any) -> tuple[Any, ...]:
        return (episode.task, [(s.kind, s.tool, s.arguments, s.observation, s.error) for s in episode.steps],
                episode.final_answer, sorted(episode.tool_names()))

    assert essence(got) == essence(expected)
    assert expected.metadata["source"] == "AgentExecutor" and got.metadata["source"] == "PolicyAgentExecutor"


class AsyncEventLog(AsyncCallbackHandler):
    """The agent-level events of :class:`EventLog`, from an async handler."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    async def on_agent_action(self, action: Any, **kwargs: Any) -> None:
        self.events.append(("agent_action", action.tool))

    async def on_tool_start(self, serialized: Any, input_str: str, **kwargs: Any) -> None:
        self.events.append(("tool_start", serialized["name"]))

    async def on_tool_end(self, output: Any, **kwargs: Any) -> None:
        self.events.append(("tool_end", None))

    async def on_agent_finish(self, finish: Any, **kwargs: Any) -> None:
        self.events.append(("agent_finish", finish.return_values["output"]))


def test_same_config_propagation_to_llm_and_tool_runs(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    classic, ours = both(kit, policy, lambda: [kit.call("get_weather", city="Tokyo"), "Sunny."])
    logs = []
    for executor in (classic, ours):
        log = ConfigLog()
        executor.invoke({"input": WEATHER}, {"callbacks": [log], **CONFIG})
        logs.append(log)
    expected, got = logs
    assert got.runs == expected.runs
    assert [kind for kind, *_ in got.runs] == ["chat_model", "tool", "chat_model"]
    assert all(tagged and m == 1 for _, _, tagged, m in got.runs)
    assert got.root_name == expected.root_name == "my-agent"


def test_same_sync_batch_and_async_callbacks(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    def script() -> list[Any]:
        return [kit.call("get_weather", city="Tokyo"), "Sunny.", kit.call("get_weather", city="Tokyo"), "Sunny."]

    classic, ours = both(kit, policy, script)
    inputs = [{"input": WEATHER}, {"input": WEATHER}]
    expected = classic.batch(inputs, {"max_concurrency": 1})
    assert ours.batch(inputs, {"max_concurrency": 1}) == expected and len(expected) == 2
    classic, ours = both(kit, policy, script)
    logs = [AsyncEventLog(), AsyncEventLog()]
    asyncio.run(classic.ainvoke({"input": WEATHER}, {"callbacks": [logs[0]]}))
    asyncio.run(ours.ainvoke({"input": WEATHER}, {"callbacks": [logs[1]]}))
    assert logs[1].events == logs[0].events
    assert logs[1].events == [("agent_action", "get_weather"), ("tool_start", "get_weather"), ("tool_end", None),
                              ("agent_finish", "Sunny.")]


def test_same_astream_events(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    async def events(executor: Any) -> list[tuple[str, str]]:
        return [(e["event"], e["name"]) async for e in executor.astream_events({"input": WEATHER}, version="v2")
                if e["event"] in ("on_tool_start", "on_tool_end") or not e["parent_ids"]]

    classic, ours = both(kit, policy, lambda: [kit.call("get_weather", city="Tokyo"), "Sunny."])
    expected, got = asyncio.run(events(classic)), asyncio.run(events(ours))
    # Ours adds custom events (the policy's ranking and steps); the rest is the same stream.
    assert ("on_custom_event", RANK_EVENT) in got
    assert [kind for kind, _ in got if kind != "on_custom_event"] == [kind for kind, _ in expected]
    assert [e for e in got if "tool" in e[0]] == [("on_tool_start", "get_weather"), ("on_tool_end", "get_weather")]
