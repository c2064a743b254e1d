"""Next-tool prediction on the bundled real data, policy vs baselines, split by task.

Experiments (all splits by task/scenario, never by step):

* ``bfcl``: train on BFCL multi-turn scenarios whose number is not 0 mod 5 (all four
  variants), evaluate on the others, per variant and pooled;
* ``tau2``: tau2-bench airline, 30 train tasks -> 20 test tasks;
* ``gpt4o``: 200 logged gpt-4o airline runs with mixed rewards: train on the runs of 40
  tasks, evaluate on the successful runs of the other 10. ``bc_success`` is BC on the
  successful training runs only, the usual way to use rewards without RL.

Usage: python benchmarks/offline_real_data.py [--experiments bfcl,tau2,gpt4o]
       [--algos bc,iql,cql,bcq] [--steps 1500] [--out runs/real_data]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.evaluation.offline import evaluate_offline
from evoharness_agent.evaluation.reports import plot_report, print_report
from evoharness_agent.learning.config import TrainConfig
from evoharness_agent.learning.trainer import train_on_episodes
from evoharness_agent.logs.bundled import (
    bfcl_paths,
    gpt4o_airline_path,
    gpt4o_airline_split,
    read_native,
    split_bfcl,
    tau2_airline_path,
    tau2_airline_split,
)
from evoharness_agent.policy import ToolPolicy

console = Console()


def experiments(names: list[str]) -> dict[str, tuple[list, dict[str, list]]]:
    """Return {experiment: (train episodes, {eval split name: episodes})}."""
    out = {}
    if "bfcl" in names:
        train, tests = [], {}
        for variant, path in zip(("base", "miss_func", "miss_param", "long_context"), bfcl_paths(), strict=True):
            variant_train, variant_test = split_bfcl(read_native(path))
            train += variant_train
            tests[f"bfcl_{variant}"] = variant_test
        tests["bfcl_all"] = [ep for split in list(tests.values()) for ep in split]
        out["bfcl"] = (train, tests)
    if "tau2" in names:
        train, test = tau2_airline_split(read_native(tau2_airline_path()))
        out["tau2"] = (train, {"tau2_airline": test})
    if "gpt4o" in names:
        train, test = gpt4o_airline_split(read_native(gpt4o_airline_path()))
        out["gpt4o"] = (train, {"gpt4o_airline_successes": test})
    return out


def main() -> None:
    """Run the experiments and print/write the tables."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--experiments", default="bfcl,tau2,gpt4o")
    parser.add_argument("--algos", default="bc,iql,cql,bcq")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/real_data"))
    args = parser.parse_args()
    encoder = StateEncoder()
    results: dict[str, dict] = {}
    for name, (train, tests) in experiments(args.experiments.split(",")).items():
        algos = args.algos.split(",") + (["bc_success"] if name == "gpt4o" else [])
        for algo in algos:
            episodes = [ep for ep in train if (ep.reward or 0) >= 1.0] if algo == "bc_success" else train
            config = TrainConfig.model_validate({
                "algorithm": {"name": "bc" if algo == "bc_success" else algo},
                # Rankings only: no temperature is reported, so no cross-fitting (tau2 and the gpt-4o runs
                # have validation splits small enough for "auto" to train five more models each).
                "training": {"steps": args.steps, "seed": args.seed, "calibration_folds": 0},
                "logging": {"tensorboard": False}})
            run_dir = args.out / name / algo
            train_on_episodes(episodes, config, run_dir, encoder=encoder, show_progress=False)
            policy = ToolPolicy.load(run_dir, encoder=encoder)
            for split, test in tests.items():
                report = evaluate_offline(policy, test, train)
                print_report(report, f"{split} / {algo} (trained on {len(episodes)} episodes)", console)
                plot_report(report, run_dir / f"{split}.png", title=f"{split}, {algo}")
                results[f"{split}/{algo}"] = report.to_json()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    console.print(f"results in {args.out / 'results.json'}")


if __name__ == "__main__":
    main()
