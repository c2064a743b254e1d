"""Schemathesis fuzzes the live server from its own OpenAPI schema: never a 5xx, responses as documented."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance, content_type_conformance]


def fuzz(url: str, examples: int) -> list[str]:
    """Run ``examples`` generated cases per operation of the schema; return the operations checked."""
    api = schemathesis.openapi.from_url(f"{url}/openapi.json")
    checked = []
    for result in api.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def run(case: schemathesis.Case) -> None:
            case.call_and_validate(checks=CHECKS, timeout=30)

        run()
        checked.append(operation.label)
    return checked


def test_no_server_error(server_url: str) -> None:
    checked = fuzz(server_url, 25)
    assert {"POST /predict", "POST /predict/batch", "POST /sessions/{session_id}/steps"} <= set(checked)


@pytest.mark.slow
def test_no_server_error_long(server_url: str) -> None:
    fuzz(server_url, 400)
