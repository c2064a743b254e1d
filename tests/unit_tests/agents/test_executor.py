"""PolicyAgentExecutor with a really trained policy, real tools and a scripted chat model."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.tools import StructuredTool

from evoharness_agent import PolicyAgentExecutor, ToolPolicy
from evoharness_agent.agents.executor import STOPPED_OUTPUT, PolicyAgentAction
from evoharness_agent.agents.llm_calls import ANSWER_PROMPT, REPLY_PROMPT
from evoharness_agent.encoding.embedder import StateEncoder

WEATHER = "What is the weather like in Tokyo today?"
DOUBLE = "Find the population of Tokyo and double it."


def agent(kit: SimpleNamespace, policy: ToolPolicy | None, llm: object, **settings: object) -> PolicyAgentExecutor:
    return PolicyAgentExecutor(llm=llm, tools=kit.tools, policy=policy, **settings)


def tools_of(result: dict) -> list[tuple[str, object, object]]:
    return [(action.tool, action.tool_input, observation) for action, observation in result["intermediate_steps"]]


def test_policy_picks_the_tool_and_the_llm_only_fills_it(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    llm = kit.llm(kit.fill, "It is sunny in Tokyo.")
    result = agent(kit, policy, llm, return_intermediate_steps=True).invoke({"input": WEATHER})
    assert set(result) == {"input", "output", "intermediate_steps"}
    assert result["output"] == "It is sunny in Tokyo."
    assert tools_of(result) == [("get_weather", {"city": "Tokyo"}, "Sunny, 21 C in Tokyo")]
    action = result["intermediate_steps"][0][0]
    assert isinstance(action, PolicyAgentAction)
    assert action.decided_by == "policy" and action.probability > 0.5
    # The LLM saw only the chosen tool, forced; then wrote the answer with no tools at all.
    assert [(c["tools"], c["tool_choice"]) for c in llm.calls] == [(["get_weather"], "get_weather"), ([], None)]
    assert llm.calls[1]["messages"][0].content == ANSWER_PROMPT  # the answer is written from the results


def test_an_answer_with_no_call_before_it_is_a_reply(kit: SimpleNamespace, default_encoder: StateEncoder) -> None:
    # The shipped default answers a greeting at once (FINISH first); the LLM is asked to reply, not
    # to answer "from the results of the tool calls below", which small models echo when there are none.
    shipped = ToolPolicy.load("default", encoder=default_encoder, device="cpu")
    for run in (lambda e: e.invoke({"input": "Hello!"}), lambda e: asyncio.run(e.ainvoke({"input": "Hello!"}))):
        llm = kit.llm("Hello! How can I help?")
        result = run(agent(kit, shipped, llm, return_intermediate_steps=True))
        assert result["intermediate_steps"] == [] and result["output"] == "Hello! How can I help?"
        (reply,) = llm.calls
        assert reply["tools"] == [] and reply["messages"][0].content == REPLY_PROMPT


def test_multi_step_run_and_string_input(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    llm = kit.llm(kit.fill, kit.fill, "Twice the population is 2000.")
    result = agent(kit, policy, llm, return_intermediate_steps=True).invoke(DOUBLE)
    assert result["input"] == DOUBLE
    assert [t for t, _, _ in tools_of(result)] == ["search_web", "calculator"]
    assert tools_of(result)[1][2] == "2000"
    assert result["output"] == "Twice the population is 2000."


def test_a_tool_without_arguments_costs_no_llm_call(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    llm = kit.llm("It is noon.")
    result = agent(kit, policy, llm, return_intermediate_steps=True).invoke({"input": "What time is it now?"})
    assert tools_of(result) == [("get_time", {}, "2025-01-01 12:00")]
    assert len(llm.calls) == 1 and result["output"] == "It is noon."


def test_json_prompt_fallback_with_one_repair(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    llm = kit.llm("I think Tokyo", '```json\n{"city": "Tokyo"}\n```', "Sunny.", tool_calling=False)
    result = agent(kit, policy, llm, return_intermediate_steps=True).invoke({"input": WEATHER})
    assert tools_of(result) == [("get_weather", {"city": "Tokyo"}, "Sunny, 21 C in Tokyo")]
    first, repair = llm.calls[0]["messages"], llm.calls[1]["messages"]
    assert '"city"' in first[0].content and "JSON" in first[0].content
    assert "not valid" in repair[-1].content and repair[-2].content == "I think Tokyo"


def test_invalid_arguments_are_repaired_once_then_become_an_observation(kit: SimpleNamespace,
                                                                          policy: ToolPolicy) -> None:
    llm = kit.llm(kit.call("get_weather", town="Tokyo"), kit.call("get_weather", town="Tokyo"))
    result = agent(kit, policy, llm, return_intermediate_steps=True, max_iterations=1).invoke({"input": WEATHER})
    assert result["output"] == STOPPED_OUTPUT
    (action, observation), = result["intermediate_steps"]
    assert action.tool == "get_weather" and action.tool_input == {"town": "Tokyo"}
    assert observation.startswith("Error: invalid arguments for 'get_weather'") and "city" in observation
    assert "city" in llm.calls[1]["messages"][-1].content  # the retry quoted the validation error


def test_handle_validation_error_of_the_tool_is_honoured(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    weather = StructuredTool.from_function(kit.by_name["get_weather"].func, name="get_weather",
                                           description=kit.by_name["get_weather"].description,
                                           handle_validation_error="Please give a city.")
    tools = [weather, *(t for t in kit.tools if t.name != "get_weather")]
    llm = kit.llm(kit.call("get_weather", town="Tokyo"), kit.call("get_weather", town="Tokyo"))
    executor = PolicyAgentExecutor(llm=llm, tools=tools, policy=policy, return_intermediate_steps=True,
                                   max_iterations=1)
    assert executor.invoke({"input": WEATHER})["intermediate_steps"][0][1] == "Please give a city."


@pytest.mark.parametrize(("handling", "expected"), [
    (True, "Error: invalid arguments for 'get_weather': no tool call; call `get_weather`"),
    ("Try again.", "Try again."),
    (lambda error: f"custom: {type(error).__name__}", "custom: OutputParserException"),
])
def test_unusable_replies_follow_handle_parsing_errors(kit: SimpleNamespace, policy: ToolPolicy, handling: object,
                                                       expected: str) -> None:
    llm = kit.llm("no idea", "still no idea")
    result = agent(kit, policy, llm, return_intermediate_steps=True, max_iterations=1,
                   handle_parsing_errors=handling).invoke({"input": WEATHER})
    (action, observation), = result["intermediate_steps"]
    assert action.tool == "get_weather" and observation == expected


def test_handle_parsing_errors_false_raises_like_agent_executor(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    events = kit.events()
    llm = kit.llm("no idea", "still no idea")
    with pytest.raises(ValueError, match="handle_parsing_errors=True"):
        agent(kit, policy, llm, handle_parsing_errors=False).invoke({"input": WEATHER}, {"callbacks": [events]})
    assert events.events[-1] == ("chain_error", "ValueError")


def test_tool_errors_become_observations(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    events = kit.events()
    handled = agent(kit, policy, kit.llm(kit.call("calculator", expression="2 ** 3")), max_iterations=1,
                    return_intermediate_steps=True).invoke({"input": "Compute 2 ** 3."}, {"callbacks": [events]})
    assert "unsupported expression" in handled["intermediate_steps"][0][1]  # the tool's handle_tool_error
    assert ("tool_end", None) in events.events
    events = kit.events()
    crashed = agent(kit, policy, kit.llm(kit.call("calculator", expression="1 / 0")), max_iterations=1,
                    return_intermediate_steps=True).invoke({"input": "Compute 1 / 0."}, {"callbacks": [events]})
    assert crashed["intermediate_steps"][0][1] == "Error: ZeroDivisionError: division by zero"
    assert ("tool_error", "ZeroDivisionError") in events.events and events.events[-1][0] == "chain_end"


def test_max_iterations_stops_with_the_agent_executor_message(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    result = agent(kit, policy, kit.llm(kit.fill), max_iterations=1, return_intermediate_steps=True).invoke(DOUBLE)
    assert result["output"] == STOPPED_OUTPUT
    assert [t for t, _, _ in tools_of(result)] == ["search_web"]


def test_early_stopping_generate_lets_the_llm_answer(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    llm = kit.llm(kit.fill, "About 2000.")
    result = agent(kit, policy, llm, max_iterations=1, early_stopping_method="generate").invoke(DOUBLE)
    assert result["output"] == "About 2000."


def test_max_execution_time_stops_between_steps(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    llm = kit.llm(kit.fill, kit.fill, delay=0.15)
    result = agent(kit, policy, llm, max_execution_time=0.1, return_intermediate_steps=True).invoke(DOUBLE)
    assert result["output"] == STOPPED_OUTPUT and len(result["intermediate_steps"]) == 1


def test_async_max_execution_time_interrupts_a_step(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    llm = kit.llm(kit.fill, delay=1.0)
    executor = agent(kit, policy, llm, max_execution_time=0.3, return_intermediate_steps=True)

    async def run() -> tuple[dict, float]:
        start = time.monotonic()
        result = await executor.ainvoke(DOUBLE)
        return result, time.monotonic() - start

    result, took = asyncio.run(run())
    assert result["output"] == STOPPED_OUTPUT and result["intermediate_steps"] == []
    assert took < 0.9


def test_return_direct_tool_ends_the_run(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    weather = kit.by_name["get_weather"].model_copy(update={"return_direct": True})
    tools = [weather, *(t for t in kit.tools if t.name != "get_weather")]
    llm = kit.llm(kit.fill)
    result = PolicyAgentExecutor(llm=llm, tools=tools, policy=policy).invoke({"input": WEATHER})
    assert result == {"input": WEATHER, "output": "Sunny, 21 C in Tokyo"}
    assert len(llm.calls) == 1


def test_callbacks_fire_in_agent_executor_order(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    events = kit.events()
    agent(kit, policy, kit.llm(kit.fill, "Sunny.")).invoke({"input": WEATHER}, {"callbacks": [events]})
    assert events.events == [("chain_start", None), ("agent_action", "get_weather"), ("tool_start", "get_weather"),
                             ("tool_end", None), ("agent_finish", "Sunny."), ("chain_end", ["output"])]


def test_stream_yields_actions_steps_then_output(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    chunks = list(agent(kit, policy, kit.llm(kit.fill, "Sunny.")).stream({"input": WEATHER}))
    assert [sorted(chunk) for chunk in chunks] == [["actions", "messages"], ["messages", "steps"],
                                                    ["messages", "output"]]
    assert chunks[0]["actions"][0].tool == "get_weather"
    assert chunks[1]["steps"][0].observation == "Sunny, 21 C in Tokyo"
    assert chunks[2]["output"] == "Sunny." and chunks[2]["messages"] == [AIMessage("Sunny.")]


def test_astream_ainvoke_batch_and_abatch(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    async def run() -> tuple[list, dict, list]:
        chunks = [c async for c in agent(kit, policy, kit.llm(kit.fill, "Sunny.")).astream({"input": WEATHER})]
        single = await agent(kit, policy, kit.llm(kit.fill, "Sunny.")).ainvoke({"input": WEATHER})
        many = await agent(kit, policy, kit.llm("Noon.", "Noon.")).abatch(
            [{"input": "What time is it now?"}, {"input": "Tell me the current time."}])
        return chunks, single, many

    chunks, single, many = asyncio.run(run())
    assert [sorted(c)[0] for c in chunks] == ["actions", "messages", "messages"] and chunks[-1]["output"] == "Sunny."
    assert single == {"input": WEATHER, "output": "Sunny."}
    assert [r["output"] for r in many] == ["Noon.", "Noon."]


def test_batch_runs_in_threads(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    results = agent(kit, policy, kit.llm("Noon.", "Noon.", "Noon.")).batch(
        [{"input": "What time is it now?"}, {"input": "Tell me the current time."}, {"input": "Current time?"}])
    assert [r["output"] for r in results] == ["Noon.", "Noon.", "Noon."]


def test_hybrid_mode_asks_the_llm_among_the_top_k_when_unsure(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    llm = kit.llm(kit.call("get_weather", city="Tokyo"), "Sunny.")
    result = agent(kit, policy, llm, mode="hybrid", confidence_threshold=1.0, top_k=2,
                   return_intermediate_steps=True).invoke({"input": WEATHER})
    action = result["intermediate_steps"][0][0]
    assert action.decided_by == "llm" and action.probability > 0.5
    assert len(llm.calls[0]["tools"]) == 2 and "get_weather" in llm.calls[0]["tools"]
    assert llm.calls[0]["tool_choice"] is None and result["output"] == "Sunny."
    confident = kit.llm(kit.fill, "Sunny.")
    result = agent(kit, policy, confident, mode="hybrid", confidence_threshold=0.0,
                   return_intermediate_steps=True).invoke({"input": WEATHER})
    assert result["intermediate_steps"][0][0].decided_by == "policy"


def test_hybrid_llm_may_answer_instead_of_calling(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    # A reply without tool calls is the answer: the run ends with it, no tool runs.
    llm = kit.llm("It is sunny in Tokyo.")
    result = agent(kit, policy, llm, mode="hybrid", confidence_threshold=1.0, top_k=2,
                   return_intermediate_steps=True).invoke({"input": WEATHER})
    assert result["output"] == "It is sunny in Tokyo." and result["intermediate_steps"] == []
    assert len(llm.calls) == 1 and llm.calls[0]["tool_choice"] is None and len(llm.calls[0]["tools"]) >= 1
    assert "reply with the final answer" in llm.calls[0]["messages"][0].content
    # Without tool calling, FINISH is one of the JSON prompt's options.
    llm = kit.llm('{"tool": "FINISH", "answer": "Sunny."}', tool_calling=False)
    result = agent(kit, policy, llm, mode="hybrid", confidence_threshold=1.0).invoke({"input": WEATHER})
    assert result["output"] == "Sunny." and len(llm.calls) == 1
    assert "- FINISH: Stop calling tools and reply to the user now" in llm.calls[0]["messages"][0].content
    llm = kit.llm('{"answer": "Sunny."}', tool_calling=False)
    assert agent(kit, policy, llm, mode="hybrid", confidence_threshold=1.0).invoke({"input": WEATHER})[
        "output"] == "Sunny."


def test_hybrid_llm_must_call_while_answering_is_unlikely(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    task = "Find the population of Paris and double it."
    search, double = kit.call("search_web", query="population of Paris"), kit.call("calculator", expression="1000 * 2")
    llm = kit.llm(search, "Paris has 1000 people.", double, "2000")
    result = agent(kit, policy, llm, mode="hybrid", confidence_threshold=1.0, top_k=3,
                   return_intermediate_steps=True).invoke({"input": task})
    assert [step[0] for step in tools_of(result)] == ["search_web", "calculator"] and result["output"] == "2000"
    # After the search worked the policy put FINISH at 0.1 or less and the calculator first: the
    # LLM had to call (tool_choice "any"), without the search it had just made; its answer was
    # sent back for repair, and the retry called the calculator.
    first, due, repair, last = llm.calls
    assert first["tool_choice"] is None and last["tool_choice"] is None
    assert due["tool_choice"] == repair["tool_choice"] == "any"
    assert "calculator" in due["tools"] and "search_web" not in due["tools"]
    assert "The request is not done yet" in due["messages"][0].content
    # Without tool calling the JSON prompt leaves FINISH out, and an answer is repaired the same way.
    llm = kit.llm('{"tool": "search_web", "arguments": {"query": "population of Paris"}}',
                  '{"tool": "FINISH", "answer": "1000"}',
                  '{"tool": "calculator", "arguments": {"expression": "1000 * 2"}}',
                  '{"tool": "FINISH", "answer": "2000"}', tool_calling=False)
    result = agent(kit, policy, llm, mode="hybrid", confidence_threshold=1.0,
                   return_intermediate_steps=True).invoke({"input": task})
    assert [step[0] for step in tools_of(result)] == ["search_web", "calculator"]
    assert "- FINISH:" not in llm.calls[1]["messages"][0].content and result["output"] == "2000"
    # continue_threshold=None: the LLM may always answer.
    llm = kit.llm(search, "Paris has 1000 people.")
    result = agent(kit, policy, llm, mode="hybrid", confidence_threshold=1.0, continue_threshold=None,
                   return_intermediate_steps=True).invoke({"input": task})
    assert result["output"] == "Paris has 1000 people." and llm.calls[1]["tool_choice"] is None


def test_hybrid_takes_a_repeated_successful_call_as_the_answer(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    weather = kit.call("get_weather", city="Tokyo")
    llm = kit.llm(weather, weather, "Sunny in Tokyo.")
    result = agent(kit, policy, llm, mode="hybrid", confidence_threshold=1.0,
                   return_intermediate_steps=True).invoke({"input": WEATHER})
    assert tools_of(result) == [("get_weather", {"city": "Tokyo"}, "Sunny, 21 C in Tokyo")]
    assert result["output"] == "Sunny in Tokyo." and not llm.calls[2]["tools"]  # write_answer wrote it
    # Any successful call of the run counts, not only the latest one.
    llm = kit.llm(weather, kit.call("get_time"), weather, "Sunny at noon.")
    result = agent(kit, policy, llm, mode="hybrid", confidence_threshold=1.0,
                   return_intermediate_steps=True).invoke({"input": WEATHER})
    assert [step[0] for step in tools_of(result)] == ["get_weather", "get_time"]
    assert result["output"] == "Sunny at noon."
    # Other arguments are a new call; so is the same call after a failure.
    llm = kit.llm(weather, kit.call("get_weather", city="Paris"), "Sunny.")
    result = agent(kit, policy, llm, mode="hybrid", confidence_threshold=1.0, max_iterations=2,
                   return_intermediate_steps=True).invoke({"input": WEATHER})
    assert [step[1] for step in tools_of(result)] == [{"city": "Tokyo"}, {"city": "Paris"}]
    compute = kit.call("calculator", expression="2 ** 3")
    llm = kit.llm(compute, compute, "No.")
    result = agent(kit, policy, llm, mode="hybrid", confidence_threshold=1.0, max_iterations=2,
                   return_intermediate_steps=True).invoke({"input": "Compute 2 ** 3."})
    assert [step[0] for step in tools_of(result)] == ["calculator", "calculator"]


def test_llm_mode_needs_no_policy_and_answers_unknown_tools(kit: SimpleNamespace) -> None:
    llm = kit.llm(kit.call("teleport", to="Tokyo"), kit.call("get_weather", city="Tokyo"), "Sunny.")
    result = agent(kit, None, llm, mode="llm", return_intermediate_steps=True).invoke({"input": WEATHER})
    (bad, refusal), (good, observation) = result["intermediate_steps"]
    assert refusal.startswith("teleport is not a valid tool, try one of [calculator, check_job, delete_file,")
    assert good.decided_by == "llm" and good.probability is None and observation == "Sunny, 21 C in Tokyo"
    assert sorted(llm.calls[0]["tools"]) == sorted(t.name for t in kit.tools)
    assert result["output"] == "Sunny."


def test_llm_context_trimming_history_and_system_prompt(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    llm = kit.llm(kit.fill, kit.fill, "2000.")
    history = [HumanMessage("Hi"), AIMessage("Hello!")]
    agent(kit, policy, llm, trim_intermediate_steps=1, system_prompt="Answer in French.").invoke(
        {"input": DOUBLE, "chat_history": history})
    final = llm.calls[-1]["messages"]
    assert isinstance(final[0], SystemMessage) and final[0].content.endswith("Answer in French.")
    assert final[1:3] == history
    assert "calculator(" in final[-1].content and "search_web(" not in final[-1].content


def test_construction_checks_and_policy_from_a_directory(kit: SimpleNamespace, policy_dir: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVOHARNESS_CACHE_DIR", str(tmp_path))  # the loaded policy's own encoder caches here
    shipped = PolicyAgentExecutor(llm=kit.llm(), tools=kit.tools)  # no policy: the shipped general one
    assert isinstance(shipped.policy, ToolPolicy) and shipped.policy.meta["known_tools"]
    with pytest.raises(ValueError, match="unique"):
        PolicyAgentExecutor(llm=kit.llm(), tools=[*kit.tools, kit.tools[0]], mode="llm")
    loaded = PolicyAgentExecutor(llm=kit.llm(), tools=kit.tools, policy=str(policy_dir))
    assert isinstance(loaded.policy, ToolPolicy)
    assert loaded.output_keys == ["output"] and loaded.input_keys == ["input"]


def test_from_agent_and_tools_finds_the_chat_model(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    llm = kit.llm()
    prompt = ChatPromptTemplate.from_messages([("human", "{input}")])
    executor = PolicyAgentExecutor.from_agent_and_tools(prompt | llm.bind_tools(kit.tools), kit.tools, policy=policy,
                                                        max_iterations=3)
    assert executor.llm is llm and executor.max_iterations == 3
    with pytest.raises(ValueError, match="no chat model"):
        PolicyAgentExecutor.from_agent_and_tools(prompt, kit.tools, policy=policy)
