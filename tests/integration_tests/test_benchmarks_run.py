"""Every benchmark without a test of its own runs end to end at tiny sizes (none asserts a figure).

A benchmark is run rarely and by hand; the package's internals change under it (the training
throughput benchmark stopped running when the optimiser became lazy). Each runs here as a
script, in its own process, as the README's "Reproducing the figures" runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kit.scripts import ROOT

RUNS: dict[str, list[str]] = {
    "decision_latency": ["--steps", "5", "--steps-per-run", "5", "--warmup", "1", "--llm-calls", "0",
                         "--json", "{out}/figures.json"],
    "encode_backends": ["--texts", "20", "--workers", "1", "--json", "{out}/figures.json"],
    "many_tools": ["--policy", "default", "--candidates", "100", "--limit", "20", "--json", "{out}/figures.json"],
    "scale": ["--sizes", "1000", "--steps", "5", "--json", "{out}/figures.json"],
    "serve_load": ["--states", "16", "--batch", "8", "--requests", "16", "--clients", "2", "--session-runs", "2",
                   "--json", "{out}/figures.json"],
    "inference": ["--steps", "5", "--steps-per-run", "5", "--warmup", "1", "--json", "{out}/figures.json"],
    "offline_real_data": ["--experiments", "tau2", "--algos", "bc", "--steps", "5", "--out", "{out}"],
    "online_bfcl": ["--steps", "5", "--repeats", "1", "--out", "{out}"],
}
"""Each benchmark's arguments for a run of seconds to two minutes; ``{out}`` is the test's folder."""


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_benchmark_runs_and_writes_its_figures(name: str, tmp_path: Path) -> None:
    arguments = [argument.format(out=tmp_path) for argument in RUNS[name]]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), *arguments], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    written = sorted(tmp_path.rglob("*.json"))
    assert written, f"{name} wrote no figures under {tmp_path}"
    for path in written:
        json.loads(path.read_text())  # every JSON it wrote is whole
