"""The llama.cpp worker: a child process that loads a GGUF file and serves chat completions.

llama.cpp runs in a child process (one per model file and settings, shared by all bound
copies of the model) that speaks JSON lines on stdin/stdout, so that its OpenMP threads are
tuned apart from torch's and a native crash surfaces as a ``LocalModelError`` instead of
killing the caller. xllamacpp is imported only in the child, never here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from evoharness_agent.local_llm.weights import INSTALL_HINT

__all__ = ["LocalModelError", "available_cores"]


class LocalModelError(RuntimeError):
    """llama.cpp refused or failed a request (bad schema, prompt larger than ``n_ctx``...)."""


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
import json, os, select, sys
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
def relay(chunk):
    # A streamed request: each chunk goes out as {"chunk": ...}; a "cancel" line from the
    # parent (its reader stopped early) ends the generation: returning True stops llama.cpp.
    send({"chunk": chunk})
    if select.select([sys.stdin], [], [], 0)[0]:
        sys.stdin.readline()
        return True
    return False

send({"ready": True})
for line in sys.stdin:
    try:
        request = json.loads(line)
        if request.get("cancel"):
            continue  # it came after its stream had already ended
        if request.get("stream"):
            server.handle_chat_completions(request, relay)
            reply = {"done": True}
        else:
            reply = server.handle_chat_completions(request)
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

    def stream_chat_completions(self, request: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Run one chat completion as a stream: yield its chunks (an ``{"error": ...}`` one on failure).

        The worker is held until the stream ends; closing the iterator early cancels the generation.
        """
        with self._lock:
            stdin, stdout = self._proc.stdin, self._proc.stdout
            if self._proc.poll() is not None or stdin is None or stdout is None or stdin.closed:
                raise LocalModelError(self._death())
            ended = False
            try:
                stdin.write(json.dumps({**request, "stream": True}) + "\n")
                stdin.flush()
                while not ended:
                    reply = self._read_line(stdout)
                    ended = "chunk" not in reply
                    if not ended or "error" in reply:
                        yield reply.get("chunk", reply)
            except OSError as exc:
                raise LocalModelError(self._death()) from exc
            finally:
                if not ended and self._proc.poll() is None:
                    self._cancel(stdin, stdout)

    def close(self) -> None:
        """Stop the worker process (idempotent)."""
        self._finalizer()

    def _read_line(self, stdout: IO[str]) -> dict[str, Any]:
        """Read one reply line from the worker; a closed pipe means it died."""
        line = stdout.readline()
        if not line:
            raise LocalModelError(self._death())
        return json.loads(line)

    def _cancel(self, stdin: IO[str], stdout: IO[str]) -> None:
        """Stop a stream its reader left early and skip its remaining chunks, keeping the protocol in step."""
        try:
            stdin.write(json.dumps({"cancel": True}) + "\n")
            stdin.flush()
            while "chunk" in self._read_line(stdout):
                pass
        except (OSError, LocalModelError):
            self.close()  # out of step or dead: the next call reports it

    def _roundtrip(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Send one JSON line and read one back; report a dead worker clearly."""
        with self._lock:
            stdin, stdout = self._proc.stdin, self._proc.stdout
            if self._proc.poll() is not None or stdin is None or stdout is None or stdin.closed:
                raise LocalModelError(self._death())
            try:
                stdin.write(json.dumps(payload) + "\n")
                stdin.flush()
                return self._read_line(stdout)
            except OSError as exc:
                raise LocalModelError(self._death()) from exc

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
