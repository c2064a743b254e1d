"""``PolicyClient`` is exported lazily: ``import evoharness_agent`` loads neither httpx nor FastAPI."""

from __future__ import annotations

import subprocess
import sys


def test_the_package_import_stays_light_and_the_client_is_exported() -> None:
    code = ("import sys, evoharness_agent; "
            "assert not {'fastapi', 'httpx', 'uvicorn', 'prometheus_client'} & set(sys.modules), 'heavy import'; "
            "from evoharness_agent import PolicyClient; "
            "from evoharness_agent.server.client import PolicyClient as direct; assert PolicyClient is direct; "
            "assert 'fastapi' not in sys.modules, 'the client must not need the server'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
