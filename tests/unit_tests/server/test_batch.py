"""The batch processor: N workers, results in input order, an error per failed task, no task lost."""

from __future__ import annotations

import re

import httpx
import pytest

from evoharness_agent.server.batch import BatchProcessor
from evoharness_agent.server.client import PolicyClient
from tests.kit.live_server import free_port

TASKS = [("What is the weather like in Rome today?", ["get_weather", "get_time"], "get_weather"),
         ("Compute 6 * 7.", ["calculator", "get_time"], "calculator"),
         ("What time is it?", ["get_time", "calculator"], "get_time"),
         ("Delete the file /tmp/rome.txt", ["delete_file", "get_time"], "delete_file")]


def batch_count(url: str) -> float:
    match = re.search(r"^evoharness_batch_size_count (\S+)$", httpx.get(url + "/metrics").text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


@pytest.mark.parametrize("chunk_size", [1, 5])
def test_results_in_input_order_with_per_task_errors(server_url: str, chunk_size: int) -> None:
    client = PolicyClient(server_url)
    processor = BatchProcessor(client, workers=4, chunk_size=chunk_size)
    expected = []
    for i in range(24):
        task, tools, best = TASKS[i % len(TASKS)]
        if i % 7 == 3:
            assert processor.add_task(task, ["get_time", "get_time"]) == i  # invalid: duplicate tools
            expected.append(None)
        else:
            assert processor.add_task(task, tools) == i
            expected.append(best)
    processor.add_request({"task_description": "", "available_tools": ["get_time"]})  # invalid too
    expected.append(None)
    before = batch_count(server_url)
    results = processor.process_all()
    assert len(processor) == 0 and [r.index for r in results] == list(range(25))
    assert [r.response.selected_tool if r.ok else None for r in results] == expected
    assert all("unique" in r.error for i, r in enumerate(results[:-1]) if expected[i] is None)
    assert "task_description" in (results[-1].error or "")
    # A chunk is one /predict/batch call; a bad task did not fail the others of its chunk.
    assert batch_count(server_url) - before == (0 if chunk_size == 1 else 5)


def test_an_unreachable_server_fails_every_task_and_loses_none() -> None:
    processor = BatchProcessor(PolicyClient(f"http://127.0.0.1:{free_port()}", retries=0, timeout=2),
                               workers=3, chunk_size=2)
    for task, tools, _ in TASKS * 2:
        processor.add_task(task, tools)
    results = processor.process_all()
    assert [r.index for r in results] == list(range(8))
    assert all(not r.ok and "unreachable" in (r.error or "") for r in results)
    assert results[5].request["task_description"] == TASKS[1][0]


def test_bad_settings_are_refused(server_url: str) -> None:
    with pytest.raises(ValueError, match="workers"):
        BatchProcessor(PolicyClient(server_url), workers=0)
