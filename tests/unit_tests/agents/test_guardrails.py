"""Guardrails: allow-list, budgets per run and per day, confirmation of risky tools, audit log."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

from evoharness_agent import Guardrails, PolicyAgentExecutor, ToolPolicy
from evoharness_agent.agents.guardrails import ToolCallRequest

WEATHER = "What is the weather like in Tokyo today?"
DELETE = "Delete the file /tmp/tokyo.txt"


def audit(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def steps(result: dict) -> list[tuple[str, object]]:
    return [(action.tool, observation) for action, observation in result["intermediate_steps"]]


def test_allow_list_hides_tools_from_the_policy_and_refuses_the_llm(kit: SimpleNamespace, policy: ToolPolicy,
                                                                     tmp_path: Path) -> None:
    rules = Guardrails(allowed_tools={"search_web", "calculator", "get_time"}, audit_log=tmp_path / "audit.jsonl")
    llm = kit.llm(kit.fill)
    result = PolicyAgentExecutor(llm=llm, tools=kit.tools, policy=policy, guardrails=rules, max_iterations=1,
                                 return_intermediate_steps=True).invoke({"input": WEATHER})
    assert {tool for tool, _ in steps(result)} <= {"search_web", "calculator", "get_time"}
    llm = kit.llm(kit.call("get_weather", city="Tokyo"), "Cannot check the weather.")
    result = PolicyAgentExecutor(llm=llm, tools=kit.tools, mode="llm", guardrails=rules,
                                 return_intermediate_steps=True).invoke({"input": WEATHER})
    (tool, observation), = steps(result)
    assert tool == "get_weather" and observation.startswith("Refused: the tool 'get_weather' is not on the allow-list")
    assert "get_weather" not in llm.calls[0]["tools"]
    assert audit(tmp_path / "audit.jsonl")[-1]["event"] == "refused"


def test_per_run_budget(kit: SimpleNamespace, tmp_path: Path) -> None:
    rules = Guardrails(max_calls_per_run={"get_weather": 1})
    llm = kit.llm(kit.call("get_weather", city="Tokyo"), kit.call("get_weather", city="Paris"), "Sunny.")
    executor = PolicyAgentExecutor(llm=llm, tools=kit.tools, mode="llm", guardrails=rules,
                                   return_intermediate_steps=True)
    result = executor.invoke({"input": WEATHER})
    assert steps(result)[0] == ("get_weather", "Sunny, 21 C in Tokyo")
    assert "budget of calls for this run" in steps(result)[1][1]
    assert "get_weather" not in llm.calls[1]["tools"]  # spent: no longer offered
    llm.script.extend([kit.call("get_weather", city="Oslo"), "Sunny."])
    assert steps(executor.invoke({"input": WEATHER}))[0][1] == "Sunny, 21 C in Oslo"  # a new run, a new budget


def test_per_day_budget_survives_a_restart_through_the_audit_log(kit: SimpleNamespace, tmp_path: Path) -> None:
    now = [datetime(2025, 1, 31, 9, 0, tzinfo=timezone.utc)]
    log = tmp_path / "audit.jsonl"

    def run(rules: Guardrails) -> object:
        llm = kit.llm(kit.call("get_weather", city="Tokyo"), "Done.")
        result = PolicyAgentExecutor(llm=llm, tools=kit.tools, mode="llm", guardrails=rules,
                                     return_intermediate_steps=True).invoke({"input": WEATHER})
        return steps(result)[0][1]

    rules = Guardrails(max_calls_per_day={"get_weather": 1}, audit_log=log, clock=lambda: now[0])
    assert run(rules) == "Sunny, 21 C in Tokyo"
    assert "budget of calls for today" in run(rules)
    restarted = Guardrails(max_calls_per_day=1, audit_log=log, clock=lambda: now[0])
    assert restarted.calls_today("get_weather") == 1 and "for today" in run(restarted)
    now[0] += timedelta(days=1)
    assert run(restarted) == "Sunny, 21 C in Tokyo"


def test_high_risk_without_a_callback_is_refused_not_executed(kit: SimpleNamespace, policy: ToolPolicy,
                                                             tmp_path: Path) -> None:
    rules = Guardrails(high_risk={"delete_file"}, audit_log=tmp_path / "audit.jsonl")
    result = PolicyAgentExecutor(llm=kit.llm(kit.fill), tools=kit.tools, policy=policy, guardrails=rules,
                                 max_iterations=1, return_intermediate_steps=True).invoke({"input": DELETE})
    (tool, observation), = steps(result)
    assert tool == "delete_file" and observation.startswith("Refused:") and "no confirmation callback" in observation
    assert kit.deleted == []
    entry = audit(tmp_path / "audit.jsonl")[-1]
    assert entry["event"] == "refused" and entry["arguments"] == {"path": "/tmp/tokyo.txt"}


def test_confirmation_approves_or_denies(kit: SimpleNamespace, policy: ToolPolicy, tmp_path: Path) -> None:
    asked: list[ToolCallRequest] = []

    def approve(request: ToolCallRequest) -> bool:
        asked.append(request)
        return True

    log = tmp_path / "audit.jsonl"
    executor = PolicyAgentExecutor(llm=kit.llm(kit.fill, "Deleted."), tools=kit.tools, policy=policy,
                                   guardrails=Guardrails(high_risk={"delete_file"}, confirm=approve, audit_log=log),
                                   return_intermediate_steps=True)
    assert steps(executor.invoke({"input": DELETE})) == [("delete_file", "deleted /tmp/tokyo.txt")]
    assert asked[0].tool == "delete_file" and asked[0].arguments == {"path": "/tmp/tokyo.txt"} and asked[0].run_id
    assert kit.deleted == ["/tmp/tokyo.txt"]
    assert [e["event"] for e in audit(log)] == ["allowed", "completed"]

    denied = PolicyAgentExecutor(llm=kit.llm(kit.fill), tools=kit.tools, policy=policy, max_iterations=1,
                                 guardrails=Guardrails(high_risk={"delete_file"}, confirm=lambda request: False),
                                 return_intermediate_steps=True).invoke({"input": DELETE})
    assert "confirmation was denied" in steps(denied)[0][1] and kit.deleted == ["/tmp/tokyo.txt"]

    def broken(request: ToolCallRequest) -> bool:
        raise RuntimeError("no terminal")

    failed = PolicyAgentExecutor(llm=kit.llm(kit.fill), tools=kit.tools, policy=policy, max_iterations=1,
                                 guardrails=Guardrails(high_risk={"delete_file"}, confirm=broken),
                                 return_intermediate_steps=True).invoke({"input": DELETE})
    assert "callback failed (RuntimeError: no terminal)" in steps(failed)[0][1] and len(kit.deleted) == 1


def test_tool_metadata_marks_high_risk_and_async_confirmation(kit: SimpleNamespace, policy: ToolPolicy) -> None:
    risky = kit.by_name["delete_file"].model_copy(update={"metadata": {"risk": "high"}})
    tools = [risky, *(t for t in kit.tools if t.name != "delete_file")]

    async def approve(request: ToolCallRequest) -> bool:
        return request.arguments["path"].startswith("/tmp/")

    rules = Guardrails(confirm=approve)
    assert rules.is_high_risk(risky) and not rules.is_high_risk(kit.by_name["get_weather"])
    result = asyncio.run(PolicyAgentExecutor(llm=kit.llm(kit.fill, "Deleted."), tools=tools, policy=policy,
                                             guardrails=rules, return_intermediate_steps=True).ainvoke(
        {"input": DELETE}))
    assert steps(result) == [("delete_file", "deleted /tmp/tokyo.txt")]
    # A sync run cannot await an async callback: the call is refused, not executed.
    result = PolicyAgentExecutor(llm=kit.llm(kit.fill), tools=tools, policy=policy, guardrails=rules,
                                 max_iterations=1, return_intermediate_steps=True).invoke({"input": DELETE})
    assert steps(result)[0][1].startswith("Refused:") and kit.deleted == ["/tmp/tokyo.txt"]


def test_audit_log_is_append_only_jsonl_of_every_call(kit: SimpleNamespace, tmp_path: Path) -> None:
    log = tmp_path / "logs" / "audit.jsonl"
    rules = Guardrails(audit_log=log)
    for _ in range(2):
        llm = kit.llm(kit.call("calculator", expression="1 / 0"), "Cannot divide by zero.")
        PolicyAgentExecutor(llm=llm, tools=kit.tools, mode="llm", guardrails=rules).invoke({"input": "1 / 0?"})
    entries = audit(log)
    assert [e["event"] for e in entries] == ["allowed", "failed", "allowed", "failed"]
    assert entries[0]["run_id"] != entries[2]["run_id"]
    assert all(e["tool"] == "calculator" and e["arguments"] == {"expression": "1 / 0"} for e in entries)
    assert datetime.fromisoformat(entries[0]["time"]).tzinfo is not None


def test_guarded_run_availability() -> None:
    rules = Guardrails(allowed_tools={"a", "b", "c"}, max_calls_per_run={"b": 0})
    run = rules.start_run("run-1")
    assert run.available(["a", "b", "c", "d"]) == {"a", "c"}
    run.refused.add("c")
    assert run.available(["a", "b", "c", "d"]) == {"a"}
