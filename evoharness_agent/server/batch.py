"""`BatchProcessor`: the seed's batch processor, on a :class:`~evoharness_agent.server.client.PolicyClient`.

Tasks are queued, ``workers`` threads send them to the server (``chunk_size`` states per
``/predict/batch`` call, or one ``/predict`` each), and :meth:`BatchProcessor.process_all` returns
one :class:`BatchResult` per task in the order the tasks were added: a decision, or the error of
that task alone. No task is lost: a task whose request failed comes back with its error.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from evoharness_agent.schema import Step
from evoharness_agent.server.client import PolicyClient, predict_payload
from evoharness_agent.server.schemas import PredictRequest, PredictResponse

__all__ = ["BatchProcessor", "BatchResult"]


@dataclass(frozen=True)
class BatchResult:
    """The outcome of one queued task: its decision, or why there is none."""

    index: int
    """The task's position among the tasks added."""
    request: Mapping[str, Any]
    """The ``/predict`` body sent for it."""
    response: PredictResponse | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the task got a decision."""
        return self.response is not None


class BatchProcessor:
    """Queue tasks, rank them on the server with N workers, get every result back in order.

    Example:
        .. code-block:: python

            processor = BatchProcessor(PolicyClient("http://127.0.0.1:8000"), workers=4)
            processor.add_task("Task 1", ["tool_a", "tool_b"])
            processor.add_task("Task 2", ["tool_c", "tool_d"])
            for result in processor.process_all():
                print(result.index, result.response.selected_tool if result.ok else result.error)

    """

    def __init__(self, client: PolicyClient, *, workers: int = 4, chunk_size: int = 1) -> None:
        """Send with ``workers`` threads, ``chunk_size`` tasks per request (1: ``/predict``, more: the batch route)."""
        if workers < 1 or chunk_size < 1:
            raise ValueError(f"workers and chunk_size must be >= 1, got {workers} and {chunk_size}")
        self.client = client
        self.workers = workers
        self.chunk_size = chunk_size
        self._tasks: list[dict[str, Any]] = []

    def __len__(self) -> int:
        """Return the number of queued tasks."""
        return len(self._tasks)

    def add_task(self, task_description: str, available_tools: Sequence[Any], history: Sequence[Step] = (), *,
                 available: Collection[str] | None = None) -> int:
        """Queue a state (as :meth:`PolicyClient.predict` takes it); return its index."""
        return self.add_request(predict_payload(task_description, history, available_tools, available=available))

    def add_request(self, request: Mapping[str, Any]) -> int:
        """Queue a ``/predict`` body as it is; return its index."""
        self._tasks.append(dict(request))
        return len(self._tasks) - 1

    def _run_chunk(self, start: int, chunk: list[dict[str, Any]]) -> list[BatchResult]:
        """Rank one chunk; every task of it gets a result, whatever fails."""
        results: dict[int, BatchResult] = {}
        valid: list[tuple[int, PredictRequest]] = []
        for offset, body in enumerate(chunk):
            try:
                valid.append((start + offset, PredictRequest.model_validate(body)))
            except ValidationError as error:  # checked here: one bad task must not fail its chunk
                results[start + offset] = BatchResult(start + offset, body, error=f"invalid request: {error}")
        if valid:
            try:
                requests = [request for _, request in valid]
                responses = (self.client.predict_batch(requests) if self.chunk_size > 1
                             else [self.client.predict_request(requests[0])])
                for (index, _), response in zip(valid, responses, strict=True):
                    results[index] = BatchResult(index, chunk[index - start], response=response)
            except Exception as error:  # noqa: BLE001 - any failure becomes the error of these tasks
                for index, _ in valid:
                    results[index] = BatchResult(index, chunk[index - start], error=f"{type(error).__name__}: {error}")
        return [results[start + offset] for offset in range(len(chunk))]

    def process_all(self) -> list[BatchResult]:
        """Rank every queued task, empty the queue, and return the results in the order tasks were added."""
        tasks, self._tasks = self._tasks, []
        chunks = [(start, tasks[start : start + self.chunk_size]) for start in range(0, len(tasks), self.chunk_size)]
        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="evoharness-batch") as pool:
            futures = [pool.submit(self._run_chunk, start, chunk) for start, chunk in chunks]
            return [result for future in futures for result in future.result()]
