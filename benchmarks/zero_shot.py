"""The zero-shot agent suite: a policy vs embedding similarity on tools no data set has.

Runs, in one go, over :data:`~evoharness_agent.evaluation.zero_shot.ZERO_SHOT_TASKS` (the reported
figure) or, with ``--suite validation``, over
:data:`~evoharness_agent.evaluation.zero_shot_validation.VALIDATION_TASKS` (disjoint tasks and
tools, the one to choose hyperparameters on), or, with ``--suite first-requests``, over
:data:`~evoharness_agent.evaluation.zero_shot_validation.VALIDATION_FIRST_REQUESTS` (50 first
decisions over the validation toolsets: a tool, or an answer when none fits):

* ``policy``: the trained policy (``--policy``, the shipped ``trained/default`` by default);
* ``embedding_similarity``: tools by similarity to the request, each once, FINISH after
  ``--calls-per-turn`` calls (2 = the shipped policy's training logs, BFCL base+long_context
  training scenarios, 1.61 calls per turn, rounded);
* ``random (expected)``: the exact expectation of a uniformly random choice.

Bigram and frequency baselines are left out: they count tool names, and no name here occurs
in any log. Prints the table (and, with ``--misses``, the policy's wrong decisions); writes
JSON with ``--json``.

Usage: python benchmarks/zero_shot.py [--suite reported|validation|first-requests] [--policy trained/default]
       [--json out.json] [--calls-per-turn 2] [--misses]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from evoharness_agent.demo import SHIPPED_POLICY
from evoharness_agent.evaluation.choosers import EmbeddingChooser, PolicyChooser
from evoharness_agent.evaluation.zero_shot import (
    ZERO_SHOT_TASKS,
    ZERO_SHOT_TOOLSETS,
    evaluate_zero_shot,
    print_zero_shot,
    random_expectation,
)
from evoharness_agent.evaluation.zero_shot_validation import (
    VALIDATION_FIRST_REQUESTS,
    VALIDATION_TASKS,
    VALIDATION_TOOLSETS,
)
from evoharness_agent.policy import ToolPolicy

console = Console()

SUITES = {"reported": (ZERO_SHOT_TASKS, ZERO_SHOT_TOOLSETS), "validation": (VALIDATION_TASKS, VALIDATION_TOOLSETS),
          "first-requests": (VALIDATION_FIRST_REQUESTS, VALIDATION_TOOLSETS)}


def main() -> None:
    """Run the suite for the policy and the baselines, print the table, write JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=sorted(SUITES), default="reported",
                        help="reported: the figure; validation: the suite to tune on; first-requests: "
                             "50 first decisions over the validation toolsets (a tool, or an answer)")
    parser.add_argument("--policy", type=Path, default=SHIPPED_POLICY, help="policy directory")
    parser.add_argument("--json", type=Path, default=None, help="write the reports here")
    parser.add_argument("--calls-per-turn", type=int, default=2, help="embedding similarity's calls before FINISH")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--misses", action="store_true", help="list the policy's wrong decisions")
    args = parser.parse_args()

    try:
        policy = ToolPolicy.load(args.policy, device=args.device)
    except (FileNotFoundError, ValueError) as error:  # not a policy directory, or another state layout
        console.print(f"[red]cannot load {args.policy}: {error}")
        raise SystemExit(1) from error
    tasks, toolsets = SUITES[args.suite]
    reports = [evaluate_zero_shot(PolicyChooser(policy, name="policy"), tasks),
               evaluate_zero_shot(EmbeddingChooser(policy.encoder, args.calls_per_turn), tasks),
               random_expectation(tasks)]
    print_zero_shot(reports, console, title=f"zero-shot {args.suite} suite, policy {args.policy}")
    if args.misses:
        for decision in reports[0].decisions:
            if not decision.correct:
                console.print(f"  {decision.task_id} step {decision.step}: gold {decision.gold}, "
                              f"policy {decision.chosen}")
    if args.json:
        document = {
            "policy": str(args.policy),
            "suite": {"name": args.suite,
                      "toolsets": {name: [tool.name for tool in tools] for name, tools in toolsets.items()},
                      "n_tasks": reports[0].overall.n_tasks, "n_decisions": reports[0].overall.n_decisions},
            "embedding_calls_per_turn": args.calls_per_turn,
            "reports": {report.chooser: report.to_json() for report in reports},
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=2, ensure_ascii=False))
        console.print(f"written to {args.json}")


if __name__ == "__main__":
    main()
