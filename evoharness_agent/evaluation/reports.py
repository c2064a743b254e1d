"""Renderings of evaluation reports: rich tables, markdown and PNG plots, offline and online.

The report classes (:class:`~evoharness_agent.evaluation.offline.OfflineReport`,
:class:`~evoharness_agent.evaluation.online.OnlineReport`) hold the numbers and their JSON;
everything a person reads is drawn here.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    # Annotations only: OnlineReport's own renderings call this module.
    from evoharness_agent.evaluation.offline import OfflineReport
    from evoharness_agent.evaluation.online import EpisodeResult, OnlineReport
    from evoharness_agent.learning.calibration import CalibrationReport

__all__ = ["ece_reading", "online_markdown", "plot_calibration", "plot_online_report", "plot_report",
           "print_online_report", "print_report"]


def ece_reading(calibration: Mapping[str, Any]) -> str:
    """Return "ECE x" beside what a calibrated policy would show on the same decisions (``CalibrationReport.to_json``).

    On a hundred decisions a perfectly calibrated policy shows an ECE of about 0.1 by chance alone,
    so an ECE means little without it; JSON written before it was measured gives the ECE alone.
    """
    text = f"ECE {calibration['ece']:.3f}"
    if "ece_if_calibrated" not in calibration:
        return text
    return (f"{text} (a calibrated policy: {calibration['ece_if_calibrated']:.3f} on these decisions, "
            f"up to {calibration['ece_if_calibrated_95']:.3f} 19 times in 20)")


def print_report(report: OfflineReport, title: str, console: Console | None = None) -> None:
    """Print an offline report as a rich table, the policy's row highlighted."""
    console = console or Console()
    table = Table(title=f"{title}: {report.n_decisions} tool-call decisions")
    for column in ("chooser", "top-1", "top-3", "MRR"):
        table.add_column(column, justify="left" if column == "chooser" else "right")
    for name, metrics in report.metrics.items():
        table.add_row(name, f"{metrics['top1']:.3f}", f"{metrics['top3']:.3f}", f"{metrics['mrr']:.3f}",
                      style="bold green" if name == "policy" else None)
    console.print(table)
    console.print(f"policy FINISH accuracy: {report.finish_accuracy:.3f} over {report.n_finish_decisions} decisions")
    calibration = report.calibration
    console.print(f"policy calibration over {calibration.n_decisions} decisions (FINISH among the candidates): "
                  f"{ece_reading(calibration.to_json())}, coverage at 95% accuracy {calibration.coverage_at_95:.3f}, "
                  f"accuracy {calibration.accuracy:.3f}, mean confidence {calibration.mean_confidence:.3f}")


def plot_report(report: OfflineReport, path: str | Path, title: str = "next-tool prediction") -> None:
    """Save a PNG: top-1 / top-3 / MRR bars per chooser, and the policy's most confused tools."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    choosers = list(report.metrics)
    fig, (bars, confused) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    width = 0.8 / 3
    for k, metric in enumerate(("top1", "top3", "mrr")):
        values = [report.metrics[c][metric] for c in choosers]
        bars.bar(np.arange(len(choosers)) + k * width, values, width, label=metric)
    bars.set_xticks(np.arange(len(choosers)) + width, choosers, rotation=15)
    bars.set_ylim(0, 1)
    bars.legend()
    bars.set_title(f"{title} ({report.n_decisions} decisions)")
    errors = sorted(((n, gold, pred) for gold, row in report.confusion.items()
                     for pred, n in row.items() if pred != gold), reverse=True)[:10]
    confused.barh([f"{gold} → {pred}" for _, gold, pred in errors][::-1], [n for n, _, _ in errors][::-1])
    confused.set_title("policy: most frequent confusions (gold → top-1)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_calibration(report: CalibrationReport, path: str | Path, title: str = "policy") -> None:
    """Save a PNG: the reliability diagram, and accuracy against coverage (most confident first)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (reliability, curve) = plt.subplots(1, 2, figsize=(11, 4.5))
    filled = [b for b in report.bins if b["n"]]
    reliability.bar([b["low"] for b in filled], [b["accuracy"] for b in filled],
                    [b["high"] - b["low"] for b in filled], align="edge", edgecolor="black", label="accuracy")
    reliability.plot([b["confidence"] for b in filled], [b["accuracy"] for b in filled], "o", color="tab:red",
                     label="(mean confidence, accuracy)")
    reliability.plot([0, 1], [0, 1], "--", color="gray", label="calibrated")
    reliability.set(xlim=(0, 1), ylim=(0, 1), xlabel="top-choice probability", ylabel="accuracy",
                    title=f"{title}: reliability (ECE {report.ece:.3f}, {report.n_decisions} decisions;\n"
                          f"a calibrated policy: {report.ece_if_calibrated:.3f})")
    reliability.legend(loc="upper left")
    curve.plot([p["coverage"] for p in report.curve], [p["accuracy"] for p in report.curve])
    curve.axhline(0.95, linestyle="--", color="gray", label="95% accuracy")
    curve.axvline(report.coverage_at_95, linestyle=":", color="tab:red",
                  label=f"coverage at 95%: {report.coverage_at_95:.2f}")
    curve.set(xlim=(0, 1), ylim=(0, 1.02), xlabel="coverage (share of decisions taken, most confident first)",
              ylabel="accuracy", title="accuracy vs coverage")
    curve.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_online_report(report: OnlineReport, console: Console | None = None) -> None:
    """Print the summary as a rich table, the policy's row highlighted."""
    console = console or Console()
    table = Table(title=f"online: {report.env}, {report.arguments} arguments")
    columns = ("chooser", "tasks", "success", "turn success", "avg steps", "avg return", "invalid calls")
    for column in columns:
        table.add_column(column, justify="left" if column == "chooser" else "right")
    for name, row in report.summary().items():
        values = [row["success_rate"], row["turn_success_rate"], row["avg_steps"], row["avg_return"],
                  row["invalid_call_rate"]]
        table.add_row(name, str(row["tasks"]),
                      *("n/a" if v is None else f"{v:.3f}" if i != 2 else f"{v:.1f}" for i, v in enumerate(values)),
                      style="bold green" if name.startswith("policy") else None)
    console.print(table)


def online_markdown(report: OnlineReport) -> str:
    """Return a summary table and a per-task table (✓/✗ and steps per chooser)."""
    def cell(value: float | int | None, digits: int = 3) -> str:
        return "n/a" if value is None else f"{value:.{digits}f}"

    names = list(report.results)
    lines = [f"## Online evaluation: {report.env}, {report.arguments} arguments", "",
             "| chooser | tasks | success rate | turn success | avg steps | avg return | invalid-call rate |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, row in report.summary().items():
        lines.append(f"| {name} | {row['tasks']} | {cell(row['success_rate'])} | "
                     f"{cell(row['turn_success_rate'])} | {cell(row['avg_steps'], 1)} | "
                     f"{cell(row['avg_return'], 2)} | {cell(row['invalid_call_rate'])} |")
    lines += ["", "Per task (✓ success, ✗ failure, ? unchecked; decisions taken):", "",
              "| task | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    by_task: dict[str, dict[str, EpisodeResult]] = {}
    for name, runs in report.results.items():
        for run in runs:
            by_task.setdefault(run.task_id, {})[name] = run
    marks = {True: "✓", False: "✗", None: "?"}
    for task_id, by_chooser in by_task.items():
        cells = [f"{marks[by_chooser[n].success]} {by_chooser[n].steps}" if n in by_chooser else "" for n in names]
        lines.append(f"| {task_id} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_online_report(report: OnlineReport, path: str | Path) -> None:
    """Save a PNG: success / turn-success / invalid-call rates, and mean steps and return, per chooser."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = report.summary()
    names = list(summary)
    x = np.arange(len(names))
    fig, (rates, sizes) = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / 3
    for k, metric in enumerate(("success_rate", "turn_success_rate", "invalid_call_rate")):
        values = [summary[n][metric] or 0.0 for n in names]
        rates.bar(x + k * width, values, width, label=metric.replace("_", " "))
    rates.set_xticks(x + width, names, rotation=15)
    rates.set_ylim(0, 1)
    rates.legend()
    rates.set_title(f"{report.env}: rates ({report.arguments} arguments)")
    for k, metric in enumerate(("avg_steps", "avg_return")):
        values = [summary[n][metric] or 0.0 for n in names]
        sizes.bar(x + (k - 0.5) * 0.4, values, 0.4, label=metric.replace("_", " "))
    sizes.axhline(0, color="black", linewidth=0.5)
    sizes.set_xticks(x, names, rotation=15)
    sizes.legend()
    sizes.set_title("mean decisions and return per task")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
