"""`Coalescer`: concurrent calls are run together, each gets its own result or error, none waits for a timer."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from evoharness_agent.server.coalescing import Coalescer


class Recorded:
    """A batch function that records its batches and holds the first one until released."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        if len(self.batches) == 1:
            self.entered.set()
            assert self.release.wait(10)
        if -1 in items:
            raise ValueError("item -1 is bad")
        return [item * 10 for item in items]


def queued(coalescer: Coalescer, count: int) -> None:
    """Wait until ``count`` calls wait behind the running batch."""
    deadline = time.monotonic() + 10
    while len(coalescer._queue) < count:
        assert time.monotonic() < deadline, "the calls never queued"
        time.sleep(0.001)


def run_behind_a_held_batch(items: list[int], max_batch: int = 64) -> tuple[Recorded, dict[int, object]]:
    """Call with item 0 (held inside its batch), then with ``items`` concurrently; return each call's outcome."""
    run = Recorded()
    sizes: list[int] = []
    coalescer = Coalescer(run, max_batch=max_batch, on_batch=sizes.append)
    outcomes: dict[int, object] = {}

    def call(item: int) -> None:
        try:
            outcomes[item] = coalescer(item)
        except ValueError as error:
            outcomes[item] = error

    with ThreadPoolExecutor(len(items) + 1) as pool:
        pool.submit(call, 0)
        assert run.entered.wait(10)
        for item in items:
            pool.submit(call, item)
        queued(coalescer, len(items))
        run.release.set()
    # on_batch hears of each batch (not of the one-by-one runs that find a failing item)
    assert sizes == [len(batch) for batch in run.batches[: len(sizes)]] and sizes[0] == 1
    return run, outcomes


def test_a_call_alone_runs_at_once_as_a_batch_of_one() -> None:
    run = Recorded()
    run.release.set()
    coalescer = Coalescer(run)
    assert coalescer(4) == 40 and coalescer(5) == 50
    assert run.batches == [[4], [5]]


def test_calls_that_arrive_during_a_batch_run_together_next() -> None:
    run, outcomes = run_behind_a_held_batch([1, 2, 3, 4, 5])
    assert run.batches[0] == [0] and sorted(run.batches[1]) == [1, 2, 3, 4, 5] and len(run.batches) == 2
    assert outcomes == {item: item * 10 for item in range(6)}  # each call its own result


def test_a_batch_takes_at_most_max_batch_items_in_arrival_order() -> None:
    run, outcomes = run_behind_a_held_batch([1, 2, 3, 4, 5], max_batch=2)
    assert [len(batch) for batch in run.batches] == [1, 2, 2, 1]
    assert outcomes == {item: item * 10 for item in range(6)}


def test_an_error_reaches_only_the_call_whose_item_caused_it() -> None:
    run, outcomes = run_behind_a_held_batch([1, -1, 2])
    assert isinstance(outcomes[-1], ValueError) and "item -1" in str(outcomes[-1])
    assert {item: outcomes[item] for item in (0, 1, 2)} == {0: 0, 1: 10, 2: 20}
    assert sorted(run.batches[1]) == [-1, 1, 2]  # the batch, then each item alone
    assert sorted(map(tuple, run.batches[2:])) == [(-1,), (1,), (2,)]


def test_a_wrong_number_of_results_is_an_error_not_a_silent_mismatch() -> None:
    coalescer: Coalescer[int, int] = Coalescer(lambda items: [])
    with pytest.raises(RuntimeError, match="gave 0 results"):
        coalescer(1)
    with pytest.raises(ValueError, match="max_batch"):
        Coalescer(lambda items: items, max_batch=0)
