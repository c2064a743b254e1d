"""Train the policy shipped in ``trained/default`` from the bundled data's training splits.

Only training splits are used (BFCL scenarios not 0 mod 5, all four variants; tau2-bench
airline train tasks; the gpt-4o airline runs of tasks 0-39), so every held-out split in
``benchmarks/offline_real_data.py`` stays a fair test of the shipped policy.

Usage: python scripts/train_default.py [--algo cql] [--steps 1500] [--out trained/default]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from evoharness_agent.config import TrainConfig
from evoharness_agent.datasets import (
    bfcl_paths,
    gpt4o_airline_path,
    gpt4o_airline_split,
    read_native,
    split_bfcl,
    tau2_airline_path,
    tau2_airline_split,
)
from evoharness_agent.trainer import train_on_episodes


def main() -> None:
    """Train and write the default policy."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--algo", default="cql")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--out", type=Path, default=Path("trained/default"))
    args = parser.parse_args()
    episodes = []
    for path in bfcl_paths():
        episodes += split_bfcl(read_native(path))[0]
    episodes += tau2_airline_split(read_native(tau2_airline_path()))[0]
    episodes += gpt4o_airline_split(read_native(gpt4o_airline_path()))[0]
    config = TrainConfig.model_validate({"algorithm": {"name": args.algo}, "training": {"steps": args.steps},
                                         "logging": {"tensorboard": False}})
    result = train_on_episodes(episodes, config, args.out)
    # The shipped directory keeps the policy only: checkpoints are for resuming a run.
    for leftover in ("checkpoint", "train_log.json"):
        target = args.out / leftover
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    print(json.dumps(dict(result), indent=2))


if __name__ == "__main__":
    main()
