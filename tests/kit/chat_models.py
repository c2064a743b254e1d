"""Test doubles for the LLM: a chat model that replays scripted replies, and callback logs.

The chat model is a double for the LLM only (it records what it was asked); the policies the
tests run against it are really trained.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import Field

from evoharness_agent.logs.events import RANK_EVENT


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


def fails(error: BaseException) -> Any:
    """A scripted reply that raises ``error`` from the model's call, as a failing provider or llama.cpp does."""
    def reply(bound: list[str]) -> AIMessage:
        raise error
    return reply


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


CONFIG: dict[str, Any] = {"tags": ["tag-1"], "metadata": {"m": 1}, "run_name": "my-agent"}
"""A run config whose tags, metadata and run name :class:`ConfigLog` looks for."""


class ConfigLog(BaseCallbackHandler):
    """Records each chat-model and tool run: its name, and whether it inherited :data:`CONFIG`'s tag and metadata."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, str, bool, Any]] = []
        self.root_name: str | None = None

    def on_chain_start(self, serialized: Any, inputs: Any, *, parent_run_id: Any = None, **kwargs: Any) -> None:
        if parent_run_id is None:
            self.root_name = kwargs.get("name")

    def on_chat_model_start(self, serialized: Any, messages: Any, *, tags: Any = None, metadata: Any = None,
                            **kwargs: Any) -> None:
        self._record("chat_model", serialized.get("name", ""), tags, metadata)

    def on_tool_start(self, serialized: Any, input_str: str, *, tags: Any = None, metadata: Any = None,
                      **kwargs: Any) -> None:
        self._record("tool", serialized["name"], tags, metadata)

    def _record(self, kind: str, name: str, tags: Any, metadata: Any) -> None:
        self.runs.append((kind, name, CONFIG["tags"][0] in (tags or []), (metadata or {}).get("m")))


class ModelCalls(BaseCallbackHandler):
    """Counts chat-model calls, the tools bound to each, and keeps the executor's RANK_EVENT payloads."""

    def __init__(self) -> None:
        self.model_calls = 0
        self.bound: list[list[str]] = []
        """The tools bound to each model call."""
        self.rankings: list[list[dict[str, Any]]] = []

    def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
        self.model_calls += 1
        tools = (kwargs.get("invocation_params") or {}).get("tools") or []
        self.bound.append([t["name"] for t in tools])

    def on_custom_event(self, name: str, data: Any, *, run_id: uuid.UUID, **kwargs: Any) -> None:
        if name == RANK_EVENT:
            self.rankings.append(data["ranking"])
