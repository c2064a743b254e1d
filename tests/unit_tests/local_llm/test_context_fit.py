"""Prompts fit the local model's context: the oldest tool results are cut first, and an overflow is retried."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool

from evoharness_agent.agents.llm_calls import build_messages, fill_arguments
from evoharness_agent.local_llm import LocalChatModel, LocalModelError
from evoharness_agent.local_llm.prompting import (
    chat_chars,
    context_overflow,
    fit_chat,
    prepare_call,
)


@tool
def lookup(key: str) -> str:
    """Look a key up in the store."""
    return "value"


def _steps(n: int, size: int) -> list[tuple[str, Any, Any]]:
    return [("lookup", {"key": f"k{i}"}, f"obs{i}:" + "x" * size) for i in range(n)]


def test_build_messages_results_are_cut_oldest_first() -> None:
    messages = build_messages("Find the value of k9", _steps(10, 1000), system_prompt="Be brief.")
    _, _, chat, _ = prepare_call(messages, [], None)
    fitted = fit_chat(chat, chat_chars(chat) - 3000)
    assert chat_chars(fitted) <= chat_chars(chat) - 3000
    text = fitted[-1]["content"]
    assert fitted[0] == chat[0]  # the instructions are whole
    assert text.startswith("Request: Find the value of k9")
    assert "obs9:" + "x" * 1000 in text and "obs5:" + "x" * 1000 in text  # the newest results are whole
    assert "obs0:" + "x" * 1000 not in text and "characters left out to fit the model's context" in text
    assert 'lookup({"key": "k0"})' in text  # a cut result still says which call it answers


def test_tool_messages_are_cut_oldest_first() -> None:
    messages: list[Any] = [HumanMessage("Find k2")]
    for i in range(3):
        messages += [AIMessage("", tool_calls=[{"name": "lookup", "args": {"key": f"k{i}"}, "id": f"c{i}"}]),
                     ToolMessage(f"obs{i}:" + "y" * 2000, tool_call_id=f"c{i}")]
    _, _, chat, _ = prepare_call(messages, [], None)
    fitted = fit_chat(chat, chat_chars(chat) - 2500)
    contents = "\n".join(turn["content"] for turn in fitted)
    assert "Find k2" in contents and "obs2:" + "y" * 2000 in contents
    assert "obs0:" + "y" * 2000 not in contents


def test_a_chat_that_cannot_fit_is_an_error_and_a_short_one_is_untouched() -> None:
    chat = [{"role": "system", "content": "s" * 500}, {"role": "user", "content": "Request: hi"}]
    assert fit_chat(chat, 10_000) == chat
    with pytest.raises(ValueError, match="even with every earlier result and exchange left out"):
        fit_chat(chat, 100)


def test_context_overflow_reads_llama_cpp_message() -> None:
    message = ("llama.cpp failed the request: request (4132 tokens) exceeds the available context size "
               "(4096 tokens), try increasing it")
    assert context_overflow(message) == (4132, 4096)
    assert context_overflow("llama.cpp failed the request: bad grammar") is None


class _ContextServer:
    """A llama.cpp stand-in with a real limit: it counts one token per 4 characters and refuses long prompts."""

    def __init__(self, n_ctx: int) -> None:
        self.n_ctx = n_ctx
        self.prompts: list[int] = []

    def handle_chat_completions(self, request: dict[str, Any]) -> dict[str, Any]:
        tokens = chat_chars(request["messages"]) // 4 + 10
        self.prompts.append(tokens)
        if tokens > self.n_ctx:
            return {"error": {"code": 400, "message": f"request ({tokens} tokens) exceeds the available context "
                                                      f"size ({self.n_ctx} tokens), try increasing it"}}
        return {"choices": [{"finish_reason": "stop", "message": {"content": '{"key": "k9"}'}}],
                "usage": {"prompt_tokens": tokens, "completion_tokens": 5, "total_tokens": tokens + 5}}


@pytest.fixture
def limited_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[LocalChatModel, _ContextServer]:
    model_file = tmp_path / "m.gguf"
    model_file.write_bytes(b"GGUF")
    server = _ContextServer(n_ctx=1024)
    monkeypatch.setattr("evoharness_agent.local_llm.chat_model._get_server", lambda *a, **k: server)
    model = LocalChatModel(model_path=str(model_file), sha256=hashlib.sha256(b"GGUF").hexdigest(), n_ctx=1024,
                           max_tokens=128)
    return model, server


def test_local_model_fits_a_long_prompt_before_sending(limited_model: tuple[LocalChatModel, _ContextServer]) -> None:
    model, server = limited_model
    messages = build_messages("Find the value of k9", _steps(10, 1000))  # ~10k characters, ~2.5k tokens
    filled = fill_arguments(model, lookup, messages)
    assert filled.arguments == {"key": "k9"} and filled.error is None
    assert server.prompts and max(server.prompts) <= 1024 - 128


def test_local_model_retries_an_overflow_with_the_reported_count(
        limited_model: tuple[LocalChatModel, _ContextServer]) -> None:
    model, server = limited_model
    model._chars_per_token = 8.0  # a guess far off: the first prompt is too long for the server
    filled = fill_arguments(model, lookup, build_messages("Find the value of k9", _steps(10, 1000)))
    assert filled.arguments == {"key": "k9"}
    assert server.prompts[0] > 1024 >= server.prompts[1]
    assert model._chars_per_token < 4.0  # learned from the reported count


def test_a_prompt_that_cannot_fit_is_a_clear_local_model_error(
        limited_model: tuple[LocalChatModel, _ContextServer]) -> None:
    model, _ = limited_model
    model.n_ctx_max = None  # never grow
    with pytest.raises(LocalModelError, match="does not fit the context of 1024 tokens"):
        model.invoke([HumanMessage("Request: " + "z" * 20_000)])


def test_a_prompt_too_long_even_when_cut_grows_the_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model_file = tmp_path / "m.gguf"
    model_file.write_bytes(b"GGUF")
    servers: dict[int, _ContextServer] = {}

    def server_for(model_path: str, n_ctx: int, *args: Any) -> _ContextServer:
        return servers.setdefault(n_ctx, _ContextServer(n_ctx=n_ctx))  # a worker per context size, as llama.cpp

    monkeypatch.setattr("evoharness_agent.local_llm.chat_model._get_server", server_for)
    model = LocalChatModel(model_path=str(model_file), sha256=hashlib.sha256(b"GGUF").hexdigest(), n_ctx=1024,
                           max_tokens=128, n_ctx_max=8192)
    request = "Request: " + "z" * 8_000  # ~2.7k tokens (3 characters each, the guess) that must not be cut
    assert model.invoke([HumanMessage(request)]).content
    assert model.context_size == 4096 and sorted(servers) == [4096]  # doubled twice, then it fit
    assert servers[4096].prompts[-1] > 1024
    with pytest.raises(LocalModelError, match="does not fit the context of 8192 tokens"):
        model.invoke([HumanMessage("Request: " + "z" * 40_000)])  # beyond n_ctx_max


def test_many_exchanges_are_left_out_oldest_first_when_cutting_results_is_not_enough() -> None:
    messages: list[Any] = [HumanMessage("Find the key that holds 42")]
    for i in range(40):
        messages += [AIMessage("", tool_calls=[{"name": "lookup", "args": {"key": f"k{i}"}, "id": f"c{i}"}]),
                     ToolMessage(f"obs{i}", tool_call_id=f"c{i}")]
    function = convert_to_openai_tool(lookup)["function"]
    for tool_choice in ("lookup", None):  # turns of their own (a forced call); merged into one (a text answer)
        _, _, chat, _ = prepare_call(messages, [function] if tool_choice else [], tool_choice)
        fitted = fit_chat(chat, chat_chars(chat) // 3)
        text = "\n".join(turn["content"] for turn in fitted)
        assert chat_chars(fitted) <= chat_chars(chat) // 3
        system = [turn for turn in chat if turn["role"] == "system"]
        assert [turn for turn in fitted if turn["role"] == "system"] == system  # the instructions are whole
        assert fitted[-1]["content"].endswith("obs39")
        assert "Find the key that holds 42" in text and "left out to fit the model's context" in text
        assert "obs38" in text and "obs0\n" not in text
