"""Guardrails around tool calls: allow-list, call budgets, confirmation, audit log.

:class:`Guardrails` is configured once and shared by every run of an executor; each run
gets a :class:`GuardedRun` (``guardrails.start_run(run_id)``) that keeps the per-run
counts. A call is refused (and the refusal becomes the step's observation, never an
exception) when the tool is not on the allow-list, its per-run or per-day budget is spent,
or it is high-risk and the confirmation callback did not approve it. Without a callback a
high-risk call is always refused: silence is not consent.

Every decision is appended to a JSONL audit log, one object per line::

    {"time": "2025-01-31T09:12:03.120000+00:00", "run_id": "…", "tool": "delete_file",
     "arguments": {"path": "/tmp/x"}, "event": "refused", "reason": "…"}

``event`` is ``allowed`` (written before the tool runs), ``completed`` or ``failed``
(after it ran) or ``refused``. Per-day counts are seeded from the ``allowed`` lines of the
log, so daily limits survive a restart.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

from langchain_core.runnables.config import run_in_executor
from langchain_core.tools import BaseTool

from evoharness_agent.runtime import append_line

__all__ = ["ConfirmCallback", "GuardedRun", "Guardrails", "ToolCallRequest"]

HIGH_RISK_METADATA_KEY = "risk"
"""A tool whose ``metadata[HIGH_RISK_METADATA_KEY] == "high"`` needs confirmation."""


@dataclass(frozen=True)
class ToolCallRequest:
    """A tool call awaiting confirmation: what would run, and in which run."""

    tool: str
    arguments: dict[str, Any]
    run_id: str


ConfirmCallback = Callable[[ToolCallRequest], "bool | Awaitable[bool]"]
"""Approves (``True``) or denies a high-risk call; may be sync or async."""


def _now() -> datetime:
    """Return the current local time, timezone-aware."""
    return datetime.now(timezone.utc).astimezone()


class Guardrails:
    """Rules every tool call must pass; shared by all runs of an executor.

    Args:
        allowed_tools: the only tool names that may run (``None``: every tool).
        max_calls_per_run: a limit per tool and run; an int applies to every tool.
        max_calls_per_day: a limit per tool and calendar day; an int applies to every tool.
        high_risk: tool names that need ``confirm`` to approve each call (tools whose
            ``metadata["risk"] == "high"`` count too).
        confirm: called with a :class:`ToolCallRequest` for each high-risk call.
        audit_log: a JSONL file every decision is appended to (``None``: no log).
        clock: returns the current time (aware datetime); tests move the day with it.

    """

    def __init__(
        self,
        *,
        allowed_tools: Iterable[str] | None = None,
        max_calls_per_run: int | Mapping[str, int] | None = None,
        max_calls_per_day: int | Mapping[str, int] | None = None,
        high_risk: Iterable[str] = (),
        confirm: ConfirmCallback | None = None,
        audit_log: str | Path | None = None,
        clock: Callable[[], datetime] = _now,
    ) -> None:
        self.allowed_tools = None if allowed_tools is None else frozenset(allowed_tools)
        self.max_calls_per_run = max_calls_per_run
        self.max_calls_per_day = max_calls_per_day
        self.high_risk = frozenset(high_risk)
        self.confirm = confirm
        self.audit_log = Path(audit_log) if audit_log is not None else None
        self.clock = clock
        # Daily counts are shared by concurrent runs (batch, async), hence the lock.
        self._lock = threading.Lock()
        self._day: date | None = None
        self._today: Counter[str] = Counter()

    def start_run(self, run_id: str) -> GuardedRun:
        """Return the guard of one run, with fresh per-run counts."""
        return GuardedRun(self, run_id)

    def is_high_risk(self, tool: BaseTool | str) -> bool:
        """Whether calls to ``tool`` need confirmation."""
        if isinstance(tool, str):
            return tool in self.high_risk
        return tool.name in self.high_risk or (tool.metadata or {}).get(HIGH_RISK_METADATA_KEY) == "high"

    def calls_today(self, tool: str) -> int:
        """Return how many calls of ``tool`` were allowed today (including earlier processes)."""
        with self._lock:
            return self._counts_for_today()[tool]

    def _counts_for_today(self) -> Counter[str]:
        """Return today's counts, re-seeding from the audit log when the day changed (lock held)."""
        today = self.clock().date()
        if today != self._day:
            self._day, self._today = today, self._seed_from_log(today)
        return self._today

    def _seed_from_log(self, day: date) -> Counter[str]:
        """Count the calls the audit log shows as allowed on ``day``."""
        counts: Counter[str] = Counter()
        if self.audit_log is None or not self.audit_log.exists():
            return counts
        zone = self.clock().tzinfo
        with self.audit_log.open(encoding="utf-8") as lines:
            for line in lines:
                try:
                    entry = json.loads(line)
                    when = datetime.fromisoformat(entry["time"])
                except (ValueError, KeyError, TypeError):
                    continue  # a torn last line from a crash must not disable the guard
                if entry.get("event") == "allowed" and when.astimezone(zone).date() == day:
                    counts[entry.get("tool", "")] += 1
        return counts

    def _reserve_daily(self, tool: str) -> bool:
        """Count one call of ``tool`` today if the daily budget allows it."""
        with self._lock:
            counts = self._counts_for_today()
            if counts[tool] >= _limit(self.max_calls_per_day, tool):
                return False
            counts[tool] += 1
            return True

    def daily_budget_left(self, tool: str) -> bool:
        """Whether ``tool`` may still be called today."""
        limit = _limit(self.max_calls_per_day, tool)
        return limit == float("inf") or self.calls_today(tool) < limit

    def audit(self, run_id: str, tool: str, arguments: Any, event: str, reason: str | None = None) -> None:
        """Append one decision to the audit log (no-op without a log)."""
        if self.audit_log is None:
            return
        entry = {"time": self.clock().isoformat(), "run_id": run_id, "tool": tool,
                 "arguments": arguments, "event": event}
        if reason is not None:
            entry["reason"] = reason
        append_line(self.audit_log, json.dumps(entry, ensure_ascii=False, default=str))


def _limit(limits: int | Mapping[str, int] | None, tool: str) -> float:
    """Return the limit that applies to ``tool`` (infinity when none)."""
    if limits is None:
        return float("inf")
    if isinstance(limits, int):
        return limits
    return limits.get(tool, float("inf"))


@dataclass
class GuardedRun:
    """The guard of one run: per-run counts, and the tools refused so far."""

    guardrails: Guardrails
    run_id: str
    calls: Counter[str] = field(default_factory=Counter)
    refused: set[str] = field(default_factory=set)

    def available(self, names: Iterable[str]) -> set[str]:
        """Return the names among ``names`` that may still be called in this run.

        A tool refused earlier in the run stays out: asking again would be refused again
        (or nag the user who already said no), and it keeps the agent from looping on it.
        """
        rules = self.guardrails
        return {name for name in names
                if (rules.allowed_tools is None or name in rules.allowed_tools)
                and name not in self.refused
                and self.calls[name] < _limit(rules.max_calls_per_run, name)
                and rules.daily_budget_left(name)}

    def _static_refusal(self, tool: str) -> str | None:
        """Return why ``tool`` may not run regardless of confirmation, if it may not."""
        rules = self.guardrails
        if rules.allowed_tools is not None and tool not in rules.allowed_tools:
            return f"the tool '{tool}' is not on the allow-list"
        if self.calls[tool] >= _limit(rules.max_calls_per_run, tool):
            return f"the tool '{tool}' has used its budget of calls for this run"
        return None

    def check(self, tool: BaseTool, arguments: Any) -> str | None:
        """Decide on a call: ``None`` when it may run (and count it), else the refusal reason."""
        reason = self._static_refusal(tool.name)
        if reason is None and self.guardrails.is_high_risk(tool):
            try:
                reason = self._confirmation(self._ask(tool, arguments))
            except Exception as error:  # noqa: BLE001 - a broken callback denies, it does not crash the run
                reason = _callback_failed(error)
        return self._settle(tool.name, arguments, reason)

    async def acheck(self, tool: BaseTool, arguments: Any) -> str | None:
        """Async :meth:`check`: a blocking confirmation callback runs in a worker thread."""
        reason = self._static_refusal(tool.name)
        if reason is None and self.guardrails.is_high_risk(tool):
            confirm = self.guardrails.confirm
            if confirm is None:
                reason = self._confirmation(None)
            else:
                request = ToolCallRequest(tool.name, _as_dict(arguments), self.run_id)
                try:
                    answer = (await confirm(request) if inspect.iscoroutinefunction(confirm)
                              else await run_in_executor(None, confirm, request))
                    if inspect.isawaitable(answer):
                        answer = await answer
                    reason = self._confirmation(answer)
                except Exception as error:  # noqa: BLE001 - a broken callback denies, it does not crash the run
                    reason = _callback_failed(error)
        return self._settle(tool.name, arguments, reason)

    def _ask(self, tool: BaseTool, arguments: Any) -> bool | None:
        """Ask the sync confirmation callback; ``None`` when there is none or it is async."""
        confirm = self.guardrails.confirm
        if confirm is None:
            return None
        answer = confirm(ToolCallRequest(tool.name, _as_dict(arguments), self.run_id))
        if inspect.isawaitable(answer):
            if asyncio.iscoroutine(answer):
                answer.close()  # never awaited in a sync run; closing avoids a warning
            return None
        return bool(answer)

    def _confirmation(self, answer: Any) -> str | None:
        """Turn a confirmation answer into a refusal reason (or ``None`` when approved)."""
        if answer is None:
            return "it is high-risk and needs a confirmation, but no confirmation callback could approve it"
        return None if answer else "it is high-risk and the confirmation was denied"

    def _settle(self, tool: str, arguments: Any, reason: str | None) -> str | None:
        """Apply the daily budget, update counts and write the audit line for a decision."""
        if reason is None and not self.guardrails._reserve_daily(tool):
            reason = f"the tool '{tool}' has used its budget of calls for today"
        if reason is None:
            self.calls[tool] += 1
            self.guardrails.audit(self.run_id, tool, arguments, "allowed")
            return None
        self.refused.add(tool)
        self.guardrails.audit(self.run_id, tool, arguments, "refused", reason)
        return reason

    def record(self, tool: str, arguments: Any, *, error: bool) -> None:
        """Write the outcome of an allowed call to the audit log."""
        self.guardrails.audit(self.run_id, tool, arguments, "failed" if error else "completed")


def _callback_failed(error: Exception) -> str:
    """Return the refusal reason when the confirmation callback raised."""
    return f"it is high-risk and the confirmation callback failed ({type(error).__name__}: {error})"


def _as_dict(arguments: Any) -> dict[str, Any]:
    """Show arguments as a dict to the confirmation callback (a bare string becomes ``input``)."""
    return dict(arguments) if isinstance(arguments, Mapping) else {"input": arguments}
