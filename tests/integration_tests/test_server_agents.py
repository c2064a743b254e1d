"""The agents against a remote policy: PolicyAgentExecutor and the middleware over a live policy server.

Each run is made twice, with the local policy and with ``PolicyClient`` of a server holding the
same policy, and must be the same run: the same tool calls, the same probabilities, the same LLM
calls (tools offered, tool forced).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("fastapi")

from langchain_core.messages import HumanMessage  # noqa: E402

from evoharness_agent import PolicyAgentExecutor, PolicyClient, ToolPolicy  # noqa: E402
from evoharness_agent.server.app import create_app, serve_in_background  # noqa: E402

WEATHER = "What is the weather like in Tokyo today?"
DOUBLE = "Find the population of Tokyo and double it."
POLL = "Wait until job 42 has finished."


@pytest.fixture(scope="module")
def remote(policy: ToolPolicy) -> Iterator[PolicyClient]:
    with serve_in_background(create_app(policy)) as url, PolicyClient(url) as client:
        yield client


def trace(result: dict, llm: Any) -> tuple:
    steps = [(a.tool, a.tool_input, o, a.decided_by, round(a.probability or 0.0, 5))
             for a, o in result["intermediate_steps"]]
    return result["output"], steps, [(c["tools"], c["tool_choice"]) for c in llm.calls]


SCRIPTS: dict[str, tuple[str, Callable[[SimpleNamespace], list], dict]] = {
    "weather": (WEATHER, lambda kit: [kit.fill, "It is sunny in Tokyo."], {}),
    "two tools": (DOUBLE, lambda kit: [kit.fill, kit.fill, "Twice the population is 2000."], {}),
    "invalid arguments": (WEATHER, lambda kit: [kit.call("get_weather", town="Tokyo")] * 2, {"max_iterations": 1}),
    "hybrid": (DOUBLE, lambda kit: [kit.call("search_web", query="population of Tokyo"), kit.fill, "2000."],
               {"mode": "hybrid", "confidence_threshold": 1.0, "top_k": 2}),
}


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_the_executor_runs_alike_on_a_remote_policy(kit: SimpleNamespace, policy: ToolPolicy,
                                                    remote: PolicyClient, name: str) -> None:
    task, script, settings = SCRIPTS[name]
    runs = []
    for chosen in (policy, remote):
        llm = kit.llm(*script(kit))
        executor = PolicyAgentExecutor(llm=llm, tools=kit.tools, policy=chosen, return_intermediate_steps=True,
                                       **settings)
        runs.append(trace(executor.invoke({"input": task}), llm))
    assert runs[0] == runs[1]
    assert runs[0][1], "the run called tools"


def test_the_async_executor_runs_alike_on_a_remote_policy(kit: SimpleNamespace, policy: ToolPolicy,
                                                          remote: PolicyClient) -> None:
    async def run(chosen: object) -> tuple:
        llm = kit.llm(kit.fill, kit.fill, "Twice the population is 2000.")
        executor = PolicyAgentExecutor(llm=llm, tools=kit.tools, policy=chosen, return_intermediate_steps=True)
        return trace(await executor.ainvoke({"input": DOUBLE}), llm)

    local, remote_run = asyncio.run(run(policy)), asyncio.run(run(remote))
    assert local == remote_run and [step[0] for step in local[1]] == ["search_web", "calculator"]


def test_the_middleware_runs_alike_on_a_remote_policy(kit: SimpleNamespace, policy: ToolPolicy,
                                                      remote: PolicyClient) -> None:
    pytest.importorskip("langchain.agents")
    from langchain.agents import create_agent

    from evoharness_agent.agents.middleware import PolicyToolSelectorMiddleware

    for task, script, options in [
        (WEATHER, lambda: [kit.call("get_weather", city="Tokyo"), "Sunny in Tokyo."], {"top_k": 2}),
        (POLL, lambda: [*[kit.call("check_job", job_id="42")] * 3, "Still running."],
         {"top_k": 1, "force_threshold": 0.5}),
    ]:
        runs = []
        for chosen in (policy, remote):
            llm = kit.llm(*script())
            selector = PolicyToolSelectorMiddleware(chosen, **options)
            result = create_agent(llm, kit.tools, middleware=[selector]).invoke({"messages": [HumanMessage(task)]})
            runs.append(([m.content for m in result["messages"]],
                         [(sorted(c["tools"]), c["tool_choice"]) for c in llm.calls],
                         [(s.tool, round(s.probability, 5)) for s in selector.last_ranking]))
        assert runs[0] == runs[1]
