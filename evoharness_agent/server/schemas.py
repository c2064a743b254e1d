"""The policy server's requests and responses: pydantic models with limits.

Every limit below turns oversized input into a 422 that names the field, before any text is
embedded. The request shape is the seed's ``/predict``: a task, the available tools (names, or
``{name, description, parameters}``) and the history so far.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from evoharness_agent.policy import ToolScore
from evoharness_agent.schema import Step, ToolSpec, as_tool_spec

__all__ = [
    "MAX_BATCH",
    "MAX_HISTORY",
    "MAX_TEXT_CHARS",
    "MAX_TOOLS",
    "BatchPredictRequest",
    "BatchPredictResponse",
    "ErrorResponse",
    "HealthResponse",
    "HistoryStep",
    "PredictRequest",
    "PredictResponse",
    "RankedTool",
    "SessionCreateRequest",
    "SessionInfo",
    "SessionStepsRequest",
    "SessionStepsResponse",
    "ToolIn",
    "tool_specs",
]

MAX_TOOLS = 512
"""The most tools one state may offer."""
MAX_HISTORY = 1024
"""The most history steps one request may carry."""
MAX_BATCH = 512
"""The most states one ``/predict/batch`` request may carry."""
MAX_TEXT_CHARS = 64_000
"""The longest task, observation or reply text, in characters."""
MAX_NAME_CHARS = 128
"""The longest tool name."""
MAX_DESCRIPTION_CHARS = 4_000
"""The longest tool description."""


def _encodable(value: Any) -> Any:
    """Reject strings that are not valid Unicode (lone surrogates): they cannot be embedded or cached."""
    stack = [value]
    while stack:  # iterative: a deeply nested JSON value must not exhaust the recursion limit
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as error:
                raise ValueError(f"text is not valid Unicode ({error.reason} at position {error.start})") from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return value


Text = Annotated[str, StringConstraints(max_length=MAX_TEXT_CHARS), AfterValidator(_encodable)]
Name = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME_CHARS), AfterValidator(_encodable)]
JsonObject = Annotated[dict[str, Any], AfterValidator(_encodable)]


class ToolIn(BaseModel):
    """A tool offered to the policy: its name, description and JSON-schema parameters."""

    model_config = ConfigDict(extra="forbid")

    name: Name
    description: Annotated[str, StringConstraints(max_length=MAX_DESCRIPTION_CHARS), AfterValidator(_encodable)] = ""
    parameters: JsonObject = Field(default_factory=lambda: {"type": "object", "properties": {}})


class HistoryStep(BaseModel):
    """One step of the run so far: a tool call (the default), an assistant reply or a user message."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"tool": "get_daily_sales", "arguments": {"date": "today"}, "observation": "[...]", "error": False}]})

    kind: Literal["tool_call", "assistant", "user"] = "tool_call"
    tool: Name | None = None
    """The tool called (required for a ``tool_call``)."""
    arguments: JsonObject = Field(default_factory=dict)
    observation: Text = ""
    error: bool = False
    """Whether the call failed."""
    content: Text = ""
    """The text of an ``assistant`` reply or a ``user`` message."""

    @model_validator(mode="after")
    def _tool_call_names_its_tool(self) -> HistoryStep:
        """Require a tool call to say which tool ran."""
        if self.kind == "tool_call" and not self.tool:
            raise ValueError("a tool_call step needs a non-empty 'tool'")
        return self

    def to_step(self) -> Step:
        """Return the package's :class:`~evoharness_agent.schema.Step` for this step."""
        return Step(kind=self.kind, tool=self.tool, arguments=self.arguments, observation=self.observation,
                    error=self.error, content=self.content)


ToolList = Annotated[list[Name | ToolIn], Field(max_length=MAX_TOOLS)]


def _check_tools(tools: list[str | ToolIn], allowed: list[str] | None) -> None:
    """Tool names are unique, and ``allowed_tools`` names only offered tools."""
    names = [tool if isinstance(tool, str) else tool.name for tool in tools]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"available_tools: tool names must be unique, repeated: {duplicates}")
    if allowed is not None:
        unknown = sorted(set(allowed) - set(names))
        if unknown:
            raise ValueError(f"allowed_tools: {unknown} are not in available_tools")


def tool_specs(tools: list[str | ToolIn]) -> list[ToolSpec]:
    """Return the :class:`~evoharness_agent.schema.ToolSpec` of each offered tool."""
    specs = []
    for tool in tools:
        if isinstance(tool, str):
            specs.append(as_tool_spec(tool))
            continue
        same = _SameTool(tool)
        specs.append(_spec_of(same) if len(same.key[2]) <= _MAX_CACHED_SCHEMA_CHARS
                     else as_tool_spec(tool.model_dump()))
    return specs


_MAX_CACHED_SCHEMA_CHARS = 16_000
"""Larger schemas are not kept: 1,024 kept tools then hold at most tens of MB, whatever clients send."""


class _SameTool:
    """A tool as a cache key: equal to another with the same name, description and parameters."""

    __slots__ = ("key", "tool")

    def __init__(self, tool: ToolIn) -> None:
        self.tool = tool
        # repr, not json.dumps: a quarter of the cost, and JSON values' reprs differ where they do.
        self.key = (tool.name, tool.description, repr(tool.parameters))

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _SameTool) and self.key == other.key


@functools.lru_cache(maxsize=1024)
def _spec_of(tool: _SameTool) -> ToolSpec:
    """Return a tool's spec, once per distinct tool: clients send the same tools with every state.

    Building a spec normalises its JSON schema: with 16-30 tools a state, that was a quarter of
    a decision's server time once the texts are embedded. The specs are shared; nothing changes one.
    """
    return as_tool_spec(tool.tool.model_dump())


_PREDICT_EXAMPLE: dict[str, Any] = {
    "task_description": "Find today's best-selling product",
    "available_tools": ["get_daily_sales", {"name": "sort_data", "description": "Sort rows by a column",
                                            "parameters": {"type": "object", "properties": {}}}],
    "history": [{"tool": "get_daily_sales", "arguments": {"date": "today"}, "observation": "[...]"}],
}


class PredictRequest(BaseModel):
    """One state: the task, the tools the agent may call, and what it did so far."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [_PREDICT_EXAMPLE]})

    task_description: Annotated[Text, StringConstraints(min_length=1)]
    available_tools: ToolList = Field(default_factory=list)
    history: Annotated[list[HistoryStep], Field(max_length=MAX_HISTORY)] = Field(default_factory=list)
    allowed_tools: Annotated[list[Name], Field(max_length=MAX_TOOLS)] | None = None
    """The names among ``available_tools`` callable at this step (``null``: all of them)."""

    @model_validator(mode="after")
    def _tools_are_consistent(self) -> PredictRequest:
        """Check the tool names."""
        _check_tools(self.available_tools, self.allowed_tools)
        return self


class RankedTool(BaseModel):
    """One ranked action: a tool or ``FINISH`` (answer the user now)."""

    tool: str
    score: float
    """The policy's raw score."""
    probability: float
    """The calibrated probability among the ranked actions."""


class PredictResponse(BaseModel):
    """The policy's decision for one state."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "selected_tool": "sort_data", "confidence": 0.83, "defer_to_llm": False,
        "ranked_tools": [{"tool": "sort_data", "score": 4.1, "probability": 0.83},
                         {"tool": "FINISH", "score": 2.5, "probability": 0.17}]}]})

    selected_tool: str
    """The best action: a tool name, or ``FINISH`` (answer the user now)."""
    confidence: float
    """The calibrated probability of ``selected_tool``: at 0.8, about 80% of such choices are right."""
    defer_to_llm: bool
    """Whether ``confidence`` is under the server's threshold, so an LLM should decide instead."""
    ranked_tools: list[RankedTool]
    """Every available action, best first."""

    @classmethod
    def from_ranking(cls, ranking: list[ToolScore], defer_threshold: float) -> PredictResponse:
        """Build the response from a policy ranking (best first)."""
        top = ranking[0]
        return cls(selected_tool=top.tool, confidence=top.probability, defer_to_llm=top.probability < defer_threshold,
                   ranked_tools=[RankedTool(tool=s.tool, score=s.score, probability=s.probability) for s in ranking])

    def ranking(self) -> list[ToolScore]:
        """Return the ranking as the policy's :class:`~evoharness_agent.policy.ToolScore` list."""
        return [ToolScore(item.tool, item.score, item.probability) for item in self.ranked_tools]


class BatchPredictRequest(BaseModel):
    """Many states, ranked in one forward pass."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"items": [_PREDICT_EXAMPLE]}]})

    items: Annotated[list[PredictRequest], Field(min_length=1, max_length=MAX_BATCH)]


class BatchPredictResponse(BaseModel):
    """One decision per state, in the order of the request."""

    results: list[PredictResponse]


class SessionCreateRequest(BaseModel):
    """Open a session for one run: the task and the tools, embedded once."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"task_description": _PREDICT_EXAMPLE["task_description"],
         "available_tools": _PREDICT_EXAMPLE["available_tools"]}]})

    task_description: Annotated[Text, StringConstraints(min_length=1)]
    available_tools: ToolList = Field(default_factory=list)

    @model_validator(mode="after")
    def _tools_are_consistent(self) -> SessionCreateRequest:
        """Check the tool names."""
        _check_tools(self.available_tools, None)
        return self


class SessionInfo(BaseModel):
    """A session: its id, the steps it holds and the seconds it lives without use."""

    session_id: str
    task_description: str
    n_steps: int
    expires_in_s: float


class SessionStepsRequest(BaseModel):
    """New steps of a session's run, then rank the next decision.

    ``start`` is the index of ``steps[0]`` in the run: steps the session already holds are
    checked and skipped, so a retried request never records a step twice.
    """

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"start": 0, "steps": _PREDICT_EXAMPLE["history"], "allowed_tools": None}]})

    start: Annotated[int, Field(ge=0)] = 0
    steps: Annotated[list[HistoryStep], Field(max_length=MAX_HISTORY)] = Field(default_factory=list)
    allowed_tools: Annotated[list[Name], Field(max_length=MAX_TOOLS)] | None = None
    """The names among the session's tools callable at this step (``null``: all of them)."""


class SessionStepsResponse(PredictResponse):
    """The decision after the new steps, and how many steps the session now holds."""

    n_steps: int


class HealthResponse(BaseModel):
    """The server is up and its policy loaded."""

    status: Literal["ok"] = "ok"
    algorithm: str
    n_known_tools: int
    sessions: int
    defer_threshold: float


class ErrorResponse(BaseModel):
    """A request the server cannot serve (unknown session, step conflict, body too large)."""

    detail: str
