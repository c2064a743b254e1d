"""Fixtures for the agent tests: real tools, a scripted chat model, and a really trained policy.

The chat model is a test double for the LLM (it replays scripted replies and records what it
was asked); the policy is not: it is trained with `train_on_episodes` on synthetic episodes
over the same tools, with the real sentence encoder, once per session.
"""

from __future__ import annotations

import ast
import operator
import os
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from langchain_core.callbacks import BaseCallbackHandler  # noqa: E402
from langchain_core.language_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from langchain_core.tools import BaseTool, ToolException, tool  # noqa: E402
from langchain_core.utils.function_calling import convert_to_openai_tool  # noqa: E402
from pydantic import Field  # noqa: E402

from evoharness_agent.config import TrainConfig  # noqa: E402
from evoharness_agent.encoding import StateEncoder  # noqa: E402
from evoharness_agent.policy import ToolPolicy, as_tool_spec  # noqa: E402
from evoharness_agent.schema import Episode, Step  # noqa: E402
from evoharness_agent.trainer import train_on_episodes  # noqa: E402

# -- real tools --------------------------------------------------------------------------------

DELETED: list[str] = []

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ToolException(f"unsupported expression: {ast.dump(node)}")


@tool
def get_weather(city: str) -> str:
    """Get the current weather forecast for a city."""
    return f"Sunny, 21 C in {city}"


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as error:
        raise ToolException(f"not an arithmetic expression: {expression!r}") from error
    value = _evaluate(tree)
    return str(int(value) if float(value).is_integer() else value)


calculator.handle_tool_error = True


@tool
def search_web(query: str) -> str:
    """Search the web for facts about a topic."""
    city = query.rsplit(" ", 1)[-1]
    return f"{city} has 1000 people"


@tool
def delete_file(path: str) -> str:
    """Delete a file from disk permanently."""
    DELETED.append(path)
    return f"deleted {path}"


@tool
def get_time() -> str:
    """Return the current date and time."""
    return "2025-01-01 12:00"


@tool
def check_job(job_id: str) -> str:
    """Check whether a background job has finished."""
    return f"job {job_id} is still running"


TOOLS: list[BaseTool] = [get_weather, calculator, search_web, delete_file, get_time, check_job]

# -- a scripted chat model (the test double for the LLM) ----------------------------------------


class ScriptedChatModel(BaseChatModel):
    """Replays scripted replies; a callable reply is computed from the bound tool names.

    Every call is recorded in ``calls`` as ``{"messages", "tools", "tool_choice"}``.
    """

    script: list[Any] = Field(default_factory=list)
    calls: list[dict[str, Any]] = Field(default_factory=list)
    tool_calling: bool = True
    delay: float = 0.0

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, *, tool_choice: Any = None, **kwargs: Any) -> Any:
        if not self.tool_calling:
            raise NotImplementedError
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], tool_choice=tool_choice, **kwargs)

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        if self.delay:
            time.sleep(self.delay)
        bound = [t["function"]["name"] for t in kwargs.get("tools") or []]
        self.calls.append({"messages": messages, "tools": bound, "tool_choice": kwargs.get("tool_choice")})
        if not self.script:
            raise AssertionError(f"the scripted model got an unscripted call #{len(self.calls)}")
        reply = self.script.pop(0)
        if callable(reply):
            reply = reply(bound)
        message = AIMessage(reply) if isinstance(reply, str) else reply
        return ChatResult(generations=[ChatGeneration(message=message)])


def call(name: str, **arguments: Any) -> AIMessage:
    """Return an AI message calling one tool."""
    return AIMessage("", tool_calls=[{"name": name, "args": arguments, "id": f"call_{uuid.uuid4().hex[:12]}"}])


FILL = {"get_weather": {"city": "Tokyo"}, "calculator": {"expression": "1000 * 2"},
        "search_web": {"query": "population of Tokyo"}, "delete_file": {"path": "/tmp/tokyo.txt"}, "get_time": {},
        "check_job": {"job_id": "42"}}


def fill(bound: list[str]) -> AIMessage:
    """A scripted reply that fills whichever tool was bound, with :data:`FILL`'s arguments."""
    return call(bound[0], **FILL[bound[0]])


class EventLog(BaseCallbackHandler):
    """Records the agent-level callback events, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.root: Any = None

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: Any, parent_run_id: Any = None,
                       **kwargs: Any) -> None:
        if parent_run_id is None:
            self.root = run_id
            self.events.append(("chain_start", None))

    def on_chain_end(self, outputs: Any, *, run_id: Any, **kwargs: Any) -> None:
        if run_id == self.root:
            self.events.append(("chain_end", sorted(outputs)))

    def on_chain_error(self, error: BaseException, *, run_id: Any, **kwargs: Any) -> None:
        if run_id == self.root:
            self.events.append(("chain_error", type(error).__name__))

    def on_agent_action(self, action: Any, **kwargs: Any) -> None:
        self.events.append(("agent_action", action.tool))

    def on_tool_start(self, serialized: Any, input_str: str, **kwargs: Any) -> None:
        self.events.append(("tool_start", serialized["name"]))

    def on_tool_end(self, output: Any, **kwargs: Any) -> None:
        self.events.append(("tool_end", None))

    def on_tool_error(self, error: BaseException, **kwargs: Any) -> None:
        self.events.append(("tool_error", type(error).__name__))

    def on_agent_finish(self, finish: Any, **kwargs: Any) -> None:
        self.events.append(("agent_finish", finish.return_values["output"]))


@pytest.fixture
def kit() -> SimpleNamespace:
    """The tools, the scripted model and helpers, as one namespace."""
    DELETED.clear()

    def llm(*script: Any, tool_calling: bool = True, delay: float = 0.0) -> ScriptedChatModel:
        return ScriptedChatModel(script=list(script), tool_calling=tool_calling, delay=delay)

    return SimpleNamespace(tools=list(TOOLS), by_name={t.name: t for t in TOOLS}, llm=llm, call=call, fill=fill,
                           deleted=DELETED, events=EventLog)


# -- a really trained policy ---------------------------------------------------------------------

CITIES = ["Paris", "Lyon", "Berlin", "Madrid", "Rome", "Oslo", "Vienna", "Prague", "Lisbon", "Dublin"]
TIME_TASKS = ["What time is it?", "Tell me the current time.", "What's the date and time now?",
              "Which time is it right now?", "Current time please."]


def training_episodes() -> list[Episode]:
    """Synthetic logs: weather → answer, search → calculator → answer, polling a job four times, …"""
    specs = [as_tool_spec(t) for t in TOOLS]
    episodes = []

    def add(kind: str, i: int, task: str, *steps: Step) -> None:
        episodes.append(Episode(id=f"{kind}{i}", task=task, tools=specs, steps=list(steps), reward=1.0))

    for i, city in enumerate(CITIES):
        add("weather", i, f"What is the weather like in {city} today?",
            Step(tool="get_weather", arguments={"city": city}, observation=f"Sunny, 21 C in {city}"),
            Step(kind="assistant", content=f"Sunny in {city}."))
        add("calc", i, f"Compute {i + 3} * {i + 7}.",
            Step(tool="calculator", arguments={"expression": f"{i + 3} * {i + 7}"},
                 observation=str((i + 3) * (i + 7))),
            Step(kind="assistant", content=str((i + 3) * (i + 7))))
        add("search", i, f"Find the population of {city} and double it.",
            Step(tool="search_web", arguments={"query": f"population of {city}"},
                 observation=f"{city} has {1000 * (i + 1)} people"),
            Step(tool="calculator", arguments={"expression": f"{1000 * (i + 1)} * 2"},
                 observation=str(2000 * (i + 1))),
            Step(kind="assistant", content=str(2000 * (i + 1))))
        add("delete", i, f"Delete the file /tmp/{city.lower()}.txt",
            Step(tool="delete_file", arguments={"path": f"/tmp/{city.lower()}.txt"}, observation="deleted"),
            Step(kind="assistant", content="Done."))
        add("time", i, TIME_TASKS[i % len(TIME_TASKS)],
            Step(tool="get_time", observation="2025-01-01 12:00"), Step(kind="assistant", content="It is noon."))
        polls = [Step(tool="check_job", arguments={"job_id": str(i)}, observation=f"job {i} is still running")
                 for _ in range(3)]
        add("poll", i, f"Wait until job {i} has finished.", *polls,
            Step(tool="check_job", arguments={"job_id": str(i)}, observation=f"job {i} has finished"),
            Step(kind="assistant", content=f"Job {i} has finished."))
    return episodes


POLICY_CONFIG = {
    "algorithm": {"name": "bc"},
    "model": {"hidden": 64},
    "training": {"steps": 150, "batch_size": 64, "device": "cpu", "eval_every": 1000, "checkpoint_every": 1000},
    "logging": {"tensorboard": False},
    "data": {"val_fraction": 0.0},
}


@pytest.fixture(scope="session")
def agent_encoder(tmp_path_factory: pytest.TempPathFactory) -> StateEncoder:
    """The real all-MiniLM-L6-v2 encoder, loaded once for the agent tests."""
    return StateEncoder(cache_dir=tmp_path_factory.mktemp("agent-embeddings"), device="cpu")


@pytest.fixture(scope="session")
def policy_dir(tmp_path_factory: pytest.TempPathFactory, agent_encoder: StateEncoder) -> Path:
    """A policy directory trained on :func:`training_episodes` (about a second of training)."""
    out = tmp_path_factory.mktemp("policy")
    train_on_episodes(training_episodes(), TrainConfig.model_validate(POLICY_CONFIG), out, encoder=agent_encoder,
                      show_progress=False)
    return out


@pytest.fixture(scope="session")
def policy(policy_dir: Path, agent_encoder: StateEncoder) -> ToolPolicy:
    """The trained policy, loaded on the CPU with the shared encoder."""
    return ToolPolicy.load(policy_dir, encoder=agent_encoder, device="cpu")
