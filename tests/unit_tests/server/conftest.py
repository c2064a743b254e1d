"""A live policy server (real uvicorn, loopback) over the really trained test policy."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("fastapi")

from evoharness_agent.policy import ToolPolicy  # noqa: E402
from evoharness_agent.server.app import create_app, serve_in_background  # noqa: E402


@pytest.fixture(scope="module")
def server_url(policy: ToolPolicy) -> Iterator[str]:
    """The base URL of a server over the test policy, for the module's tests."""
    with serve_in_background(create_app(policy, max_body_bytes=256 * 1024)) as url:
        yield url
