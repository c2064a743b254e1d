"""The policy server: a FastAPI app that ranks tools with a :class:`~evoharness_agent.policy.ToolPolicy`.

``create_app(policy)`` builds the app; ``evoharness-agent serve`` runs it on uvicorn. Endpoints:

* ``POST /predict``: one state → the best action, its calibrated confidence, every action ranked,
  and whether an LLM should decide instead (confidence under ``defer_threshold``).
* ``POST /predict/batch``: many states in one forward pass, results in request order.
* ``POST /sessions``, ``POST /sessions/{id}/steps``, ``GET``/``DELETE /sessions/{id}``: the
  incremental form of one run, each step embedded once (a bounded store with expiry).
* ``GET /healthz``, ``GET /metrics`` (Prometheus text).

Concurrent decisions of ``/predict`` and of sessions are ranked together, with one encoder call
for their new texts (:class:`~evoharness_agent.server.coalescing.Coalescer`).

Bad input is a 422 naming the field, a body over ``max_body_bytes`` a 413; neither reaches the policy.
Endpoints are plain functions, so FastAPI runs them in its thread pool while the event loop keeps
accepting requests; the policy and its encoder lock what they share.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.routing import Match

from evoharness_agent.policy import ToolPolicy, ToolScore
from evoharness_agent.schema import Step, ToolSpec, as_tool_spec
from evoharness_agent.server.coalescing import Coalescer
from evoharness_agent.server.schemas import (
    BatchPredictRequest,
    BatchPredictResponse,
    ErrorResponse,
    HealthResponse,
    PredictRequest,
    PredictResponse,
    SessionCreateRequest,
    SessionInfo,
    SessionStepsRequest,
    SessionStepsResponse,
    tool_specs,
)
from evoharness_agent.server.sessions import MAX_SESSION_STEPS, SessionStore

__all__ = ["DEFAULT_MAX_BODY_BYTES", "ENV_BACKEND", "ENV_DEFER_THRESHOLD", "ENV_POLICY", "ENV_THREADS", "create_app",
           "create_app_from_env",
           "rank_requests", "serve_in_background"]

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
"""The largest request body accepted (413 above it)."""

# How ``evoharness-agent serve --workers N`` hands its settings to each uvicorn worker process.
ENV_POLICY = "EVOHARNESS_SERVE_POLICY"
ENV_DEFER_THRESHOLD = "EVOHARNESS_SERVE_DEFER_THRESHOLD"
ENV_BACKEND = "EVOHARNESS_SERVE_BACKEND"
ENV_THREADS = "EVOHARNESS_SERVE_THREADS"

_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
_ASGIApp = Callable[[_Scope, _Receive, _Send], Awaitable[None]]

_ERRORS: dict[int | str, dict[str, Any]] = {413: {"model": ErrorResponse, "description": "Request body too large"}}
_SESSION_ERRORS: dict[int | str, dict[str, Any]] = {
    **_ERRORS, 404: {"model": ErrorResponse, "description": "No such session (expired, evicted or closed)"}}


class _Metrics:
    """The server's Prometheus metrics, in a registry of its own (one per app)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter("evoharness_requests_total", "HTTP requests served.",
                                ["method", "endpoint", "status"], registry=registry)
        self.errors = Counter("evoharness_request_errors_total", "HTTP requests answered with an error status.",
                              ["endpoint", "status"], registry=registry)
        self.latency = Histogram("evoharness_request_duration_seconds", "Time to serve a request.",
                                 ["endpoint"], registry=registry,
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0))
        self.batch_size = Histogram("evoharness_batch_size", "States ranked per forward pass of /predict/batch.",
                                    registry=registry, buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
        self.coalesced = Histogram("evoharness_coalesced_states",
                                   "Concurrent /predict and session states ranked together.",
                                   registry=registry, buckets=(1, 2, 4, 8, 16, 32, 64))
        self.sessions = Gauge("evoharness_sessions", "Live sessions in the store.", registry=registry)


class _MetricsMiddleware:
    """Count every request and time it, labelled by route template (never by raw path: ids stay out)."""

    def __init__(self, app: _ASGIApp, metrics: _Metrics, routes: Callable[[], Sequence[Any]]) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes

    def _endpoint(self, scope: _Scope) -> str:
        for route in self.routes():
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return str(route.path)
        return "unmatched"

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # an exception before the response started
        started = time.perf_counter()

        async def record_status(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            endpoint = self._endpoint(scope)
            self.metrics.latency.labels(endpoint).observe(time.perf_counter() - started)
            self.metrics.requests.labels(scope["method"], endpoint, str(status)).inc()
            if status >= 400:
                self.metrics.errors.labels(endpoint, str(status)).inc()


class _BodyLimitMiddleware:
    """Answer 413 to a body over ``max_bytes``, by its Content-Length or as it streams in."""

    def __init__(self, app: _ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def _reject(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        response = JSONResponse({"detail": f"request body over the limit of {self.max_bytes} bytes"}, 413)
        await response(scope, receive, send)

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(scope, receive, send)
            return
        # Read the (bounded) body first, so a chunked upload cannot grow past the limit either.
        chunks, total = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                await self._reject(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)


@dataclass
class _Group:
    """States whose tools can share one tool table: no name means two different tools among them."""

    specs: dict[str, ToolSpec] = field(default_factory=dict)
    bare: set[str] = field(default_factory=set)
    """History tools that are not offered (the policy describes them by name alone)."""
    members: list[int] = field(default_factory=list)

    def admits(self, specs: dict[str, ToolSpec], bare: set[str]) -> bool:
        """Whether a state with these tools ranks here exactly as it would alone."""
        # Most specs are the very objects the group holds (tool_specs shares them): identity first.
        return (all((held := self.specs.get(name, spec)) is spec or held == spec for name, spec in specs.items())
                and not specs.keys() & self.bare and not bare & self.specs.keys())


@dataclass(frozen=True)
class _State:
    """One state to rank: a task, the run so far, the tools by name, and the names callable now."""

    task: str
    history: Sequence[Step]
    specs: dict[str, ToolSpec]
    allowed: set[str]


def _request_state(request: PredictRequest) -> _State:
    """Return the state a ``/predict`` body describes."""
    specs = {spec.name: spec for spec in tool_specs(request.available_tools)}
    allowed = set(request.allowed_tools if request.allowed_tools is not None else specs)
    return _State(request.task_description, [step.to_step() for step in request.history], specs, allowed)


def _rank_states(policy: ToolPolicy, states: Sequence[_State]) -> list[list[ToolScore]]:
    """Rank many states, one forward pass per group of states with consistent tools (usually one).

    Each state is ranked among its own tools, exactly as :meth:`ToolPolicy.rank` ranks it alone:
    the others' tools are masked out (the scorer compares only available tools).
    """
    groups: list[_Group] = []
    for index, state in enumerate(states):
        bare = {step.tool for step in state.history if step.tool and step.tool not in state.specs}
        group = next((group for group in groups if group.admits(state.specs, bare)), None)
        if group is None:
            group = _Group()
            groups.append(group)
        group.specs.update(state.specs)
        group.bare |= bare
        group.members.append(index)
    rankings: list[list[ToolScore]] = [[] for _ in states]
    for group in groups:
        members = [states[i] for i in group.members]
        ranked = policy.rank_batch([(state.task, state.history) for state in members], list(group.specs.values()),
                                   available=[state.allowed for state in members])
        for index, ranking in zip(group.members, ranked, strict=True):
            rankings[index] = ranking
    return rankings


def rank_requests(policy: ToolPolicy, requests: Sequence[PredictRequest]) -> list[list[ToolScore]]:
    """Rank the states of many ``/predict`` bodies together, each exactly as :meth:`ToolPolicy.rank` ranks it alone."""
    return _rank_states(policy, [_request_state(request) for request in requests])


def _invalid(field_name: str, message: str) -> RequestValidationError:
    """Return a 422 in FastAPI's own error shape, for checks that need server state."""
    return RequestValidationError([{"loc": ("body", field_name), "msg": message, "type": "value_error"}])


class _AsciiJSONResponse(JSONResponse):
    """JSON with non-ASCII escaped: a 422 echoes the input, which may hold a lone surrogate UTF-8 cannot encode."""

    def render(self, content: Any) -> bytes:
        """Encode ``content`` as ASCII-only JSON."""
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


async def _validation_error(request: Request, error: Exception) -> JSONResponse:
    """Answer a request that failed validation with 422 and every error (field, message, input)."""
    assert isinstance(error, RequestValidationError)  # registered for this type only
    # An echoed NaN or infinity (Python's JSON parser accepts them) is not JSON: sent as text.
    errors = jsonable_encoder(error.errors(), custom_encoder={float: lambda x: x if math.isfinite(x) else str(x)})
    return _AsciiJSONResponse({"detail": errors}, status_code=422)


def create_app(policy: ToolPolicy, *, defer_threshold: float = 0.5, max_sessions: int = 1024,
               session_ttl_s: float = 900.0, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               registry: CollectorRegistry | None = None) -> FastAPI:
    """Build the policy server's app.

    Args:
        policy: the policy that ranks.
        defer_threshold: ``defer_to_llm`` is true when the best action's probability is under this.
        max_sessions: the most live sessions; the least recently used one makes room for a new one.
        session_ttl_s: seconds a session lives without use.
        max_body_bytes: the largest request body (413 above it).
        registry: the Prometheus registry of ``/metrics`` (default: a new one for this app).

    Returns:
        The FastAPI app, for uvicorn or any ASGI server.

    """
    if not 0.0 <= defer_threshold <= 1.0:
        raise ValueError(f"defer_threshold must be a probability in [0, 1], got {defer_threshold}")
    # Load the sentence-transformer now: the first request must not wait seconds for it.
    policy.rank("warm-up", [], [])
    metrics = _Metrics(registry or CollectorRegistry())
    store = SessionStore(policy, max_sessions=max_sessions, ttl_s=session_ttl_s)
    app = FastAPI(title="evoharness-agent policy server", version="1",
                  description="Ranks the tools an agent may call next with a policy learned offline from tool-use "
                              "logs. Probabilities are calibrated: at 0.8, about 80% of such choices are right.")
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_middleware(_BodyLimitMiddleware, max_bytes=max_body_bytes)
    app.add_middleware(_MetricsMiddleware, metrics=metrics, routes=lambda: app.router.routes)

    def decide(ranking: list[ToolScore]) -> PredictResponse:
        return PredictResponse.from_ranking(ranking, defer_threshold)

    # Concurrent decisions, of /predict and of sessions alike, are ranked together.
    rank_together: Coalescer[_State, list[ToolScore]] = Coalescer(
        lambda states: _rank_states(policy, states), on_batch=metrics.coalesced.observe)

    @app.post("/predict", operation_id="predict", response_model=PredictResponse, responses=_ERRORS,
              summary="Rank the tools for one state")
    def predict(request: PredictRequest) -> PredictResponse:
        """Rank the available tools and FINISH for a task and its history; pick the best."""
        return decide(rank_together(_request_state(request)))

    @app.post("/predict/batch", operation_id="predictBatch", response_model=BatchPredictResponse,
              responses=_ERRORS, summary="Rank the tools for many states in one forward pass")
    def predict_batch(request: BatchPredictRequest) -> BatchPredictResponse:
        """Rank many states; results come in the order of ``items``."""
        metrics.batch_size.observe(len(request.items))
        return BatchPredictResponse(results=[decide(r) for r in rank_requests(policy, request.items)])

    def info(session_id: str) -> SessionInfo:
        entry = store.get(session_id)
        if entry is None:
            raise HTTPException(404, f"no session {session_id!r} (expired, evicted or closed): open a new one")
        return SessionInfo(session_id=session_id, task_description=entry.session.task,
                           n_steps=len(entry.session.history), expires_in_s=store.expires_in(entry))

    @app.post("/sessions", operation_id="createSession", response_model=SessionInfo, status_code=201,
              responses=_ERRORS, summary="Open a session for one run")
    def create_session(request: SessionCreateRequest) -> SessionInfo:
        """Open a session: the task is embedded with its first decision, each step with the decision it precedes."""
        session_id = store.create(request.task_description, tool_specs(request.available_tools))
        metrics.sessions.set(len(store))
        return info(session_id)

    @app.get("/sessions/{session_id}", operation_id="getSession", response_model=SessionInfo,
             responses=_SESSION_ERRORS, summary="Describe a session")
    def get_session(session_id: str) -> SessionInfo:
        """Return a live session's step count and the seconds it lives without use."""
        return info(session_id)

    @app.post("/sessions/{session_id}/steps", operation_id="addSessionSteps", response_model=SessionStepsResponse,
              responses={**_SESSION_ERRORS, 409: {"model": ErrorResponse,
                                                  "description": "The steps do not continue the session's run"}},
              summary="Add a session's new steps and rank the next decision")
    def add_steps(session_id: str, request: SessionStepsRequest) -> SessionStepsResponse:
        """Record the steps the session does not hold yet, then rank (each text is embedded once, ever)."""
        entry = store.get(session_id)
        if entry is None:
            raise HTTPException(404, f"no session {session_id!r} (expired, evicted or closed): open a new one")
        with entry.lock:  # one request of a session at a time: steps stay in order
            session = entry.session
            held = len(session.history)
            if request.start > held:
                raise HTTPException(409, f"steps start at {request.start} but the session holds {held}: "
                                         f"send from step {held}")
            steps = [step.to_step() for step in request.steps]
            known = held - request.start
            for offset, step in enumerate(steps[:known]):
                if session.history[request.start + offset] != step:
                    raise HTTPException(409, f"step {request.start + offset} differs from the one the session holds")
            fresh = steps[known:]
            if held + len(fresh) > MAX_SESSION_STEPS:
                raise _invalid("steps", f"a session holds at most {MAX_SESSION_STEPS} steps")
            names = {spec.name for spec in session.tools}
            if request.allowed_tools is not None and not set(request.allowed_tools) <= names:
                unknown = sorted(set(request.allowed_tools) - names)
                raise _invalid("allowed_tools", f"{unknown} are not among the session's tools")
            for step in fresh:  # embedded with the other states ranked together
                session.observe(step, embed=False)
            specs = {spec.name: spec for spec in map(as_tool_spec, session.tools)}
            allowed = set(request.allowed_tools) if request.allowed_tools is not None else set(specs)
            ranking = rank_together(_State(session.task, list(session.history), specs, allowed))
            return SessionStepsResponse(**decide(ranking).model_dump(), n_steps=len(session.history))

    @app.delete("/sessions/{session_id}", operation_id="deleteSession", status_code=204,
                responses=_SESSION_ERRORS, summary="Close a session")
    def delete_session(session_id: str) -> Response:
        """Close a session and free its memory."""
        if not store.delete(session_id):
            raise HTTPException(404, f"no session {session_id!r} (expired, evicted or closed)")
        metrics.sessions.set(len(store))
        return Response(status_code=204)

    @app.get("/healthz", operation_id="healthz", response_model=HealthResponse, summary="Liveness")
    def healthz() -> HealthResponse:
        """Report that the server is up and its policy loaded."""
        return HealthResponse(algorithm=str(policy.meta.get("algorithm", "")), n_known_tools=len(policy.known_tools),
                              sessions=len(store), defer_threshold=defer_threshold)

    @app.get("/metrics", operation_id="metrics", response_class=Response, summary="Prometheus metrics",
             responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format"}})
    def prometheus() -> Response:
        """Request counts, latency histogram, batch sizes, errors and live sessions."""
        metrics.sessions.set(len(store))
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def create_app_from_env() -> FastAPI:
    """Build the app from the settings ``evoharness-agent serve`` puts in the environment (one per worker)."""
    threads = os.environ.get(ENV_THREADS)
    policy = ToolPolicy.load(os.environ.get(ENV_POLICY, "default"), backend=os.environ.get(ENV_BACKEND, "torch"),
                             threads=int(threads) if threads else None)
    return create_app(policy, defer_threshold=float(os.environ.get(ENV_DEFER_THRESHOLD, "0.5")))


@contextmanager
def serve_in_background(app: Any, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a background thread (``port=0``: one the OS picks); yield its base URL.

    For notebooks, tests and benchmarks; the server stops when the block ends.
    """
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    try:
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on {host}:{bound}")
            time.sleep(0.01)
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
