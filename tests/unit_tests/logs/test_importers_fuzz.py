"""Fuzz the log importers: whatever bytes a log file holds, only `LogFormatError` may escape.

The inputs are near misses of real logs (a valid OpenAI, LangChain or native line with one
value replaced by an arbitrary JSON value), arbitrary JSON, raw bytes, deep nesting, a bad
byte inside a valid line, and gzip files that are corrupted or cut short.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.load import dumpd
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage, messages_to_dict

from evoharness_agent.logs.importers import FORMATS, LogFormatError, detect_format, load_episodes

_KEYS = ["messages", "role", "content", "tool_calls", "function", "name", "arguments", "id", "type",
         "lc", "kwargs", "data", "tools", "reward", "task", "steps", "kind", "tool", "observation",
         "error", "tool_call_id", "function_call", "parameters", "metadata", "additional_kwargs",
         "invalid_tool_calls", "status", "args", "available_at_start", "tools_added",
         "final_answer", "description", "args_schema", "functions", "properties"]
_WORDS = ["user", "assistant", "tool", "system", "function", "ai", "human", "chat", "constructor",
          "not_implemented", "secret", "error", "dict", "object", "x", "", "langchain", "schema",
          "messages", "AIMessage", "HumanMessage", "ToolMessage", '{"city": "Paris"}', "{not json"]

_scalars = (st.none() | st.booleans() | st.integers() | st.floats() | st.sampled_from(_WORDS)
            | st.text(max_size=8))
json_values = st.recursive(
    _scalars,
    lambda inner: (st.lists(inner, max_size=3)
                   | st.dictionaries(st.sampled_from(_KEYS) | st.text(max_size=4), inner, max_size=4)
                   | st.sampled_from([["langchain", "schema", "messages", "AIMessage"]])
                   | st.fixed_dictionaries({"lc": st.just(1), "type": st.sampled_from(
                       ["constructor", "not_implemented", "secret"]),
                       "id": st.lists(st.sampled_from(_WORDS), max_size=4), "kwargs": inner})),
    max_leaves=12,
)

_AI = AIMessage("", tool_calls=[{"id": "c1", "name": "get_weather", "args": {"city": "Paris"}}])
_CHAT = [HumanMessage("Weather in Paris?"), _AI, ToolMessage("sunny", tool_call_id="c1"),
         AIMessage("Sunny.")]
_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                            "parameters": {"type": "dict", "properties": {}}}}]
SEEDS: list[Any] = [
    {"messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "c1", "type": "function",
                       "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                  {"role": "assistant", "function_call": {"name": "get_weather", "arguments": "{}"}},
                  {"role": "function", "name": "get_weather", "content": "rainy"},
                  {"role": "assistant", "content": "Sunny."}],
     "tools": _TOOLS, "reward": 1.0, "metadata": {}},
    {"messages": dumpd(_CHAT), "tools": _TOOLS, "reward": 0.5},
    messages_to_dict(_CHAT),
    [{"type": "human", "content": "Weather?"},
     {"type": "ai", "content": "", "tool_calls": [{"id": "c1", "name": "get_weather", "args": {}}]},
     {"type": "tool", "content": "sunny", "tool_call_id": "c1"}],
    {"id": "ep-1", "task": "Weather in Paris?", "tools": [{"name": "get_weather"}],
     "available_at_start": None,
     "steps": [{"kind": "tool_call", "tool": "get_weather", "arguments": {"city": "Paris"},
                "observation": "sunny", "error": False, "reward": None},
               {"kind": "user", "content": "And Rome?", "tools_added": ["get_weather"]},
               {"kind": "assistant", "content": "Sunny."}],
     "final_answer": "Sunny.", "reward": 1.0, "metadata": {}},
]
_DEEP = "\x00deep\x00"  # stands for a nesting too deep for json.dumps to write


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Yield the path of every value inside ``value``, itself included."""
    yield prefix
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, inner in items:
        yield from _paths(inner, (*prefix, key))


def _replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    """Return a copy of ``value`` with the value at ``path`` replaced by ``new``."""
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _replaced(value[path[0]], path[1:], new)
    return copy


@st.composite
def mutated_records(draw: st.DrawFn) -> Any:
    """A valid seed line with one value replaced (sometimes by a too-deep nesting)."""
    seed = draw(st.sampled_from(SEEDS))
    path = draw(st.sampled_from(list(_paths(seed))))
    new = draw(json_values | st.just(_DEEP))
    return _replaced(seed, path, new)


@st.composite
def lines(draw: st.DrawFn) -> bytes:
    """One line of a log file, as bytes."""
    kind = draw(st.sampled_from(["mutated", "mutated", "seed", "json", "bytes", "deep", "bad_byte"]))
    if kind == "bytes":
        return draw(st.binary(max_size=40)).replace(b"\n", b" ")
    if kind == "deep":
        depth = draw(st.integers(1, 5000))
        return ("[" * depth + "]" * depth).encode()
    record = (draw(mutated_records()) if kind == "mutated" else draw(st.sampled_from(SEEDS))
              if kind in ("seed", "bad_byte") else draw(json_values))
    depth = draw(st.integers(50, 3000))
    text = json.dumps(record).replace(json.dumps(_DEEP), "[" * depth + "]" * depth).encode()
    if kind == "bad_byte":
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80"])) + text[at:]
    return text


@st.composite
def log_files(draw: st.DrawFn) -> tuple[str, bytes]:
    """A file name and its bytes: plain JSONL, gzip, or gzip corrupted or cut short."""
    data = b"\n".join(draw(st.lists(lines(), min_size=0, max_size=4))) + b"\n"
    how = draw(st.sampled_from(["plain", "plain", "gzip", "truncated", "flipped", "garbage"]))
    if how == "plain":
        return "logs.jsonl", data
    packed = gzip.compress(data, mtime=0)
    if how == "truncated":
        packed = packed[: draw(st.integers(0, len(packed) - 1))]
    elif how == "flipped":
        at = draw(st.integers(0, len(packed) - 1))
        packed = packed[:at] + bytes([packed[at] ^ draw(st.integers(1, 255))]) + packed[at + 1:]
    elif how == "garbage":
        packed = draw(st.binary(max_size=60))
    return "logs.jsonl.gz", packed


def exercise(path: Path) -> None:
    """Detect and load ``path`` every way a user can; let anything but LogFormatError escape."""
    try:
        detect_format(path)
    except LogFormatError:
        pass
    for fmt in ("auto", *FORMATS):
        for skip in (False, True):
            try:
                load_episodes([path], format=fmt, skip_invalid=skip)
            except LogFormatError as err:
                assert err.path == str(path) and err.line >= 0, err


_SETTINGS = settings(deadline=None, database=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _fuzz(examples: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        @settings(_SETTINGS, max_examples=examples)
        @given(log_files())
        def run(file: tuple[str, bytes]) -> None:
            for stale in Path(folder).iterdir():
                stale.unlink()
            path = Path(folder) / file[0]
            path.write_bytes(file[1])
            exercise(path)

        run()


def test_fuzz_importers_raise_only_log_format_errors() -> None:
    """A few hundred generated files (more with EVOHARNESS_FUZZ_EXAMPLES)."""
    _fuzz(int(os.environ.get("EVOHARNESS_FUZZ_EXAMPLES", "250")))


@pytest.mark.slow
def test_fuzz_importers_ten_thousand_cases() -> None:
    _fuzz(10_000)
