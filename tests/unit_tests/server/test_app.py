"""The policy server over HTTP: decisions equal the local policy's, limits answer 422/413, metrics count."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from evoharness_agent.policy import ToolPolicy
from evoharness_agent.schema import FINISH, Step, as_tool_spec
from evoharness_agent.server.schemas import MAX_TEXT_CHARS, MAX_TOOLS, ToolIn, tool_specs
from tests.kit.tools import TOOLS

WEATHER = "What is the weather like in Tokyo today?"
SPECS = [as_tool_spec(tool) for tool in TOOLS]
WIRE_TOOLS = [spec.model_dump() for spec in SPECS]
CALLED = {"tool": "get_weather", "arguments": {"city": "Tokyo"}, "observation": "Sunny, 21 C in Tokyo"}


def post(url: str, path: str, body: object) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=30)


def as_pairs(ranked: list[dict]) -> list[tuple[str, float]]:
    return [(item["tool"], round(item["probability"], 5)) for item in ranked]


def local_pairs(policy: ToolPolicy, task: str, history: list[Step], tools: list, **kwargs: object) -> list:
    return [(s.tool, round(s.probability, 5)) for s in policy.rank(task, history, tools, **kwargs)]


def test_predict_is_the_local_policy_decision(server_url: str, policy: ToolPolicy) -> None:
    first = post(server_url, "/predict", {"task_description": WEATHER, "available_tools": WIRE_TOOLS})
    assert first.status_code == 200
    body = first.json()
    assert body["selected_tool"] == "get_weather" == body["ranked_tools"][0]["tool"]
    assert body["confidence"] == body["ranked_tools"][0]["probability"] > 0.5 and body["defer_to_llm"] is False
    assert as_pairs(body["ranked_tools"]) == local_pairs(policy, WEATHER, [], SPECS)
    assert sum(item["probability"] for item in body["ranked_tools"]) == pytest.approx(1.0)
    # After the call, the policy answers; names alone are accepted as tools too (the seed's shape).
    after = post(server_url, "/predict", {"task_description": WEATHER, "history": [CALLED],
                                          "available_tools": [tool["name"] for tool in WIRE_TOOLS]}).json()
    assert after["selected_tool"] == FINISH
    names = [tool.name for tool in SPECS]
    assert as_pairs(after["ranked_tools"]) == local_pairs(policy, WEATHER, [Step(**CALLED)], names)
    # allowed_tools narrows the ranking exactly as ``available`` does locally.
    narrowed = post(server_url, "/predict", {"task_description": WEATHER, "available_tools": WIRE_TOOLS,
                                             "allowed_tools": ["calculator", "get_time"]}).json()
    assert {item["tool"] for item in narrowed["ranked_tools"]} == {"calculator", "get_time", FINISH}
    assert as_pairs(narrowed["ranked_tools"]) == local_pairs(policy, WEATHER, [], SPECS,
                                                             available={"calculator", "get_time"})


def test_concurrent_predicts_are_ranked_together_each_as_alone(policy: ToolPolicy) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from evoharness_agent.server.app import create_app, serve_in_background

    tasks = [f"What is the weather like in city {i} today?" for i in range(24)]
    bodies = [{"task_description": task, "history": [CALLED] if i % 3 else [],
               "available_tools": WIRE_TOOLS if i % 2 else [tool["name"] for tool in WIRE_TOOLS]}
              for i, task in enumerate(tasks)]
    with serve_in_background(create_app(policy)) as url, httpx.Client(timeout=30) as client:
        with ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(lambda body: client.post(url + "/predict", json=body), bodies))
        metrics = client.get(url + "/metrics").text
    for body, answer in zip(bodies, answers, strict=True):
        assert answer.status_code == 200
        tools = body["available_tools"] if isinstance(body["available_tools"][0], str) else SPECS
        history = [Step(**CALLED)] if body["history"] else []
        served, alone = as_pairs(answer.json()["ranked_tools"]), local_pairs(policy, body["task_description"], history,
                                                                             tools)
        # In a batch, BLAS may round the last bits of a score otherwise than alone.
        assert [tool for tool, _ in served] == [tool for tool, _ in alone]
        assert [p for _, p in served] == pytest.approx([p for _, p in alone], abs=1e-4)
    # Every state went through the coalescer, in batches of one or more.
    assert "evoharness_coalesced_states_sum 24.0" in metrics


def test_concurrent_sessions_are_ranked_together_each_as_alone(policy: ToolPolicy) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from evoharness_agent.server.app import create_app, serve_in_background

    runs = [(f"What is the weather like in town {i}?",
             [{**CALLED, "arguments": {"city": f"town {i}"}, "observation": f"{i} C"},
              {"kind": "user", "content": f"And the time in town {i}?"}]) for i in range(12)]

    def run(client: httpx.Client, url: str, task: str, steps: list[dict]) -> list[list[tuple[str, float]]]:
        session_id = client.post(url + "/sessions", json={"task_description": task,
                                                          "available_tools": WIRE_TOOLS}).json()["session_id"]
        rankings = []
        for start in range(len(steps) + 1):
            body = {"start": 0, "steps": steps[:start]}
            answer = client.post(f"{url}/sessions/{session_id}/steps", json=body)
            assert answer.status_code == 200 and answer.json()["n_steps"] == start
            rankings.append(as_pairs(answer.json()["ranked_tools"]))
        return rankings

    with serve_in_background(create_app(policy)) as url, httpx.Client(timeout=30) as client:
        with ThreadPoolExecutor(12) as pool:
            served = list(pool.map(lambda item: run(client, url, *item), runs))
        metrics = client.get(url + "/metrics").text
    for (task, steps), rankings in zip(runs, served, strict=True):
        for start, ranking in enumerate(rankings):
            alone = local_pairs(policy, task, [Step(**step) for step in steps[:start]], SPECS)
            assert [tool for tool, _ in ranking] == [tool for tool, _ in alone]
            assert [p for _, p in ranking] == pytest.approx([p for _, p in alone], abs=1e-4)
    assert "evoharness_coalesced_states_sum 36.0" in metrics  # every decision of every session


def test_defer_to_llm_follows_the_threshold(policy: ToolPolicy) -> None:
    from evoharness_agent.server.app import create_app, serve_in_background

    with serve_in_background(create_app(policy, defer_threshold=1.0)) as url:
        body = post(url, "/predict", {"task_description": WEATHER, "available_tools": WIRE_TOOLS}).json()
    assert body["defer_to_llm"] is True and body["confidence"] < 1.0
    with pytest.raises(ValueError, match="defer_threshold"):
        create_app(policy, defer_threshold=1.5)


def test_batch_equals_one_by_one_in_order_across_tool_sets(server_url: str) -> None:
    items = [
        {"task_description": WEATHER, "available_tools": WIRE_TOOLS},
        {"task_description": "Compute 4 * 8.", "available_tools": ["calculator", "get_time"]},
        {"task_description": WEATHER, "available_tools": WIRE_TOOLS, "history": [CALLED]},
        # The same name with another description: ranked in a pass of its own, still right.
        {"task_description": WEATHER, "available_tools": [{"name": "get_weather", "description": "Stock prices"}]},
        # A history tool that is not offered here, but is offered (described) in another item.
        {"task_description": "Find the population of Lyon and double it.", "available_tools": ["calculator"],
         "history": [{"tool": "search_web", "arguments": {"query": "Lyon"}, "observation": "2000 people"}]},
        {"task_description": "What time is it?", "available_tools": WIRE_TOOLS, "allowed_tools": ["get_time"]},
    ]
    response = post(server_url, "/predict/batch", {"items": items})
    assert response.status_code == 200
    results = response.json()["results"]
    singles = [post(server_url, "/predict", item).json() for item in items]
    assert [as_pairs(r["ranked_tools"]) for r in results] == [as_pairs(s["ranked_tools"]) for s in singles]
    assert [r["selected_tool"] for r in results][:3] == ["get_weather", "calculator", FINISH]


@pytest.mark.parametrize(("body", "field"), [
    ({"task_description": "", "available_tools": ["a"]}, "task_description"),
    ({"available_tools": ["a"]}, "task_description"),
    ({"task_description": "x", "available_tools": ["a", "a"]}, "unique"),
    ({"task_description": "x", "available_tools": ["a"], "allowed_tools": ["b"]}, "allowed_tools"),
    ({"task_description": "x", "available_tools": ["a"], "history": [{"kind": "tool_call"}]}, "tool_call"),
    ({"task_description": "x", "available_tools": [f"t{i}" for i in range(MAX_TOOLS + 1)]}, "available_tools"),
    ({"task_description": "x" * (MAX_TEXT_CHARS + 1)}, "task_description"),
    ({"task_description": "x", "history": [{"tool": "a", "observation": "y" * (MAX_TEXT_CHARS + 1)}]}, "observation"),
    ({"task_description": "x", "available_tools": [{"name": ""}]}, "name"),
    ({"task_description": "x", "available_tools": [{"name": "a", "colour": "red"}]}, "colour"),
    ({"task_description": "x", "history": [{"tool": "a", "arguments": {"k": "\ud800"}}]}, "Unicode"),
    ({"task_description": "x", "available_tools": [{"name": "a", "parameters": []}]}, "parameters"),
    ({"task_description": float("nan")}, "task_description"),  # Python's JSON accepts NaN; pydantic must not
])
def test_bad_input_is_a_422_that_names_the_field(server_url: str, body: dict, field: str) -> None:
    # json.dumps keeps a lone surrogate escaped (\ud800), as a client in another language may send it.
    response = httpx.post(server_url + "/predict", content=json.dumps(body), timeout=30,
                          headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert field in response.text


def test_malformed_json_and_a_batch_without_items_are_422(server_url: str) -> None:
    response = httpx.post(server_url + "/predict", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 422 and "json" in response.text.lower()
    assert post(server_url, "/predict/batch", {"items": []}).status_code == 422
    assert post(server_url, "/predict/batch", {"items": [{"task_description": ""}]}).status_code == 422


def test_a_body_over_the_limit_is_a_413_declared_or_streamed(server_url: str) -> None:
    big = json.dumps({"task_description": "x", "history": [{"tool": "a", "observation": "y" * 60_000}] * 5})
    assert len(big) > 256 * 1024
    declared = httpx.post(server_url + "/predict", content=big, headers={"content-type": "application/json"})
    assert declared.status_code == 413 and "limit" in declared.json()["detail"]

    def chunks():  # no Content-Length: the limit holds while the body streams in
        for start in range(0, len(big), 8192):
            yield big[start : start + 8192].encode()

    streamed = httpx.post(server_url + "/predict", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413
    # Under the limit the same route serves.
    assert post(server_url, "/predict", {"task_description": "x"}).status_code == 200


def test_sessions_rank_like_the_local_policy_and_retries_are_idempotent(server_url: str, policy: ToolPolicy) -> None:
    created = post(server_url, "/sessions", {"task_description": WEATHER, "available_tools": WIRE_TOOLS})
    assert created.status_code == 201
    session_id = created.json()["session_id"]
    assert created.json()["n_steps"] == 0 and created.json()["expires_in_s"] > 0
    path = f"/sessions/{session_id}/steps"
    empty = post(server_url, path, {"start": 0, "steps": []}).json()
    assert empty["n_steps"] == 0 and as_pairs(empty["ranked_tools"]) == local_pairs(policy, WEATHER, [], SPECS)
    once = post(server_url, path, {"start": 0, "steps": [CALLED]}).json()
    assert once["n_steps"] == 1 and once["selected_tool"] == FINISH
    assert as_pairs(once["ranked_tools"]) == local_pairs(policy, WEATHER, [Step(**CALLED)], SPECS)
    again = post(server_url, path, {"start": 0, "steps": [CALLED]}).json()  # a retried request
    assert again["n_steps"] == 1 and again["ranked_tools"] == once["ranked_tools"]
    gap = post(server_url, path, {"start": 3, "steps": []})
    assert gap.status_code == 409 and "send from step 1" in gap.json()["detail"]
    other = post(server_url, path, {"start": 0, "steps": [{**CALLED, "observation": "Rain"}]})
    assert other.status_code == 409 and "differs" in other.json()["detail"]
    unknown = post(server_url, path, {"start": 1, "allowed_tools": ["nope"]})
    assert unknown.status_code == 422 and "allowed_tools" in unknown.text
    info = httpx.get(f"{server_url}/sessions/{session_id}").json()
    assert info["n_steps"] == 1 and info["task_description"] == WEATHER
    assert httpx.delete(f"{server_url}/sessions/{session_id}").status_code == 204
    gone = f"{server_url}/sessions/{session_id}"
    for response in (httpx.get(gone), httpx.delete(gone), post(server_url, path, {"start": 1})):
        assert response.status_code == 404 and "no session" in response.json()["detail"]


def test_healthz_and_metrics(server_url: str) -> None:
    health = httpx.get(server_url + "/healthz").json()
    assert health["status"] == "ok" and health["n_known_tools"] > 0
    post(server_url, "/predict/batch", {"items": [{"task_description": WEATHER, "available_tools": WIRE_TOOLS}] * 3})
    post(server_url, "/predict", {"task_description": ""})
    response = httpx.get(server_url + "/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert 'evoharness_requests_total{endpoint="/predict/batch",method="POST",status="200"}' in text
    assert 'evoharness_request_errors_total{endpoint="/predict",status="422"}' in text
    assert 'evoharness_request_duration_seconds_bucket{endpoint="/predict",le="0.1"}' in text
    assert 'evoharness_batch_size_bucket{le="4.0"}' in text and "evoharness_batch_size_sum" in text
    assert "evoharness_sessions " in text
    # Session ids never become labels: routes are labelled by their template.
    assert 'endpoint="/sessions/{session_id}' in text or "/sessions/" not in text


def test_openapi_is_fit_for_a_generated_client(server_url: str) -> None:
    schema = httpx.get(server_url + "/openapi.json").json()
    operations = {op["operationId"]: (path, method, op) for path, methods in schema["paths"].items()
                  for method, op in methods.items()}
    assert set(operations) >= {"predict", "predictBatch", "createSession", "getSession", "addSessionSteps",
                               "deleteSession", "healthz", "metrics"}
    _, _, predict = operations["predict"]
    assert predict["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("PredictResponse")
    assert {"413", "422"} <= set(predict["responses"])
    assert "404" in operations["addSessionSteps"][2]["responses"]
    components = schema["components"]["schemas"]
    assert components["PredictRequest"]["examples"] and components["PredictResponse"]["examples"]
    assert components["PredictRequest"]["properties"]["available_tools"]["maxItems"] == MAX_TOOLS


def test_tool_specs_are_built_once_per_distinct_tool() -> None:
    # Clients send their same tools with every state: the server normalises each schema once.
    def tool(description: str = "Weather of a city", **extra: Any) -> ToolIn:
        return ToolIn(name="get_weather", description=description, parameters={
            "type": "dict", "properties": {"city": {"type": "str"}}, "required": ["city"], **extra})

    first, again = tool_specs([tool(), "FINISH"]), tool_specs([tool()])
    assert first[0] is again[0] and first[0] == as_tool_spec(tool().model_dump())
    assert first[0].parameters["type"] == "object" and first[1].name == FINISH
    other = tool_specs([tool(description="Weather")])[0]
    assert other is not first[0] and other.description == "Weather"
    assert tool_specs([tool(additionalProperties=False)])[0].parameters["additionalProperties"] is False
    huge = tool(examples=["x" * 20_000])  # not kept: whatever clients send, the kept specs stay small
    assert tool_specs([huge])[0] is not tool_specs([huge])[0]
    assert tool_specs([huge])[0] == as_tool_spec(huge.model_dump())
