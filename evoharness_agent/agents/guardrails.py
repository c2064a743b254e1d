"""Guardrails around tool calls: allow-list, call budgets, confirmation, audit log.

:class:`Guardrails` is configured once and shared by every run of an executor; each run
gets a :class:`GuardedRun` (``guardrails.start_run(run_id)``) that keeps the per-run
counts. A call is refused (and the refusal becomes the step's observation, never an
exception) when the tool is not on the allow-list, its per-run or per-day budget is spent,
or it is high-risk and the confirmation callback did not approve it. Every doubt refuses:

* without a callback a high-risk call is refused (silence is not consent);
* only ``True`` or ``Approval(approved=True)`` approves; ``"yes"``, ``1``, ``{"approved": True}``,
  ``None`` or a callback that raises all refuse, with a refusal text that says why;
* an identical repeat (same tool, same arguments) of a high-risk call already made in the
  run is refused unless the callback, told so by ``ToolCallRequest.repeat``, answers
  ``Approval(approved=True, repeat=True)``;
* a call that cannot be written to the audit log (or whose daily count cannot be read under
  the log's lock) is refused.

Every decision is appended to a JSONL audit log, one object per line, its arguments and
reason scrubbed of personal data (:class:`~evoharness_agent.logs.scrubber.PIIScrubber`)::

    {"time": "2025-01-31T09:12:03.120000+00:00", "run_id": "…", "tool": "delete_file",
     "arguments": {"path": "/tmp/x"}, "event": "refused", "reason": "…"}

``event`` is ``allowed`` (written before the tool runs), ``completed`` or ``failed`` (after
it ran), ``refused``, ``cancelled`` (an async tool stopped with its run) or ``abandoned``
(the run stopped while a sync tool kept running in its worker thread; a ``completed`` or
``failed`` line with the reason :data:`AFTER_STOP` follows when its outcome comes, and the
``abandoned`` line stands when it never can, e.g. the event loop closed first).

Per-day budgets are counted from the ``allowed`` lines of the audit log, so they survive a
restart and hold across processes sharing one log: the count and the ``allowed`` line are
read and written under a file lock (``filelock``, ``<audit_log>.lock``), so two processes
with a budget of 5 allow 5 calls between them, not 10. Without an audit log the daily count
lives in this object only (one process). A torn last line (a crash mid-write, bad UTF-8,
partial JSON) is skipped with a :class:`AuditLogWarning`; the valid lines still count, and the
next line written starts on a line of its own.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import threading
import warnings
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime, timezone, tzinfo
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout
from langchain_core.runnables.config import run_in_executor
from langchain_core.tools import BaseTool

from evoharness_agent.logs.scrubber import PIIScrubber, scrub_value
from evoharness_agent.runtime import append_line

__all__ = [
    "AFTER_STOP",
    "Approval",
    "AuditLogWarning",
    "ConfirmCallback",
    "GuardedRun",
    "Guardrails",
    "ToolCallRequest",
]

HIGH_RISK_METADATA_KEY = "risk"
"""A tool whose ``metadata[HIGH_RISK_METADATA_KEY] == "high"`` needs confirmation."""

AFTER_STOP = "it finished after its run had stopped"
"""The reason on the outcome line of a tool that was still running when its run stopped."""


class AuditLogWarning(UserWarning):
    """A line of the audit log was torn or invalid and was skipped."""


@dataclass(frozen=True)
class ToolCallRequest:
    """A tool call awaiting confirmation: what would run, in which run, and whether it repeats one."""

    tool: str
    arguments: dict[str, Any]
    run_id: str
    repeat: bool = False
    """Whether this run already made this exact call (same tool, same arguments): only
    ``Approval(approved=True, repeat=True)`` lets it run again."""


@dataclass(frozen=True)
class Approval:
    """A confirmation callback's explicit answer.

    Args:
        approved: whether the call may run (``True`` or ``False``, nothing else).
        repeat: approves an identical repeat of a call already made in the run too
            (see :attr:`ToolCallRequest.repeat`).
        note: why; shown in the refusal text when the call is denied.

    """

    approved: bool
    repeat: bool = False
    note: str | None = None

    def __post_init__(self) -> None:
        """Refuse anything but real booleans: ``Approval(approved="no")`` must not read as yes."""
        for name in ("approved", "repeat"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"Approval.{name} must be True or False, got {getattr(self, name)!r}")


ConfirmCallback = Callable[[ToolCallRequest], "bool | Approval | Awaitable[bool | Approval]"]
"""Approves (``True`` or ``Approval(approved=True)``) or denies a high-risk call; may be sync or async."""


def _now() -> datetime:
    """Return the current local time, timezone-aware."""
    return datetime.now(timezone.utc).astimezone()


def _names(value: str | Iterable[str], parameter: str) -> frozenset[str]:
    """Return the tool names of ``value``: one name for a string, else the collection's names."""
    if isinstance(value, str):
        return frozenset({value})
    if isinstance(value, (bytes, bytearray, Mapping)) or not isinstance(value, Iterable):
        raise TypeError(f"Guardrails({parameter}=...) takes a tool name or a collection of tool names, "
                        f"got {type(value).__name__}")
    names = list(value)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"Guardrails({parameter}=...): tool names are strings, got {name!r}")
    return frozenset(names)


def _limits(value: int | Mapping[str, int] | None, parameter: str) -> int | dict[str, int] | None:
    """Check a budget: ``None``, a count for every tool, or ``{tool: count}`` (counts are ints >= 0)."""
    if value is None:
        return None
    counts = value if isinstance(value, Mapping) else {"": value}
    for tool, count in counts.items():
        if not isinstance(tool, str) or isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise TypeError(f"Guardrails({parameter}=...) takes a count >= 0 or {{tool name: count}}, "
                            f"got {value!r}")
    return dict(value) if isinstance(value, Mapping) else value


class Guardrails:
    """Rules every tool call must pass; shared by all runs of an executor (and processes, via the log).

    Args:
        allowed_tools: the only tool names that may run (``None``: every tool); a string is one name.
        max_calls_per_run: a limit per tool and run; an int applies to every tool.
        max_calls_per_day: a limit per tool and calendar day; an int applies to every tool. With an
            ``audit_log`` it holds across restarts and across processes sharing the log (a file lock
            guards the count); without one, within this object only.
        high_risk: tool names that need ``confirm`` to approve each call (tools whose
            ``metadata["risk"] == "high"`` count too); a string is one name.
        confirm: called with a :class:`ToolCallRequest` for each high-risk call; only ``True`` or
            ``Approval(approved=True)`` approves.
        audit_log: a JSONL file every decision is appended to (``None``: no log).
        clock: returns the current time (aware datetime); tests move the day with it.
        scrubber: turns each string of the logged arguments and reasons into its scrubbed form
            (default: a :class:`PIIScrubber`).
        lock_timeout: seconds to wait for the audit log's lock; a call that cannot get it is refused.

    Raises:
        TypeError: a name list or budget of the wrong type (``high_risk=5``, ``max_calls_per_run="3"``).

    """

    def __init__(
        self,
        *,
        allowed_tools: str | Iterable[str] | None = None,
        max_calls_per_run: int | Mapping[str, int] | None = None,
        max_calls_per_day: int | Mapping[str, int] | None = None,
        high_risk: str | Iterable[str] = (),
        confirm: ConfirmCallback | None = None,
        audit_log: str | Path | None = None,
        clock: Callable[[], datetime] = _now,
        scrubber: Callable[[str], str] | None = None,
        lock_timeout: float = 30.0,
    ) -> None:
        self.allowed_tools = None if allowed_tools is None else _names(allowed_tools, "allowed_tools")
        self.max_calls_per_run = _limits(max_calls_per_run, "max_calls_per_run")
        self.max_calls_per_day = _limits(max_calls_per_day, "max_calls_per_day")
        self.high_risk = _names(high_risk, "high_risk")
        self.confirm = confirm
        self.audit_log = Path(audit_log) if audit_log is not None else None
        self.clock = clock
        self.scrubber: Callable[[str], str] = scrubber or PIIScrubber()
        self.lock_timeout = lock_timeout
        # Concurrent runs (batch, async) share the counts: the thread lock guards them in this
        # process, the file lock across the processes that share the audit log.
        self._lock = threading.Lock()
        self._file_lock = (FileLock(f"{self.audit_log}.lock", timeout=lock_timeout)
                           if self.audit_log is not None else None)
        self._allowed: Counter[tuple[date, str]] = Counter()
        """Allowed calls per (day, tool): read from the audit log, or counted here without one."""
        self._zone: tzinfo | None = None
        self._offset = 0
        self._lines_read = 0

    def start_run(self, run_id: str) -> GuardedRun:
        """Return the guard of one run, with fresh per-run counts."""
        return GuardedRun(self, run_id)

    def is_high_risk(self, tool: BaseTool | str) -> bool:
        """Whether calls to ``tool`` need confirmation."""
        if isinstance(tool, str):
            return tool in self.high_risk
        return tool.name in self.high_risk or (tool.metadata or {}).get(HIGH_RISK_METADATA_KEY) == "high"

    def calls_today(self, tool: str) -> int:
        """Return how many calls of ``tool`` were allowed today (including earlier and other processes)."""
        with self._locked():
            return self._counts_today()[tool]

    def daily_budget_left(self, tool: str) -> bool:
        """Whether ``tool`` may still be called today."""
        limit = _limit(self.max_calls_per_day, tool)
        return limit == float("inf") or self.calls_today(tool) < limit

    def audit(self, run_id: str, tool: str, arguments: Any, event: str, reason: str | None = None) -> None:
        """Append one decision to the audit log (no-op without a log); a failed write only warns."""
        if self.audit_log is None:
            return
        try:
            with self._locked():
                self._write(run_id, tool, arguments, event, reason)
        except (OSError, Timeout):
            # Not written under the lock: still one whole O_APPEND line; the count is unaffected
            # (only ``allowed`` lines count, and those are written by _admit, which refuses instead).
            try:
                append_line(self.audit_log, self._line(run_id, tool, arguments, event, reason))
            except OSError as error:
                warnings.warn(f"audit log {self.audit_log}: could not write a {event!r} line for {tool!r} ({error})",
                              AuditLogWarning, stacklevel=2)

    # -- the daily count, shared through the audit log ---------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the thread lock and, with an audit log, its file lock (raises ``Timeout``)."""
        with self._lock:
            if self._file_lock is None:
                yield
            else:
                with self._file_lock:
                    yield

    def _admit(self, run_id: str, tool: str, arguments: Any) -> str | None:
        """Count one call of ``tool`` today and log it as allowed, or return why it may not run.

        Reading the count and writing the ``allowed`` line happen under one lock, so concurrent
        runs and processes cannot both take the last call of a budget.
        """
        try:
            with self._locked():
                if self._counts_today()[tool] >= _limit(self.max_calls_per_day, tool):
                    return f"the tool '{tool}' has used its budget of calls for today"
                if self.audit_log is None:
                    self._allowed[(self.clock().date(), tool)] += 1
                else:
                    self._write(run_id, tool, arguments, "allowed")  # counted when the log is read next
        except Timeout:
            return (f"the audit log {self.audit_log} stayed locked for {self.lock_timeout:g} s, "
                    "so the call cannot be logged")
        except OSError as error:
            return f"the audit log {self.audit_log} could not be read or written ({error})"
        return None

    def _counts_today(self) -> Counter[str]:
        """Return today's allowed calls per tool, reading what the audit log gained since last time (locks held)."""
        now = self.clock()
        if self.audit_log is not None:
            self._read_log(now.tzinfo)
        today = now.date()
        return Counter({tool: count for (day, tool), count in self._allowed.items() if day == today})

    def _read_log(self, zone: tzinfo | None) -> None:
        """Count the ``allowed`` lines appended to the audit log since the last read (locks held)."""
        assert self.audit_log is not None
        if not self.audit_log.exists():
            data = b""
        else:
            with self.audit_log.open("rb") as log:
                size = os.fstat(log.fileno()).st_size
                if zone != self._zone or size < self._offset:  # another time zone (DST), or a rotated log
                    self._zone, self._offset, self._lines_read = zone, 0, 0
                    self._allowed.clear()
                log.seek(self._offset)
                data = log.read(size - self._offset)
        if not data:
            return
        *complete, tail = data.split(b"\n")
        for number, raw in enumerate(complete, start=self._lines_read + 1):
            self._count_line(raw, number, zone, torn=False)
        if tail:  # no line end: a writer crashed mid-line; the next write ends it (see _write)
            self._count_line(tail, self._lines_read + len(complete) + 1, zone, torn=True)
        self._offset += len(data)
        self._lines_read += len(complete)

    def _count_line(self, raw: bytes, number: int, zone: tzinfo | None, *, torn: bool) -> None:
        """Count one audit line if it is an ``allowed`` entry; warn and skip it when it is unreadable."""
        if not raw.strip():
            return  # the line end written after a torn line
        try:
            entry = json.loads(raw.decode("utf-8"))
            event, tool = entry["event"], entry["tool"]
            when = datetime.fromisoformat(entry["time"]).astimezone(zone)
        except (ValueError, KeyError, TypeError) as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            what = "is torn (no line end: a crash mid-write?)" if torn else f"is not an audit entry ({error})"
            warnings.warn(f"audit log {self.audit_log}: line {number} {what}; skipped, the valid lines still count",
                          AuditLogWarning, stacklevel=2)
            return
        if event == "allowed" and isinstance(tool, str):
            self._allowed[(when.date(), tool)] += 1

    def _line(self, run_id: str, tool: str, arguments: Any, event: str, reason: str | None) -> str:
        """Return the JSON line of one decision, arguments and reason scrubbed."""
        entry: dict[str, Any] = {"time": self.clock().isoformat(), "run_id": run_id, "tool": tool,
                                 "arguments": scrub_value(arguments, self.scrubber), "event": event}
        if reason is not None:
            entry["reason"] = self.scrubber(reason)
        # ASCII escapes: a lone surrogate from an LLM's arguments cannot make the line unwritable.
        return json.dumps(entry, default=str)

    def _write(self, run_id: str, tool: str, arguments: Any, event: str, reason: str | None = None) -> None:
        """Append one decision line (locks held); after a torn last line, end that line first."""
        assert self.audit_log is not None
        line = self._line(run_id, tool, arguments, event, reason)
        append_line(self.audit_log, "\n" + line if _ends_mid_line(self.audit_log) else line)


def _ends_mid_line(path: Path) -> bool:
    """Whether ``path`` ends without a line end (a torn last line)."""
    try:
        with path.open("rb") as log:
            if log.seek(0, os.SEEK_END) == 0:
                return False
            log.seek(-1, os.SEEK_END)
            return log.read(1) != b"\n"
    except FileNotFoundError:
        return False


def _limit(limits: int | Mapping[str, int] | None, tool: str) -> float:
    """Return the limit that applies to ``tool`` (infinity when none)."""
    if limits is None:
        return float("inf")
    if isinstance(limits, int):
        return limits
    return limits.get(tool, float("inf"))


_NO_CALLBACK = "it is high-risk and needs a confirmation, but no confirmation callback could approve it"
_ASYNC_IN_SYNC = ("it is high-risk and its confirmation callback is async, which a sync run cannot await "
                  "(use ainvoke, or a sync callback)")
_DENIED = "it is high-risk and the confirmation was denied"
_REPEAT = ("it repeats a high-risk call already made in this run (same tool, same arguments), and the "
           "confirmation did not approve the repeat explicitly (Approval(approved=True, repeat=True))")


def _verdict(answer: Any, request: ToolCallRequest) -> str | None:
    """Turn a confirmation callback's answer into a refusal reason, or ``None`` for an explicit approval."""
    if isinstance(answer, Approval):
        if not answer.approved:
            return f"{_DENIED}: {answer.note}" if answer.note else _DENIED
        return _REPEAT if request.repeat and not answer.repeat else None
    if answer is True:
        return _REPEAT if request.repeat else None
    if answer is False:
        return _DENIED
    shown = repr(answer)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return (f"it is high-risk and the confirmation callback returned {shown} ({type(answer).__name__}), which is "
            "not an approval: only True or Approval(approved=True) runs it")


def _callback_failed(error: Exception) -> str:
    """Return the refusal reason when the confirmation callback raised."""
    return f"it is high-risk and the confirmation callback failed ({type(error).__name__}: {error})"


def _as_dict(arguments: Any) -> dict[str, Any]:
    """Show arguments as a dict to the confirmation callback (a bare string becomes ``input``)."""
    return dict(arguments) if isinstance(arguments, Mapping) else {"input": arguments}


def _call_key(tool: str, arguments: Any) -> tuple[str, str]:
    """Return what makes two calls identical: the tool and its arguments, key order aside."""
    return tool, json.dumps(_as_dict(arguments), sort_keys=True, default=str)


@dataclass
class GuardedRun:
    """The guard of one run: per-run counts, the calls made, and the tools refused so far."""

    guardrails: Guardrails
    run_id: str
    calls: Counter[str] = field(default_factory=Counter)
    refused: set[str] = field(default_factory=set)
    made: set[tuple[str, str]] = field(default_factory=set)
    """The (tool, arguments) of every call allowed in this run, for spotting identical repeats."""

    def available(self, names: Iterable[str]) -> set[str]:
        """Return the names among ``names`` that may still be called in this run.

        A tool refused earlier in the run stays out: asking again would be refused again
        (or nag the user who already said no), and it keeps the agent from looping on it.
        """
        rules = self.guardrails
        today: Counter[str] | None = Counter()
        if rules.max_calls_per_day is not None:
            try:
                with rules._locked():
                    today = rules._counts_today()
            except (OSError, Timeout):
                today = None  # the daily counts cannot be read: no tool with a daily limit is offered
        return {name for name in names
                if (rules.allowed_tools is None or name in rules.allowed_tools)
                and name not in self.refused
                and self.calls[name] < _limit(rules.max_calls_per_run, name)
                and (today[name] < _limit(rules.max_calls_per_day, name) if today is not None
                     else _limit(rules.max_calls_per_day, name) == float("inf"))}

    def _static_refusal(self, tool: str) -> str | None:
        """Return why ``tool`` may not run regardless of confirmation, if it may not."""
        rules = self.guardrails
        if rules.allowed_tools is not None and tool not in rules.allowed_tools:
            return f"the tool '{tool}' is not on the allow-list"
        if self.calls[tool] >= _limit(rules.max_calls_per_run, tool):
            return f"the tool '{tool}' has used its budget of calls for this run"
        return None

    def _request(self, tool: BaseTool, arguments: Any) -> ToolCallRequest:
        """Return what the confirmation callback is asked about."""
        return ToolCallRequest(tool.name, _as_dict(arguments), self.run_id,
                               repeat=_call_key(tool.name, arguments) in self.made)

    def check(self, tool: BaseTool, arguments: Any) -> str | None:
        """Decide on a call: ``None`` when it may run (and count it), else the refusal reason."""
        reason = self._static_refusal(tool.name)
        confirm = self.guardrails.confirm
        if reason is None and self.guardrails.is_high_risk(tool):
            if confirm is None:
                reason = _NO_CALLBACK
            else:
                request = self._request(tool, arguments)
                try:
                    answer = confirm(request)
                    if inspect.isawaitable(answer):
                        if asyncio.iscoroutine(answer):
                            answer.close()  # never awaited in a sync run; closing avoids a warning
                        reason = _ASYNC_IN_SYNC
                    else:
                        reason = _verdict(answer, request)
                except Exception as error:  # noqa: BLE001 - a broken callback denies, it does not crash the run
                    reason = _callback_failed(error)
        return self._settle(tool.name, arguments, reason)

    async def acheck(self, tool: BaseTool, arguments: Any) -> str | None:
        """Async :meth:`check`: a blocking confirmation callback runs in a worker thread."""
        reason = self._static_refusal(tool.name)
        confirm = self.guardrails.confirm
        if reason is None and self.guardrails.is_high_risk(tool):
            if confirm is None:
                reason = _NO_CALLBACK
            else:
                request = self._request(tool, arguments)
                try:
                    answer = (await confirm(request) if inspect.iscoroutinefunction(confirm)
                              else await run_in_executor(None, confirm, request))
                    if inspect.isawaitable(answer):
                        answer = await answer
                    reason = _verdict(answer, request)
                except Exception as error:  # noqa: BLE001 - a broken callback denies, it does not crash the run
                    reason = _callback_failed(error)
        return self._settle(tool.name, arguments, reason)

    def _settle(self, tool: str, arguments: Any, reason: str | None) -> str | None:
        """Apply the daily budget, update counts and write the audit line for a decision."""
        if reason is None:
            reason = self.guardrails._admit(self.run_id, tool, arguments)
        if reason is None:
            self.calls[tool] += 1
            self.made.add(_call_key(tool, arguments))
            return None
        self.refused.add(tool)
        self.guardrails.audit(self.run_id, tool, arguments, "refused", reason)
        return reason

    def record(self, tool: str, arguments: Any, *, error: bool, after_stop: bool = False) -> None:
        """Write the outcome of an allowed call to the audit log (``after_stop``: it came after the run stopped)."""
        self.guardrails.audit(self.run_id, tool, arguments, "failed" if error else "completed",
                              AFTER_STOP if after_stop else None)

    def stopped(self, tool: str, arguments: Any, *, still_running: bool) -> None:
        """Write that the run stopped during an allowed call: ``abandoned`` (its thread runs on) or ``cancelled``."""
        if still_running:
            self.guardrails.audit(self.run_id, tool, arguments, "abandoned",
                                  "the run stopped while the tool was still running in its worker thread; "
                                  "its outcome follows when it comes")
        else:
            self.guardrails.audit(self.run_id, tool, arguments, "cancelled", "the run stopped during the call")
