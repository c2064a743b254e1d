"""Read users' tool-use logs into :class:`~evoharness_agent.schema.Episode` objects.

Three JSONL formats are understood, one episode per line (``.jsonl`` or ``.jsonl.gz``):

* ``native``: one :class:`Episode` per line.
* ``openai``: ``{"messages": [...], "tools": [...], "reward": ...}`` chat-completions logs,
  including the legacy ``function_call`` / ``role: "function"`` shape.
* ``langchain``: a list of serialized LangChain messages (``messages_to_dict``, ``dumpd`` or
  plain ``{"type": "ai", ...}`` dicts), bare or under ``"messages"`` as in ``openai``.

Every problem is reported as a :class:`LogFormatError` naming file, line and field.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import warnings
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from langchain_core import messages as lc
from langchain_core.load import load as lc_load
from pydantic import BaseModel, ValidationError

from evoharness_agent.runtime import atomic_writer
from evoharness_agent.schema import Episode, ToolSpec

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

__all__ = ["FORMATS", "LoadResult", "LogFormatError", "detect_format", "episode_from_messages", "load_episodes",
           "write_episodes"]

FORMATS = ("native", "openai", "langchain")
_DETECT_LINES = 5
_MAX_DEPTH = 100
"""Deeper JSON is refused: real logs nest a dozen levels, and Python code recursing through
deeper values (validation, LangChain's loader, schema normalisation) could exhaust the stack."""
_Model = TypeVar("_Model", bound=BaseModel)


class LogFormatError(ValueError):
    """A log line that cannot be read as an episode, located by file, line and field."""

    def __init__(self, path: str | Path, line: int, field: str, reason: str) -> None:
        self.path, self.line, self.field, self.reason = str(path), line, field, reason
        where = f"field '{field}': " if field else ""
        super().__init__(f"{self.path}:{line}: {where}{reason}")


class _Bad(Exception):
    """A problem inside one record; the loader adds the file and line."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field, self.reason = field, reason


@dataclass
class LoadResult:
    """The episodes read, and the lines skipped because they were invalid."""

    episodes: list[Episode] = field(default_factory=list)
    skipped: list[LogFormatError] = field(default_factory=list)

    def summary(self) -> str:
        """Return e.g. "skipped 3 of 120 lines: 2 × field 'messages': ..., 1 × ..."."""
        total = len(self.episodes) + len(self.skipped)
        text = f"skipped {len(self.skipped)} of {total} lines"
        problems = Counter(f"field '{err.field}': {err.reason}" if err.field else err.reason
                           for err in self.skipped)
        details = ", ".join(f"{count} × {problem}" for problem, count in problems.most_common())
        return f"{text}: {details}" if details else text


def detect_format(path: str | Path) -> str:
    """Return the format of a log file, judged from its first non-empty lines."""
    try:
        found = _detect(Path(path))
    except _Unreadable as unreadable:
        raise unreadable.error from None
    if found is None:
        raise LogFormatError(path, 0, "", "the file has no episodes to detect a format from")
    return found


def load_episodes(paths: Sequence[str | Path], format: str = "auto", *,
                  skip_invalid: bool = False,
                  default_reward: float | None = None) -> LoadResult:
    """Read every episode in the given files and directories (``*.jsonl``/``*.jsonl.gz``).

    Args:
        paths: log files, and directories whose ``*.jsonl``/``*.jsonl.gz`` files are read.
        format: one of :data:`FORMATS`, or ``"auto"`` to detect each file's format.
        skip_invalid: skip bad lines (and the unreadable rest of a corrupt gzip file) and
            list them in :attr:`LoadResult.skipped`, instead of raising on the first.
        default_reward: the reward of episodes whose log gives none.

    Raises:
        LogFormatError: a line is not an episode (not UTF-8, not JSON, too deeply nested, a
            missing or malformed field, a non-finite reward), a gzip file is corrupt or cut
            short, or the format cannot be detected; it names the file, line and field.

    """
    if format not in (*FORMATS, "auto"):
        raise ValueError(f"unknown log format {format!r}; expected 'auto' or one of {FORMATS}")
    if default_reward is not None and not math.isfinite(default_reward):
        raise ValueError(f"default_reward must be a finite number, not {default_reward}")
    if isinstance(paths, (str, Path)):
        paths = [paths]  # a lone path is a Sequence of characters; accept it as meant
    result = LoadResult()
    shared: dict[str, ToolSpec] = {}
    for path in _expand(paths):
        stem = path.name.removesuffix(".gz").removesuffix(".jsonl")
        try:
            kind = _detect(path) if format == "auto" else format
            if kind is None:
                continue  # an empty file (no non-blank line): nothing to convert
            for line, raw in _lines(path):
                try:
                    episode = _CONVERTERS[kind](_parse(raw))
                except _Bad as bad:
                    error = LogFormatError(path, line, bad.field, bad.reason)
                    if not skip_invalid:
                        raise error from None
                    result.skipped.append(error)
                    continue
                episode.id = episode.id or f"{stem}:{line}"
                if episode.reward is None:
                    episode.reward = default_reward
                episode.tools = _shared_tools(episode.tools, shared)
                result.episodes.append(episode)
        except _Unreadable as unreadable:  # the rest of the file is lost; what came before is kept
            if not skip_invalid:
                raise unreadable.error from None
            result.skipped.append(unreadable.error)
    return result


def write_episodes(path: str | Path, episodes: Iterable[Episode]) -> None:
    """Write episodes as native JSONL (gzip for ``.gz``), atomically replacing ``path``."""
    with atomic_writer(path) as raw:
        if str(path).endswith(".gz"):
            with gzip.GzipFile(fileobj=raw, mode="wb") as zipped:
                _write_lines(zipped, episodes)
        else:
            _write_lines(raw, episodes)


def _write_lines(stream: SupportsWrite[bytes], episodes: Iterable[Episode]) -> None:
    """Write one JSON line per episode."""
    for episode in episodes:
        stream.write(episode.model_dump_json().encode() + b"\n")


def _expand(paths: Iterable[str | Path]) -> Iterator[Path]:
    """Yield the log files named by ``paths``, listing directories' files sorted by name."""
    for path in map(Path, paths):
        if not path.is_dir():
            yield path
            continue
        files = sorted({*path.glob("*.jsonl"), *path.glob("*.jsonl.gz")})
        if not files:
            raise FileNotFoundError(f"{path}: no *.jsonl or *.jsonl.gz files in this directory")
        yield from files


class _Unreadable(Exception):
    """A file that cannot be read past some line (a corrupt or truncated gzip stream)."""

    def __init__(self, error: LogFormatError) -> None:
        super().__init__(str(error))
        self.error = error


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """Yield (1-based line number, raw bytes) for each non-blank line of a plain or gzip file.

    Lines are decoded one by one (in :func:`_parse`), so one bad byte costs only its line.

    Raises:
        _Unreadable: the gzip stream is corrupt or cut short; the lines before it were yielded.

    """
    zipped = path.name.endswith(".gz")
    number = 0
    try:
        with gzip.open(path, "rb") if zipped else path.open("rb") as stream:
            for number, raw in enumerate(stream, 1):
                if raw.strip():
                    yield number, raw
    except (OSError, EOFError, zlib.error) as err:
        if not zipped or isinstance(err, FileNotFoundError | IsADirectoryError | PermissionError):
            raise
        reason = f"corrupt or truncated gzip file, unreadable from this line on ({type(err).__name__}: {err})"
        raise _Unreadable(LogFormatError(path, number + 1, "", reason)) from None


def _parse(text: str | bytes, at: str = "") -> Any:
    """Parse JSON text (a raw line is decoded as UTF-8 first), reporting a failure at field ``at``."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise _Bad(at, f"not valid UTF-8 (byte 0x{text[err.start]:02x} at column {err.start + 1})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise _Bad(at, f"not valid JSON ({err.msg} at column {err.colno})") from None
    except RecursionError:
        raise _Bad(at, f"nested more than {_MAX_DEPTH} levels deep") from None
    _check_depth(value, at)
    return value


def _check_depth(value: Any, at: str) -> None:
    """Refuse JSON nested deeper than `_MAX_DEPTH`, naming the field where it goes too deep."""
    # Level by level, without recursion (which measuring must not risk) and without per-value
    # bookkeeping (every line of a large log passes here); the path is found only for the error.
    level = [value] if isinstance(value, (dict, list)) else []
    for _ in range(_MAX_DEPTH + 1):
        inner: list[Any] = []
        for item in level:
            inner.extend(item.values() if isinstance(item, dict) else item)
        if not inner:
            return
        level = [item for item in inner if isinstance(item, (dict, list))]
    raise _Bad(_deepest_path(value, at), f"nested more than {_MAX_DEPTH} levels deep")


def _deepest_path(value: Any, at: str) -> str:
    """Return the field path, below ``at``, of a value nested deeper than `_MAX_DEPTH`."""
    # depth first, each entry carrying its path as a (parent path, key) chain
    stack: list[tuple[Any, int, tuple[Any, Any] | None]] = [(value, 0, None)]
    while stack:
        item, depth, path = stack.pop()
        if depth > _MAX_DEPTH:
            keys = []
            while path is not None:
                path, key = path
                keys.append(f"[{key}]" if isinstance(key, int) else f".{key}")
            return (at + "".join(reversed(keys))).lstrip(".")
        if isinstance(item, dict):
            stack.extend((inner, depth + 1, (path, key)) for key, inner in item.items())
        elif isinstance(item, list):
            stack.extend((inner, depth + 1, (path, i)) for i, inner in enumerate(item))
    return at


def _detect(path: Path) -> str | None:
    """Return the one format the first recognisable lines agree on, None for an empty file.

    Raises:
        _Unreadable: the file is a corrupt gzip stream with no readable line before the damage.

    """
    votes: dict[str, int] = {}  # format -> first line that looks like it
    first = 0
    try:
        for seen, (line, raw) in enumerate(_lines(path), 1):
            first = first or line
            try:
                votes.setdefault(_classify(_parse(raw)), line)
            except _Bad:
                pass  # a broken line is reported when it is loaded; it must not block detection
            if len(votes) > 1 or seen == _DETECT_LINES:
                break
    except _Unreadable:
        if not votes:  # nothing readable to judge from: the corruption is the problem to report
            raise
    if not first:
        return None
    if len(votes) == 1:
        return next(iter(votes))
    looks = f"looks like {' and '.join(sorted(votes))}" if votes else "no line looks like any"
    raise LogFormatError(path, min(votes.values(), default=first), "",
                         f"cannot tell the log format ({looks}); pass format= one of {FORMATS}")


def _classify(record: Any) -> str:
    """Guess the format of one parsed line."""
    if isinstance(record, list):
        return "langchain"
    if isinstance(record, dict):
        if "task" in record or "steps" in record:
            return "native"
        messages = record.get("messages")
        first = messages[0] if isinstance(messages, list) and messages else None
        if isinstance(first, dict) and ("lc" in first or "type" in first):
            return "langchain"
        if isinstance(first, dict) and "role" in first:
            return "openai"
    raise _Bad("", "neither an Episode nor a message list")


def _shared_tools(tools: list[ToolSpec], shared: dict[str, ToolSpec]) -> list[ToolSpec]:
    """Return ``tools`` with each one replaced by the first equal spec read before it.

    Logs list the same tools in every episode: one object per distinct spec keeps a million
    transitions' episodes in memory (the synthetic 1M run held 7.4 GB, mostly copies of 200 tools).
    """
    out = []
    for tool in tools:
        key = json.dumps([tool.name, tool.description, tool.parameters], sort_keys=True, default=str)
        out.append(shared.setdefault(key, tool))
    return out


def _native(record: Any) -> Episode:
    """Validate one native line."""
    if not isinstance(record, dict):
        raise _Bad("", "expected a JSON object (an Episode)")
    return _validated(Episode, record)


def _validated(model: type[_Model], data: dict[str, Any], at: str = "") -> _Model:
    """Validate ``data`` as ``model``, turning pydantic's first error into a located `_Bad`."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise _located(err, at) from None


def _located(err: ValidationError, at: str) -> _Bad:
    """Translate a pydantic error into a `_Bad` whose field is ``at`` + the error's ``loc``."""
    first, more = err.errors()[0], err.error_count() - 1
    where = at + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
    reason = first["msg"].removeprefix("Value error, ")
    return _Bad(where.lstrip("."), reason + (f" (and {more} more)" if more else ""))


@dataclass
class _Msg:
    """A chat message reduced to what an Episode needs; ``at`` locates it for errors."""

    role: str  # "system", "user", "assistant" or "tool"
    at: str
    content: str = ""
    calls: list[tuple[str | None, str, dict[str, Any]]] = field(default_factory=list)
    call_id: str | None = None
    error: bool = False


_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
          "tool": "tool", "function": "tool"}
_ERROR_START = re.compile(r"\s*(error|exception)\b", re.IGNORECASE)


def _openai(record: Any) -> Episode:
    """Convert one OpenAI chat-completions log line."""
    if not isinstance(record, dict):
        raise _Bad("", "expected a JSON object with 'messages'")
    messages = _message_list(record.get("messages"), "messages")
    tools_key = "tools" if "tools" in record else "functions"  # legacy logs list "functions"
    msgs = [_openai_message(msg, f"messages[{i}]") for i, msg in enumerate(messages)]
    return _chat_episode(record, msgs, _tools(record.get(tools_key), tools_key))


def _openai_message(msg: Any, at: str) -> _Msg:
    """Reduce one OpenAI message, including the legacy ``function_call`` shape."""
    if not isinstance(msg, dict):
        raise _Bad(at, "expected a message object")
    role = _ROLES.get(msg["role"]) if isinstance(msg.get("role"), str) else None
    if role is None:
        raise _Bad(f"{at}.role", f"unknown role {msg.get('role')!r}")
    tool_calls = msg.get("tool_calls") or []
    if not isinstance(tool_calls, list):
        raise _Bad(f"{at}.tool_calls", "expected a list")
    calls = []
    for j, call in enumerate(tool_calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise _Bad(f"{at}.tool_calls[{j}].function", "missing function object")
        calls.append(_call(call.get("id"), function, f"{at}.tool_calls[{j}].function"))
    if isinstance(msg.get("function_call"), dict):
        calls.append(_call(None, msg["function_call"], f"{at}.function_call"))
    return _Msg(role, at, _text(msg.get("content")), calls, msg.get("tool_call_id"))


def _langchain(record: Any) -> Episode:
    """Convert one line of serialized LangChain messages (a bare list or under "messages")."""
    if isinstance(record, list):
        record, prefix = {"messages": record}, ""
    elif isinstance(record, dict):
        prefix = "messages"
    else:
        raise _Bad("", "expected a list of messages or an object with 'messages'")
    messages = _message_list(record.get("messages"), prefix)
    msgs = [_lc_message(_lc_load(msg, f"{prefix}[{i}]"), f"{prefix}[{i}]")
            for i, msg in enumerate(messages)]
    return _chat_episode(record, msgs, _tools(record.get("tools"), "tools"))


def episode_from_messages(messages: Sequence[lc.BaseMessage], tools: Sequence[ToolSpec] = ()) -> Episode:
    """Read a live conversation (LangChain messages) as an episode, exactly as a logged one is read.

    The task is the first user message, later user messages are ``user`` steps, and a tool
    result is an error when its status says so or its text reports a failure.

    Raises:
        LogFormatError: the messages do not form an episode (e.g. no user message yet); its
            ``field`` locates the message.

    """
    try:
        msgs = [_lc_message(message, f"messages[{i}]") for i, message in enumerate(messages)]
        return _chat_episode({}, msgs, list(tools))
    except _Bad as bad:
        raise LogFormatError("<messages>", 0, bad.field, bad.reason) from None


def _lc_load(msg: Any, at: str) -> lc.BaseMessage:
    """Rebuild a LangChain message from its ``dumpd``, ``messages_to_dict`` or plain form."""
    if not isinstance(msg, dict):
        raise _Bad(at, "expected a message object")
    _check_lc_fields(msg, at)
    try:
        if "lc" in msg:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # `load` is flagged beta; that is not the user's
                message = lc_load(msg, allowed_objects="messages")
        elif isinstance(msg.get("data"), dict):
            message = lc.messages_from_dict([msg])[0]
        else:
            message = lc.convert_to_messages([msg])[0]
    except ValidationError as err:
        raise _located(err, at) from None
    except KeyError as err:
        raise _Bad(at, f"missing key {err}") from None
    except (ValueError, TypeError, AttributeError, IndexError, NotImplementedError) as err:
        # LangChain's loaders fail this way on malformed input (odd `kwargs`, `tool_calls: "x"`,
        # `"type": "not_implemented"`): a bad line, not a bug to crash the import on
        first_line = next(iter(str(err).splitlines()), "")
        raise _Bad(at, f"not a LangChain message ({type(err).__name__}: {first_line})") from None
    if not isinstance(message, lc.BaseMessage):
        raise _Bad(at, f"not a LangChain message but {type(message).__name__}")
    return message


def _check_lc_fields(msg: dict[str, Any], at: str) -> None:
    """Check the shape of the fields LangChain's loaders trust, so a bad one is named precisely."""
    # the same routing as `_lc_load`: dumpd's constructor kwargs, messages_to_dict's data, or plain
    key = "kwargs" if "lc" in msg else "data" if isinstance(msg.get("data"), dict) else None
    body = msg.get(key) if key else msg
    where = f"{at}.{key}" if key else at
    if not isinstance(body, dict):
        if msg.get("type") == "constructor":
            raise _Bad(where, "expected an object")
        return  # another `lc` type ("secret", "not_implemented"): refused by the loader
    for name in ("tool_calls", "invalid_tool_calls"):
        calls = body.get(name)
        if calls is not None and not isinstance(calls, list):
            raise _Bad(f"{where}.{name}", "expected a list of tool calls")
        for j, call in enumerate(calls or []):
            if not isinstance(call, dict):
                raise _Bad(f"{where}.{name}[{j}]", "expected a tool call object")
    if not isinstance(body.get("additional_kwargs", {}), dict):
        raise _Bad(f"{where}.additional_kwargs", "expected an object")


def _lc_message(message: lc.BaseMessage, at: str) -> _Msg:
    """Reduce one LangChain message."""
    content = _text(message.content)
    if isinstance(message, lc.ToolMessage):
        return _Msg("tool", at, content, call_id=message.tool_call_id,
                    error=message.status == "error")
    if isinstance(message, lc.AIMessage):
        if message.invalid_tool_calls:
            bad = message.invalid_tool_calls[0]
            raise _Bad(f"{at}.invalid_tool_calls[0]",
                       f"tool call arguments are not valid JSON ({bad.get('args')!r})")
        calls = [(call.get("id"), _name(call.get("name"), f"{at}.tool_calls[{j}].name"),
                  call["args"]) for j, call in enumerate(message.tool_calls)]
        legacy = message.additional_kwargs.get("function_call")
        if isinstance(legacy, dict) and not calls:
            calls.append(_call(None, legacy, f"{at}.additional_kwargs.function_call"))
        return _Msg("assistant", at, content, calls)
    role = ("tool" if isinstance(message, lc.FunctionMessage)
            else "user" if isinstance(message, lc.HumanMessage)
            else "system" if isinstance(message, lc.SystemMessage)
            else _ROLES.get(message.role) if isinstance(message, lc.ChatMessage) else None)
    if role is None:
        raise _Bad(at, f"unsupported message type {type(message).__name__}")
    return _Msg(role, at, content)


def _chat_episode(record: dict[str, Any], msgs: list[_Msg], tools: list[ToolSpec]) -> Episode:
    """Assemble an Episode from reduced chat messages; ``record`` gives id, reward, metadata."""
    known = {tool.name for tool in tools}
    task: str | None = None
    system: list[str] = []
    steps: list[dict[str, Any]] = []
    pending: list[tuple[str | None, dict[str, Any]]] = []  # tool calls awaiting a result
    final = ""
    for msg in msgs:
        if msg.role == "system":
            system.append(msg.content)
        elif msg.role == "user" and task is None:
            task = msg.content
        elif msg.role == "user":
            steps.append({"kind": "user", "content": msg.content})
        elif msg.role == "assistant" and msg.calls:
            for call_id, name, arguments in msg.calls:
                if name not in known:  # offered mid-conversation: known from now on
                    known.add(name)
                    tools.append(ToolSpec(name=name))
                steps.append({"kind": "tool_call", "tool": name, "arguments": arguments})
                pending.append((call_id, steps[-1]))
        elif msg.role == "assistant" and msg.content:
            steps.append({"kind": "assistant", "content": msg.content})
            final = msg.content
        elif msg.role == "tool":
            step = _answered(pending, msg)
            step["observation"] = msg.content
            step["error"] = msg.error or _looks_like_error(msg.content)
    if task is None:
        raise _Bad("messages", "no user message to take the task from")
    metadata = record.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise _Bad("metadata", "expected a JSON object")
    if system:
        metadata = {**metadata, "system": "\n\n".join(system)}
    episode_id = record.get("id")
    return _validated(Episode, {
        "id": "" if episode_id is None else str(episode_id), "task": task, "tools": tools,
        "steps": steps, "final_answer": final, "reward": record.get("reward"),
        "metadata": metadata})


def _answered(pending: list[tuple[str | None, dict[str, Any]]], msg: _Msg) -> dict[str, Any]:
    """Pop the pending tool call a tool result answers: by id, else the oldest one."""
    if not pending:
        raise _Bad(msg.at, "a tool result with no tool call awaiting it")
    if msg.call_id is not None and any(call_id is not None for call_id, _ in pending):
        for i, (call_id, step) in enumerate(pending):
            if call_id == msg.call_id:
                del pending[i]
                return step
        raise _Bad(f"{msg.at}.tool_call_id",
                   f"no earlier tool call awaiting a result has id {msg.call_id!r}")
    return pending.pop(0)[1]


def _looks_like_error(text: str) -> bool:
    """Whether a tool result reports a failure: "Error...", a traceback, or {"error": ...}."""
    if _ERROR_START.match(text) or "Traceback (most recent call last)" in text:
        return True
    if not text.lstrip().startswith("{"):
        return False
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    return isinstance(value, dict) and bool(value.get("error"))


def _message_list(value: Any, at: str) -> list[Any]:
    """Check that a line holds a non-empty list of messages."""
    if not isinstance(value, list) or not value:
        raise _Bad(at, "missing or not a non-empty list of messages")
    return value


def _tools(value: Any, at: str) -> list[ToolSpec]:
    """Read tools given as OpenAI function dicts or ``{name, description, parameters}``."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise _Bad(at, "expected a list of tools")
    tools = []
    for i, tool in enumerate(value):
        nested = isinstance(tool, dict) and isinstance(tool.get("function"), dict)
        spec, where = (tool["function"], f"{at}[{i}].function") if nested else (tool, f"{at}[{i}]")
        if not isinstance(spec, dict):
            raise _Bad(where, "expected a tool object")
        parameters = spec.get("parameters", spec.get("args_schema"))
        tools.append(_validated(ToolSpec, {
            "name": _name(spec.get("name"), f"{where}.name"),
            "description": spec.get("description") or "", "parameters": parameters}, where))
    return tools


def _call(call_id: str | None, function: dict[str, Any],
          at: str) -> tuple[str | None, str, dict[str, Any]]:
    """Read an OpenAI ``{"name", "arguments"}`` function call."""
    return call_id, _name(function.get("name"), f"{at}.name"), _arguments(
        function.get("arguments"), f"{at}.arguments")


def _name(value: Any, at: str) -> str:
    """Check a tool name."""
    if not isinstance(value, str) or not value:
        raise _Bad(at, "missing or empty tool name")
    return value


def _arguments(value: Any, at: str) -> dict[str, Any]:
    """Read call arguments given as a JSON string or an object."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        value = _parse(value, at)
    if not isinstance(value, dict):
        raise _Bad(at, f"expected a JSON object, got {type(value).__name__}")
    return value


def _text(content: Any) -> str:
    """Flatten message content (text, None, or a list of content parts) to a string."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = (part if isinstance(part, str) else part.get("text")
                 for part in content if isinstance(part, (str, dict)))
        return "\n".join(part for part in parts if isinstance(part, str))
    return json.dumps(content, ensure_ascii=False, default=str)


_CONVERTERS = {"native": _native, "openai": _openai, "langchain": _langchain}
