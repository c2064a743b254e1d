"""The GPU check runs end to end on a CPU (its documented smoke test), so a lent GPU's minutes go to figures."""

from __future__ import annotations

import json
from pathlib import Path

from tests.kit.scripts import load_script

gpu = load_script("gpu", "benchmarks")


def test_gpu_check_runs_on_cpu_and_reports_positive_rates(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    gpu.main(["--device", "cpu", "--transitions", "2000", "--unique-texts", "400", "--tools", "64",
              "--candidates", "8", "--batch-sizes", "64", "--hidden", "16", "--updates", "2", "--warmup", "1",
              "--texts", "16", "--encode-batch", "32", "--json", str(out)])
    report = json.loads(out.read_text())
    assert [row["batch_size"] for row in report["training"]] == [64]
    assert all(row["transitions_per_s"] > 0 for row in report["training"])
    # Fewer texts than one encoder batch: the warm-up must not eat the timed texts.
    assert report["encoder"]["texts"] == 16 and report["encoder"]["texts_per_s"] > 0
    assert report["device"] == "cpu" and report["peak_device_bytes"] is None
