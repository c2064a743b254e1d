"""Train the general policy shipped in the package on every bundled domain's training split.

The default must be useful on tools it never saw, so it learns from every domain we have
(BFCL multi-turn and single-turn, MetaTool, StableToolBench, tau-bench and tau2-bench retail
and airline, the logged gpt-4o runs), with random distractor tools from other domains added
to every episode and no per-tool biases (a tool's identity does not carry over; its text
does). Held-out splits stay out, so the figures measured on them stay fair:

* BFCL multi-turn scenarios whose number is 0 mod 5 (all four variants);
* tau2-bench airline's official test split, and tau-bench airline tasks 40-49 (the gpt-4o
  runs' and the replayed test tasks' held-out tasks);
* 14 of tau2-bench retail's 74 tasks, spread over the task ids (:func:`tau2_retail_split`).

The recipe is ``scripts/default_policy.yaml``.

Usage: python scripts/train_default.py [--algo cql] [--steps 2000] [--json result.json]
       [--out evoharness_agent/trained/default]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from collections import Counter
from pathlib import Path

import torch

from evoharness_agent.learning.checkpoints import weights_sha256
from evoharness_agent.learning.config import load_config
from evoharness_agent.learning.cross_fit import CROSS_FIT_DIR
from evoharness_agent.learning.trainer import train_on_episodes
from evoharness_agent.logs.bundled import training_set

RECIPE = Path(__file__).with_name("default_policy.yaml")
"""The shipped policy's training config, with why each setting was chosen."""


def main() -> None:
    """Train and write the default policy."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--algo", default=None, help="algorithm (default: the recipe's, cql)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the recipe's)")
    parser.add_argument("--out", type=Path, default=Path("evoharness_agent/trained/default"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    episodes = training_set("default")
    config = load_config(RECIPE, {"algorithm": {"name": args.algo}, "training": {"steps": args.steps}})
    start = time.perf_counter()
    result = train_on_episodes(episodes, config, args.out)
    seconds = time.perf_counter() - start
    # The shipped directory keeps the policy only: checkpoints are for resuming a run.
    for leftover in ("checkpoint", "checkpoint.previous", "train_log.json", CROSS_FIT_DIR):
        target = args.out / leftover
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    summary = {
        **dict(result), "n_episodes": len(episodes), "seconds": seconds, "config": config.model_dump(),
        "weights_sha256": weights_sha256(args.out),
        "data": dict(Counter(str(ep.metadata["domain"]) for ep in episodes)),
        "hardware": {"device": "cuda" if torch.cuda.is_available() else "cpu", "cpu_count": os.cpu_count(),
                     "torch": torch.__version__, "threads": torch.get_num_threads()},
    }
    print(json.dumps(summary, indent=2, default=str))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2, default=str))


if __name__ == "__main__":
    main()
