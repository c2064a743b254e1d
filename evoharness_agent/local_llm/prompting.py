"""What the model is asked and how its reply is read: JSON schemas, grammars, prompts, tool calls.

xllamacpp's own tool calling does not work with the small Qwen models, so every structured
reply goes through llama.cpp's JSON-schema constrained decoding (LLGuidance) instead: this
module builds the schema and grammar of each call, renders the LangChain messages (with a
note resolving relative dates) into the chat template's messages, and turns the
constrained JSON back into an ``AIMessage`` with ``tool_calls``.

``tool_choice`` follows LangChain: "auto" or unset lets the model decide between calling a
tool and answering in text (the route's options are the tools plus :func:`answer_option`);
"required"/"any" or a tool's name force a call; "none" answers in text.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.tool import invalid_tool_call, tool_call
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel

__all__ = [
    "answer_option",
    "build_choice_schema",
    "build_grammar",
    "build_route_schema",
    "chat_chars",
    "context_overflow",
    "fit_chat",
    "parse_tool_reply",
    "prepare_call",
    "relative_date_hints",
]

TOOL_KEY = "tool"
ARGS_KEY = "arguments"


# --------------------------------------------------------------------------- schemas


def _close_objects(schema: Any) -> Any:
    """Return a copy of a JSON schema whose objects with a ``properties`` key forbid extra keys.

    An empty ``properties`` (a tool without arguments) is closed too: its only value is ``{}``.
    """
    # Without this LLGuidance lets a small model invent arguments the tool would reject.
    if isinstance(schema, list):
        return [_close_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _close_objects(value) for key, value in schema.items()}
    if (
        isinstance(out.get("properties"), dict)
        and "additionalProperties" not in out
        and out.get("type", "object") == "object"
    ):
        out["additionalProperties"] = False
    return out


def _tool_parameters(function: Mapping[str, Any]) -> dict[str, Any]:
    """Return the JSON schema of an OpenAI function's parameters, closed against extra keys."""
    params = dict(function.get("parameters") or {})
    params.setdefault("type", "object")
    params.setdefault("properties", {})
    return _close_objects(params)


def answer_option(names: Iterable[str]) -> str:
    """Return the route option that means "answer in text now": ``"answer"`` unless a tool has that name."""
    taken = set(names)
    option, n = "answer", 1
    while option in taken:
        n += 1
        option = f"answer_{n}"
    return option


def build_choice_schema(functions: Sequence[Mapping[str, Any]], *, answer: str | None = None) -> dict[str, Any]:
    """Build the schema ``{"tool": <one name>, "arguments": <that tool's parameters>}``.

    With ``answer`` (see :func:`answer_option`) one more branch, ``{"tool": answer}``, lets the
    model choose to answer in text instead of calling a tool.
    """
    branches = [
        {
            "type": "object",
            "properties": {
                TOOL_KEY: {"type": "string", "enum": [fn["name"]]},
                ARGS_KEY: _tool_parameters(fn),
            },
            "required": [TOOL_KEY, ARGS_KEY],
            "additionalProperties": False,
        }
        for fn in functions
    ]
    if answer is not None:
        branches.append(
            {
                "type": "object",
                "properties": {TOOL_KEY: {"type": "string", "enum": [answer]}},
                "required": [TOOL_KEY],
                "additionalProperties": False,
            }
        )
    # anyOf whose branches are told apart by the "tool" key, which the model writes first:
    # LLGuidance then constrains the arguments to the chosen tool's schema in one pass.
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def build_route_schema(functions: Sequence[Mapping[str, Any]], *, answer: str | None = None) -> dict[str, Any]:
    """Build the schema ``{"tool": <one of the names, or answer>}`` for picking a tool by name.

    With ``answer`` (see :func:`answer_option`) the names end with that option, which means
    "no tool: answer in text now".
    """
    names = [fn["name"] for fn in functions]
    if answer is not None:
        names.append(answer)
    return {
        "type": "object",
        "properties": {TOOL_KEY: {"type": "string", "enum": names}},
        "required": [TOOL_KEY],
        "additionalProperties": False,
    }


def build_grammar(schema: Mapping[str, Any]) -> str:
    """Return the LLGuidance grammar that constrains output to compact JSON valid for ``schema``."""
    guided = dict(schema)
    # Compact separators: ~25% fewer generated tokens than llama.cpp's default pretty JSON,
    # and no runaway whitespace. Lenient: unknown keywords or formats are ignored, not errors.
    guided["x-guidance"] = {
        "whitespace_flexible": False,
        "item_separator": ", ",
        "key_separator": ": ",
        "lenient": True,
    }
    return "%llguidance {}\nstart: %json " + json.dumps(guided, ensure_ascii=False)


def _structured_schema(schema: Mapping[str, Any] | type) -> tuple[dict[str, Any], str, str]:
    """Return (JSON schema, title, description) for a pydantic model, TypedDict or dict schema."""
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        js = schema.model_json_schema()
        return js, js.get("title", schema.__name__), js.get("description", "")
    if isinstance(schema, Mapping):
        if schema.get("type") == "function" and "function" in schema:
            fn = schema["function"]
            return dict(fn.get("parameters") or {}), fn["name"], fn.get("description", "")
        if "name" in schema and "parameters" in schema:
            return dict(schema["parameters"]), schema["name"], schema.get("description", "")
        if "properties" in schema or "type" in schema or "$ref" in schema or "anyOf" in schema:
            js = dict(schema)
            return js, js.get("title", "output"), js.get("description", "")
    fn = convert_to_openai_tool(schema)["function"]
    return dict(fn.get("parameters") or {}), fn["name"], fn.get("description", "")


# --------------------------------------------------------------------------- messages


def _text(content: Any) -> str:
    """Flatten LangChain message content (a string or a list of blocks) to text."""
    if isinstance(content, str):
        return content
    pieces: list[str] = []
    for block in content or []:
        if isinstance(block, str):
            pieces.append(block)
        elif isinstance(block, Mapping) and block.get("type") == "text":
            pieces.append(str(block.get("text", "")))
    return "\n".join(pieces)


def _to_chat_messages(
    messages: Sequence[BaseMessage], extra_system: str | None = None, *, calls_as_results: bool = False
) -> list[dict[str, str]]:
    """Convert LangChain messages to the role/content dicts of the chat template.

    With ``calls_as_results`` (text answers) tool calls are not written as assistant turns:
    each result says which call it answers, and consecutive user-side turns are merged.
    """
    # Chat templates (Qwen's ChatML included) expect one system message, first: merge them.
    system = [_text(m.content) for m in messages if isinstance(m, SystemMessage)]
    if extra_system:
        system.append(extra_system)
    out: list[dict[str, str]] = []
    if system:
        out.append({"role": "system", "content": "\n\n".join(s for s in system if s)})
    calls: dict[str, tuple[str, str]] = {}
    for msg in messages:
        if isinstance(msg, SystemMessage):
            continue
        if isinstance(msg, AIMessage):
            # Calls and results are written as plain prose: with the template's native
            # tool roles, or calls as JSON, the 0.5B model answered with another JSON call
            # instead of a final answer.
            lines = [_text(msg.content)] if _text(msg.content) else []
            for call in msg.tool_calls:
                args = json.dumps(call["args"], ensure_ascii=False)
                calls[str(call.get("id"))] = (call["name"], args)
                if not calls_as_results:
                    lines.append(f"I call the tool {call['name']} with arguments {args}.")
            if lines or not calls_as_results:
                out.append({"role": "assistant", "content": "\n".join(lines)})
        elif isinstance(msg, ToolMessage):
            name, args = calls.get(msg.tool_call_id, (msg.name or "the tool", ""))
            name = msg.name or name
            status = " (error)" if getattr(msg, "status", "success") == "error" else ""
            if calls_as_results:
                # Asked for text after calls written as "I call the tool ...", the 0.5B model
                # wrote one more such line as its answer: here calls appear only in results.
                shown = f"{name}({args})" if args else name
                out.append({"role": "user", "content": f"Result of {shown}{status}: {_text(msg.content)}"})
            else:
                out.append({"role": "user", "content": f"Result of {name}{status}: {_text(msg.content)}"})
        elif isinstance(msg, HumanMessage):
            out.append({"role": "user", "content": _text(msg.content)})
        else:
            role = {"human": "user", "ai": "assistant"}.get(msg.type, "user")
            out.append({"role": role, "content": _text(msg.content)})
    if calls_as_results:
        merged: list[dict[str, str]] = []
        for turn in out:
            if merged and turn["role"] == "user" and merged[-1]["role"] == "user":
                merged[-1] = {"role": "user", "content": f"{merged[-1]['content']}\n{turn['content']}"}
            else:
                merged.append(turn)
        out = merged
    return out


_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
_NUMBERS |= {"seven": 7, "eight": 8, "nine": 9, "ten": 10}
_DATE_PATTERN = re.compile(
    r"\b(?:(?P<dat>(?:the\s+)?day\s+after\s+tomorrow)"
    r"|(?P<tomorrow>tomorrow)|(?P<today>today|tonight)|(?P<yesterday>yesterday)"
    r"|(?P<in>in\s+(?P<n>\d{1,3}|" + "|".join(_NUMBERS) + r")\s+(?P<unit>days?|weeks?))"
    r"|(?P<wd>(?:(?P<q>this|next|coming|on)\s+)?(?P<day>" + "|".join(_WEEKDAYS) + r")))\b",
    re.IGNORECASE,
)


def relative_date_hints(text: str, today: dt.date) -> dict[str, dt.date]:
    """Resolve relative dates in ``text`` ("tomorrow", "next Friday", "in 3 days") to dates."""
    hints: dict[str, dt.date] = {}
    for match in _DATE_PATTERN.finditer(text):
        if match["dat"]:
            delta = 2
        elif match["tomorrow"]:
            delta = 1
        elif match["today"]:
            delta = 0
        elif match["yesterday"]:
            delta = -1
        elif match["in"]:
            raw = match["n"].lower()
            n = int(raw) if raw.isdigit() else _NUMBERS[raw]
            delta = n * (7 if match["unit"].lower().startswith("week") else 1)
        else:
            # The coming such day; on that very weekday only "this X" means today.
            delta = (_WEEKDAYS.index(match["day"].lower()) - today.weekday()) % 7
            if delta == 0 and (match["q"] or "").lower() != "this":
                delta = 7
        hints.setdefault(match.group(0), today + dt.timedelta(days=delta))
    return hints


def _date_note(today: dt.date, texts: Iterable[str] = ()) -> str:
    """Tell the model today's date and what the relative dates in ``texts`` resolve to."""
    # The 0.5B model cannot do calendar arithmetic (it put "next Friday" on a Saturday even
    # with a 7-day calendar in the prompt), so the dates are resolved here and it copies them.
    hints: dict[str, dt.date] = {}
    for text in texts:
        for phrase, day in relative_date_hints(text, today).items():
            hints.setdefault(phrase, day)
    if not hints:
        return f"Today is {today:%A} {today.isoformat()}. Write dates as YYYY-MM-DD."
    # Without today's date beside them: given both, the model often copied today's date.
    resolved = "; ".join(f'"{k}" means {v.isoformat()}' for k, v in list(hints.items())[:8])
    return f"Dates in the request: {resolved}. Write dates as YYYY-MM-DD."


def _strip_titles(schema: Any) -> Any:
    """Drop pydantic's auto-generated "title" keys, which only cost prompt tokens."""
    if isinstance(schema, list):
        return [_strip_titles(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            # Keys here are names (a property may well be called "title"), not keywords.
            out[key] = {name: _strip_titles(sub) for name, sub in value.items()}
        else:
            out[key] = _strip_titles(value)
    return out


def _tool_doc(function: Mapping[str, Any]) -> str:
    """Describe one tool for the prompt: name, description and parameters schema."""
    params = _strip_titles(function.get("parameters") or {})
    return (
        f"- {function['name']}: {function.get('description', '').strip()}\n"
        f"  parameters: {json.dumps(params, ensure_ascii=False)}"
    )


def _new_call_id() -> str:
    """Return a fresh tool-call id in OpenAI's style."""
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_tool_reply(content: str, *, forced: str | None, names: Iterable[str]) -> AIMessage:
    """Turn constrained JSON output into an AIMessage with tool_calls (or invalid_tool_calls)."""
    names = list(names)
    call_id = _new_call_id()
    try:
        data = json.loads(content)
    except json.JSONDecodeError as exc:
        return AIMessage(
            content=content,
            invalid_tool_calls=[
                invalid_tool_call(name=forced, args=content, id=call_id, error=f"invalid JSON from model: {exc}")
            ],
        )
    name: object  # from the model's JSON: anything until checked against names
    if forced is not None:
        name, args = forced, data
    elif isinstance(data, dict):
        name, args = data.get(TOOL_KEY), data.get(ARGS_KEY, {})
    else:
        name, args = None, data
    error = None
    if name not in names:
        error = f"model chose unknown tool {name!r}; available: {names}"
    elif not isinstance(args, dict):
        error = f"tool arguments must be a JSON object, got {type(args).__name__}"
    if error is not None:
        return AIMessage(
            content=content,
            invalid_tool_calls=[
                invalid_tool_call(
                    name=name if isinstance(name, str) else None,
                    args=content,
                    id=call_id,
                    error=error,
                )
            ],
        )
    assert isinstance(name, str)  # it is one of names
    return AIMessage(content="", tool_calls=[tool_call(name=name, args=args, id=call_id)])


def _normalize_tool_choice(tool_choice: Any, functions: Sequence[Mapping[str, Any]]) -> tuple[str, str | None]:
    """Return the mode ("text" | "forced" | "choice" | "auto") and the forced tool name, if any.

    "auto" (``tool_choice`` "auto" or unset): the model decides, a tool call or a text answer;
    "choice": it must call one of several tools ("required", "any", ``True``).
    """
    names = [fn["name"] for fn in functions]
    if not functions or tool_choice in ("none", False):
        return "text", None
    if isinstance(tool_choice, Mapping):
        tool_choice = (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
    if tool_choice in (None, "auto"):
        return "auto", None
    if tool_choice in ("any", "required", True):
        return ("forced", names[0]) if len(names) == 1 else ("choice", None)
    if isinstance(tool_choice, str):
        if tool_choice not in names:
            raise ValueError(f"tool_choice {tool_choice!r} is not one of the bound tools {names}")
        return "forced", tool_choice
    raise ValueError(f"unsupported tool_choice {tool_choice!r}")


def prepare_call(
    messages: Sequence[BaseMessage],
    functions: Sequence[Mapping[str, Any]],
    tool_choice: Any = None,
    response_format: Mapping[str, Any] | None = None,
    today: dt.date | None = None,
    two_stage: bool = True,
) -> tuple[str, str | None, list[dict[str, str]], dict[str, Any] | None]:
    """Build (mode, forced tool, chat messages, JSON schema or None) for one model call.

    Modes: "text", "forced" (fill one tool's arguments), "route" (first stage of a
    two-stage choice: pick a tool name) and "choice" (pick a tool and fill it in one pass).
    With ``tool_choice`` "auto" or unset, the route's (or the one-pass choice's) options also
    include :func:`answer_option`, which the caller turns into a plain text call.
    """
    mode, forced = _normalize_tool_choice(tool_choice, functions)
    answer: str | None = None
    if mode == "auto":
        mode, answer = "choice", answer_option(fn["name"] for fn in functions)
    note = ""
    if today is not None:
        # The last few user turns are where "tomorrow" or "next Friday" come from.
        texts = [_text(m.content) for m in messages if isinstance(m, HumanMessage)]
        note = _date_note(today, texts[-3:])
    schema: dict[str, Any] | None = None
    extra: str | None = None
    if mode == "forced":
        fn = next(f for f in functions if f["name"] == forced)
        schema = _tool_parameters(fn)
        extra = (
            f"Call the tool `{forced}` now.\n{_tool_doc(fn)}\n{note}\n"
            "Reply with only the JSON object of its arguments, with values taken from "
            "the conversation."
        )
    elif mode == "choice" and two_stage:
        # Picking the name alone first, from names and descriptions only, then filling the
        # chosen tool as a forced call, routed 13/16 test requests right vs 11/16 in one pass
        # (the 0.5B model over-picks the first tool when the arguments' schemas are shown).
        mode = "route"
        schema = build_route_schema(functions, answer=answer)
        docs = "\n".join(f"- {f['name']}: {f.get('description', '').strip()}" for f in functions)
        if answer is None:
            extra = (
                f"Tools:\n{docs}\nWhich one tool does what the user asks? "
                f'Reply with only JSON: {{"{TOOL_KEY}": <tool name>}}.'
            )
        else:
            # The answer option is listed and enumerated last: first, the 0.5B model picked it
            # even less often. It still over-picks tools; the caller biases the option up.
            extra = (
                f"Tools:\n{docs}\n{_answer_doc(answer)}\nWhat is the next step? "
                f'Reply with only JSON: {{"{TOOL_KEY}": <tool name or "{answer}">}}.'
            )
    elif mode == "choice":
        schema = build_choice_schema(functions, answer=answer)
        docs = "\n".join(_tool_doc(f) for f in functions)
        if answer is None:
            extra = (
                f"Tools:\n{docs}\n{note}\nChoose the one tool that best does the next step, "
                "and fill its arguments from the conversation. Reply with only JSON: "
                f'{{"{TOOL_KEY}": <tool name>, "{ARGS_KEY}": {{...}}}}.'
            )
        else:
            extra = (
                f"Tools:\n{docs}\n{_answer_doc(answer)}\n{note}\nWhat is the next step? "
                f'Reply with only JSON: {{"{TOOL_KEY}": <tool name>, "{ARGS_KEY}": {{...}}}} '
                f'to call a tool, or {{"{TOOL_KEY}": "{answer}"}} to answer.'
            )
    elif response_format:
        spec = response_format.get("json_schema") or {}
        schema = _close_objects(spec.get("schema") or response_format.get("schema") or {})
        extra = (
            "Reply with only a JSON object matching this JSON schema:\n"
            f"{json.dumps(_strip_titles(schema), ensure_ascii=False)}\n{note}"
        )
    return mode, forced, _to_chat_messages(messages, extra, calls_as_results=mode == "text"), schema


def _answer_doc(answer: str) -> str:
    """Describe the answer option in the tool list of an auto choice."""
    return f"- {answer}: no tool; reply to the user in plain text now."


def _repeats_a_call(messages: Sequence[BaseMessage], call: Mapping[str, Any]) -> bool:
    """Whether ``call`` repeats a tool call (same name and arguments) whose result is already in.

    Only calls since the last user message count, and only those with a result that is not an error.
    """
    succeeded: set[str] = set()
    for msg in reversed(messages):
        if isinstance(msg, HumanMessage):
            return False
        if isinstance(msg, ToolMessage) and getattr(msg, "status", "success") != "error":
            succeeded.add(msg.tool_call_id)
        elif isinstance(msg, AIMessage) and any(
            c.get("id") in succeeded and c["name"] == call.get("name") and c["args"] == call.get("args")
            for c in msg.tool_calls
        ):
            return True
    return False


def _reply_text(response: Mapping[str, Any]) -> str:
    """Return the assistant text of a chat-completion response."""
    return _text(response["choices"][0].get("message", {}).get("content") or "")


def _parse_route(content: str, names: Sequence[str]) -> str | None:
    """Return the name (a tool, or the answer option) a route or choice reply picked, or None if not in ``names``."""
    try:
        data = json.loads(content)
    except json.JSONDecodeError:
        return None
    name = data.get(TOOL_KEY) if isinstance(data, dict) else None
    return name if name in names else None


# --------------------------------------------------------------------------- fitting the context

RESULTS_HEADER = "Results so far:"
"""The line after which ``agents.llm_calls.build_messages`` lists the results, one numbered block each."""
_NUMBERED = re.compile(r"\d+\. ")
_RESULT_HEAD = 120
"""Characters a cut result keeps: its call (tool and arguments) and the start of its output."""
_OVERFLOW = re.compile(r"\((\d+) tokens\) exceeds the available context size \((\d+) tokens\)")


def chat_chars(chat: Sequence[Mapping[str, str]]) -> int:
    """Return the characters of a chat's contents (what :func:`fit_chat` budgets)."""
    return sum(len(turn["content"]) for turn in chat)


def context_overflow(message: str) -> tuple[int, int] | None:
    """Return (request tokens, context tokens) when llama.cpp refused a prompt as too long, else ``None``."""
    match = _OVERFLOW.search(message)
    return (int(match[1]), int(match[2])) if match else None


@dataclass
class _Segment:
    """A piece of a chat turn: a tool result (which may be cut) or other text (kept)."""

    text: str
    is_result: bool


def _segments(content: str) -> list[_Segment]:
    """Split a user turn into segments, in order.

    A result starts at a line ``Result of ...`` (a tool message, see :func:`_to_chat_messages`)
    or, after a :data:`RESULTS_HEADER` line, at a numbered line; the lines up to the next start
    belong to it (observations span lines).
    """
    segments: list[_Segment] = []
    numbered = False
    for line in content.splitlines(keepends=True):
        if line.strip() == RESULTS_HEADER:
            numbered = True
            segments.append(_Segment(line, False))
        elif line.startswith("Result of ") or (numbered and _NUMBERED.match(line)):
            segments.append(_Segment(line, True))
        elif segments:
            segments[-1].text += line
        else:
            segments.append(_Segment(line, False))
    return segments


def _shorten(text: str, excess: int, keep: int) -> tuple[str, int]:
    """Cut ``text``'s tail by about ``excess`` characters (keeping ``keep``), noting the cut; return it and the rest."""
    cut = min(len(text) - keep, excess + 60)  # the note itself takes room
    if cut <= 0:
        return text, excess
    note = f" [... {cut} characters left out to fit the model's context]\n"
    shortened = text[: len(text) - cut].rstrip() + note
    gained = len(text) - len(shortened)
    return (shortened, excess - gained) if gained > 0 else (text, excess)


def fit_chat(chat: Sequence[Mapping[str, str]], max_chars: int) -> list[dict[str, str]]:
    """Return ``chat`` with at most ``max_chars`` characters of content, cutting the oldest results first.

    Tool results (see :func:`_segments`) are shortened from the oldest on, each keeping its head
    (which call it answers) and a note of what was left out; if that is not enough, whole earlier
    exchanges (assistant turns, turns of results) are left out, oldest first. The instructions,
    the tool list and the requests are never cut.

    Raises:
        ValueError: the chat does not fit even with every result cut.

    """
    excess = chat_chars(chat) - max_chars
    if excess <= 0:
        return [dict(turn) for turn in chat]
    turns = [(turn, _segments(turn["content"]) if turn["role"] == "user" else [_Segment(turn["content"], False)])
             for turn in chat]
    results = [segment for _, segments in turns for segment in segments if segment.is_result]
    for segment in results:  # first each result keeps its head: which call it answers
        if excess > 0:
            segment.text, excess = _shorten(segment.text, excess, _RESULT_HEAD)
    only_results = [all(seg.is_result or not seg.text.strip() for seg in segments) for _, segments in turns]
    for (_, segments), results_only in zip(turns, only_results, strict=True):
        if not results_only:  # then whole results inside a request's turn go, oldest first, but the newest
            excess = _drop_results([seg for seg in segments if seg.is_result and seg is not results[-1]], excess)
    fitted = [{**turn, "content": "".join(segment.text for segment in segments)} for turn, segments in turns]
    if excess > 0:  # then whole earlier turns of results and calls
        fitted, excess = _drop_old_turns(fitted, only_results, excess)
    if excess > 0:
        raise ValueError(f"the prompt needs {excess} characters more than the model's context holds even with "
                         "every earlier result and exchange left out (the instructions, tools and requests stay)")
    return fitted


def _drop_results(segments: list[_Segment], excess: int) -> int:
    """Empty result segments of one turn, oldest first, until ``excess`` is gone; one note says how many."""
    if excess <= 0 or not segments:
        return excess
    reserve = 70  # the note, written once the count is known
    excess += reserve
    dropped = 0
    for segment in segments:
        if excess <= 0:
            break
        excess -= len(segment.text)
        segment.text = ""
        dropped += 1
    segments[0].text = f"[{dropped} earlier results left out to fit the model's context]\n"
    return excess - reserve + len(segments[0].text)


def _drop_old_turns(chat: list[dict[str, str]], only_results: list[bool], excess: int) -> tuple[
        list[dict[str, str]], int]:
    """Leave out whole earlier exchanges (assistant turns, turns of results), oldest first; return chat and excess.

    The system turn, the first user turn (the task), every other request and the last turn stay.
    """
    users = [i for i, turn in enumerate(chat) if turn["role"] == "user"]
    first_user = users[0] if users else -1
    droppable = [i for i, turn in enumerate(chat[:-1])
                 if i != first_user and (turn["role"] == "assistant" or (turn["role"] == "user" and only_results[i]))]
    dropped: set[int] = set()
    note_size = 70  # the note that replaces them
    excess += note_size
    for i in droppable:
        if excess <= 0:
            break
        dropped.add(i)
        excess -= len(chat[i]["content"])
    if not dropped:
        return chat, excess - note_size
    note = {"role": "user", "content": f"[{len(dropped)} earlier turns left out to fit the model's context]"}
    kept: list[dict[str, str]] = []
    for i, turn in enumerate(chat):
        if i == min(dropped):
            kept.append(note)
        if i not in dropped:
            kept.append(turn)
    return kept, excess + note_size - len(note["content"])
