"""Malformed logs become located `LogFormatError`s, skippable line by line (issue 9, log import)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from evoharness_agent.logs.importers import LogFormatError, detect_format, load_episodes

HUMAN = {"type": "human", "content": "Weather in Paris?"}
AI_CTOR = ["langchain", "schema", "messages", "AIMessage"]


def openai_line(**overrides: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "Weather in Paris?"},
                         {"role": "assistant", "tool_calls": [{"id": "c1", "function": {
                             "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                         {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                         {"role": "assistant", "content": "Sunny."}],
            "reward": 1.0, **overrides}


def langchain_line(*messages: Any) -> list[Any]:
    return [HUMAN, *messages, {"type": "ai", "content": "Sunny."}]


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def between_good_lines(tmp_path: Path, good: Any, bad: str | bytes) -> Path:
    """A file whose lines 1 and 3 are valid and line 2 is ``bad``."""
    line = json.dumps(good).encode()
    path = tmp_path / "logs.jsonl"
    path.write_bytes(b"\n".join([line, bad if isinstance(bad, bytes) else bad.encode(), line]) + b"\n")
    return path


CASES = [
    ("messages-not-a-list", openai_line(), json.dumps({"messages": 5}), "messages", "list of messages"),
    ("tool-calls-a-string", langchain_line(), json.dumps(langchain_line(
        {"type": "ai", "content": "", "tool_calls": "x"})), "[1].tool_calls", "expected a list"),
    ("odd-kwargs", langchain_line(), json.dumps(langchain_line(
        {"lc": 1, "type": "constructor", "id": AI_CTOR, "kwargs": ["content"]})), "[1].kwargs",
     "expected an object"),
    ("odd-tool-call-in-kwargs", langchain_line(), json.dumps(langchain_line(
        {"lc": 1, "type": "constructor", "id": AI_CTOR, "kwargs": {"content": "", "tool_calls": [[1]]}})),
     "[1].kwargs.tool_calls[0]", "expected a tool call object"),
    ("not-implemented", langchain_line(), json.dumps(langchain_line(
        {"lc": 1, "type": "not_implemented", "id": ["x"], "repr": "x"})), "[1]", "NotImplementedError"),
    ("deep-line", openai_line(), deep(5000), "", "nested more than 100 levels"),
    ("deep-field", openai_line(), json.dumps(openai_line(metadata={"a": "DEEP"})).replace(
        '"DEEP"', deep(300)), "metadata.a" + "[0]" * 99, "nested more than 100 levels"),
    ("deep-arguments", openai_line(), json.dumps(openai_line()).replace(
        r'{\"city\": \"Paris\"}', deep(300)), "messages[1].tool_calls[0].function.arguments" + "[0]" * 101,
     "nested more than 100 levels"),
    ("bad-byte", openai_line(), json.dumps(openai_line()).encode().replace(b"Paris?", b"Par\xffis?"), "",
     "not valid UTF-8 (byte 0xff at column"),
    ("nan-reward", openai_line(), json.dumps(openai_line(reward=float("nan"))), "reward", "finite number"),
    ("inf-reward", openai_line(), json.dumps(openai_line(reward=1e999)), "reward", "finite number"),
    ("inf-step-reward", {"task": "t"}, json.dumps(
        {"task": "t", "steps": [{"kind": "assistant", "reward": float("-inf")}]}), "steps[0].reward",
     "finite number"),
]


@pytest.mark.parametrize(("good", "bad", "field", "text"), [case[1:] for case in CASES],
                         ids=[case[0] for case in CASES])
def test_bad_line_is_located_and_skippable(tmp_path: Path, good: Any, bad: str | bytes, field: str,
                                           text: str) -> None:
    path = between_good_lines(tmp_path, good, bad)
    with pytest.raises(LogFormatError) as info:
        load_episodes([path])
    assert (info.value.path, info.value.line, info.value.field) == (str(path), 2, field)
    assert text in info.value.reason
    result = load_episodes([path], skip_invalid=True)
    assert [episode.id for episode in result.episodes] == ["logs:1", "logs:3"]
    assert [(err.line, err.field) for err in result.skipped] == [(2, field)]


def test_bad_byte_in_the_first_line_does_not_block_detection(tmp_path: Path) -> None:
    path = tmp_path / "logs.jsonl"
    path.write_bytes(b'{"task": "caf\xe9"}\n' + json.dumps({"task": "ok"}).encode() + b"\n")
    assert detect_format(path) == "native"
    result = load_episodes([path], skip_invalid=True)
    assert [e.task for e in result.episodes] == ["ok"]
    assert "not valid UTF-8 (byte 0xe9 at column 14)" in result.skipped[0].reason


def gzip_of_lines(n: int) -> bytes:
    # incompressible observations, so that the stream's damage lands after the first lines
    import random

    noise = random.Random(0)
    return gzip.compress(b"".join(json.dumps(
        {"task": f"t{i}", "steps": [{"kind": "assistant", "content": noise.randbytes(3000).hex()}]}
    ).encode() + b"\n" for i in range(n)), mtime=0)


@pytest.mark.parametrize("damage", ["truncated", "flipped", "crc"])
def test_corrupt_gzip_names_the_file_and_keeps_what_was_read(tmp_path: Path, damage: str) -> None:
    packed = gzip_of_lines(10)
    if damage == "truncated":
        packed = packed[: len(packed) // 2]
    elif damage == "flipped":
        middle = len(packed) // 2
        packed = packed[:middle] + bytes([packed[middle] ^ 0xFF]) + packed[middle + 1:]
    else:  # the last 8 bytes are the CRC and length of the uncompressed data
        packed = packed[:-8] + bytes(8)
    path = tmp_path / "logs.jsonl.gz"
    path.write_bytes(packed)
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"task": "other"}) + "\n")
    with pytest.raises(LogFormatError) as info:
        load_episodes([path, other])
    assert info.value.path == str(path)
    result = load_episodes([path, other], skip_invalid=True)
    tasks = [e.task for e in result.episodes]
    assert tasks[0] == "t0" and tasks[-1] == "other"
    unreadable = result.skipped[-1]  # a flipped byte may first garble a few lines (skipped too)
    assert unreadable.path == str(path) and "corrupt or truncated gzip file" in unreadable.reason
    if damage == "crc":  # the CRC is checked after the last line: every line was read
        assert tasks == [f"t{i}" for i in range(10)] + ["other"]
        assert unreadable.line == 11
    assert detect_format(path) == "native"


def test_gzip_without_a_readable_line(tmp_path: Path) -> None:
    path = tmp_path / "logs.jsonl.gz"
    path.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(LogFormatError, match=r"logs\.jsonl\.gz:1: corrupt or truncated gzip file"):
        detect_format(path)
    result = load_episodes([path], skip_invalid=True)
    assert (result.episodes, [err.line for err in result.skipped]) == ([], [1])


def test_non_finite_default_reward_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "logs.jsonl"
    path.write_text(json.dumps({"task": "t"}) + "\n")
    with pytest.raises(ValueError, match="default_reward must be a finite number"):
        load_episodes([path], default_reward=float("nan"))
