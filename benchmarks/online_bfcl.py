"""Online tool choice on held-out BFCL scenarios, and what collected mixed data adds.

Everything runs in BFCL's executable environment with gold arguments (the k-th call of a
tool in a turn gets the k-th gold call's arguments; a tool the turn does not need gets
none), so the figures measure tool choice and stopping alone. Success is BFCL's rule: every
turn of the scenario leaves the API instances in the gold state with the gold results seen.

1. Train on the gold demonstrations of the training scenarios (number not 0 mod 5) of the
   ``--train-variants`` (default base and long_context, whose turns all need calls; the
   miss_func/miss_param variants add turns that must be answered without calls).
2. Evaluate CQL and BC online on the held-out base scenarios beside the baselines: random,
   previous-tool bigram and embedding similarity, all fit on the same training logs.
3. Collect mixed-quality logs: roll an epsilon-greedy version of the BC policy out on the
   training scenarios (``--repeats`` runs each); the env's rewards mark each run, and every
   successful turn's FINISH earns ``--turn-reward`` (also given to the gold turns). Each run
   is cut after its first failed turn: BFCL's state carries over, so every later turn of a
   run off the gold path fails whatever is done (``--keep-after-failure`` keeps them).
4. Compare, on the held-out scenarios: the gold-only CQL policy; CQL fine-tuned (``--init``)
   on gold + all collected runs (offline RL uses the failures); and BC on gold + only the
   collected runs that fully succeeded (the "successes only" way to use the same data).

Usage: python benchmarks/online_bfcl.py [--steps 1500] [--repeats 3] [--epsilon 0.3]
       [--out runs/online_bfcl]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.envs.registry import load_environment
from evoharness_agent.evaluation.baselines import CountBaselines
from evoharness_agent.evaluation.choosers import (
    BigramChooser,
    EmbeddingChooser,
    EpsilonChooser,
    PolicyChooser,
    RandomChooser,
)
from evoharness_agent.evaluation.online import collect, evaluate_online, reward_turns
from evoharness_agent.evaluation.reports import print_online_report
from evoharness_agent.learning.config import TrainConfig
from evoharness_agent.learning.trainer import train_on_episodes
from evoharness_agent.policy import ToolPolicy
from evoharness_agent.schema import Episode

console = Console()


def train(name: str, algo: str, episodes: list[Episode], out: Path, steps: int, encoder: StateEncoder,
          init: Path | None = None) -> ToolPolicy:
    """Train one policy into ``out / name`` and load it."""
    config = TrainConfig.model_validate({"algorithm": {"name": algo}, "training": {"steps": steps},
                                         "logging": {"tensorboard": False}})
    console.print(f"[bold]{name}[/]: {algo} on {len(episodes)} episodes" + (f", init {init}" if init else ""))
    train_on_episodes(episodes, config, out / name, encoder=encoder, init=init, show_progress=False)
    return ToolPolicy.load(out / name, encoder=encoder)


def main() -> None:
    """Run the four stages and print/write the reports."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-variants", default="base,long_context")
    parser.add_argument("--eval-variant", default="base")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epsilon", type=float, default=0.3)
    parser.add_argument("--turn-reward", type=float, default=2.0)
    parser.add_argument("--keep-after-failure", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/online_bfcl"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    encoder = StateEncoder()

    train_setups = [load_environment("bfcl", variant=v, split="train") for v in args.train_variants.split(",")]
    gold = [reward_turns(ep, args.turn_reward) for setup in train_setups for ep in setup.tasks]
    test = load_environment("bfcl", variant=args.eval_variant, split="test")
    console.print(f"{len(gold)} gold training scenarios ({args.train_variants}); "
                  f"{len(test.tasks)} held-out {args.eval_variant} scenarios")

    cql_gold = train("cql_gold", "cql", gold, args.out, args.steps, encoder)
    bc_gold = train("bc_gold", "bc", gold, args.out, args.steps, encoder)
    counts = CountBaselines(gold)
    baselines = [RandomChooser(args.seed), BigramChooser(counts),
                 EmbeddingChooser(encoder, max(1, round(counts.calls_per_turn)))]
    first = evaluate_online(test.env, test.tasks, [PolicyChooser(cql_gold, "cql_gold"),
                                                  PolicyChooser(bc_gold, "bc_gold"), *baselines],
                            env_name=test.name)
    print_online_report(first, console)

    behaviour = EpsilonChooser(PolicyChooser(bc_gold, "bc_gold"), args.epsilon, args.seed)
    collected = [ep for setup in train_setups
                 for ep in collect(setup.env, setup.tasks, behaviour, repeats=args.repeats,
                                   turn_reward=args.turn_reward, until_failure=not args.keep_after_failure)]
    successes = [ep for ep in collected if ep.reward == 1.0]
    turns = [ok for ep in collected for ok in ep.metadata["rollout"]["turn_success"]]
    console.print(f"collected {len(collected)} runs with {behaviour.name}: {len(successes)} fully successful, "
                  f"turn success {sum(turns) / len(turns):.3f}")

    cql_mixed = train("cql_mixed_finetuned", "cql", gold + collected, args.out, args.steps, encoder,
                      init=args.out / "cql_gold")
    iql_mixed = train("iql_mixed", "iql", gold + collected, args.out, args.steps, encoder)
    bc_successes = train("bc_successes", "bc", gold + successes, args.out, args.steps, encoder)
    second = evaluate_online(test.env, test.tasks, [
        PolicyChooser(cql_gold, "cql_gold"), PolicyChooser(cql_mixed, "cql_mixed_finetuned"),
        PolicyChooser(iql_mixed, "iql_mixed"), PolicyChooser(bc_successes, "bc_gold+successes")],
        env_name=test.name)
    print_online_report(second, console)

    for name, report in (("baselines", first), ("mixed_data", second)):
        report.write_json(args.out / f"{name}.json")
        report.write_markdown(args.out / f"{name}.md")
        report.plot(args.out / f"{name}.png")
    (args.out / "collected.json").write_text(json.dumps({
        "behaviour": behaviour.name, "runs": len(collected), "successful_runs": len(successes),
        "turn_success": sum(turns) / len(turns)}, indent=2))
    console.print(f"reports in {args.out}/")


if __name__ == "__main__":
    main()
