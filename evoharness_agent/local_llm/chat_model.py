"""The LangChain chat model ``LocalChatModel``: a local GGUF file run by llama.cpp.

It binds tools and structured output like any LangChain chat model, builds each call with
``prompting``, runs it on the ``worker`` process, and loads only weights whose sha256 is
the expected one (``weights``). Tool calls and structured output are decoded under JSON
schemas, so their arguments always parse and match the tool's schema. ``stream`` sends text
(and structured JSON) token by token as llama.cpp writes it, and a tool call in one chunk.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import closing
from functools import partial
from operator import itemgetter
from pathlib import Path
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LangSmithParams, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from evoharness_agent.local_llm.prompting import (
    _normalize_tool_choice,
    _parse_route,
    _repeats_a_call,
    _reply_text,
    _structured_schema,
    answer_option,
    build_grammar,
    chat_chars,
    context_overflow,
    fit_chat,
    parse_tool_reply,
    prepare_call,
)
from evoharness_agent.local_llm.weights import DEFAULT_MODEL, MODELS, ensure_model, verify_sha256
from evoharness_agent.local_llm.worker import LocalModelError, _get_server, _release_servers, available_cores

__all__ = ["LocalChatModel"]


def _add_usage(total: dict[str, int], response: Mapping[str, Any]) -> None:
    """Add a response's token counts to ``total`` (a two-stage choice makes two calls)."""
    for key, value in (response.get("usage") or {}).items():
        if isinstance(value, int):
            total[key] = total.get(key, 0) + value


def _check_reply(response: Any) -> dict[str, Any]:
    """Return a llama.cpp reply (or stream chunk), or raise ``LocalModelError`` if it is an error."""
    if not isinstance(response, dict) or "error" in response:
        err = response.get("error") if isinstance(response, dict) else response
        message = err.get("message", err) if isinstance(err, dict) else err
        raise LocalModelError(f"llama.cpp failed the request: {message}")
    return response


def _drain(replies: Generator[Any, None, ChatResult]) -> ChatResult:
    """Run a reply generator to its end, dropping what it streams, and return its result."""
    while True:
        try:
            next(replies)
        except StopIteration as done:
            return done.value


class LocalChatModel(BaseChatModel):
    """LangChain chat model over a local GGUF file, run on CPU by llama.cpp (xllamacpp).

    Tool calls and structured output are produced with JSON-schema constrained decoding, so
    their arguments always parse and match the tool's schema. With ``tool_choice`` "auto" or
    unset the model decides, as LangChain means it: it calls one of the tools or answers in text.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model_path: str
    """Path of the GGUF file (omitted: the bundled default model, ``DEFAULT_MODEL``)."""
    sha256: str | None = None
    """Expected sha256 of ``model_path``, checked before loading (None: not checked)."""
    temperature: float = 0.0
    """Sampling temperature; 0 is greedy, which suits argument filling."""
    max_tokens: int = 512
    """Most tokens generated per call."""
    n_ctx: int = 4096
    """Context window in tokens (prompt plus reply)."""
    n_ctx_max: int | None = 32768
    """Largest context the model may grow to when a prompt does not fit ``n_ctx`` even with old
    tool results cut (a long tool list): the context doubles, on a llama.cpp worker of its own,
    up to this (Qwen2.5-Coder's trained context). None: never grow, the call fails instead."""
    n_threads: int | None = Field(default=None, validate_default=True)
    """CPU threads; None means all available cores, and more are capped to those."""
    n_batch: int = 512
    """Prompt-processing batch size."""
    seed: int | None = None
    """Sampling seed (only matters when temperature > 0)."""
    current_date: dt.date | None = None
    """The date given to the model as today for tool and structured calls (None: today)."""
    date_in_prompt: bool = True
    """Whether tool and structured calls tell the model today's date and the coming week."""
    two_stage_choice: bool = True
    """Choose among several tools by picking the name first, then filling that tool's
    arguments (two calls, better routing), instead of one ``{"tool", "arguments"}`` reply."""
    answer_bias: float = 2.0
    """Log-odds added to the "answer" option of the route when the model decides (``tool_choice``
    "auto" or unset): the 0.5B model over-picks tools (it called get_weather on "Hi! Just say
    hello"). 2.0 multiplies the answer's odds by about 7: on 19 test turns it decided right 13
    times instead of 9, and answered none that needed a tool; 0 leaves the model's own choice."""
    repeat_guard: bool = True
    """When the model decides: answer in text instead of repeating a tool call of the current
    turn (same tool, same arguments) that already succeeded: the 0.5B model otherwise copies its
    last call over and over (56 get_weather calls in one run) instead of answering from the result."""
    verbose: bool = False
    """Whether llama.cpp logs to stderr."""

    _chars_per_token: float = PrivateAttr(default=3.0)
    _grown_ctx: int | None = PrivateAttr(default=None)
    """Prompt characters per token, as llama.cpp counted them (the lowest seen; 3.0 until measured)."""

    @model_validator(mode="before")
    @classmethod
    def _default_model(cls, values: Any) -> Any:
        """Without a ``model_path``, run the bundled default model (``DEFAULT_MODEL``), its sha256 checked."""
        if isinstance(values, dict) and values.get("model_path") is None:
            spec = MODELS[DEFAULT_MODEL]
            values = {**values, "model_path": str(ensure_model(spec.name))}
            values.setdefault("sha256", spec.sha256)
        return values

    @field_validator("n_threads")
    @classmethod
    def _cap_threads(cls, value: int | None) -> int:
        """Default to, and cap at, the cores available to this process."""
        cores = available_cores()
        if value is None:
            return cores
        if value < 1:
            raise ValueError("n_threads must be at least 1")
        return min(value, cores)

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike[str], **kwargs: Any) -> LocalChatModel:
        """Create a model from a known name (see ``MODELS``) or from a GGUF file path."""
        key = str(name_or_path)
        spec = MODELS.get(key.lower())
        if spec is not None:
            path = ensure_model(spec.name)
            kwargs.setdefault("sha256", spec.sha256)
            return cls(model_path=str(path), **kwargs)
        if Path(key).expanduser().is_file():
            return cls(model_path=str(Path(key).expanduser()), **kwargs)
        raise ValueError(f"{key!r} is neither a known model {sorted(MODELS)} nor an existing GGUF file")

    @property
    def _llm_type(self) -> str:
        """Return the LangChain type tag of this model."""
        return "evoharness-local-llamacpp"

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        """Return the standard tracing parameters: provider llama.cpp, the GGUF file as the model name."""
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "llamacpp"
        params.setdefault("ls_model_name", Path(self.model_path).name)  # a per-call ``model`` is already set
        return params

    @property
    def _identifying_params(self) -> dict[str, Any]:
        """Return the settings that identify this model's outputs (for caching and tracing)."""
        return {
            "model_path": self.model_path,
            "sha256": self.sha256,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "n_ctx": self.n_ctx,
            "n_threads": self.n_threads,
            "seed": self.seed,
        }

    # ------------------------------------------------------------------ loading

    def _server(self) -> Any:
        """Return the llama.cpp server, verifying the file's sha256 before the first load."""
        if self.sha256 is not None:
            verify_sha256(self.model_path, self.sha256)  # memoised: hashed once per process
        elif not Path(self.model_path).is_file():
            raise FileNotFoundError(f"model file not found: {self.model_path}")
        return _get_server(self.model_path, self.context_size, int(self.n_threads or 1), self.n_batch, self.verbose)

    @property
    def context_size(self) -> int:
        """The context window calls run with now: ``n_ctx``, or more once a prompt needed it."""
        return self._grown_ctx or self.n_ctx

    def load(self) -> LocalChatModel:
        """Load the weights now instead of at the first call; return self."""
        self._server()
        return self

    def close(self) -> None:
        """Free the llama.cpp server(s) of this model file (the next call loads it again)."""
        _release_servers(self.model_path)

    # ------------------------------------------------------------------ binding

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | dict[str, Any] | bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools; "auto"/unset lets the model answer instead, calls are decoded under the tools' schemas.

        ``tool_choice``: "auto" or ``None`` (the model decides: one of the tools, or a text
        answer), "required"/"any"/``True`` (one of the tools), a tool's name (that tool), or
        "none" (a text answer).
        """
        kwargs.pop("strict", None)  # every call is schema-constrained already
        functions = [convert_to_openai_tool(t)["function"] for t in tools]
        _normalize_tool_choice(tool_choice, functions)  # fail now on an unknown name
        return self.bind(tools=functions, tool_choice=tool_choice, **kwargs)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type,
        *,
        include_raw: bool = False,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | BaseModel]:
        """Return a runnable whose output is parsed from JSON constrained to ``schema``."""
        kwargs.pop("method", None)
        kwargs.pop("strict", None)
        if kwargs:
            raise ValueError(f"unsupported arguments {kwargs}")
        js, title, description = _structured_schema(schema)
        llm = self.bind(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": title, "description": description, "schema": js},
            },
            ls_structured_output_format={"kwargs": {"method": "json_schema"}, "schema": schema},
        )
        parser: Runnable[Any, Any]
        if isinstance(schema, type) and is_basemodel_subclass(schema):  # pydantic v2 or v1 models
            parser = PydanticOutputParser(pydantic_object=schema)
        else:
            parser = JsonOutputParser()
        if include_raw:
            parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
            fallback = RunnablePassthrough.assign(parsed=lambda _: None)
            return RunnableMap(raw=llm) | parsed.with_fallbacks([fallback], exception_key="parsing_error")
        return llm | parser

    # ------------------------------------------------------------------ generation

    def _today(self) -> dt.date:
        """Return the date the model is told is today."""
        return self.current_date or dt.date.today()

    def _request(
        self,
        chat: list[dict[str, str]],
        stop: list[str] | None,
        schema: dict[str, Any] | None,
        logit_bias: list[list[Any]] | None = None,
    ) -> dict[str, Any]:
        """Build the OpenAI-style chat-completion request of one llama.cpp call, its prompt fit to ``n_ctx``."""
        request: dict[str, Any] = {
            "messages": self._fit(chat),
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "cache_prompt": True,
        }
        if self.seed is not None:
            request["seed"] = self.seed
        if stop:
            request["stop"] = list(stop)
        if schema is not None:
            request["grammar"] = build_grammar(schema)
        if logit_bias:
            request["logit_bias"] = logit_bias  # llama.cpp: [[text, bias]] biases the text's tokens
        return request

    def _learn_ratio(self, chat: list[dict[str, str]], tokens: int) -> None:
        """Lower the characters-per-token estimate to what llama.cpp counted for ``chat``."""
        self._chars_per_token = min(self._chars_per_token, 0.9 * chat_chars(chat) / tokens)

    def _fit(self, chat: list[dict[str, str]]) -> list[dict[str, str]]:
        """Cut the oldest tool results until the prompt leaves ``max_tokens`` of the context for the reply.

        When even that does not fit (instructions and the tool list alone are too long), the
        context doubles, up to ``n_ctx_max``: what the model needs to read is never cut.
        """
        while True:
            context = self.context_size
            budget = max(context - self.max_tokens, context // 4)
            try:
                return fit_chat(chat, int(budget * self._chars_per_token))
            except ValueError as error:
                limit = max(self.n_ctx_max or self.n_ctx, self.n_ctx)
                if context >= limit:
                    raise LocalModelError(f"the prompt does not fit the context of {context} tokens: {error}; "
                                          "give the model a larger n_ctx or n_ctx_max") from None
                self._grown_ctx = min(context * 2, limit)

    def _complete(
        self,
        chat: list[dict[str, str]],
        stop: list[str] | None,
        schema: dict[str, Any] | None,
        logit_bias: list[list[Any]] | None = None,
    ) -> dict[str, Any]:
        """Run one chat completion on llama.cpp and return its raw response.

        A prompt that llama.cpp still finds too long (the characters-per-token guess was off) is
        fit again with the token count llama.cpp reported, and retried (twice at most).
        """
        for attempt in range(3):
            request = self._request(chat, stop, schema, logit_bias)
            try:
                response = _check_reply(self._server().handle_chat_completions(request))
                break
            except LocalModelError as error:
                overflow = context_overflow(str(error))
                if overflow is None or attempt == 2:
                    raise
                self._learn_ratio(request["messages"], overflow[0])
        prompt_tokens = (response.get("usage") or {}).get("prompt_tokens")
        # Short prompts are mostly chat-template tokens: only long ones tell the ratio that matters.
        if isinstance(prompt_tokens, int) and prompt_tokens >= self.context_size // 4:
            self._learn_ratio(request["messages"], prompt_tokens)
        if not response.get("choices"):
            raise LocalModelError(f"llama.cpp failed the request: no choices in {response}")
        return response

    def _call(
        self,
        chat: list[dict[str, str]],
        stop: list[str] | None,
        schema: dict[str, Any] | None,
        logit_bias: list[list[Any]] | None = None,
        *,
        stream: bool = False,
    ) -> Generator[str, None, dict[str, Any]]:
        """Run one chat completion; with ``stream``, yield its text as llama.cpp writes it.

        Either way the return value is the response as a non-streamed call gives it.
        """
        if not stream:
            return self._complete(chat, stop, schema, logit_bias)
        request = self._request(chat, stop, schema, logit_bias)
        request["stream_options"] = {"include_usage": True}  # token counts come in the last chunk
        pieces: list[str] = []
        finish: str | None = None
        response: dict[str, Any] = {}
        overflow = False
        # closing: an early stop of the caller cancels the generation and frees the worker.
        with closing(self._server().stream_chat_completions(request)) as chunks:
            for chunk in chunks:
                if not pieces and "error" in chunk and context_overflow(json.dumps(chunk["error"])) is not None:
                    overflow = True
                    break
                for choice in _check_reply(chunk).get("choices") or []:
                    finish = choice.get("finish_reason") or finish
                    if delta := (choice.get("delta") or {}).get("content"):
                        pieces.append(delta)
                        yield delta
                response |= {key: chunk[key] for key in ("usage", "timings") if chunk.get(key)}
        if overflow:
            # Refused as too long before a token was written: the non-streamed call fits the
            # prompt again on llama.cpp's token count and retries; its text comes as one piece.
            response = self._complete(chat, stop, schema, logit_bias)
            if text := _reply_text(response):
                yield text
            return response
        return {"choices": [{"message": {"content": "".join(pieces)}, "finish_reason": finish}], **response}

    def _reply(
        self, messages: list[BaseMessage], stop: list[str] | None, *, stream: bool, **kwargs: Any
    ) -> Generator[str, None, ChatResult]:
        """Generate one reply: plain text, a constrained tool call, or constrained JSON.

        With ``tool_choice`` "auto" or unset, the route may pick the answer option: the reply is
        then plain text from a second, unconstrained call. With ``stream``, the call that writes
        the reply's text (a text answer or structured JSON) yields it as it is generated; route
        and tool-argument calls do not stream, as their JSON is read whole into a tool call.
        """
        functions: list[dict[str, Any]] = list(kwargs.get("tools") or [])
        names = [f["name"] for f in functions]
        today = self._today() if self.date_in_prompt else None
        mode, forced, chat, schema = prepare_call(
            messages,
            functions,
            kwargs.get("tool_choice"),
            kwargs.get("response_format"),
            today=today,
            two_stage=self.two_stage_choice,
        )
        usage: dict[str, int] = {}
        auto = _normalize_tool_choice(kwargs.get("tool_choice"), functions)[0] == "auto"
        answer = answer_option(names)
        bias = [[answer, self.answer_bias]] if auto and self.answer_bias else None
        response = yield from self._call(
            chat, None if mode == "route" else stop, schema, bias, stream=stream and mode == "text"
        )
        _add_usage(usage, response)
        content = _reply_text(response)
        message: AIMessage | None = None
        if mode in ("route", "choice"):
            # An auto choice may pick the answer option instead of a tool: the answer is then
            # written by a plain, unconstrained text call on the same conversation.
            picked = _parse_route(content, [*names, answer])
            if picked == answer:
                mode, forced, chat, schema = prepare_call(messages, functions, "none", today=today)
            elif mode == "route" and picked is None:
                message = parse_tool_reply(content, forced=None, names=names)
            elif mode == "route":
                mode, forced, chat, schema = prepare_call(messages, functions, picked, today=today)
            if message is None and mode != "choice":
                response = yield from self._call(chat, stop, schema, stream=stream and mode == "text")
                _add_usage(usage, response)
                content = _reply_text(response)
        if message is None:
            if mode in ("forced", "choice"):
                message = parse_tool_reply(content, forced=forced, names=names)
            else:
                message = AIMessage(content=content)
        if auto and self.repeat_guard and message.tool_calls and _repeats_a_call(messages, message.tool_calls[0]):
            mode, forced, chat, schema = prepare_call(messages, functions, "none", today=today)
            response = yield from self._call(chat, stop, schema, stream=stream)
            _add_usage(usage, response)
            message = AIMessage(content=_reply_text(response))
        choice = response["choices"][0]
        message.usage_metadata = UsageMetadata(
            input_tokens=usage.get("prompt_tokens", 0),
            output_tokens=usage.get("completion_tokens", 0),
            total_tokens=usage.get("total_tokens", 0),
        )
        message.response_metadata = {
            "model_name": Path(self.model_path).name,
            "finish_reason": choice.get("finish_reason"),
            "timings": response.get("timings", {}),
        }
        info = {"finish_reason": choice.get("finish_reason")}
        return ChatResult(
            generations=[ChatGeneration(message=message, generation_info=info)],
            llm_output={"model_name": Path(self.model_path).name, "token_usage": usage},
        )

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        """Generate one reply: plain text, a constrained tool call, or constrained JSON."""
        return _drain(self._reply(messages, stop, stream=False, **kwargs))

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        """Stream one reply: text token by token from llama.cpp, a tool call as one chunk once decoded.

        A tool call is not streamed in pieces: its JSON is checked against the tool names first,
        and a call the model decided on may still become a text answer (``repeat_guard``). The
        last chunk (``chunk_position="last"``) carries the tool calls, the token usage and the
        response metadata. ``astream`` runs this in a thread (LangChain's default ``_astream``).
        """
        streamed = False
        with closing(self._reply(messages, stop, stream=True, **kwargs)) as replies:
            while True:
                try:
                    delta = next(replies)
                except StopIteration as done:
                    result: ChatResult = done.value
                    break
                streamed = True
                chunk = ChatGenerationChunk(message=AIMessageChunk(content=delta))
                if run_manager is not None:
                    run_manager.on_llm_new_token(delta, chunk=chunk)
                yield chunk
        generation = result.generations[0]
        message = generation.message
        assert isinstance(message, AIMessage)  # _reply builds AIMessages
        last = AIMessageChunk(
            content="" if streamed else message.content,  # streamed text is already out
            tool_calls=message.tool_calls,
            invalid_tool_calls=message.invalid_tool_calls,
            usage_metadata=message.usage_metadata,
            response_metadata=message.response_metadata,
            chunk_position="last",
        )
        yield ChatGenerationChunk(message=last, generation_info=generation.generation_info)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        """Generate in a thread-pool thread; calls to the llama.cpp worker are serialised."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, partial(self._generate, messages, stop, None, **kwargs))
