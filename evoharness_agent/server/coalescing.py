"""`Coalescer`: concurrent single requests ranked together, as one batch.

Sixteen clients calling ``/predict`` at once would otherwise be ranked one after the other, each
with its own encoder call and forward pass, under the policy's lock: about three times the cost
of the same states in one ``/predict/batch``. A :class:`Coalescer` sets no timer: a call that
finds the policy idle runs at once, alone; the calls that arrive while a batch runs wait, and
the oldest of them runs them all as the next batch when it ends (leadership passes from
thread to thread, so no caller serves others' batches after its own result is ready).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["Coalescer"]

Item = TypeVar("Item")
Result = TypeVar("Result")


class _Waiter(Generic[Item, Result]):
    """One call waiting in a :class:`Coalescer`: its item, then its result or error, or the lead."""

    def __init__(self, item: Item) -> None:
        self.item = item
        self.woken = threading.Event()
        self.lead = False
        self.outcome: tuple[Result, None] | tuple[None, BaseException] | None = None
        """(result, None) or (None, error), once its batch has run."""

    def result(self) -> Result:
        """Return the result, or raise the error, of this call alone."""
        if self.outcome is None:
            raise RuntimeError("its batch was interrupted before it ran")
        result, error = self.outcome
        if error is not None:
            raise error
        return result  # type: ignore[return-value]  # (result, None)


class Coalescer(Generic[Item, Result]):
    """Run the concurrent calls of ``run_batch`` together: the calls that arrive during one batch form the next.

    When a batch raises, its items are run one by one, so an error reaches only the call whose
    item caused it.

    Args:
        run_batch: returns one result per item of a list, in order.
        max_batch: the most items one batch takes (the rest wait for the next).
        on_batch: told each batch's size (a metric).

    """

    def __init__(self, run_batch: Callable[[list[Item]], Sequence[Result]], *, max_batch: int = 64,
                 on_batch: Callable[[int], None] | None = None) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._on_batch = on_batch
        self._lock = threading.Lock()
        self._queue: list[_Waiter[Item, Result]] = []
        self._running = False

    def __call__(self, item: Item) -> Result:
        """Return ``item``'s result, computed with the items of the calls that arrived while a batch ran."""
        waiter: _Waiter[Item, Result] = _Waiter(item)
        with self._lock:
            self._queue.append(waiter)
            waiter.lead = not self._running
            self._running = True
        if not waiter.lead:
            waiter.woken.wait()  # set when this call's batch has run, or when it is this call's turn to lead
        if waiter.lead:
            self._lead()
        return waiter.result()

    def _lead(self) -> None:
        """Run the oldest waiting items (this call's among them) as one batch, then pass the lead on."""
        with self._lock:
            batch = self._queue[: self._max_batch]
            del self._queue[: self._max_batch]
        try:
            self._run(batch)
        finally:
            for waiter in batch:
                if not waiter.lead:
                    waiter.woken.set()
            with self._lock:
                if self._queue:  # the oldest waiter runs the next batch, its own item first
                    self._queue[0].lead = True
                    self._queue[0].woken.set()
                else:
                    self._running = False

    def _run(self, batch: list[_Waiter[Item, Result]]) -> None:
        """Give every waiter of ``batch`` its result, or its own error."""
        if self._on_batch is not None:
            self._on_batch(len(batch))
        try:
            results = list(self._run_batch([waiter.item for waiter in batch]))
            if len(results) != len(batch):
                raise RuntimeError(f"a batch of {len(batch)} items gave {len(results)} results")
        except Exception as error:
            if len(batch) == 1:
                batch[0].outcome = (None, error)
                return
            for waiter in batch:  # find whose item fails: only that call gets the error
                try:
                    waiter.outcome = (self._run_batch([waiter.item])[0], None)
                except Exception as own:
                    waiter.outcome = (None, own)
            return
        for waiter, result in zip(batch, results, strict=True):
            waiter.outcome = (result, None)
