"""``evoharness-agent demo``: train on real bundled logs, evaluate against baselines, show it."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from evoharness_agent.config import TrainConfig
from evoharness_agent.datasets import bfcl_paths, read_native, split_bfcl
from evoharness_agent.evaluation import evaluate_offline, plot_report, print_report
from evoharness_agent.policy import ToolPolicy
from evoharness_agent.trainer import train_on_episodes

__all__ = ["run_demo"]


def run_demo(out: str | Path, *, steps: int = 1500, console: Console | None = None) -> dict[str, dict]:
    """Train BC and CQL on BFCL base (scenarios ≢ 0 mod 5), evaluate on the held-out fifth."""
    console = console or Console()
    out = Path(out)
    episodes = read_native(bfcl_paths(["base"])[0])
    train_set, test_set = split_bfcl(episodes)
    console.rule("[bold]evoharness-agent demo: BFCL multi-turn (base)")
    console.print(f"{len(train_set)} training scenarios, {len(test_set)} held-out scenarios "
                  "(split by scenario number, never by step)")
    reports = {}
    for algo in ("bc", "cql"):
        config = TrainConfig.model_validate({"algorithm": {"name": algo}, "training": {"steps": steps}})
        train_on_episodes(train_set, config, out / algo)
        policy = ToolPolicy.load(out / algo)
        report = evaluate_offline(policy, test_set, train_set)
        print_report(report, f"{algo} on held-out BFCL scenarios", console)
        plot_report(report, out / f"{algo}_offline.png", title=f"BFCL base, {algo}")
        reports[algo] = report.to_json()

    example = test_set[0]
    console.rule("[bold]one held-out scenario, step by step")
    console.print(f"[bold]task:[/] {example.task}")
    policy = ToolPolicy.load(out / "cql", encoder=policy.encoder)
    session = policy.session(example.task, example.tools)
    for step, available in zip(example.steps, example.availability(), strict=True):
        if step.is_decision:
            ranked = session.rank(available)
            top = ", ".join(f"{s.tool} {s.probability:.2f}" for s in ranked[:3])
            mark = "[green]✓[/]" if ranked[0].tool == step.action else "[red]✗[/]"
            console.print(f"  {mark} gold [bold]{step.action}[/]   policy: {top}")
        else:
            console.print(f"[bold]user:[/] {step.content}")
        session.observe(step)
    console.print(f"plots in {out}/*.png")
    return reports
