"""Stopping is a decision: the real local model answers when it should, in both agent paths.

No test double: Qwen2.5-Coder-0.5B (llama.cpp on CPU) and policies trained here, in the test,
on a few synthetic episodes over the test's own tools (not the shipped default policy).

* ``LocalChatModel.bind_tools(tools)`` with ``tool_choice`` unset may answer instead of calling;
* ``create_agent`` with ``PolicyToolSelectorMiddleware`` finishes a weather→convert task in a
  bounded number of model calls (the model gets no tools once the policy is sure of FINISH);
* ``PolicyAgentExecutor(mode="hybrid")`` books once on a search→book task whose logs leave the
  policy unsure after the booking, so the LLM decides there.

Skipped without the ``local`` extra; each test takes 5-30 s on 2 busy cores (one more, marked
slow, runs ``create_agent`` with the model alone).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("xllamacpp")

from langchain_core.messages import AIMessage, HumanMessage  # noqa: E402
from langchain_core.tools import BaseTool, tool  # noqa: E402

from evoharness_agent.agents.executor import PolicyAgentAction, PolicyAgentExecutor  # noqa: E402
from evoharness_agent.encoding.embedder import StateEncoder  # noqa: E402
from evoharness_agent.learning.config import TrainConfig  # noqa: E402
from evoharness_agent.learning.trainer import train_on_episodes  # noqa: E402
from evoharness_agent.local_llm import MODELS, LocalChatModel  # noqa: E402
from evoharness_agent.policy import ToolPolicy  # noqa: E402
from evoharness_agent.schema import FINISH, Episode, Step, as_tool_spec  # noqa: E402
from tests.kit.agent_logs import POLICY_CONFIG  # noqa: E402
from tests.kit.chat_models import ModelCalls  # noqa: E402

MODEL = "qwen2.5-coder-0.5b"
_MISSING_CHUNKS = [m for m in MODELS[MODEL].chunk_modules if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(bool(_MISSING_CHUNKS), reason=f"the local model's weights are missing: "
                                                                f"{_MISSING_CHUNKS}")

CITIES = ["Paris", "Lyon", "Berlin", "Madrid", "Rome", "Oslo", "Vienna", "Prague", "Lisbon", "Dublin"]
BOOKED: list[str] = []


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city, with the temperature in Celsius."""
    return f"Sunny, 18 C in {city}"


@tool
def celsius_to_fahrenheit(celsius: float) -> str:
    """Convert a temperature from Celsius to Fahrenheit."""
    return f"{celsius * 9 / 5 + 32:g} F"


@tool
def search_flights(origin: str, destination: str, date: str) -> str:
    """Search flights from an origin city to a destination city on a date (YYYY-MM-DD)."""
    return f"Flight AF123 from {origin} to {destination} on {date} at 09:00, 120 EUR"


@tool
def book_flight(flight_id: str) -> str:
    """Book a flight by its id."""
    BOOKED.append(flight_id)
    return f"Booked flight {flight_id}; confirmation code XK42"


WEATHER_TOOLS: list[BaseTool] = [get_weather, celsius_to_fahrenheit]
TRAVEL_TOOLS: list[BaseTool] = [search_flights, book_flight]


def weather_episodes() -> list[Episode]:
    """Weather in Fahrenheit: get_weather → celsius_to_fahrenheit → answer; plus each tool alone."""
    specs = [as_tool_spec(t) for t in WEATHER_TOOLS]
    episodes = []
    for i, city in enumerate(CITIES):
        celsius = 10 + i
        weather = Step(tool="get_weather", arguments={"city": city}, observation=f"Sunny, {celsius} C in {city}")
        convert = Step(tool="celsius_to_fahrenheit", arguments={"celsius": celsius},
                       observation=f"{celsius * 9 / 5 + 32:g} F")
        for j, task in enumerate([f"What is the weather in {city}, in Fahrenheit?",
                                  f"How warm is it in {city} today, in degrees Fahrenheit?"]):
            episodes.append(Episode(id=f"f{i}-{j}", task=task, tools=specs, reward=1.0, steps=[
                weather, convert, Step(kind="assistant", content=f"Sunny and {convert.observation} in {city}.")]))
        episodes.append(Episode(id=f"w{i}", task=f"What's the weather like in {city}?", tools=specs, reward=1.0,
                                steps=[weather, Step(kind="assistant", content=f"Sunny, {celsius} C.")]))
        episodes.append(Episode(id=f"c{i}", task=f"Convert {celsius} C to Fahrenheit.", tools=specs, reward=1.0,
                                steps=[convert, Step(kind="assistant", content=convert.observation)]))
    return episodes


def booking_task(i: int) -> str:
    """The request of the i-th booking episode."""
    origin, destination = CITIES[i % len(CITIES)], CITIES[(i + 3) % len(CITIES)]
    return f"Find a flight from {origin} to {destination} on 2025-05-{i % 28 + 1:02d} and book it."


def booking_episodes() -> list[Episode]:
    """search_flights → book_flight, then an answer in half the logs and a second booking in the others.

    Logs with that mistake leave the policy unsure after the first booking, as in the issue.
    """
    specs = [as_tool_spec(t) for t in TRAVEL_TOOLS]
    episodes = []
    for i in range(20):
        origin, destination = CITIES[i % len(CITIES)], CITIES[(i + 3) % len(CITIES)]
        date = f"2025-05-{i % 28 + 1:02d}"
        search = Step(tool="search_flights", arguments={"origin": origin, "destination": destination, "date": date},
                      observation=f"Flight AF{100 + i} from {origin} to {destination} on {date} at 09:00, 120 EUR")
        book = Step(tool="book_flight", arguments={"flight_id": f"AF{100 + i}"},
                    observation=f"Booked flight AF{100 + i}; confirmation code XK{i}")
        steps = [search, book, book] if i % 2 else [search, book]
        episodes.append(Episode(id=f"b{i}", task=booking_task(i), tools=specs, reward=1.0,
                                steps=[*steps, Step(kind="assistant", content=f"Booked AF{100 + i}.")]))
    return episodes


def trained(episodes: list[Episode], out: Path, encoder: StateEncoder) -> ToolPolicy:
    """Train a small policy on ``episodes`` (about a second) and load it on the CPU."""
    train_on_episodes(episodes, TrainConfig.model_validate(POLICY_CONFIG), out, encoder=encoder, show_progress=False)
    return ToolPolicy.load(out, encoder=encoder, device="cpu")


@pytest.fixture(scope="module")
def llm() -> Iterator[LocalChatModel]:
    model = LocalChatModel.from_pretrained(MODEL, max_tokens=128).load()
    yield model
    model.close()


def test_auto_tool_choice_may_answer_and_required_still_calls(llm: LocalChatModel) -> None:
    hello = llm.bind_tools([get_weather]).invoke("Hi! Just say hello")
    assert not hello.tool_calls and not hello.invalid_tool_calls
    assert hello.content.strip() and "{" not in hello.content
    forced = llm.bind_tools([get_weather], tool_choice="required").invoke("Hi! Just say hello")
    assert [call["name"] for call in forced.tool_calls] == ["get_weather"]
    # Answering is an option, not the rule: a weather question still gets its call.
    weather = llm.bind_tools([get_weather], tool_choice="auto").invoke("What is the weather in Paris?")
    assert [call["name"] for call in weather.tool_calls] == ["get_weather"]
    assert "paris" in weather.tool_calls[0]["args"]["city"].lower()


def test_create_agent_with_the_middleware_stops(llm: LocalChatModel, agent_encoder: StateEncoder,
                                                tmp_path: Path) -> None:
    pytest.importorskip("langchain.agents")
    from langchain.agents import create_agent

    from evoharness_agent.agents.middleware import PolicyToolSelectorMiddleware

    policy = trained(weather_episodes(), tmp_path / "weather", agent_encoder)
    selector = PolicyToolSelectorMiddleware(policy, top_k=2)
    calls = ModelCalls()
    graph = create_agent(llm, WEATHER_TOOLS, middleware=[selector])
    result = graph.invoke({"messages": [HumanMessage("What is the weather in Paris, in Fahrenheit?")]},
                          {"callbacks": [calls], "recursion_limit": 12})

    made = [call["name"] for m in result["messages"] if isinstance(m, AIMessage) for call in m.tool_calls]
    assert len(made) == len(set(made)) <= 2, made  # no tool twice, let alone 56 times
    assert calls.model_calls <= 4, calls.model_calls
    final = result["messages"][-1]
    assert isinstance(final, AIMessage) and not final.tool_calls and final.text.strip()
    # It stopped because the policy was sure of FINISH: the last model call had no tools.
    assert calls.bound[-1] == [] and all(calls.bound[:-1])
    assert selector.last_ranking[0].tool == FINISH
    assert selector.last_ranking[0].probability >= (selector.finish_threshold or 0.0)


@pytest.mark.slow
def test_create_agent_alone_stops(llm: LocalChatModel) -> None:
    # No policy at all: the model decides every step, and may answer at each one.
    pytest.importorskip("langchain.agents")
    from langchain.agents import create_agent

    calls = ModelCalls()
    result = create_agent(llm, WEATHER_TOOLS).invoke(
        {"messages": [HumanMessage("What is the weather in Paris, in Fahrenheit?")]},
        {"callbacks": [calls], "recursion_limit": 16})
    final = result["messages"][-1]
    assert isinstance(final, AIMessage) and not final.tool_calls and final.text.strip()
    assert calls.model_calls <= 6, calls.model_calls


def test_hybrid_executor_books_once(llm: LocalChatModel, agent_encoder: StateEncoder, tmp_path: Path) -> None:
    policy = trained(booking_episodes(), tmp_path / "booking", agent_encoder)
    BOOKED.clear()
    threshold = 0.75
    calls = ModelCalls()
    executor = PolicyAgentExecutor(llm=llm, tools=TRAVEL_TOOLS, policy=policy, mode="hybrid",
                                   confidence_threshold=threshold, top_k=3, max_iterations=5,
                                   return_intermediate_steps=True)
    task = "Find a flight from Paris to Rome on 2025-05-01 and book it."
    result = executor.invoke({"input": task}, {"callbacks": [calls]})

    assert len(BOOKED) == 1, result["intermediate_steps"]
    tools = [action.tool for action, _ in result["intermediate_steps"]]
    assert tools == ["search_flights", "book_flight"]
    assert all(isinstance(action, PolicyAgentAction) for action, _ in result["intermediate_steps"])
    # The premise: after the booking the policy was unsure, so the LLM had the choice (and answered).
    after_booking = calls.rankings[2]
    assert after_booking[0]["probability"] < threshold, after_booking
    assert isinstance(result["output"], str) and result["output"].strip()
