from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from langchain_core.load import dumpd
from langchain_core.messages import (
    AIMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    messages_to_dict,
)

from evoharness_agent.logs.importers import (
    FORMATS,
    LoadResult,
    LogFormatError,
    detect_format,
    load_episodes,
    write_episodes,
)
from evoharness_agent.schema import FINISH, Episode, Step, ToolSpec

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "dict", "properties": {"city": {"type": "str"}}}}}


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def native_record(**overrides: Any) -> dict[str, Any]:
    record = {"id": "ep-1", "task": "Weather in Paris?",
              "tools": [{"name": "get_weather", "description": "Weather"}],
              "steps": [{"kind": "tool_call", "tool": "get_weather",
                         "arguments": {"city": "Paris"}, "observation": "sunny"},
                        {"kind": "assistant", "content": "Sunny."}],
              "final_answer": "Sunny.", "reward": 1.0}
    return {**record, **overrides}


def openai_record(**overrides: Any) -> dict[str, Any]:
    record = {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "c2", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "tool_call_id": "c2", "content": "rainy"},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "assistant", "content": "Paris is sunny, Rome rainy."}],
        "tools": [WEATHER], "reward": 1.0}
    return {**record, **overrides}


def load_one(path: Path, **kwargs: Any) -> Episode:
    result = load_episodes([path], **kwargs)
    assert not result.skipped
    assert len(result.episodes) == 1
    return result.episodes[0]


def expect_error(path: Path, line: int, field: str, text: str, fmt: str = "auto") -> None:
    with pytest.raises(LogFormatError) as info:
        load_episodes([path], format=fmt)
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), line, field)
    assert str(err).startswith(f"{path}:{line}: ")
    if field:
        assert f"field '{field}': " in str(err)
    assert text in err.reason


# --- native -------------------------------------------------------------------------------

def test_native_round_trip(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "logs.jsonl", [native_record()])
    episode = load_one(path)
    assert episode == Episode.model_validate(native_record())
    assert [step.action for step in episode.steps] == ["get_weather", FINISH]


def test_native_defaults_id_and_reward(tmp_path: Path) -> None:
    record = native_record()
    del record["id"], record["reward"]
    path = tmp_path / "runs.jsonl"
    path.write_text("\n\n" + json.dumps(record) + "\n  \n")
    assert load_one(path).id == "runs:3"
    assert load_one(path).reward is None
    assert load_one(path, default_reward=0.25).reward == 0.25


def test_native_type_dict_schema_is_normalised(tmp_path: Path) -> None:
    tool = {"name": "f", "parameters": {"type": "dict", "properties": {"n": {"type": "int"}}}}
    path = write_jsonl(tmp_path / "a.jsonl", [native_record(tools=[tool])])
    assert load_one(path).tools[0].parameters == {
        "type": "object", "properties": {"n": {"type": "integer"}}}


@pytest.mark.parametrize(("record", "field", "text"), [
    ({"steps": []}, "task", "Field required"),
    (native_record(steps=[{"kind": "tool_call"}, {"kind": "nope"}]), "steps[0]",
     "needs a non-empty 'tool'"),
    (native_record(steps=[{"kind": "assistant"}, {"kind": "nope"}]), "steps[1].kind",
     "Input should be"),
    (native_record(tools=[{"name": ""}]), "tools[0].name", "at least 1 character"),
    ([1, 2], "", "expected a JSON object"),
])
def test_native_errors_name_the_field(tmp_path: Path, record: Any, field: str,
                                      text: str) -> None:
    path = write_jsonl(tmp_path / "logs.jsonl", [native_record(), record])
    expect_error(path, 2, field, text, fmt="native")


def test_bad_json_line(tmp_path: Path) -> None:
    path = tmp_path / "logs.jsonl"
    path.write_text(json.dumps(native_record()) + "\n{not json\n")
    expect_error(path, 2, "", "not valid JSON", fmt="native")


# --- openai -------------------------------------------------------------------------------

def test_openai_conversation(tmp_path: Path) -> None:
    episode = load_one(write_jsonl(tmp_path / "chat.jsonl", [openai_record(id=7)]))
    assert episode.id == "7"
    assert episode.task == "Weather in Paris and Rome?"
    assert episode.metadata == {"system": "Be brief."}
    assert episode.tools[0].parameters["type"] == "object"
    calls = [(s.kind, s.tool, s.arguments, s.observation) for s in episode.steps]
    assert calls == [("tool_call", "get_weather", {"city": "Paris"}, "sunny"),
                     ("tool_call", "get_weather", {"city": "Rome"}, "rainy"),
                     ("assistant", None, {}, "")]
    assert episode.final_answer == "Paris is sunny, Rome rainy."
    assert episode.reward == 1.0


def test_openai_user_turns_unknown_tools_and_errors(tmp_path: Path) -> None:
    record = {"messages": [
        {"role": "user", "content": "Book a table"},
        {"role": "assistant", "content": "For how many?"},
        {"role": "user", "content": [{"type": "text", "text": "Four"}]},
        {"role": "assistant", "tool_calls": [
            {"function": {"name": "book", "arguments": '{"n": 4}'}}]},
        {"role": "tool", "content": '{"error": "no tables"}'},
        {"role": "assistant", "tool_calls": [{"function": {"name": "waitlist"}}]},
        {"role": "tool", "content": "Traceback (most recent call last):\n ..."},
        {"role": "assistant", "tool_calls": [{"function": {"name": "waitlist"}}]},
        {"role": "tool", "content": "ok, you are on the list"}],
        "tools": [{"type": "function", "function": {"name": "book"}}]}
    episode = load_one(write_jsonl(tmp_path / "a.jsonl", [record]))
    assert [s.kind for s in episode.steps] == [
        "assistant", "user", "tool_call", "tool_call", "tool_call"]
    assert episode.steps[1].content == "Four"
    assert [s.error for s in episode.steps[2:]] == [True, True, False]
    assert episode.tool_names() == ["book", "waitlist"]
    assert episode.tools[1] == ToolSpec(name="waitlist")
    assert episode.available_at_start is None
    assert episode.final_answer == "For how many?"
    assert episode.reward is None


def test_openai_legacy_function_call(tmp_path: Path) -> None:
    record = {"messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None,
         "function_call": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
        {"role": "function", "name": "get_weather", "content": "Error: city not found"},
        {"role": "assistant", "content": "Sorry."}],
        "functions": [WEATHER["function"]]}
    episode = load_one(write_jsonl(tmp_path / "a.jsonl", [record]), default_reward=1.0)
    assert episode.tools[0].description == "Weather for a city"
    step = episode.steps[0]
    assert (step.tool, step.arguments, step.error) == ("get_weather", {"city": "Oslo"}, True)
    assert episode.reward == 1.0


def test_openai_args_not_json(tmp_path: Path) -> None:
    record = openai_record()
    record["messages"][2]["tool_calls"][0]["function"]["arguments"] = '{"city": '
    path = write_jsonl(tmp_path / "logs.jsonl", [openai_record(), openai_record(), record])
    expect_error(path, 3, "messages[2].tool_calls[0].function.arguments", "not valid JSON")
    with pytest.raises(LogFormatError) as info:
        load_episodes([path])
    assert str(info.value) == (f"{path}:3: field "
                               "'messages[2].tool_calls[0].function.arguments': "
                               "not valid JSON (Expecting value at column 10)")


@pytest.mark.parametrize(("edit", "field", "text"), [
    (lambda r: r["messages"][3].update(tool_call_id="c9"), "messages[3].tool_call_id",
     "'c9'"),
    (lambda r: r["messages"][2]["tool_calls"][1]["function"].update(arguments="[1]"),
     "messages[2].tool_calls[1].function.arguments", "expected a JSON object"),
    (lambda r: r["messages"][2]["tool_calls"][0]["function"].pop("name"),
     "messages[2].tool_calls[0].function.name", "missing or empty tool name"),
    (lambda r: r["messages"][2]["tool_calls"][0].pop("function"),
     "messages[2].tool_calls[0].function", "missing function object"),
    (lambda r: r["messages"][1].update(role="robot"), "messages[1].role", "'robot'"),
    (lambda r: r["messages"].insert(1, {"role": "tool", "content": "x"}), "messages[1]",
     "no tool call awaiting"),
    (lambda r: r.update(messages=[]), "messages", "non-empty list"),
    (lambda r: r.update(messages=r["messages"][:1]), "messages", "no user message"),
    (lambda r: r.update(tools=[{"type": "function", "function": {"name": ""}}]),
     "tools[0].function.name", "missing or empty tool name"),
    (lambda r: r.update(tools=[{"name": "f", "parameters": "x"}]), "tools[0].parameters",
     "valid dictionary"),
    (lambda r: r.update(reward="great"), "reward", "valid number"),
    (lambda r: r.update(metadata=[1]), "metadata", "expected a JSON object"),
])
def test_openai_errors_name_the_field(tmp_path: Path, edit: Any, field: str,
                                      text: str) -> None:
    record = openai_record()
    edit(record)
    path = write_jsonl(tmp_path / "logs.jsonl", [record])
    expect_error(path, 1, field, text, fmt="openai")


# --- langchain ----------------------------------------------------------------------------

def lc_messages() -> list[Any]:
    return [SystemMessage("Be brief."), HumanMessage("Weather in Paris?"),
            AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Paris"},
                                       "id": "t1"}]),
            ToolMessage("boom", tool_call_id="t1", status="error"),
            AIMessage([{"type": "text", "text": "Cannot tell."}])]


@pytest.mark.parametrize("serialize", [
    messages_to_dict,
    lambda msgs: [dumpd(m) for m in msgs],
    lambda msgs: [{"type": m.type, "content": m.content,
                   **({"tool_calls": m.tool_calls} if getattr(m, "tool_calls", None) else {}),
                   **({"tool_call_id": m.tool_call_id, "status": m.status}
                      if isinstance(m, ToolMessage) else {})} for m in msgs],
], ids=["to_dict", "dumpd", "plain"])
def test_langchain_forms(tmp_path: Path, serialize: Any) -> None:
    lines = [serialize(lc_messages()),
             {"messages": serialize(lc_messages()), "reward": 0.0, "id": "x",
              "tools": [{"name": "get_weather", "description": "d",
                         "args_schema": {"type": "object", "properties": {}}}]}]
    path = write_jsonl(tmp_path / "lc.jsonl", lines)
    assert detect_format(path) == "langchain"
    bare, wrapped = load_episodes([path]).episodes
    for episode in (bare, wrapped):
        assert episode.task == "Weather in Paris?"
        assert episode.metadata == {"system": "Be brief."}
        step = episode.steps[0]
        assert (step.tool, step.arguments, step.observation, step.error) == (
            "get_weather", {"city": "Paris"}, "boom", True)
        assert episode.final_answer == "Cannot tell."
    assert (bare.id, bare.reward, bare.tools[0].description) == ("lc:1", None, "")
    assert (wrapped.id, wrapped.reward, wrapped.tools[0].description) == ("x", 0.0, "d")


def test_langchain_errors(tmp_path: Path) -> None:
    bad_args = {"type": "ai", "content": "",
                "tool_calls": [{"name": "f", "args": "{", "id": "1"}]}
    lines = [[dumpd(HumanMessage("hi")), {"type": "martian", "content": "x"}],
             [messages_to_dict([HumanMessage("hi")])[0], bad_args],
             [{"type": "human", "content": "hi"}, {"type": "tool", "content": "x"}],
             {"messages": [{"lc": 1, "type": "constructor",
                            "id": ["langchain", "schema", "messages", "EvilMessage"],
                            "kwargs": {}}]},
             [dumpd(HumanMessage("hi")), dumpd(AIMessage(
                 "", additional_kwargs={"tool_calls": [{"id": "1", "type": "function",
                 "function": {"name": "f", "arguments": "{bad"}}]}))]]
    path = write_jsonl(tmp_path / "lc.jsonl", lines)
    result = load_episodes([path], format="langchain", skip_invalid=True)
    assert result.episodes == []
    assert [(e.line, e.field) for e in result.skipped] == [
        (1, "[1]"), (2, "[1].tool_calls[0].args"), (3, "[1]"), (4, "messages[0]"),
        (5, "[1].invalid_tool_calls[0]")]
    assert "martian" in result.skipped[0].reason
    assert "tool_call_id" in result.skipped[2].reason
    assert "not valid JSON" in result.skipped[4].reason


# --- files, detection, skipping, writing -------------------------------------------------

def test_gzip_and_directories(tmp_path: Path) -> None:
    with gzip.open(tmp_path / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps(native_record(id="gz")) + "\n")
    write_jsonl(tmp_path / "a.jsonl", [openai_record(id="oa")])
    write_jsonl(tmp_path / "c.jsonl", [messages_to_dict(lc_messages())])
    (tmp_path / "notes.txt").write_text("ignored")
    result = load_episodes([tmp_path])
    assert [e.id for e in result.episodes] == ["oa", "gz", "c:1"]
    assert load_episodes(tmp_path / "b.jsonl.gz").episodes[0].id == "gz"
    assert detect_format(tmp_path / "b.jsonl.gz") == "native"


def test_empty_directory_and_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_episodes([tmp_path])
    with pytest.raises(ValueError, match="unknown log format"):
        load_episodes([tmp_path], format="csv")


@pytest.mark.parametrize(("lines", "expected"), [
    ([native_record()], "native"),
    ([openai_record()], "openai"),
    ([messages_to_dict(lc_messages())], "langchain"),
    ([{"messages": [dumpd(HumanMessage("x"))]}], "langchain"),
    (["garbage", openai_record()], "openai"),
])
def test_detect_format(tmp_path: Path, lines: list[Any], expected: str) -> None:
    assert expected in FORMATS
    assert detect_format(write_jsonl(tmp_path / "x.jsonl", lines)) == expected


@pytest.mark.parametrize(("lines", "text"), [
    ([native_record(), openai_record()], "looks like native and openai"),
    ([{"foo": 1}, 3], "no line looks like any"),
    ([], "no episodes"),
])
def test_detect_format_errors(tmp_path: Path, lines: list[Any], text: str) -> None:
    path = write_jsonl(tmp_path / "x.jsonl", lines)
    with pytest.raises(LogFormatError, match=text) as info:
        detect_format(path)
    assert str(info.value).startswith(f"{path}:")


def test_skip_invalid_collects_everything(tmp_path: Path) -> None:
    path = tmp_path / "logs.jsonl"
    bad_args = openai_record()
    bad_args["messages"][2]["tool_calls"][0]["function"]["arguments"] = "{"
    lines = [json.dumps(openai_record()), "{oops", json.dumps({"messages": []}),
             json.dumps(bad_args), json.dumps({"messages": "x"}), json.dumps(openai_record())]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(LogFormatError):
        load_episodes([path], format="openai")
    result = load_episodes([path], format="openai", skip_invalid=True)
    assert isinstance(result, LoadResult)
    assert len(result.episodes) == 2
    assert [e.line for e in result.skipped] == [2, 3, 4, 5]
    summary = result.summary()
    assert summary.startswith("skipped 4 of 6 lines: 2 × field 'messages': missing")
    assert "1 × not valid JSON" in summary
    assert LoadResult(episodes=result.episodes).summary() == "skipped 0 of 2 lines"


@pytest.mark.parametrize("name", ["out.jsonl", "sub/out.jsonl.gz"])
def test_write_round_trip(tmp_path: Path, name: str) -> None:
    episodes = [Episode.model_validate(native_record()),
                Episode(id="b", task="t", steps=[Step(kind="user", content="more")])]
    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    path.write_text("old contents")
    write_episodes(path, episodes)
    assert load_episodes([path], format="native").episodes == episodes
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_write_failure_keeps_old_file(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text("old contents")

    def broken() -> Any:
        yield Episode(task="t")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        write_episodes(path, broken())
    assert path.read_text() == "old contents"
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]


def test_episodes_listing_the_same_tools_share_one_object_per_spec(tmp_path: Path) -> None:
    search = {"name": "search", "description": "Search the web.", "parameters": {"type": "object", "properties": {}}}
    other = {**search, "description": "Search the catalog."}  # same name, another spec: kept apart
    records = [{"task": f"t{i}", "tools": [search, other if i == 2 else search]} for i in range(3)]
    a, b, c = load_episodes([write_jsonl(tmp_path / "logs.jsonl", records)]).episodes
    assert a.tools[0] is b.tools[0] is c.tools[0] is a.tools[1]
    assert c.tools[1] is not c.tools[0] and c.tools[1].description == "Search the catalog."
    assert [tool.model_dump() for tool in b.tools] == [ToolSpec(**search).model_dump()] * 2
