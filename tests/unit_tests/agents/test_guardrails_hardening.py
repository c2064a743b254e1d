"""Guardrails under bad input, concurrency and crashes: explicit approvals only, names, a budget
shared by processes, tools outliving their run, identical repeats, a scrubbed and crash-tolerant log."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from langchain_core.tools import StructuredTool, tool

from evoharness_agent import Guardrails, PolicyAgentExecutor
from evoharness_agent.agents.executor import STOPPED_OUTPUT
from evoharness_agent.agents.guardrails import AFTER_STOP, Approval, AuditLogWarning, ToolCallRequest

NOON = datetime(2025, 1, 31, 12, 0, tzinfo=timezone.utc)


@tool
def book(flight: str, email: str = "") -> str:
    """Book a flight."""
    return f"booked {flight}"


def events(log: Path) -> list[str]:
    return [json.loads(line)["event"] for line in log.read_text().splitlines()]


# -- 1. only an explicit approval runs a high-risk tool ---------------------------------------------

@pytest.mark.parametrize("answer", ["no", "deny", "yes", "true", {"approved": False}, {"approved": True}, 1, None,
                                    [True], Approval(approved=False)])
def test_anything_but_an_explicit_approval_refuses(answer: Any) -> None:
    rules = Guardrails(high_risk={"book"}, confirm=lambda request: answer)
    reason = rules.start_run("r").check(book, {"flight": "LY1"})
    assert reason is not None and "high-risk" in reason
    if isinstance(answer, Approval):
        assert "confirmation was denied" in reason
    else:
        assert "not an approval: only True or Approval(approved=True) runs it" in reason and repr(answer) in reason


@pytest.mark.parametrize("answer", [True, Approval(approved=True, note="ok by Ana")])
def test_true_or_an_approval_object_approves(answer: Any) -> None:
    assert Guardrails(high_risk="book", confirm=lambda request: answer).start_run("r").check(book, {"flight": "1"}) \
        is None


def test_async_runs_refuse_non_approvals_too() -> None:
    async def says_no(request: ToolCallRequest) -> Any:
        return "no"

    async def approves(request: ToolCallRequest) -> Any:
        return Approval(approved=True)

    refused = asyncio.run(Guardrails(high_risk="book", confirm=says_no).start_run("r").acheck(book, {"flight": "1"}))
    assert refused is not None and "returned 'no'" in refused
    assert asyncio.run(Guardrails(high_risk="book", confirm=approves).start_run("r").acheck(book, {"flight": "1"})) \
        is None
    blocking = Guardrails(high_risk="book", confirm=lambda request: "yes")  # a sync callback, in a thread
    assert "not an approval" in str(asyncio.run(blocking.start_run("r").acheck(book, {"flight": "1"})))


def test_a_denial_note_and_a_malformed_approval_are_refusals() -> None:
    denied = Guardrails(high_risk="book", confirm=lambda request: Approval(approved=False, note="over budget"))
    assert denied.start_run("r").check(book, {"flight": "1"}) == \
        "it is high-risk and the confirmation was denied: over budget"
    with pytest.raises(TypeError, match="Approval.approved must be True or False"):
        Approval(approved="yes")  # type: ignore[arg-type]
    malformed = Guardrails(high_risk="book", confirm=lambda request: Approval(approved=1))  # type: ignore[arg-type]
    assert "callback failed (TypeError" in str(malformed.start_run("r").check(book, {"flight": "1"}))


# -- 2. a string is one name; other types are refused clearly ---------------------------------------

def test_a_string_is_one_tool_name() -> None:
    rules = Guardrails(high_risk="delete_file", allowed_tools="calculator")
    assert rules.high_risk == {"delete_file"} and rules.is_high_risk("delete_file") and not rules.is_high_risk("d")
    assert rules.start_run("r").available(["calculator", "c", "delete_file"]) == {"calculator"}


@pytest.mark.parametrize(("settings", "message"), [
    ({"high_risk": 5}, "high_risk=...) takes a tool name or a collection of tool names, got int"),
    ({"allowed_tools": b"calculator"}, "got bytes"),
    ({"allowed_tools": {"calculator": True}}, "got dict"),
    ({"high_risk": ["book", 3]}, "tool names are strings, got 3"),
    ({"max_calls_per_run": "3"}, "max_calls_per_run=...) takes a count >= 0"),
    ({"max_calls_per_run": True}, "max_calls_per_run"),
    ({"max_calls_per_day": {"book": -1}}, "max_calls_per_day"),
])
def test_wrong_types_are_rejected(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(TypeError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        Guardrails(**settings)


# -- 3. a daily budget shared through the audit log holds across processes ---------------------------

CHILD = """
import sys, time
from pathlib import Path
from langchain_core.tools import tool
from evoharness_agent.agents.guardrails import Guardrails

@tool
def book(flight: str) -> str:
    \"\"\"Book a flight.\"\"\"
    return flight

log, go = sys.argv[1], Path(sys.argv[2])
rules = Guardrails(max_calls_per_day=5, audit_log=log)
print(rules.calls_today("book"), flush=True)  # both processes see the budget unspent
while not go.exists():
    time.sleep(0.002)
print(sum(rules.start_run(f"run-{i}").check(book, {"flight": str(i)}) is None for i in range(8)), flush=True)
"""


def test_a_daily_budget_holds_across_two_processes(tmp_path: Path) -> None:
    log, go = tmp_path / "audit.jsonl", tmp_path / "go"
    children = [subprocess.Popen([sys.executable, "-c", CHILD, str(log), str(go)], stdout=subprocess.PIPE, text=True)
                for _ in range(2)]
    assert [child.stdout.readline().strip() for child in children] == ["0", "0"]  # type: ignore[union-attr]
    go.touch()
    allowed = [int(child.communicate(timeout=60)[0]) for child in children]
    assert sum(allowed) == 5
    assert events(log).count("allowed") == 5 and events(log).count("refused") == 11
    assert Guardrails(max_calls_per_day=5, audit_log=log).calls_today("book") == 5


# -- 4. an async run that stops during a sync tool ----------------------------------------------------

def slow_tool(booked: list[str]) -> StructuredTool:
    def slow_book(flight: str) -> str:
        """Book a flight, slowly."""
        time.sleep(0.6)
        booked.append(flight)
        return f"booked {flight}"

    return StructuredTool.from_function(slow_book)


def test_a_sync_tool_outliving_its_run_is_reported_and_audited(kit: SimpleNamespace, tmp_path: Path) -> None:
    log, booked = tmp_path / "audit.jsonl", []
    executor = PolicyAgentExecutor(llm=kit.llm(kit.call("slow_book", flight="LY1")), tools=[slow_tool(booked)],
                                   mode="llm", guardrails=Guardrails(audit_log=log), max_execution_time=0.2)

    async def server() -> tuple[dict[str, Any], list[str]]:  # a long-lived event loop, as in a server
        result = await executor.ainvoke({"input": "Book LY1"})
        during = events(log)
        await asyncio.sleep(0.8)
        return result, during

    result, during = asyncio.run(server())
    assert result["output"] == STOPPED_OUTPUT and result["still_running"] == ["slow_book"]
    assert during == ["allowed", "abandoned"] and booked == ["LY1"]
    last = json.loads(log.read_text().splitlines()[-1])
    assert last["event"] == "completed" and last["reason"] == AFTER_STOP


def test_an_outcome_that_cannot_be_known_stays_abandoned(kit: SimpleNamespace, tmp_path: Path) -> None:
    log, booked = tmp_path / "audit.jsonl", []
    executor = PolicyAgentExecutor(llm=kit.llm(kit.call("slow_book", flight="LY2")), tools=[slow_tool(booked)],
                                   mode="llm", guardrails=Guardrails(audit_log=log), max_execution_time=0.2)
    result = asyncio.run(executor.ainvoke({"input": "Book LY2"}))  # the loop closes while the tool runs
    assert result["still_running"] == ["slow_book"] and events(log) == ["allowed", "abandoned"]


def test_an_async_tool_is_cancelled_with_its_run(kit: SimpleNamespace, tmp_path: Path) -> None:
    async def slow_search(query: str) -> str:
        """Search, slowly."""
        await asyncio.sleep(2)
        return "found"

    log = tmp_path / "audit.jsonl"
    executor = PolicyAgentExecutor(llm=kit.llm(kit.call("slow_search", query="x")),
                                   tools=[StructuredTool.from_function(coroutine=slow_search)], mode="llm",
                                   guardrails=Guardrails(audit_log=log), max_execution_time=0.2)
    result = asyncio.run(executor.ainvoke({"input": "Search x"}))
    assert result == {"input": "Search x", "output": STOPPED_OUTPUT} and events(log) == ["allowed", "cancelled"]


# -- 5. an identical repeat of a high-risk call needs its own approval --------------------------------

def test_an_identical_high_risk_repeat_is_refused_unless_approved_as_a_repeat() -> None:
    asked: list[ToolCallRequest] = []

    def approve(request: ToolCallRequest) -> bool:
        asked.append(request)
        return True

    run = Guardrails(high_risk="book", confirm=approve).start_run("r")
    assert run.check(book, {"flight": "LY1", "email": ""}) is None
    reason = run.check(book, {"email": "", "flight": "LY1"})  # key order does not make it another call
    assert reason is not None and "repeats a high-risk call already made in this run" in reason
    assert [request.repeat for request in asked] == [False, True]

    def approve_repeats(request: ToolCallRequest) -> Approval:
        return Approval(approved=True, repeat=request.repeat)

    run = Guardrails(high_risk="book", confirm=approve_repeats).start_run("r")
    assert run.check(book, {"flight": "LY1"}) is None and run.check(book, {"flight": "LY1"}) is None
    assert Guardrails(high_risk="book", confirm=approve).start_run("r").check(book, {"flight": "LY1"}) is None


def test_the_executor_books_once_and_says_why_not_twice(kit: SimpleNamespace) -> None:
    llm = kit.llm(kit.call("book", flight="LY1"), kit.call("book", flight="LY1"), "Booked.")
    result = PolicyAgentExecutor(llm=llm, tools=[book], mode="llm", return_intermediate_steps=True,
                                 guardrails=Guardrails(high_risk="book", confirm=lambda request: True)).invoke(
        {"input": "Book LY1"})
    (_, first), (_, second) = result["intermediate_steps"]
    assert first == "booked LY1" and second.startswith("Refused: it repeats a high-risk call")


# -- 6. a scrubbed audit log that survives a torn line -------------------------------------------------

def test_the_audit_log_stores_scrubbed_arguments(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"

    def broken(request: ToolCallRequest) -> bool:
        raise RuntimeError("cannot reach jane.doe@example.com")

    rules = Guardrails(audit_log=log)
    rules.start_run("r").check(book, {"flight": "LY1", "email": "jane.doe@example.com", "card": "4111 1111 1111 1111"})
    Guardrails(audit_log=log, high_risk="book", confirm=broken).start_run("r").check(book, {"flight": "LY1"})
    text = log.read_text()
    assert "jane.doe" not in text and "4111" not in text and "[EMAIL]" in text and "[CARD]" in text
    assert json.loads(text.splitlines()[0])["arguments"]["flight"] == "LY1"
    assert rules.start_run("r").check(book, {"flight": "LY\ud8001"}) is None  # a lone surrogate is still logged
    assert json.loads(log.read_text().splitlines()[-1])["arguments"]["flight"].startswith("LY")


def test_a_torn_last_line_is_skipped_reported_and_ended(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    valid = {"time": NOON.isoformat(), "run_id": "old", "tool": "book", "arguments": {}, "event": "allowed"}
    log.write_bytes(json.dumps(valid).encode() + b"\n" + b'{"time": "\xff\xfe", "event": "allowed"}\n'
                    + json.dumps(valid).encode()[:25])  # a bad byte, then a crash mid-write
    rules = Guardrails(max_calls_per_day=2, audit_log=log, clock=lambda: NOON)
    with pytest.warns(AuditLogWarning) as caught:
        assert rules.calls_today("book") == 1
    assert [str(w.message).split(": ", 1)[1] for w in caught] == [
        "line 2 is not an audit entry ('utf-8' codec can't decode byte 0xff in position 10: invalid start byte); "
        "skipped, the valid lines still count",
        "line 3 is torn (no line end: a crash mid-write?); skipped, the valid lines still count"]
    run = rules.start_run("r")
    assert run.check(book, {"flight": "1"}) is None and "budget of calls for today" in str(run.check(book, {}))
    assert rules.calls_today("book") == 2
    with pytest.warns(AuditLogWarning) as later:  # a later process: the torn line is ended, the new lines stand alone
        assert Guardrails(audit_log=log, clock=lambda: NOON).calls_today("book") == 2
    assert [str(w.message).split(": ", 1)[1][:30] for w in later] == ["line 2 is not an audit entry (",
                                                                      "line 3 is not an audit entry ("]
    assert log.read_bytes().splitlines()[3].startswith(b'{"time"')


def test_an_audit_log_that_cannot_be_written_refuses_the_call(tmp_path: Path) -> None:
    rules = Guardrails(audit_log=tmp_path, max_calls_per_day=3)  # a folder: every read and write fails
    run = rules.start_run("r")
    assert run.available(["book"]) == set()
    with pytest.warns(AuditLogWarning, match="could not write a 'refused' line"):
        reason = run.check(book, {"flight": "1"})
    assert reason is not None and reason.startswith(f"the audit log {tmp_path} could not be read or written")
