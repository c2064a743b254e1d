"""`PolicyClient`: call a policy server (``evoharness-agent serve``) over HTTP, sync or async.

A client has the surface the agents use of a local :class:`~evoharness_agent.policy.ToolPolicy`
(``rank`` and ``session``), so ``PolicyAgentExecutor(policy=PolicyClient(url))`` and
``PolicyToolSelectorMiddleware(PolicyClient(url))`` rank remotely exactly as they rank locally.

Example:
    .. code-block:: python

        client = PolicyClient("http://127.0.0.1:8000")
        decision = client.predict("Cancel reservation EHGLP3", tools=["get_reservation_details", "cancel"])
        decision.selected_tool, decision.confidence

"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx

from evoharness_agent.policy import ToolScore
from evoharness_agent.schema import Step, as_tool_spec
from evoharness_agent.server.schemas import (
    MAX_DESCRIPTION_CHARS,
    MAX_TEXT_CHARS,
    BatchPredictResponse,
    HealthResponse,
    PredictRequest,
    PredictResponse,
    SessionInfo,
    SessionStepsResponse,
)

__all__ = ["PolicyClient", "PolicyRequestError", "PolicyServerError", "RemoteSession", "predict_payload", "wire_step",
           "wire_tool"]

_RETRY_STATUS = frozenset({502, 503, 504})
"""Statuses worth retrying: a proxy or a restarting server, not the request."""


class PolicyServerError(RuntimeError):
    """The policy server could not answer: unreachable, or an error status."""

    def __init__(self, message: str, status: int | None = None, detail: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


class PolicyRequestError(PolicyServerError, ValueError):
    """The server rejected the request as invalid (422), or its body as too large (413)."""


def _clip(text: str, limit: int) -> str:
    """Shorten a text to the server's limit (the policy embeds far less than that)."""
    return text if len(text) <= limit else text[:limit]


def wire_tool(tool: Any) -> dict[str, Any]:
    """Return a tool (a ToolSpec, LangChain tool, OpenAI function dict or name) as the server takes it."""
    spec = as_tool_spec(tool)
    return {"name": spec.name, "description": _clip(spec.description, MAX_DESCRIPTION_CHARS),
            "parameters": spec.parameters}


def wire_step(step: Step) -> dict[str, Any]:
    """Return a step as the server takes it."""
    return {"kind": step.kind, "tool": step.tool, "arguments": step.arguments,
            "observation": _clip(step.observation, MAX_TEXT_CHARS), "error": step.error,
            "content": _clip(step.content, MAX_TEXT_CHARS)}


def predict_payload(task: str, history: Sequence[Step] = (), tools: Sequence[Any] = (), *,
                    available: Collection[str] | None = None) -> dict[str, Any]:
    """Return the ``/predict`` body for one state (the tools' specs, the steps, the callable subset)."""
    wired = [wire_tool(tool) for tool in tools]
    return {"task_description": _clip(task, MAX_TEXT_CHARS), "available_tools": wired,
            "history": [wire_step(step) for step in history], "allowed_tools": _allowed(available, wired)}


def _allowed(available: Collection[str] | None, tools: Sequence[Mapping[str, Any]]) -> list[str] | None:
    """Return the callable names among ``tools``: a local policy ignores other names, the server refuses them."""
    if available is None:
        return None
    return sorted(set(available) & {tool["name"] for tool in tools})


def _backoff(attempt: int) -> float:
    """Seconds to wait before retry ``attempt + 1``: 50 ms, doubling."""
    return 0.05 * 2**attempt


def _raise_for(response: httpx.Response) -> None:
    """Turn an error status into :class:`PolicyServerError` (or :class:`PolicyRequestError`), with its detail."""
    if response.is_success:
        return
    try:
        detail = response.json().get("detail")
    except ValueError:
        detail = response.text
    error = PolicyRequestError if response.status_code in (413, 422) else PolicyServerError
    raise error(f"{response.request.method} {response.request.url.path} -> {response.status_code}: {detail}",
                response.status_code, detail)


class PolicyClient:
    """A client of the policy server, with the ``rank``/``session`` surface of a local policy.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8000``.
        timeout: seconds per request.
        retries: how many times a request is retried after a connection failure or a 502/503/504
            (every endpoint is safe to repeat: sessions skip steps they already hold).
        transport, async_transport: httpx transports (tests, proxies, mounted apps).

    """

    def __init__(self, base_url: str = "http://127.0.0.1:8000", *, timeout: float = 10.0, retries: int = 2,
                 transport: httpx.BaseTransport | None = None,
                 async_transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport)
        self._timeout, self._async_transport = timeout, async_transport
        self._async_http: httpx.AsyncClient | None = None

    # -- transport ---------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: Any = None) -> httpx.Response:
        """Send a request, retrying transient failures; raise on an error status."""
        for attempt in range(self.retries + 1):
            try:
                response = self._http.request(method, path, json=body)
            except httpx.TransportError as error:
                self._give_up_on(error, attempt)
            else:
                if self._final(response, attempt):
                    return response
            time.sleep(_backoff(attempt))
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    async def _arequest(self, method: str, path: str, body: Any = None) -> httpx.Response:
        """Async :meth:`_request`."""
        if self._async_http is None:
            self._async_http = httpx.AsyncClient(base_url=self.base_url, timeout=self._timeout,
                                                 transport=self._async_transport)
        for attempt in range(self.retries + 1):
            try:
                response = await self._async_http.request(method, path, json=body)
            except httpx.TransportError as error:
                self._give_up_on(error, attempt)
            else:
                if self._final(response, attempt):
                    return response
            await asyncio.sleep(_backoff(attempt))
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _give_up_on(self, error: httpx.TransportError, attempt: int) -> None:
        """Raise :class:`PolicyServerError` when a transport failure was the last attempt; else let it retry."""
        if attempt == self.retries:
            raise PolicyServerError(f"policy server {self.base_url} unreachable: {error!r}") from error

    def _final(self, response: httpx.Response, attempt: int) -> bool:
        """Whether ``response`` is the answer (raising on an error status); ``False``: retry it."""
        if response.status_code in _RETRY_STATUS and attempt < self.retries:
            return False
        _raise_for(response)
        return True

    def close(self) -> None:
        """Close the sync connection pool (use :meth:`aclose` for the async one)."""
        self._http.close()

    async def aclose(self) -> None:
        """Close both connection pools."""
        self._http.close()
        if self._async_http is not None:
            await self._async_http.aclose()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    async def __aenter__(self) -> PolicyClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.aclose()

    # -- endpoints ---------------------------------------------------------------------------

    def predict(self, task: str, history: Sequence[Step] = (), tools: Sequence[Any] = (), *,
                available: Collection[str] | None = None) -> PredictResponse:
        """``POST /predict``: the server's decision for one state."""
        body = predict_payload(task, history, tools, available=available)
        return PredictResponse.model_validate(self._request("POST", "/predict", body).json())

    async def apredict(self, task: str, history: Sequence[Step] = (), tools: Sequence[Any] = (), *,
                       available: Collection[str] | None = None) -> PredictResponse:
        """Async :meth:`predict`."""
        body = predict_payload(task, history, tools, available=available)
        return PredictResponse.model_validate((await self._arequest("POST", "/predict", body)).json())

    def predict_request(self, request: PredictRequest | Mapping[str, Any]) -> PredictResponse:
        """``POST /predict`` with a ready body (checked here first)."""
        return PredictResponse.model_validate(self._request("POST", "/predict", _as_body(request)).json())

    def predict_batch(self, requests: Sequence[PredictRequest | Mapping[str, Any]]) -> list[PredictResponse]:
        """``POST /predict/batch``: decisions for many states (``/predict`` bodies), in order."""
        body = {"items": [_as_body(request) for request in requests]}
        return BatchPredictResponse.model_validate(self._request("POST", "/predict/batch", body).json()).results

    async def apredict_batch(self, requests: Sequence[PredictRequest | Mapping[str, Any]]) -> list[PredictResponse]:
        """Async :meth:`predict_batch`."""
        body = {"items": [_as_body(request) for request in requests]}
        response = await self._arequest("POST", "/predict/batch", body)
        return BatchPredictResponse.model_validate(response.json()).results

    def rank(self, task: str, history: Sequence[Step] = (), tools: Sequence[Any] = (), *,
             available: Collection[str] | None = None) -> list[ToolScore]:
        """Rank the available tools (and FINISH) for one state, best first, as :meth:`ToolPolicy.rank` does."""
        return self.predict(task, history, tools, available=available).ranking()

    async def arank(self, task: str, history: Sequence[Step] = (), tools: Sequence[Any] = (), *,
                    available: Collection[str] | None = None) -> list[ToolScore]:
        """Async :meth:`rank`."""
        return (await self.apredict(task, history, tools, available=available)).ranking()

    def session(self, task: str, tools: Sequence[Any]) -> RemoteSession:
        """Open a server session for one run (the task is embedded on the server now)."""
        session = RemoteSession(self, task, tools)
        session.open()
        return session

    async def asession(self, task: str, tools: Sequence[Any]) -> RemoteSession:
        """Async :meth:`session`."""
        session = RemoteSession(self, task, tools)
        await session.aopen()
        return session

    def healthz(self) -> HealthResponse:
        """``GET /healthz``."""
        return HealthResponse.model_validate(self._request("GET", "/healthz").json())

    async def ahealthz(self) -> HealthResponse:
        """Async :meth:`healthz`."""
        return HealthResponse.model_validate((await self._arequest("GET", "/healthz")).json())


def _as_body(request: PredictRequest | Mapping[str, Any]) -> dict[str, Any]:
    """Return a ``/predict`` body, checked here so a bad item fails before the whole batch is sent."""
    model = request if isinstance(request, PredictRequest) else PredictRequest.model_validate(request)
    return model.model_dump(mode="json")


class RemoteSession:
    """A run's session on the policy server, with the ``observe``/``rank`` surface of a local session.

    Steps are kept here and sent with the next :meth:`rank`, where the server embeds each one
    once. The session keeps the whole run, so when the server has dropped it (expiry, eviction,
    a restart, another worker) the next rank opens a new one and sends every step again.
    """

    def __init__(self, client: PolicyClient, task: str, tools: Sequence[Any]) -> None:
        """Describe the run; :meth:`open` (or :meth:`PolicyClient.session`) opens it on the server."""
        self.client = client
        self.task = task
        self.tools = [wire_tool(tool) for tool in tools]
        self.history: list[Step] = []
        self.session_id: str | None = None
        self._sent = 0
        """How many of ``history`` the server holds."""

    def _create_body(self) -> dict[str, Any]:
        return {"task_description": _clip(self.task, MAX_TEXT_CHARS), "available_tools": self.tools}

    def _steps_body(self, available: Collection[str] | None) -> dict[str, Any]:
        return {"start": self._sent, "steps": [wire_step(step) for step in self.history[self._sent:]],
                "allowed_tools": _allowed(available, self.tools)}

    def _opened(self, response: httpx.Response) -> None:
        self.session_id, self._sent = SessionInfo.model_validate(response.json()).session_id, 0

    def _ranked(self, response: httpx.Response) -> list[ToolScore]:
        decision = SessionStepsResponse.model_validate(response.json())
        self._sent = decision.n_steps
        return decision.ranking()

    def open(self) -> None:
        """Open the session on the server (again, when it was dropped)."""
        self._opened(self.client._request("POST", "/sessions", self._create_body()))

    async def aopen(self) -> None:
        """Async :meth:`open`."""
        self._opened(await self.client._arequest("POST", "/sessions", self._create_body()))

    def observe(self, step: Step) -> None:
        """Record a step of the run; the server gets it with the next :meth:`rank`."""
        self.history.append(step)

    def rank(self, available: Collection[str] | None = None) -> list[ToolScore]:
        """Send the new steps and rank the tools for the current state, best first."""
        if self.session_id is None:
            self.open()
        try:
            response = self.client._request("POST", f"/sessions/{self.session_id}/steps", self._steps_body(available))
        except PolicyServerError as error:
            if error.status != 404:
                raise
            self.open()  # dropped by the server: a new session gets the whole run
            response = self.client._request("POST", f"/sessions/{self.session_id}/steps", self._steps_body(available))
        return self._ranked(response)

    async def arank(self, available: Collection[str] | None = None) -> list[ToolScore]:
        """Async :meth:`rank`."""
        if self.session_id is None:
            await self.aopen()
        path = f"/sessions/{self.session_id}/steps"
        try:
            response = await self.client._arequest("POST", path, self._steps_body(available))
        except PolicyServerError as error:
            if error.status != 404:
                raise
            await self.aopen()
            response = await self.client._arequest("POST", f"/sessions/{self.session_id}/steps",
                                                   self._steps_body(available))
        return self._ranked(response)

    def close(self) -> None:
        """Close the session on the server (a dropped one is already closed)."""
        if self.session_id is not None:
            try:
                self.client._request("DELETE", f"/sessions/{self.session_id}")
            except PolicyServerError as error:
                if error.status != 404:
                    raise
            self.session_id = None

    async def aclose(self) -> None:
        """Async :meth:`close`."""
        if self.session_id is not None:
            try:
                await self.client._arequest("DELETE", f"/sessions/{self.session_id}")
            except PolicyServerError as error:
                if error.status != 404:
                    raise
            self.session_id = None
