"""The session store: bounded (least recently used goes first) and expiring, on an injected clock."""

from __future__ import annotations

import uuid

import pytest

from evoharness_agent.policy import ToolPolicy
from evoharness_agent.schema import Step
from evoharness_agent.server.sessions import SessionStore


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_sessions_expire_after_ttl_without_use(policy: ToolPolicy) -> None:
    clock = Clock()
    store = SessionStore(policy, max_sessions=10, ttl_s=60.0, clock=clock)
    kept, dropped = store.create("What time is it?", ["get_time"]), store.create("Compute 2 * 3.", ["calculator"])
    clock.now = 50.0
    entry = store.get(kept)  # use renews the lease
    assert entry is not None and store.expires_in(entry) == 60.0
    clock.now = 70.0
    assert store.get(dropped) is None and len(store) == 1
    assert store.get(kept) is not None
    clock.now = 200.0
    assert len(store) == 0 and store.get(kept) is None and not store.delete(kept)


def test_the_store_is_bounded_and_evicts_the_least_recently_used(policy: ToolPolicy) -> None:
    clock = Clock()
    store = SessionStore(policy, max_sessions=2, ttl_s=60.0, clock=clock)
    first = store.create("What time is it?", ["get_time"])
    clock.now = 1.0
    second = store.create("Compute 2 * 3.", ["calculator"])
    clock.now = 2.0
    assert store.get(first) is not None  # first is now the most recently used
    third = store.create("Delete /tmp/a.txt", ["delete_file"])
    assert len(store) == 2 and store.get(second) is None
    assert store.get(first) is not None and store.get(third) is not None
    assert store.delete(third) and len(store) == 1


def test_each_step_is_embedded_once(policy: ToolPolicy) -> None:
    store = SessionStore(policy)
    encoded = policy.encoder.n_encoded
    entry = store.get(store.create(f"What is the weather like in Oslo today? ({uuid.uuid4()})", ["get_weather"]))
    assert entry is not None and policy.encoder.n_encoded == encoded  # the task waits for the first decision
    entry.session.rank()  # the task's and the tools' texts are embedded at the first decision
    assert policy.encoder.n_encoded > encoded
    encoded = policy.encoder.n_encoded
    entry.session.observe(Step(tool="get_weather", arguments={"city": "Oslo"}, observation=f"Snow ({uuid.uuid4()})"))
    assert policy.encoder.n_encoded == encoded + 1  # the new step, once
    entry.session.rank()
    entry.session.rank()
    assert policy.encoder.n_encoded == encoded + 1  # deciding embeds nothing new


def test_bad_bounds_are_refused(policy: ToolPolicy) -> None:
    with pytest.raises(ValueError, match="max_sessions"):
        SessionStore(policy, max_sessions=0)

