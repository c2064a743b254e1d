"""PolicyClient against the live server: sync and async, sessions that survive the server dropping them."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from evoharness_agent.policy import ToolPolicy
from evoharness_agent.schema import FINISH, Step
from evoharness_agent.server.app import create_app, serve_in_background
from evoharness_agent.server.client import PolicyClient, PolicyRequestError, PolicyServerError
from tests.kit.live_server import free_port
from tests.kit.tools import TOOLS

WEATHER = "What is the weather like in Tokyo today?"
DOUBLE = "Find the population of Tokyo and double it."
CALLED = Step(tool="get_weather", arguments={"city": "Tokyo"}, observation="Sunny, 21 C in Tokyo")
SEARCHED = Step(tool="search_web", arguments={"query": "population of Tokyo"}, observation="Tokyo has 1000 people")


def pairs(ranking: list) -> list[tuple[str, float]]:
    return [(s.tool, round(s.probability, 5)) for s in ranking]


def test_sync_client_ranks_as_the_local_policy(server_url: str, policy: ToolPolicy) -> None:
    with PolicyClient(server_url) as client:
        assert client.healthz().status == "ok"
        assert pairs(client.rank(WEATHER, [], TOOLS)) == pairs(policy.rank(WEATHER, [], TOOLS))
        assert pairs(client.rank(WEATHER, [CALLED], TOOLS)) == pairs(policy.rank(WEATHER, [CALLED], TOOLS))
        # Names the tools do not have are ignored, as locally (FINISH among them).
        available = {"calculator", "search_web", "no_such_tool", FINISH}
        assert (pairs(client.rank(DOUBLE, [], TOOLS, available=available))
                == pairs(policy.rank(DOUBLE, [], TOOLS, available=available)))
        decision = client.predict(WEATHER, tools=TOOLS)
        assert decision.selected_tool == "get_weather" and decision.confidence > 0.5
        items = [(WEATHER, ["get_weather", "get_time"]), (DOUBLE, ["search_web", "calculator"])]
        batch = client.predict_batch([{"task_description": task, "available_tools": names} for task, names in items])
        # Tools given by name alone are ranked as the local policy ranks them (a test policy: the choice is its own).
        assert [d.selected_tool for d in batch] == [policy.rank(task, [], names)[0].tool for task, names in items]
        assert batch[0].selected_tool == "get_weather"
        with pytest.raises(PolicyRequestError, match="unique") as caught:
            client.predict(WEATHER, tools=["get_time", "get_time"])
        assert caught.value.status == 422


def test_async_client(server_url: str, policy: ToolPolicy) -> None:
    async def run() -> None:
        async with PolicyClient(server_url) as client:
            assert (await client.ahealthz()).status == "ok"
            ranked = await asyncio.gather(*(client.arank(WEATHER, [CALLED] * i, TOOLS) for i in range(3)))
            assert [pairs(r) for r in ranked] == [pairs(policy.rank(WEATHER, [CALLED] * i, TOOLS)) for i in range(3)]
            assert (await client.apredict(DOUBLE, tools=TOOLS)).selected_tool == "search_web"
            batch = await client.apredict_batch([{"task_description": WEATHER, "available_tools": ["get_weather"]}])
            assert batch[0].selected_tool == "get_weather"
            session = await client.asession(DOUBLE, TOOLS)
            assert (await session.arank())[0].tool == "search_web"
            session.observe(SEARCHED)
            assert pairs(await session.arank()) == pairs(policy.rank(DOUBLE, [SEARCHED], TOOLS))
            await session.aclose()
            assert session.session_id is None

    asyncio.run(run())


def test_remote_session_ranks_as_a_local_session(server_url: str, policy: ToolPolicy) -> None:
    client = PolicyClient(server_url)
    remote, local = client.session(DOUBLE, TOOLS), policy.session(DOUBLE, TOOLS)
    assert remote.session_id is not None
    calculated = Step(tool="calculator", arguments={"expression": "1000 * 2"}, observation="2000")
    for step in (None, SEARCHED, calculated):
        if step is not None:
            remote.observe(step)
            local.observe(step)
        assert pairs(remote.rank()) == pairs(local.rank())
    assert remote.rank({"calculator"})[0].tool in {"calculator", FINISH}
    info = httpx.get(f"{server_url}/sessions/{remote.session_id}").json()
    assert info["n_steps"] == 2  # each step sent once
    remote.close()
    remote.close()  # closing twice is harmless


def test_a_dropped_session_is_reopened_with_the_whole_run(policy: ToolPolicy) -> None:
    with serve_in_background(create_app(policy, max_sessions=1, session_ttl_s=0.5)) as url:
        client = PolicyClient(url)
        first = client.session(DOUBLE, TOOLS)
        first.observe(SEARCHED)
        expected = pairs(policy.rank(DOUBLE, [SEARCHED], TOOLS))
        assert pairs(first.rank()) == expected
        old_id = first.session_id
        second = client.session(WEATHER, TOOLS)  # the store holds one: the first is evicted
        assert second.rank()[0].tool == "get_weather"
        assert pairs(first.rank()) == expected and first.session_id != old_id
        assert httpx.get(f"{url}/sessions/{first.session_id}").json()["n_steps"] == 1
        time.sleep(0.7)  # and expired
        assert pairs(first.rank()) == expected


def test_an_unreachable_server_is_a_clear_error_after_retries() -> None:
    client = PolicyClient(f"http://127.0.0.1:{free_port()}", retries=1, timeout=2)
    with pytest.raises(PolicyServerError, match="unreachable"):
        client.rank(WEATHER, [], TOOLS)


def test_a_503_is_retried(server_url: str, policy: ToolPolicy) -> None:
    class FlakyOnce(httpx.HTTPTransport):
        failed = False

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            if not self.failed:
                self.failed = True
                return httpx.Response(503, json={"detail": "restarting"})
            return super().handle_request(request)

    client = PolicyClient(server_url, transport=FlakyOnce())
    assert pairs(client.rank(WEATHER, [], TOOLS)) == pairs(policy.rank(WEATHER, [], TOOLS))
    with pytest.raises(PolicyServerError) as caught:
        PolicyClient(server_url, retries=0, transport=FlakyOnce()).rank(WEATHER, [], TOOLS)
    assert caught.value.status == 503 and not isinstance(caught.value, PolicyRequestError)
