"""PolicyToolSelectorMiddleware inside a real `create_agent` graph, with a really trained policy."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("langchain.agents")

from langchain.agents import create_agent  # noqa: E402
from langchain.agents.middleware import ModelRequest  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402

from evoharness_agent import EpisodeRecorder, ToolPolicy, load_episodes  # noqa: E402
from evoharness_agent.agents.middleware import PolicyToolSelectorMiddleware, conversation_state  # noqa: E402
from evoharness_agent.schema import FINISH  # noqa: E402
from tests.kit.chat_models import CONFIG, ConfigLog  # noqa: E402

WEATHER = "What is the weather like in Tokyo today?"
POLL = "Wait until job 42 has finished."


def choices(llm: object) -> list[tuple[list[str], object]]:
    return [(sorted(c["tools"]), c["tool_choice"]) for c in llm.calls]


def test_narrows_to_top_k_and_forces_only_when_confident(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    llm = kit.llm(kit.call("get_weather", city="Tokyo"), "Sunny in Tokyo.")
    selector = PolicyToolSelectorMiddleware(policy, top_k=2, force_threshold=0.8, finish_threshold=None)
    graph = create_agent(llm, kit.tools, middleware=[selector])
    result = graph.invoke({"messages": [HumanMessage(WEATHER)]})
    assert result["messages"][-1].content == "Sunny in Tokyo."
    assert result["messages"][2].content == "Sunny, 21 C in Tokyo"  # the real tool ran
    (first_tools, first_choice), (second_tools, second_choice) = choices(llm)
    assert len(first_tools) == 2 and "get_weather" in first_tools and first_choice == "get_weather"
    assert len(second_tools) == 2 and second_choice is None  # FINISH is never forced
    assert selector.last_ranking[0].tool == FINISH


def test_a_confident_finish_leaves_the_model_no_tools(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    llm = kit.llm(kit.call("get_weather", city="Tokyo"), "Sunny in Tokyo.")
    selector = PolicyToolSelectorMiddleware(policy, top_k=1, always_include=["get_time"])
    result = create_agent(llm, kit.tools, middleware=[selector]).invoke({"messages": [HumanMessage(WEATHER)]})
    assert result["messages"][-1].content == "Sunny in Tokyo."
    # The policy is sure the weather answers the request: the model is offered nothing to call.
    assert choices(llm) == [(["get_time", "get_weather"], "get_weather"), ([], None)]
    assert selector.last_ranking[0].tool == FINISH and selector.last_ranking[0].probability >= 0.8
    # Under the threshold the model still sees the top tools, and decides itself.
    unsure = PolicyToolSelectorMiddleware(policy, top_k=2, finish_threshold=1.0)
    llm = kit.llm(kit.call("get_weather", city="Tokyo"), "Sunny in Tokyo.")
    create_agent(llm, kit.tools, middleware=[unsure]).invoke({"messages": [HumanMessage(WEATHER)]})
    second_tools, second_choice = choices(llm)[1]
    assert len(second_tools) == 2 and second_choice is None
    for bad in ({"finish_threshold": 1.5}, {"force_threshold": -0.1}, {"continue_threshold": 2.0}):
        with pytest.raises(ValueError, match="probability"):
            PolicyToolSelectorMiddleware(policy, **bad)


def test_never_forces_the_same_tool_twice_in_a_row(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    llm = kit.llm(*[kit.call("check_job", job_id="42")] * 3, "Job 42 is still running.")
    selector = PolicyToolSelectorMiddleware(policy, top_k=1, force_threshold=0.5)
    create_agent(llm, kit.tools, middleware=[selector]).invoke({"messages": [HumanMessage(POLL)]})
    # The policy wants check_job again after each poll, confidently: forcing it every time would
    # leave the model no way to answer.
    assert [choice for _, choice in choices(llm)] == ["check_job", None, None, None]
    assert selector.last_ranking[0].tool == "check_job" and selector.last_ranking[0].probability > 0.5
    assert all(tools == ["check_job"] for tools, _ in choices(llm))


def test_a_call_is_required_while_answering_is_unlikely(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    task = "Find the population of Paris and double it."
    script = (kit.call("search_web", query="population of Paris"), kit.call("calculator", expression="1000 * 2"),
              "2000")
    llm = kit.llm(*script)
    selector = PolicyToolSelectorMiddleware(policy, top_k=2, force_threshold=None)
    result = create_agent(llm, kit.tools, middleware=[selector]).invoke({"messages": [HumanMessage(task)]})
    assert result["messages"][-1].content == "2000"
    (_, first), (second_tools, second), (_, third) = choices(llm)
    # After the search worked, the policy gives answering now a probability under 0.1 and ranks
    # the calculator first: the model must call, and is not shown the search it just made.
    assert first is None and second == "any" and third is None
    assert "calculator" in second_tools and "search_web" not in second_tools and len(second_tools) == 2
    free = PolicyToolSelectorMiddleware(policy, top_k=2, force_threshold=None, continue_threshold=None)
    llm = kit.llm(*script)
    create_agent(llm, kit.tools, middleware=[free]).invoke({"messages": [HumanMessage(task)]})
    assert [choice for _, choice in choices(llm)] == [None, None, None]
    assert "search_web" in choices(llm)[1][0]


def test_not_forced_under_the_threshold_and_always_include(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    llm = kit.llm(kit.call("get_weather", city="Tokyo"), "Sunny.")
    selector = PolicyToolSelectorMiddleware(policy, top_k=1, force_threshold=None, always_include=["get_time"])
    create_agent(llm, kit.tools, middleware=[selector]).invoke({"messages": [HumanMessage(WEATHER)]})
    assert choices(llm)[0] == (["get_time", "get_weather"], None)


def test_async_graph_and_a_policy_directory(kit: SimpleNamespace, policy_dir: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVOHARNESS_CACHE_DIR", str(tmp_path))  # the loaded policy's own encoder caches here
    llm = kit.llm(kit.call("get_weather", city="Tokyo"), "Sunny.")
    graph = create_agent(llm, kit.tools, middleware=[PolicyToolSelectorMiddleware(policy_dir, top_k=3)])
    result = asyncio.run(graph.ainvoke({"messages": [HumanMessage(WEATHER)]}))
    assert result["messages"][-1].content == "Sunny."
    assert choices(llm)[0][1] == "get_weather" and len(choices(llm)[0][0]) == 3


def test_leaves_a_decided_tool_choice_alone(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    request = ModelRequest(model=kit.llm(), messages=[HumanMessage(WEATHER)], tools=kit.tools, tool_choice="any")
    assert PolicyToolSelectorMiddleware(policy).select(request) is request
    no_user = ModelRequest(model=kit.llm(), messages=[AIMessage("Hello")], tools=kit.tools)
    assert PolicyToolSelectorMiddleware(policy).select(no_user) is no_user


def test_conversation_state_reads_calls_results_and_turns() -> None:
    messages = [HumanMessage("Weather in Tokyo?"),
                AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Tokyo"}, "id": "a"}]),
                ToolMessage("boom", tool_call_id="a", status="error"), AIMessage("Sorry, it failed."),
                HumanMessage("Try Paris then.")]
    task, steps = conversation_state(messages)
    assert task == "Weather in Tokyo?"
    assert [(s.kind, s.tool, s.observation, s.error, s.content) for s in steps] == [
        ("tool_call", "get_weather", "boom", True, ""), ("assistant", None, "", False, "Sorry, it failed."),
        ("user", None, "", False, "Try Paris then.")]


def test_recorder_records_create_agent_graphs(kit: SimpleNamespace, policy: ToolPolicy, tmp_path: Path) -> None:
    path = tmp_path / "graph.jsonl"
    llm = kit.llm(kit.call("search_web", query="population of Tokyo"), kit.call("calculator", expression="1000 * 2"),
                  "2000 people.")
    create_agent(llm, kit.tools).invoke({"messages": [HumanMessage("Find the population of Tokyo and double it.")]},
                                        {"callbacks": [EpisodeRecorder(path, background=False)]})
    llm = kit.llm(kit.call("get_weather", city="Tokyo"), "Sunny.")
    create_agent(llm, kit.tools, middleware=[PolicyToolSelectorMiddleware(policy, top_k=1)]).invoke(
        {"messages": [HumanMessage(WEATHER)]},
        {"callbacks": [EpisodeRecorder(path, tools=kit.tools, background=False)]})
    plain, narrowed = load_episodes([path]).episodes
    assert [(s.tool, s.observation) for s in plain.steps] == [
        ("search_web", "Tokyo has 1000 people"), ("calculator", "2000"), (None, "")]
    assert plain.final_answer == "2000 people." and plain.steps[-1].content == "2000 people."
    assert sorted(plain.tool_names()) == sorted(t.name for t in kit.tools)  # learned from the bound tools
    assert narrowed.task == WEATHER and [s.tool for s in narrowed.steps] == ["get_weather", None]
    assert sorted(narrowed.tool_names()) == sorted(t.name for t in kit.tools)  # given: the model saw only one


def _graphs(kit: SimpleNamespace, policy: ToolPolicy, script: Any) -> tuple[Any, Any]:
    """create_agent without and with the middleware, each over a fresh copy of the scripted replies."""
    plain = create_agent(kit.llm(*script()), kit.tools)
    narrowed = create_agent(kit.llm(*script()), kit.tools, middleware=[PolicyToolSelectorMiddleware(policy, top_k=2)])
    return plain, narrowed


def _weather_script(kit: SimpleNamespace, runs: int = 1) -> Any:
    return lambda: [kit.call("get_weather", city="Tokyo"), "Sunny in Tokyo."] * runs


def _shape(messages: list[Any]) -> list[tuple[str, Any]]:
    return [(m.type, [c["name"] for c in m.tool_calls] if isinstance(m, AIMessage) and m.tool_calls else m.content)
            for m in messages]


def test_streams_like_create_agent_sync_and_async(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    def updates(chunks: list[dict[str, Any]]) -> list[tuple[str, Any]]:
        return [(node, _shape(update["messages"])) for chunk in chunks for node, update in chunk.items()]

    request = {"messages": [HumanMessage(WEATHER)]}
    plain, narrowed = _graphs(kit, policy, _weather_script(kit))
    expected = updates(list(plain.stream(request, stream_mode="updates")))
    assert updates(list(narrowed.stream(request, stream_mode="updates"))) == expected
    assert [node for node, _ in expected] == ["model", "tools", "model"]

    async def messages(graph: Any) -> list[tuple[str, Any]]:
        return [(meta["langgraph_node"], _shape([m])[0]) async for m, meta in graph.astream(request,
                                                                                          stream_mode="messages")]

    plain, narrowed = _graphs(kit, policy, _weather_script(kit))
    assert asyncio.run(messages(narrowed)) == asyncio.run(messages(plain))


def test_batches_like_create_agent(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    inputs = [{"messages": [HumanMessage(WEATHER)]}, {"messages": [HumanMessage(WEATHER)]}]
    plain, narrowed = _graphs(kit, policy, _weather_script(kit, runs=2))
    expected = [_shape(r["messages"]) for r in plain.batch(inputs, {"max_concurrency": 1})]
    assert [_shape(r["messages"]) for r in narrowed.batch(inputs, {"max_concurrency": 1})] == expected
    plain, narrowed = _graphs(kit, policy, _weather_script(kit, runs=2))
    expected = [_shape(r["messages"]) for r in asyncio.run(plain.abatch(inputs, {"max_concurrency": 1}))]
    assert [_shape(r["messages"]) for r in asyncio.run(narrowed.abatch(inputs, {"max_concurrency": 1}))] == expected


def test_callbacks_and_config_reach_model_and_tool_runs(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    logs = []
    for graph in _graphs(kit, policy, _weather_script(kit)):
        log = ConfigLog()
        graph.invoke({"messages": [HumanMessage(WEATHER)]}, {"callbacks": [log], **CONFIG})
        logs.append(log)
    expected, got = logs
    assert got.runs == expected.runs
    assert [(kind, tagged, m) for kind, _, tagged, m in got.runs] == [("chat_model", True, 1), ("tool", True, 1),
                                                                      ("chat_model", True, 1)]
    assert got.root_name == expected.root_name == "my-agent"
