"""A bounded store of live policy sessions, each expiring after a while without use.

A session is the server side of one agent run: a :class:`~evoharness_agent.policy.PolicySession`
that embeds the task once and each new step once, as the executor does locally (here with the
decisions of other sessions ranked at the same time, in one encoder call). The store holds
at most ``max_sessions``; when full, the session used longest ago makes room. A client whose
session expired or was evicted gets a 404 and opens a new one with the run's steps so far
(:class:`~evoharness_agent.server.client.PolicyClient` does this itself).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from evoharness_agent.policy import PolicySession, ToolPolicy

__all__ = ["MAX_SESSION_STEPS", "SessionEntry", "SessionStore"]

MAX_SESSION_STEPS = 2048
"""The most steps one session may hold (its memory is bounded like the store's)."""


@dataclass
class SessionEntry:
    """A stored session, the lock that serialises its requests, and when it was last used."""

    session: PolicySession
    last_used: float
    lock: threading.Lock = field(default_factory=threading.Lock)


class SessionStore:
    """Live sessions by id: at most ``max_sessions``, each dropped ``ttl_s`` seconds after its last use."""

    def __init__(self, policy: ToolPolicy, *, max_sessions: int = 1024, ttl_s: float = 900.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """Keep sessions of ``policy``; ``clock`` is injectable so expiry can be tested without sleeping."""
        if max_sessions < 1 or ttl_s <= 0:
            raise ValueError(f"max_sessions must be >= 1 and ttl_s > 0, got {max_sessions} and {ttl_s}")
        self.policy = policy
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, SessionEntry] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Return the number of live sessions."""
        with self._lock:
            self._expire(self._clock())
            return len(self._entries)

    def _expire(self, now: float) -> None:
        """Drop the sessions unused for ``ttl_s`` (called with the lock held)."""
        while self._entries:
            session_id, entry = next(iter(self._entries.items()))
            if now - entry.last_used < self.ttl_s:
                break
            del self._entries[session_id]

    def create(self, task: str, tools: Sequence[Any]) -> str:
        """Open a session and return its id; its task is embedded with its first decision's other new texts."""
        session = self.policy.session(task, tools, embed=False)
        session_id = secrets.token_urlsafe(16)
        with self._lock:
            now = self._clock()
            self._expire(now)
            while len(self._entries) >= self.max_sessions:
                self._entries.popitem(last=False)
            self._entries[session_id] = SessionEntry(session, now)
        return session_id

    def get(self, session_id: str) -> SessionEntry | None:
        """Return the live session ``session_id`` (marking it used), or ``None``."""
        with self._lock:
            now = self._clock()
            self._expire(now)
            entry = self._entries.get(session_id)
            if entry is not None:
                entry.last_used = now
                self._entries.move_to_end(session_id)
            return entry

    def expires_in(self, entry: SessionEntry) -> float:
        """Seconds until ``entry`` expires unless used again."""
        return max(0.0, entry.last_used + self.ttl_s - self._clock())

    def delete(self, session_id: str) -> bool:
        """Close a session; return whether it was live."""
        with self._lock:
            self._expire(self._clock())
            return self._entries.pop(session_id, None) is not None
