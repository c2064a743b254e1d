"""Fine-tuning from the shipped default vs training from scratch, on a few of a user's logs.

For tau2-bench retail (74 tasks: 60 train -> 14 test, ``tau2_retail_split``) and BFCL
multi-turn (scenarios 0 mod 5 held out, all four variants), both trained on the first 10, 25,
50 and all training tasks (a seeded order of tasks; a BFCL task is a scenario with its
variants), with the same config (``training.steps`` unset, as ``train`` leaves it: 1,500 steps
from scratch, about 100 passes over the training decisions from the default, within 500-1,500),
evaluated on the same held-out tasks. The default
it starts from never saw those held-out tasks (``scripts/train_default.py`` leaves them out).
Reported side by side: top-1 over tool calls (FINISH excluded, as ``evaluate`` does) and
the live top-1 over every decision with FINISH among the candidates; and, for those live
decisions, the calibration on the held-out tasks (expected calibration error and coverage at
95% accuracy of the reported probability). The temperature is cross-fitted
(``training.calibration_folds``, 5 folds: every task scored out of fold, so each run trains on all
its tasks, with no validation split).
The JSON records which policy the runs started from (``start``: its weights' sha256), so the
model card can tell when the default has changed since, and the settings (``config``: steps,
calibration folds; ``--calibration-folds 0`` fits the temperature on the validation split alone,
six times faster).

Usage: python benchmarks/fine_tune.py [--domains tau2_retail,bfcl] [--sizes 10,25,50,all]
       [--steps N] [--calibration-folds 5] [--init default] [--json runs/fine_tune.json]
       [--plot runs/fine_tune.png]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.evaluation.offline import evaluate_offline
from evoharness_agent.learning.checkpoints import weights_sha256
from evoharness_agent.learning.config import TrainConfig
from evoharness_agent.learning.trainer import task_group, train_on_episodes
from evoharness_agent.logs.bundled import domain_episodes, split_bfcl, tau2_retail_split
from evoharness_agent.policy import ToolPolicy
from evoharness_agent.schema import Episode

console = Console()


def splits(domain: str) -> tuple[list[Episode], list[Episode]]:
    """Return (train, test) episodes of a domain, split by task."""
    episodes = domain_episodes(domain)
    if domain == "tau2_retail":
        return tau2_retail_split(episodes)
    if domain == "bfcl":
        return split_bfcl(episodes)
    raise ValueError(f"no fine-tuning split for {domain!r}")


def first_tasks(episodes: list[Episode], n: int | None, seed: int) -> list[Episode]:
    """Return the episodes of the first ``n`` tasks in a seeded order (all when ``n`` is None)."""
    groups: dict[str, list[Episode]] = {}
    for position, episode in enumerate(episodes):
        groups.setdefault(task_group(episode, position), []).append(episode)
    order = sorted(groups)
    random.Random(seed).shuffle(order)
    return [ep for key in order[:n] for ep in groups[key]]


def run_config(encoder: StateEncoder, steps: int | None, *, folds: int = 0, seed: int = 0) -> TrainConfig:
    """Return the config of a run on ``encoder``'s embeddings (``steps`` None: unset, as ``train`` leaves it)."""
    # From scratch on the embeddings of the start's encoders: a run from scratch and a fine-tune differ in their
    # start only.
    return TrainConfig.model_validate({"model": {"encoder": encoder.model_name, "step_encoder": encoder.step_model,
                                                 "max_seq_length": encoder.max_seq_length},
                                       "training": {"steps": steps, "calibration_folds": folds, "seed": seed},
                                       "logging": {"tensorboard": False}})


def measure(train: list[Episode], test: list[Episode], init: str | None, steps: int | None, folds: int, out: Path,
            encoder: StateEncoder) -> dict[str, float]:
    """Train (from ``init`` or from scratch) and return top-1, live top-1 and calibration on ``test``."""
    train_on_episodes(train, run_config(encoder, steps, folds=folds), out, encoder=encoder, init=init,
                      show_progress=False)
    policy = ToolPolicy.load(out, encoder=encoder)
    report = evaluate_offline(policy, test, train, encoder=encoder)
    result = {"steps": policy.meta["config"]["training"]["steps"], "top1": report.metrics["policy"]["top1"],
              "top3": report.metrics["policy"]["top3"],
              "live_top1": report.calibration.accuracy, "temperature": policy.temperature,
              "ece": report.calibration.ece, "ece_if_calibrated": report.calibration.ece_if_calibrated,
              "ece_if_calibrated_95": report.calibration.ece_if_calibrated_95,
              "coverage_at_95": report.calibration.coverage_at_95,
              "embedding_similarity_top1": report.metrics["embedding_similarity"]["top1"],
              "bigram_top1": report.metrics["bigram"]["top1"]}
    return result


def _calibration_cell(result: dict[str, float]) -> str:
    """Return "ECE / coverage", then the ECE a calibrated policy would show on the same decisions."""
    cell = f"{result['ece']:.3f} / {result['coverage_at_95']:.3f}"
    if "ece_if_calibrated" in result:
        cell += f"; {result['ece_if_calibrated']:.3f}"
    return cell


def plot(results: dict[str, Any], path: Path) -> None:
    """Save the curves: top-1 against training tasks, from scratch and from the default."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, (domain, rows) in zip(axes[0], results.items(), strict=True):
        sizes = [row["n_tasks"] for row in rows]
        # One colour per start, one line style per measure: the gap between the starts is the point.
        for start, colour in (("scratch", "tab:gray"), ("default", "tab:red")):
            ax.plot(sizes, [row[start]["top1"] for row in rows], "-", color=colour, marker="o",
                    label=f"from {start}: top-1 (FINISH excluded)")
            ax.plot(sizes, [row[start]["live_top1"] for row in rows], "--", color=colour, marker="x",
                    label=f"from {start}: live top-1")
        ax.axhline(0.8, color="tab:green", linestyle=":", linewidth=1, label="target top-1 0.80")
        ax.set_xscale("log")
        ax.set_xticks(sizes, [str(size) for size in sizes])
        ax.minorticks_off()
        ax.set_xlabel("training tasks")
        ax.set_ylabel("held-out accuracy")
        ax.set_ylim(0, 1)
        ax.set_title(domain)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    """Run the curves for each domain, print them and write JSON (and a PNG)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--domains", default="tau2_retail,bfcl")
    parser.add_argument("--sizes", default="10,25,50,all")
    parser.add_argument("--steps", type=int, default=None,
                        help="gradient steps of every run (default: training.steps unset, as `train` leaves it)")
    parser.add_argument("--calibration-folds", type=int, default=5,
                        help="cross-fitting folds of the temperature (0: the validation split alone)")
    parser.add_argument("--init", default="default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/fine_tune"))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    encoder = ToolPolicy.load(args.init).encoder  # the encoders the start policy was trained on
    results: dict[str, Any] = {}
    for domain in args.domains.split(","):
        train, test = splits(domain)
        rows = []
        for size in args.sizes.split(","):
            n = None if size == "all" else int(size)
            subset = first_tasks(train, n, args.seed)
            n_tasks = len({task_group(ep, i) for i, ep in enumerate(subset)})
            row: dict[str, Any] = {"n_tasks": n_tasks, "n_episodes": len(subset)}
            for start, init in (("scratch", None), ("default", args.init)):
                row[start] = measure(subset, test, init, args.steps, args.calibration_folds,
                                     args.out / domain / f"{size}_{start}", encoder)
            rows.append(row)
            console.print(f"{domain} {n_tasks} tasks: scratch {row['scratch']['top1']:.3f} / "
                          f"{row['scratch']['live_top1']:.3f}, from default {row['default']['top1']:.3f} / "
                          f"{row['default']['live_top1']:.3f} (top-1 / live top-1)")
        results[domain] = rows
        table = Table(title=f"{domain}: held-out top-1 (FINISH excluded) / live top-1 (FINISH included)")
        for column in ("training tasks", "scratch", "from default", "embedding similarity"):
            table.add_column(column, justify="right")
        for row in rows:
            table.add_row(str(row["n_tasks"]), f"{row['scratch']['top1']:.3f} / {row['scratch']['live_top1']:.3f}",
                          f"{row['default']['top1']:.3f} / {row['default']['live_top1']:.3f}",
                          f"{row['scratch']['embedding_similarity_top1']:.3f}")
        console.print(table)
        calibration = Table(title=f"{domain}: calibration on the held-out tasks, ECE / coverage at 95% accuracy; "
                                  "the ECE a calibrated policy would show on the same decisions")
        for column in ("training tasks", "scratch", "from default"):
            calibration.add_column(column, justify="right")
        for row in rows:
            calibration.add_row(str(row["n_tasks"]), _calibration_cell(row["scratch"]),
                                _calibration_cell(row["default"]))
        console.print(calibration)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        start = {"policy": str(args.init), "weights_sha256": weights_sha256(args.init)}
        config = {"steps": args.steps, "calibration_folds": args.calibration_folds, "seed": args.seed}
        args.json.write_text(json.dumps({"start": start, "config": config, "domains": results}, indent=2))
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
