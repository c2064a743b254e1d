"""``evoharness-agent serve``: a bad policy is a clear error; the real command serves over HTTP."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from evoharness_agent import cli
from tests.kit.live_server import free_port


def test_a_missing_policy_fails_before_serving(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli.app, ["serve", "--policy", str(tmp_path / "missing"), "--port", "1"])
    assert result.exit_code == 2 and "missing" in result.output
    result = CliRunner().invoke(cli.app, ["serve", "--defer-threshold", "1.5"])
    assert result.exit_code == 2 and "defer-threshold" in result.output


def test_the_onnx_backend_needs_an_export(policy_dir: Path) -> None:
    # a trained (not exported) directory: a clear pointer to `evoharness-agent export`, before serving
    result = CliRunner().invoke(cli.app, ["serve", "--policy", str(policy_dir), "--backend", "onnx", "--port", "1"])
    assert result.exit_code == 2 and "export" in result.output


def wait_healthy(url: str, process: subprocess.Popen, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read() if process.stderr else "server exited"
        try:
            return httpx.get(url + "/healthz", timeout=5).json()
        except httpx.TransportError:
            time.sleep(0.5)
    raise AssertionError("the server did not come up")


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_serve_runs_uvicorn_with_the_policy(policy_dir: Path, tmp_path: Path, workers: int) -> None:
    port = free_port()
    env = {**os.environ, "EVOHARNESS_CACHE_DIR": str(tmp_path)}
    process = subprocess.Popen([sys.executable, "-m", "evoharness_agent.cli", "serve", "--policy", str(policy_dir),
                                "--port", str(port), "--workers", str(workers), "--defer-threshold", "0.7"],
                               env=env, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        health = wait_healthy(url, process)
        assert health["defer_threshold"] == 0.7 and health["n_known_tools"] > 0
        decision = httpx.post(url + "/predict", json={"task_description": "What time is it?",
                                                      "available_tools": ["get_time", "calculator"]},
                              timeout=60).json()
        assert decision["selected_tool"] == "get_time"
    finally:
        process.terminate()
        process.wait(timeout=30)
