"""The native log schema: one `Episode` per JSONL line.

An episode is what one agent run did: the task, the tools it could use, and the ordered
steps. Steps are of three kinds, so multi-turn conversations fit the same shape:

* ``tool_call``: the agent called ``tool`` with ``arguments`` and got ``observation``
  (``error`` is true when the call failed). This is a decision whose action is the tool.
* ``assistant``: the agent answered the user instead of calling a tool. This is a decision
  whose action is :data:`FINISH` ("answer now").
* ``user``: a new user message arrived (a new turn). Not a decision; it may make new tools
  available (``tools_added``), as in BFCL's missing-function scenarios.

Example line::

    {"id": "ep-1", "task": "Cancel reservation EHGLP3",
     "tools": [{"name": "get_reservation_details", "description": "...",
                "parameters": {"type": "object", "properties": {...}}}],
     "steps": [{"kind": "tool_call", "tool": "get_reservation_details",
                "arguments": {"reservation_id": "EHGLP3"}, "observation": "{...}"},
               {"kind": "assistant", "content": "Your reservation is cancelled."}],
     "final_answer": "Your reservation is cancelled.", "reward": 1.0, "metadata": {}}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

FINISH = "FINISH"
"""The action "stop calling tools and answer the user"; ranked like any other tool."""

FINISH_DESCRIPTION = (
    "Stop calling tools and reply to the user now: answer, ask for missing information, "
    "or explain why the request cannot be done."
)

__all__ = [
    "FINISH",
    "FINISH_DESCRIPTION",
    "Episode",
    "Step",
    "ToolSpec",
    "as_tool_spec",
    "finish_spec",
    "invalid_arguments_text",
    "refused_text",
    "tool_error_text",
    "unavailable_tool_text",
    "unknown_tool_text",
]


class ToolSpec(BaseModel):
    """A tool the agent may call: name, description and JSON-schema parameters."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})

    @field_validator("parameters", mode="before")
    @classmethod
    def _normalise_schema(cls, value: Any) -> Any:
        """Accept real logs' ``"type": "dict"`` (BFCL, Gemini style) as ``"object"``."""
        return _normalise_json_schema(value) if value is not None else {"type": "object"}

    def text(self) -> str:
        """Return the text embedded for this tool: its name and description."""
        return f"{self.name}: {self.description}".strip()


class Step(BaseModel):
    """One event of an episode: a tool call, an assistant reply or a user message."""

    model_config = ConfigDict(extra="ignore")

    kind: Literal["tool_call", "assistant", "user"] = "tool_call"
    tool: str | None = None
    arguments: dict[str, Any] = Field(default_factory=dict)
    observation: str = ""
    error: bool = False
    content: str = ""
    reward: float | None = Field(default=None, allow_inf_nan=False)  # NaN/inf would poison training
    tools_added: list[str] = Field(default_factory=list)

    @field_validator("observation", mode="before")
    @classmethod
    def _stringify_observation(cls, value: Any) -> Any:
        """Keep structured observations as JSON text: the encoder embeds strings."""
        if value is None:
            return ""
        if isinstance(value, str):
            return value
        import json

        return json.dumps(value, ensure_ascii=False, default=str)

    def model_post_init(self, __context: Any) -> None:
        """Check that a tool call names its tool."""
        if self.kind == "tool_call" and not self.tool:
            raise ValueError("a tool_call step needs a non-empty 'tool'")

    @property
    def is_decision(self) -> bool:
        """Whether the agent chose an action here (a tool, or FINISH)."""
        return self.kind != "user"

    @property
    def action(self) -> str:
        """The action taken at this step: the tool's name, or FINISH for a reply."""
        return self.tool if self.kind == "tool_call" and self.tool else FINISH


class Episode(BaseModel):
    """One logged agent run (one JSONL line in the native format)."""

    model_config = ConfigDict(extra="ignore")

    id: str = ""
    task: str
    tools: list[ToolSpec] = Field(default_factory=list)
    available_at_start: list[str] | None = None
    steps: list[Step] = Field(default_factory=list)
    final_answer: str = ""
    reward: float | None = Field(default=None, allow_inf_nan=False)
    metadata: dict[str, Any] = Field(default_factory=dict)

    def tool_names(self) -> list[str]:
        """Return the names of every tool the episode knows, in order."""
        return [tool.name for tool in self.tools]

    def availability(self) -> list[set[str]]:
        """Return, for each step, the set of tool names available when it happened."""
        available = set(self.tool_names() if self.available_at_start is None
                        else self.available_at_start)
        per_step = []
        for step in self.steps:
            available |= set(step.tools_added)
            per_step.append(set(available))
        return per_step


def _normalise_json_schema(schema: Any) -> Any:
    """Map non-standard JSON-schema types found in real logs to standard ones, recursively."""
    if isinstance(schema, dict):
        out = {key: _normalise_json_schema(value) for key, value in schema.items()}
        aliases = {"dict": "object", "float": "number", "int": "integer", "list": "array",
                   "tuple": "array", "bool": "boolean", "str": "string", "any": None}
        kind = out.get("type")
        if isinstance(kind, str) and kind in aliases:
            if aliases[kind] is None:
                out.pop("type")
            else:
                out["type"] = aliases[kind]
        return out
    if isinstance(schema, list):
        return [_normalise_json_schema(item) for item in schema]
    return schema


def finish_spec() -> ToolSpec:
    """Return the FINISH pseudo-tool, ranked like the real tools."""
    return ToolSpec(name=FINISH, description=FINISH_DESCRIPTION)


def as_tool_spec(tool: Any) -> ToolSpec:
    """Accept a ToolSpec, a LangChain tool, an OpenAI function dict or a name; return a ToolSpec.

    A LangChain tool keeps its full JSON schema (required fields, types, descriptions), the
    same one an LLM is shown, so training logs and live runs describe a tool identically.
    """
    if isinstance(tool, ToolSpec):
        return tool
    if isinstance(tool, str):
        return finish_spec() if tool == FINISH else ToolSpec(name=tool)
    if isinstance(tool, dict):
        function = tool.get("function", tool)
        return ToolSpec(name=function["name"], description=function.get("description", ""),
                        parameters=function.get("parameters") or {"type": "object"})
    if hasattr(tool, "name") and hasattr(tool, "description"):
        from langchain_core.utils.function_calling import convert_to_openai_tool

        function = convert_to_openai_tool(tool)["function"]
        return ToolSpec(name=tool.name, description=tool.description or "",
                        parameters=function.get("parameters") or {"type": "object"})
    raise TypeError(f"cannot use {type(tool).__name__} as a tool: give a ToolSpec, BaseTool or dict")


# The observations of calls that failed or did not run. They are embedded into the policy's
# state, so the environments, the executor and the recorder must word them identically.

def tool_error_text(error: BaseException) -> str:
    """Return the observation of a tool that raised ``error``."""
    return f"Error: {type(error).__name__}: {error}"


def invalid_arguments_text(tool: str, detail: object) -> str:
    """Return the observation of a call whose arguments the tool's schema rejects."""
    return f"Error: invalid arguments for {tool!r}: {' '.join(str(detail).split())}"


def unknown_tool_text(tool: str, available: Iterable[str]) -> str:
    """Return the observation of a call to a tool that does not exist."""
    return f"Error: unknown tool {tool!r}. Available tools: {', '.join(available)}"


def unavailable_tool_text(tool: str) -> str:
    """Return the observation of a call to a tool that exists but is not available now."""
    return f"Error: tool {tool!r} is not available in this turn"


def refused_text(reason: str) -> str:
    """Return the observation of a call the guardrails refused."""
    return f"Refused: {reason}. The tool was not run."
