"""Transfer to a domain never trained on: leave one whole domain out, policy vs embedding similarity.

For each left-out domain, a policy is trained on every other bundled domain (minus the
domains that share users or scenarios with it: tau-bench and tau2-bench airline, and their
retail pair) and evaluated on the left-out domain's logged decisions, beside the baselines
in the same run (embedding similarity, bigram and frequency fit on the training logs, random).
Hyperparameters are chosen on the validation domains (``stabletoolbench``, ``bfcl_single``),
never on the reported ones.

Usage: python benchmarks/transfer.py [--leave-out bfcl,tau_retail,tau2_airline,metatool]
       [--algo cql] [--steps 2000] [--distractors 8] [--answer-only-share 0.0] [--composed-share 0.5]
       [--tool-bias] [--prerequisite-penalty 3] [--prerequisite-finish-penalty 3]
       [--open-part-finish-penalty 2] [--open-part-threshold 0.25] [--set model.hidden=32]
       [--json runs/transfer.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.evaluation.offline import evaluate_offline
from evoharness_agent.evaluation.reports import print_report
from evoharness_agent.learning.config import TrainConfig
from evoharness_agent.learning.trainer import train_on_episodes
from evoharness_agent.logs.bundled import DOMAINS, all_domain_episodes
from evoharness_agent.policy import ToolPolicy
from evoharness_agent.schema import Episode

console = Console()

SIBLINGS = {"tau_retail": {"tau2_retail"}, "tau2_retail": {"tau_retail"},
            "tau_airline": {"tau2_airline"}, "tau2_airline": {"tau_airline"}}
"""Domains that share users, orders or scenarios: leaving one out leaves its sibling out too."""
REPORTED = ("bfcl", "tau_retail", "tau2_airline", "metatool")
VALIDATION = ("stabletoolbench", "bfcl_single")


def training_domains(left_out: str) -> list[str]:
    """Return the domains a policy for ``left_out`` may train on."""
    return [d for d in DOMAINS if d != left_out and d not in SIBLINGS.get(left_out, set())]


def config_for(args: argparse.Namespace) -> TrainConfig:
    """Return the training config the flags describe."""
    raw: dict[str, Any] = {
        "algorithm": {"name": args.algo},
        "model": {"tool_bias": args.tool_bias, "prerequisite_penalty": args.prerequisite_penalty,
                  "prerequisite_finish_penalty": args.prerequisite_finish_penalty,
                  "open_part_finish_penalty": args.open_part_finish_penalty,
                  "open_part_threshold": args.open_part_threshold},
        "data": {"distractors": args.distractors, "val_fraction": 0.05, "answer_only_share": args.answer_only_share,
                 "composed_share": args.composed_share},
        "training": {"steps": args.steps, "seed": args.seed},
        "logging": {"tensorboard": False},
    }
    for item in args.set:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        raw.setdefault(section, {})[name] = yaml.safe_load(value)
    return TrainConfig.model_validate(raw)


def run(left_out: str, episodes: dict[str, list[Episode]], config: TrainConfig, out: Path,
        encoder: StateEncoder) -> dict[str, Any]:
    """Train without ``left_out``, evaluate on it; return the offline report as JSON plus timings."""
    train = [ep for d in training_domains(left_out) for ep in episodes[d]]
    start = time.perf_counter()
    train_on_episodes(train, config, out / left_out, encoder=encoder, show_progress=True)
    seconds = time.perf_counter() - start
    policy = ToolPolicy.load(out / left_out, encoder=encoder)
    report = evaluate_offline(policy, episodes[left_out], train, encoder=encoder)
    print_report(report, f"left out: {left_out} (trained on {', '.join(training_domains(left_out))})", console)
    return {**report.to_json(), "train_seconds": seconds, "n_train_episodes": len(train)}


def main() -> None:
    """Run the leave-one-domain-out experiments and print one summary table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--leave-out", default=",".join(REPORTED))
    parser.add_argument("--algo", default="cql")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--distractors", type=int, default=8)
    parser.add_argument("--answer-only-share", type=float, default=0.0,
                        help="share of the episodes that never call a tool to train on")
    parser.add_argument("--composed-share", type=float, default=0.5,
                        help="share of the one-call episodes joined into two-part requests")
    parser.add_argument("--tool-bias", action="store_true", help="learn per-tool biases (they do not transfer)")
    parser.add_argument("--prerequisite-penalty", type=float, default=3.0,
                        help="the default's prerequisite rule for tools (model.prerequisite_penalty)")
    parser.add_argument("--prerequisite-finish-penalty", type=float, default=3.0,
                        help="the rule for FINISH (model.prerequisite_finish_penalty)")
    parser.add_argument("--open-part-finish-penalty", type=float, default=2.0,
                        help="the default's rule for FINISH with a request part open (model.open_part_finish_penalty)")
    parser.add_argument("--open-part-threshold", type=float, default=0.25,
                        help="how much better an open tool must serve that part (model.open_part_threshold)")
    parser.add_argument("--set", action="append", default=[], help="section.key=value config override")
    parser.add_argument("--out", type=Path, default=Path("runs/transfer"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    config = config_for(args)
    episodes = all_domain_episodes()
    encoder = StateEncoder()
    results = {d: run(d, episodes, config, args.out, encoder) for d in args.leave_out.split(",")}
    console.rule("leave one domain out: top-1 on the left-out domain's tool calls")
    for domain, result in results.items():
        metrics = result["metrics"]
        gap = metrics["policy"]["top1"] - metrics["embedding_similarity"]["top1"]
        console.print(f"{domain:16s} policy {metrics['policy']['top1']:.3f}   embedding similarity "
                      f"{metrics['embedding_similarity']['top1']:.3f}   gap {gap:+.3f}   bigram "
                      f"{metrics['bigram']['top1']:.3f}   FINISH acc {result['finish_accuracy']:.3f}   "
                      f"({result['n_decisions']} decisions, {result['train_seconds']:.0f} s training)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"config": config.model_dump(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
