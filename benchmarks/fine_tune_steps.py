"""How many gradient steps a fine-tune should take: the validation sweep behind ``training.steps`` unset.

For BFCL and tau2-bench retail, the training tasks only (``benchmarks/fine_tune.py``'s split; the
held-out tasks are never read) are split by task: a seeded fifth for validation, the rest to
fine-tune on (its first N tasks, seeded, for each size). Every fine-tune starts from the policy
``benchmarks/transfer.py`` trained without that domain (``--start-dir``: ``bfcl`` and
``tau_retail``, which also left tau2 retail out), so the start has never seen a validation task, as
the shipped default has never seen a user's tools (the default itself trained on these training
tasks, so it cannot judge them). Reported per size and number of steps, averaged over seeds: top-1
and top-3 over tool calls, and the live top-1 over every decision with FINISH among the candidates.

Usage: python benchmarks/fine_tune_steps.py [--domains tau2_retail,bfcl] [--sizes 10,25,all]
       [--steps 250,500,1000,1500] [--seeds 2] [--start-dir runs/transfer] [--json runs/fine_tune_steps.json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))  # fine_tune.py, beside this script

from fine_tune import first_tasks, run_config, splits  # noqa: E402

from evoharness_agent.encoding.embedder import StateEncoder  # noqa: E402
from evoharness_agent.evaluation.offline import evaluate_offline  # noqa: E402
from evoharness_agent.learning.trainer import task_group, train_on_episodes  # noqa: E402
from evoharness_agent.policy import ToolPolicy  # noqa: E402
from evoharness_agent.schema import Episode  # noqa: E402

console = Console()
START = {"bfcl": "bfcl", "tau2_retail": "tau_retail"}
"""The ``benchmarks/transfer.py`` policy each domain's fine-tunes start from (left out: that domain)."""
SPLIT_SEED = 7


def validation_split(domain: str) -> tuple[list[Episode], list[Episode]]:
    """Return (fine-tune, validation) episodes: the domain's training tasks, a seeded fifth of them for validation."""
    train, _ = splits(domain)
    groups = sorted({task_group(episode, i) for i, episode in enumerate(train)})
    held = set(random.Random(SPLIT_SEED).sample(groups, len(groups) // 5))
    inner = [episode for i, episode in enumerate(train) if task_group(episode, i) not in held]
    return inner, [episode for i, episode in enumerate(train) if task_group(episode, i) in held]


def sweep(domain: str, sizes: list[int | None], steps: list[int], seeds: int, start: Path, out: Path,
          encoder: StateEncoder) -> list[dict[str, Any]]:
    """Fine-tune at every size, number of steps and seed; return the validation figures averaged over seeds."""
    inner, validation = validation_split(domain)
    rows = []
    for size in sizes:
        for n_steps in steps:
            figures, decisions = [], 0
            for seed in range(seeds):
                subset = first_tasks(inner, size, seed)
                decisions = sum(step.is_decision for episode in subset for step in episode.steps)
                run = out / domain / f"{size or 'all'}_{n_steps}_{seed}"
                train_on_episodes(subset, run_config(encoder, n_steps, seed=seed), run, encoder=encoder, init=start,
                                  show_progress=False)
                report = evaluate_offline(ToolPolicy.load(run, encoder=encoder), validation, inner, encoder=encoder)
                figures.append([report.metrics["policy"]["top1"], report.metrics["policy"]["top3"],
                                report.calibration.accuracy])
            mean = np.mean(figures, axis=0)
            rows.append({"tasks": size or "all", "decisions": decisions, "steps": n_steps, "top1": float(mean[0]),
                         "top3": float(mean[1]), "live_top1": float(mean[2])})
            console.print(f"{domain} {size or 'all'} tasks ({decisions} decisions), {n_steps} steps: "
                          f"top-1 {mean[0]:.3f}, top-3 {mean[1]:.3f}, live {mean[2]:.3f}")
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    """Run the sweep for each domain, print it and write JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--domains", default="tau2_retail,bfcl")
    parser.add_argument("--sizes", default="10,25,all")
    parser.add_argument("--steps", default="250,500,1000,1500")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--start-dir", type=Path, default=Path("runs/transfer"),
                        help="benchmarks/transfer.py's --out: its left-out policies are the starts")
    parser.add_argument("--out", type=Path, default=Path("runs/fine_tune_steps"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    encoder = ToolPolicy.load("default").encoder  # the transfer policies embed as the default does
    sizes = [None if size == "all" else int(size) for size in args.sizes.split(",")]
    steps = [int(n) for n in args.steps.split(",")]
    results = {}
    for domain in args.domains.split(","):
        start = args.start_dir / START[domain]
        if not (start / "policy.json").exists():
            raise SystemExit(f"{start}: no policy; run python benchmarks/transfer.py --leave-out {START[domain]} first")
        results[domain] = sweep(domain, sizes, steps, args.seeds, start, args.out, encoder)
        table = Table(title=f"{domain}: validation tasks, fine-tuned from the policy that never saw the domain")
        for column in ("tasks", "decisions", "steps", "top-1", "top-3", "live top-1"):
            table.add_column(column, justify="right")
        for row in results[domain]:
            table.add_row(str(row["tasks"]), str(row["decisions"]), str(row["steps"]), f"{row['top1']:.3f}",
                          f"{row['top3']:.3f}", f"{row['live_top1']:.3f}")
        console.print(table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"seeds": args.seeds, "domains": results}, indent=2))


if __name__ == "__main__":
    main()
