"""The LLM's jobs in a policy-driven agent: fill the chosen tool's arguments, answer at the end.

With tool calling the chosen tool is bound alone and forced
(``llm.bind_tools([tool], tool_choice=tool.name)``); a chat model without tool calling
(``bind_tools`` raises ``NotImplementedError``) gets a JSON prompt built from the tool's
args schema instead. Either way the arguments are validated against the schema with
pydantic, and an invalid reply gets exactly one repair retry that quotes the error. What is
still invalid after the retry is returned with its error (the tool's own validation then
turns it into an observation); a reply with no usable arguments at all raises
``OutputParserException`` for the executor's ``handle_parsing_errors``.

When the policy is unsure (hybrid mode) or not used (llm mode), :func:`choose_tool` lets the
LLM pick among candidate tools or answer now (FINISH), in the same call: with tool calling the
tools are bound with ``tool_choice`` unset (LangChain's "auto": the model decides) and a reply
without tool calls is the answer; in the JSON prompt FINISH is one of the listed options.

When the chat model itself fails a call (a prompt over its context, a timeout, a provider
error) rather than replying badly, every function here raises :class:`LLMCallError`, so a
caller can cost that one decision instead of crashing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.exceptions import OutputParserException
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_core.utils.json import parse_json_markdown
from pydantic import BaseModel, ValidationError

from evoharness_agent.schema import FINISH, FINISH_DESCRIPTION, invalid_arguments_text

__all__ = [
    "LLMCallError",
    "LLMChoice",
    "ToolArguments",
    "achoose_tool",
    "afill_arguments",
    "ainvoke_llm",
    "awrite_answer",
    "build_messages",
    "choose_tool",
    "fill_arguments",
    "invoke_llm",
    "validation_error",
    "write_answer",
]

FILL_PROMPT = (
    "You write the arguments of the next tool call of an agent. The tool `{name}` has been chosen "
    "for this step. Call it with arguments taken from the user's request and the results so far; "
    "do not invent values they do not support."
)
FILL_JSON_PROMPT = (
    "You write the arguments of the next tool call of an agent. The tool `{name}` ({description}) "
    "has been chosen for this step. Take the values from the user's request and the results so far; "
    "do not invent values they do not support. Reply with one JSON object of arguments that matches "
    "this JSON schema, and nothing else:\n{schema}"
)
CHOOSE_PROMPT = (
    "You are an agent using tools. Call the one tool that best serves the next step of the user's "
    "request, or, when the results so far are enough, reply with the final answer in plain text."
)
CALL_PROMPT = (
    "You are an agent using tools. The request is not done yet: call the one tool that best serves "
    "the next step of the user's request."
)
CALL_JSON_PROMPT = (
    "You are an agent using tools. The request is not done yet: pick the one tool that best serves "
    "the next step of the user's request. The options:\n{tools}\n"
    'Reply with one JSON object and nothing else: {{"tool": "<tool name>", '
    '"arguments": {{...the tool\'s arguments...}}}}'
)
CHOOSE_JSON_PROMPT = (
    "You are an agent using tools. Pick the one tool that best serves the next step of the user's "
    "request, or FINISH when the results so far are enough. The options:\n{tools}\n"
    'Reply with one JSON object and nothing else: {{"tool": "<tool name or FINISH>", '
    '"arguments": {{...the tool\'s arguments...}}, "answer": "<the final answer, when the tool is FINISH>"}}'
)
ANSWER_PROMPT = (
    "Write the final answer to the user's request from the results of the tool calls below. "
    # Small local models otherwise answer from the first call: a failed one of a retried step, or the
    # Celsius reading a conversion replaced (the weather task of the README).
    "Calls run in order, each building on the ones before: a failed call may be followed by one that "
    "worked, and a value looked up may then be converted. Answer from the results that worked, with "
    "the latest value of each thing. Be concise, and say so when the results do not answer the request."
)
REPLY_PROMPT = (
    # With no results, ANSWER_PROMPT's talk of tool calls makes small local models echo it ("The latest
    # value of each thing is:") or the user's message back instead of replying.
    "Reply to the user's message below. No tool was called for it, so answer from what you know, briefly "
    "and helpfully; if it asks for something only a tool could do, say so."
)
REPAIR_PROMPT = "That reply was not valid: {error}\n{instruction}"


class LLMCallError(RuntimeError):
    """The chat model failed a call (context overflow, timeout, provider error): there is no reply to read."""


@dataclass(frozen=True)
class ToolArguments:
    """Arguments for one tool call, with the validation error left after the repair retry."""

    tool: str
    arguments: dict[str, Any]
    tool_call_id: str
    error: str | None = None


@dataclass(frozen=True)
class LLMChoice:
    """The LLM's pick among candidate tools: a call, or (``call is None``) a final answer."""

    call: ToolArguments | None
    answer: str = ""


def build_messages(task: str, steps: Sequence[tuple[str, Any, Any]], *, system_prompt: str | None = None,
                   chat_history: Sequence[BaseMessage] = ()) -> list[BaseMessage]:
    """Return the conversation shown to the LLM: history, then the request and the results so far.

    ``steps`` are ``(tool, arguments, observation)`` triples. They are rendered as text rather
    than tool-call messages so that any chat model reads them, with or without tool calling.
    ``LocalChatModel`` finds the numbered results after the "Results so far:" line and cuts the
    oldest first when the prompt would overflow its context (``local_llm.prompting.fit_chat``).
    """
    lines = [f"Request: {task}"]
    if steps:
        lines.append("\nResults so far:")
        for i, (tool, arguments, observation) in enumerate(steps, 1):
            shown = json.dumps(arguments, ensure_ascii=False, default=str) if isinstance(
                arguments, Mapping) else repr(arguments)
            lines.append(f"{i}. {tool}({shown}) -> {observation}")
    head = [SystemMessage(system_prompt)] if system_prompt else []
    return [*head, *chat_history, HumanMessage("\n".join(lines))]


def validation_error(tool: BaseTool, arguments: Any) -> str | None:
    """Return why ``arguments`` do not fit the tool's args schema, or ``None`` when they do."""
    if not isinstance(arguments, Mapping):
        return f"expected a JSON object of arguments, got {type(arguments).__name__}"
    schema = tool.tool_call_schema
    if isinstance(schema, dict):
        missing = [name for name in schema.get("required", []) if name not in arguments]
        return f"missing required arguments: {', '.join(missing)}" if missing else None
    try:
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            schema.model_validate(dict(arguments))
        else:  # a pydantic.v1 model
            schema.parse_obj(dict(arguments))
    except (ValidationError, ValueError, TypeError) as error:
        return _one_line(error)
    return None


def _with_system(prompt: str, messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """Put our instructions first, merged with the user's system prompt: some providers take one."""
    if messages and isinstance(messages[0], SystemMessage):
        return [SystemMessage(f"{prompt}\n\n{messages[0].text}"), *messages[1:]]
    return [SystemMessage(prompt), *messages]


def _one_line(error: Exception) -> str:
    """Condense an exception (pydantic errors span lines) for a prompt or an observation."""
    return " ".join(str(error).split())


def _call_id() -> str:
    """Return a fresh tool call id, for calls the LLM did not give one."""
    return f"call_{uuid.uuid4().hex[:24]}"


def _schema_json(tool: BaseTool) -> str:
    """Return the JSON schema of the tool's arguments, as the LLM should see it."""
    return json.dumps(convert_to_openai_tool(tool)["function"].get("parameters", {}), ensure_ascii=False)


_ChatRunnable = Runnable[LanguageModelInput, AIMessage]
"""A chat model, or one with tools bound: messages in, an AIMessage out."""


def _failed(error: Exception) -> LLMCallError:
    """Return the :class:`LLMCallError` for a chat model's exception."""
    return LLMCallError(f"the LLM call failed: {type(error).__name__}: {_one_line(error)}")


def invoke_llm(runnable: _ChatRunnable, messages: Sequence[BaseMessage],
               config: RunnableConfig | None = None) -> AIMessage:
    """Call the chat model; its own failure (not a bad reply) becomes :class:`LLMCallError`."""
    try:
        return runnable.invoke(list(messages), config)
    except OutputParserException:
        raise
    except Exception as error:  # noqa: BLE001 - any provider's failure costs the call, not the caller
        raise _failed(error) from error


async def ainvoke_llm(runnable: _ChatRunnable, messages: Sequence[BaseMessage],
                      config: RunnableConfig | None = None) -> AIMessage:
    """Async :func:`invoke_llm`."""
    try:
        return await runnable.ainvoke(list(messages), config)
    except OutputParserException:
        raise
    except Exception as error:  # noqa: BLE001 - any provider's failure costs the call, not the caller
        raise _failed(error) from error


def _bind(llm: BaseChatModel, tools: Sequence[BaseTool], **kwargs: Any) -> _ChatRunnable | None:
    """Bind tools when the model supports tool calling; ``None`` selects the JSON prompt."""
    try:
        return llm.bind_tools(list(tools), **kwargs)
    except NotImplementedError:
        return None


class _Fill:
    """One argument-filling exchange: the prompt, how to read a reply, and its repair."""

    def __init__(self, llm: BaseChatModel, tool: BaseTool, messages: Sequence[BaseMessage]) -> None:
        self.tool = tool
        bound = _bind(llm, [tool], tool_choice=tool.name)
        self.json_mode = bound is None
        self.runnable: _ChatRunnable = llm if bound is None else bound
        if self.json_mode:
            system = FILL_JSON_PROMPT.format(name=tool.name, description=tool.description,
                                             schema=_schema_json(tool))
        else:
            system = FILL_PROMPT.format(name=tool.name)
        self.messages = _with_system(system, messages)

    def read(self, reply: BaseMessage) -> tuple[dict[str, Any] | None, str, str | None]:
        """Return (arguments or None when unusable, call id, error or None)."""
        if self.json_mode:
            try:
                arguments = parse_json_markdown(reply.text)
            except (json.JSONDecodeError, ValueError, TypeError) as error:
                return None, _call_id(), f"not a JSON object ({_one_line(error)})"
            if not isinstance(arguments, dict):
                return None, _call_id(), "not a JSON object"
            return arguments, _call_id(), validation_error(self.tool, arguments)
        calls = [c for c in getattr(reply, "tool_calls", []) if c.get("name") == self.tool.name]
        if not calls:
            bad = getattr(reply, "invalid_tool_calls", [])
            why = f"invalid tool call ({bad[0].get('error') or bad[0].get('args')})" if bad else "no tool call"
            return None, _call_id(), f"{why}; call `{self.tool.name}`"
        call = calls[0]
        return call["args"], call.get("id") or _call_id(), validation_error(self.tool, call["args"])

    def repair(self, reply: BaseMessage, error: str) -> list[BaseMessage]:
        """Return the retry prompt: the failed reply as text, then the error."""
        instruction = ("Reply with the corrected JSON object only." if self.json_mode
                       else f"Call `{self.tool.name}` again with valid arguments.")
        shown = reply.text or json.dumps(getattr(reply, "tool_calls", []), default=str)
        return [*self.messages, AIMessage(shown), HumanMessage(REPAIR_PROMPT.format(error=error,
                                                                                    instruction=instruction))]

    def result(self, reply: BaseMessage, read: tuple[dict[str, Any] | None, str, str | None]) -> ToolArguments:
        """Return the final arguments, or raise when the reply holds none."""
        arguments, call_id, error = read
        if arguments is None:
            raise OutputParserException(f"Could not fill the arguments of `{self.tool.name}`: {error}",
                                        llm_output=reply.text, send_to_llm=True,
                                        observation=invalid_arguments_text(self.tool.name, error))
        return ToolArguments(self.tool.name, arguments, call_id, error)


def fill_arguments(llm: BaseChatModel, tool: BaseTool, messages: Sequence[BaseMessage],
                   config: RunnableConfig | None = None) -> ToolArguments:
    """Ask the LLM for the arguments of ``tool``, with one repair retry."""
    if not _takes_arguments(tool):
        return ToolArguments(tool.name, {}, _call_id())
    fill = _Fill(llm, tool, messages)
    reply = invoke_llm(fill.runnable, fill.messages, config)
    read = fill.read(reply)
    if read[2] is not None:
        reply = invoke_llm(fill.runnable, fill.repair(reply, read[2]), config)
        read = fill.read(reply)
    return fill.result(reply, read)


async def afill_arguments(llm: BaseChatModel, tool: BaseTool, messages: Sequence[BaseMessage],
                          config: RunnableConfig | None = None) -> ToolArguments:
    """Async :func:`fill_arguments`."""
    if not _takes_arguments(tool):
        return ToolArguments(tool.name, {}, _call_id())
    fill = _Fill(llm, tool, messages)
    reply = await ainvoke_llm(fill.runnable, fill.messages, config)
    read = fill.read(reply)
    if read[2] is not None:
        reply = await ainvoke_llm(fill.runnable, fill.repair(reply, read[2]), config)
        read = fill.read(reply)
    return fill.result(reply, read)


def _takes_arguments(tool: BaseTool) -> bool:
    """Whether the tool has arguments to fill: a tool without any needs no LLM call at all."""
    schema = tool.tool_call_schema
    if isinstance(schema, dict):
        return bool(schema.get("properties"))
    fields = schema.model_fields if hasattr(schema, "model_fields") else schema.__fields__  # pydantic v2, v1
    return bool(fields)


class _Choose:
    """One tool-choice exchange among candidate tools; answering now (FINISH) is an option unless a call is due."""

    def __init__(self, llm: BaseChatModel, tools: Sequence[BaseTool], messages: Sequence[BaseMessage],
                 may_answer: bool = True) -> None:
        self.tools = {tool.name: tool for tool in tools}
        self.may_answer = may_answer or not tools
        due: dict[str, Any] = {} if self.may_answer else {"tool_choice": "any"}
        bound = _bind(llm, tools, **due) if tools else llm
        self.json_mode = bound is None
        self.runnable: _ChatRunnable = llm if bound is None else bound
        if self.json_mode:
            listing = [f"- {t.name}: {t.description} Arguments schema: {_schema_json(t)}" for t in tools]
            if self.may_answer:
                listing.append(f"- {FINISH}: {FINISH_DESCRIPTION} No arguments; write the reply as the answer.")
            system = (CHOOSE_JSON_PROMPT if self.may_answer else CALL_JSON_PROMPT).format(tools="\n".join(listing))
        else:
            system = CHOOSE_PROMPT if self.may_answer else CALL_PROMPT
        self.messages = _with_system(system, messages)

    def read(self, reply: AIMessage) -> LLMChoice | str:
        """Return the choice, or why the reply is unusable."""
        if not self.json_mode:
            calls = getattr(reply, "tool_calls", [])
            if calls:
                call = calls[0]
                tool = self.tools.get(call["name"])
                error = validation_error(tool, call["args"]) if tool is not None else None
                return LLMChoice(ToolArguments(call["name"], call["args"], call.get("id") or _call_id(), error))
            if getattr(reply, "invalid_tool_calls", []):
                bad = reply.invalid_tool_calls[0]
                return f"invalid tool call ({bad.get('error') or bad.get('args')})"
            return LLMChoice(None, reply.text) if self.may_answer else "no tool call: the request needs one now"
        try:
            picked = parse_json_markdown(reply.text)
        except (json.JSONDecodeError, ValueError, TypeError) as error:
            return f"not a JSON object ({_one_line(error)})"
        answers = isinstance(picked, dict) and (
            (picked.get("tool") in (None, "") and isinstance(picked.get("answer"), str))  # no tool key: FINISH
            or (isinstance(picked.get("tool"), str) and picked["tool"].strip().upper() == FINISH))
        if answers and not self.may_answer:
            return "no tool picked: the request needs a call now"
        if answers:
            return LLMChoice(None, str(picked.get("answer") or ""))
        if not isinstance(picked, dict) or not isinstance(picked.get("tool"), str):
            return 'expected a JSON object with a "tool" name'
        arguments = picked.get("arguments") or {}
        tool = self.tools.get(picked["tool"])
        invalid = validation_error(tool, arguments) if tool is not None else None
        return LLMChoice(ToolArguments(picked["tool"], arguments if isinstance(arguments, dict) else {},
                                       _call_id(), invalid))

    def repair(self, reply: BaseMessage, error: str) -> list[BaseMessage]:
        """Return the retry prompt after an unusable reply."""
        instruction = ("Reply with the corrected JSON object only." if self.json_mode
                       else "Call one of the tools with valid arguments, or answer in plain text." if self.may_answer
                       else "Call one of the tools with valid arguments.")
        shown = reply.text or json.dumps(getattr(reply, "invalid_tool_calls", []), default=str)
        return [*self.messages, AIMessage(shown), HumanMessage(REPAIR_PROMPT.format(error=error,
                                                                                    instruction=instruction))]

    @staticmethod
    def error_of(read: LLMChoice | str) -> str | None:
        """Return what a retry should fix: an unusable reply or invalid arguments."""
        if isinstance(read, str):
            return read
        return read.call.error if read.call is not None else None

    @staticmethod
    def result(reply: BaseMessage, read: LLMChoice | str) -> LLMChoice:
        """Return the final choice, or raise when the reply holds none."""
        if isinstance(read, str):
            raise OutputParserException(f"Could not read the tool choice: {read}", llm_output=reply.text,
                                        observation=read, send_to_llm=True)
        return read


def choose_tool(llm: BaseChatModel, tools: Sequence[BaseTool], messages: Sequence[BaseMessage],
                config: RunnableConfig | None = None, *, may_answer: bool = True) -> LLMChoice:
    """Let the LLM call one of ``tools`` or answer now (FINISH), with one repair retry.

    With tool calling, ``tools`` are bound with ``tool_choice`` unset ("auto") and a reply
    without tool calls is the answer; without, the JSON prompt lists FINISH among the options.
    Without ``tools`` the LLM just answers. ``may_answer=False`` makes a call due: the tools are
    bound with ``tool_choice="any"`` (the JSON prompt leaves FINISH out) and an answer is
    repaired like an invalid reply.
    """
    choose = _Choose(llm, tools, messages, may_answer)
    reply = invoke_llm(choose.runnable, choose.messages, config)
    read = choose.read(reply)
    if (error := choose.error_of(read)) is not None:
        reply = invoke_llm(choose.runnable, choose.repair(reply, error), config)
        read = choose.read(reply)
    return choose.result(reply, read)


async def achoose_tool(llm: BaseChatModel, tools: Sequence[BaseTool], messages: Sequence[BaseMessage],
                       config: RunnableConfig | None = None, *, may_answer: bool = True) -> LLMChoice:
    """Async :func:`choose_tool`."""
    choose = _Choose(llm, tools, messages, may_answer)
    reply = await ainvoke_llm(choose.runnable, choose.messages, config)
    read = choose.read(reply)
    if (error := choose.error_of(read)) is not None:
        reply = await ainvoke_llm(choose.runnable, choose.repair(reply, error), config)
        read = choose.read(reply)
    return choose.result(reply, read)


def _answer_messages(messages: Sequence[BaseMessage], called_tools: bool) -> list[BaseMessage]:
    """Return ``messages`` under the instructions for the final answer: from the calls' results, or a reply."""
    return _with_system(ANSWER_PROMPT if called_tools else REPLY_PROMPT, messages)


def write_answer(llm: BaseChatModel, messages: Sequence[BaseMessage], config: RunnableConfig | None = None,
                 *, called_tools: bool = True) -> str:
    """Ask the LLM for the final answer to the request in ``messages`` (``called_tools``: from their results)."""
    return invoke_llm(llm, _answer_messages(messages, called_tools), config).text


async def awrite_answer(llm: BaseChatModel, messages: Sequence[BaseMessage],
                        config: RunnableConfig | None = None, *, called_tools: bool = True) -> str:
    """Async :func:`write_answer`."""
    return (await ainvoke_llm(llm, _answer_messages(messages, called_tools), config)).text
