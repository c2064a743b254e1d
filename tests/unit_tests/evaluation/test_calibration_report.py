"""The calibration part of the offline report: the printed line, the plot, and `evaluate --plot`."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from evoharness_agent import cli
from evoharness_agent.evaluation.offline import OfflineReport
from evoharness_agent.evaluation.reports import plot_calibration, print_report
from evoharness_agent.learning.calibration import calibration_report
from evoharness_agent.logs.importers import write_episodes
from tests.kit.synthetic_logs import synthetic_episodes

PNG = b"\x89PNG\r\n\x1a\n"


def _report() -> OfflineReport:
    # 10 decisions at 0.9 (9 right), 10 at 0.5 (5 right): calibrated, ECE 0.
    calibration = calibration_report([0.9] * 10 + [0.5] * 10, [True] * 9 + [False] + [True, False] * 5)
    return OfflineReport(n_decisions=20, metrics={"policy": {"top1": 0.7, "top3": 1.0, "mrr": 0.8}},
                         finish_accuracy=1.0, n_finish_decisions=20, calibration=calibration)


def test_print_report_shows_calibration() -> None:
    buffer = io.StringIO()
    print_report(_report(), "unit", Console(file=buffer, width=400))
    text = buffer.getvalue()
    assert "calibration over 20 decisions" in text
    assert "ECE 0.000 (a calibrated policy: " in text and "coverage at 95% accuracy 0.000" in text
    assert f"{_report().calibration.ece_if_calibrated:.3f} on these decisions" in text
    assert "accuracy 0.700" in text and "mean confidence 0.700" in text


def test_report_curve_is_the_accuracy_coverage_curve() -> None:
    report = _report().calibration
    assert report.curve == [{"coverage": 0.5, "accuracy": pytest.approx(0.9)},
                            {"coverage": 1.0, "accuracy": pytest.approx(0.7)}]
    many = calibration_report([i / 1000 for i in range(1000)], [i % 3 != 0 for i in range(1000)])
    assert len(many.curve) == 100 and many.curve[-1]["coverage"] == 1.0  # thinned, the end kept


def test_plot_calibration_writes_a_png(tmp_path: Path) -> None:
    path = tmp_path / "calibration.png"
    plot_calibration(_report().calibration, path)
    data = path.read_bytes()
    assert data.startswith(PNG) and len(data) > 5000
    plot_calibration(calibration_report([], []), tmp_path / "empty.png")  # no decisions: still a figure
    assert (tmp_path / "empty.png").read_bytes().startswith(PNG)


def test_evaluate_plot_writes_the_calibration_plot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVOHARNESS_CACHE_DIR", str(tmp_path / "cache"))  # never the user's cache
    monkeypatch.setattr(cli, "console", Console(width=400))
    write_episodes(tmp_path / "logs.jsonl", synthetic_episodes())
    (tmp_path / "fast.yaml").write_text("training: {batch_size: 8, device: cpu, threads: 1}\n"
                                        "model: {hidden: 8, history_window: 1}\nlogging: {tensorboard: false}\n")
    runner = CliRunner()
    trained = runner.invoke(cli.app, ["train", "--data", str(tmp_path / "logs.jsonl"), "--out", str(tmp_path / "p"),
                                      "--config", str(tmp_path / "fast.yaml"), "--steps", "5"])
    assert trained.exit_code == 0, trained.output
    evaluated = runner.invoke(cli.app, ["evaluate", "--policy", str(tmp_path / "p"), "--data",
                                        str(tmp_path / "logs.jsonl"), "--baseline-data", str(tmp_path / "logs.jsonl"),
                                        "--json", str(tmp_path / "r.json"),
                                        "--plot", str(tmp_path / "r.png")])
    assert evaluated.exit_code == 0, evaluated.output
    assert (tmp_path / "r.png").read_bytes().startswith(PNG)
    assert (tmp_path / "r_calibration.png").read_bytes().startswith(PNG)
    assert "ECE" in evaluated.output
    calibration = json.loads((tmp_path / "r.json").read_text())["calibration"]
    assert calibration["n_decisions"] == 15  # every decision: 9 tool calls and 6 replies
    assert sum(b["n"] for b in calibration["bins"]) == 15
