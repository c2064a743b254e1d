"""Validation figures of a training recipe: what every setting of the shipped default is chosen on.

A setting (``--set section.key=value`` over ``scripts/default_policy.yaml``, as for
``benchmarks/transfer.py``) is judged on data never reported as a figure, in one run:

* the validation domains left out, ``stabletoolbench`` and ``bfcl_single``: a policy trained on
  every other domain (``transfer.run``), scored on the left-out domain's logged tool calls
  (top-1, FINISH accuracy) and on its live decisions (FINISH among the candidates: top-1, ECE,
  coverage at 95% accuracy), beside embedding similarity;
* a multi-turn domain left out: a policy trained without the retail group (tau-bench retail and
  its sibling tau2-bench retail), scored on tau2-bench retail's training tasks
  (:func:`tau2_retail_split`'s training part, as ``benchmarks/fine_tune.py`` splits them; the
  held-out tasks are never read). The two validation domains above are single requests, and
  every other multi-turn domain is reported left out or shares its tools with one that is;
  scoring the retail group's policy on tau-bench retail would be the reported ``tau_retail``
  figure;
* a policy trained on the default's own training data (:func:`default_training_split`), scored
  on the validation zero-shot suite (:data:`VALIDATION_TASKS`: invented toolsets that no data set
  and no reported figure has), on 50 first requests over the same toolsets
  (:data:`VALIDATION_FIRST_REQUESTS`: a tool, or an answer when none fits) and on the live
  decisions of its validation split (the episodes
  ``training.seed`` and ``data.val_fraction`` hold out), per domain;
* online BFCL: the same recipe trained without BFCL's training scenarios numbered 1 mod 5
  (:data:`ONLINE_VALIDATION_MOD`; the test scenarios are 0 mod 5 and never read), rolled out on
  those scenarios' base variant with gold arguments: turn and task success, as ``evaluate --env
  bfcl`` reports the test split; and on all four variants, four times the turns (retraining
  alone moves the base figure by about two of its 113 turns). It is the one figure here that acts
  in an environment, where a rule that holds a tool back costs the whole turn;
* many tools: the policy left out of ``bfcl_single`` ranks 300 of its requests' gold tools among
  100 random tools of the other domains (``benchmarks/many_tools.py``'s construction, drawn with
  :data:`MANY_TOOLS_SEED`, not the reported run's seed): recall@1. A rule that reads the tool set as
  one app's (a tool the request's verb asks for, a lookup that gives some missing identifier) can
  misfire in a catalogue of unrelated tools.

The README's validation table reads these figures. Each run trains five policies (about 20
minutes on 2 CPU cores); the temperature is the validation split's (``calibration_folds`` 0),
as in ``benchmarks/transfer.py``.

Usage: python benchmarks/validation.py [--set model.open_part_threshold=0.3] [--algo cql]
       [--steps 2000] [--seed 0] [--out runs/validation] [--json runs/validation.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))  # transfer.py, beside this script

import many_tools  # noqa: E402
from transfer import VALIDATION, add_recipe_arguments, config_for, run, training_domains  # noqa: E402

from evoharness_agent.encoding.embedder import StateEncoder  # noqa: E402
from evoharness_agent.envs.registry import load_environment  # noqa: E402
from evoharness_agent.evaluation.choosers import PolicyChooser  # noqa: E402
from evoharness_agent.evaluation.offline import evaluate_offline  # noqa: E402
from evoharness_agent.evaluation.online import evaluate_online  # noqa: E402
from evoharness_agent.evaluation.zero_shot import evaluate_zero_shot  # noqa: E402
from evoharness_agent.evaluation.zero_shot_validation import VALIDATION_FIRST_REQUESTS, VALIDATION_TASKS  # noqa: E402
from evoharness_agent.learning.config import TrainConfig  # noqa: E402
from evoharness_agent.learning.trainer import train_on_episodes, validation_episodes  # noqa: E402
from evoharness_agent.logs.bundled import (  # noqa: E402
    BFCL_VARIANTS,
    all_domain_episodes,
    bfcl_scenario_number,
    default_training_split,
    tau2_retail_split,
)
from evoharness_agent.policy import ToolPolicy  # noqa: E402
from evoharness_agent.schema import FINISH, Episode  # noqa: E402

console = Console()


MULTI_TURN = "tau2_retail"
"""The multi-turn validation domain: its training tasks, scored by a policy without its group."""
ONLINE_VALIDATION_MOD = 1
"""BFCL's training scenarios numbered this mod 5 are the online validation scenarios (the test ones are 0)."""
MANY_TOOLS_SEED = 1
"""The many-tools validation figure's draw of requests and distractors (``benchmarks/many_tools.py`` reports seed 0)."""


def measure_many_tools(out: Path, encoder: StateEncoder) -> dict[str, Any]:
    """Return recall@k of the policy left out of ``bfcl_single``, its requests' gold among 100 random tools."""
    policy = ToolPolicy.load(out / "bfcl_single", encoder=encoder)
    return many_tools.run(policy, 100, 300, MANY_TOOLS_SEED)


def measure_multi_turn(episodes: dict[str, list[Episode]], config: TrainConfig, out: Path,
                       encoder: StateEncoder) -> dict[str, Any]:
    """Train without the retail group; return the offline report on tau2-bench retail's training tasks."""
    train = [episode for domain in training_domains(MULTI_TURN) for episode in episodes[domain]]
    train_on_episodes(train, config, out / f"{MULTI_TURN}_multi_turn", encoder=encoder, show_progress=True)
    policy = ToolPolicy.load(out / f"{MULTI_TURN}_multi_turn", encoder=encoder)
    tasks, _ = tau2_retail_split(episodes[MULTI_TURN])  # the held-out part is never scored
    return evaluate_offline(policy, tasks, train, encoder=encoder).to_json()


def measure_default_recipe(episodes: dict[str, list[Episode]], config: TrainConfig, out: Path,
                           encoder: StateEncoder) -> dict[str, Any]:
    """Train on the default's training data; return the validation suite's, first requests' and split's figures."""
    trained = [episode for group in episodes.values() for episode in default_training_split(group)]
    train_on_episodes(trained, config, out / "all", encoder=encoder, show_progress=True)
    policy = ToolPolicy.load(out / "all", encoder=encoder)
    suite = evaluate_zero_shot(policy, VALIDATION_TASKS)
    assert suite.calibration is not None  # a policy reports its confidence
    first = evaluate_zero_shot(policy, VALIDATION_FIRST_REQUESTS).decisions
    split = validation_episodes(trained, config)
    by_domain: dict[str, list[Episode]] = {}
    for episode in split:
        by_domain.setdefault(str(episode.metadata.get("domain")), []).append(episode)
    live = {domain: evaluate_offline(policy, group, trained, encoder=encoder).calibration
            for domain, group in sorted(by_domain.items())}
    calibration = evaluate_offline(policy, split, trained, encoder=encoder).calibration
    return {"suite": {**asdict(suite.overall), "ece": suite.calibration.ece,
                      "coverage_at_95": suite.calibration.coverage_at_95},
            "first_requests": {"right": sum(d.chosen == d.gold for d in first), "decisions": len(first),
                               "tool_requests_answered": sum(d.gold != FINISH and d.chosen == FINISH for d in first),
                               "answers": sum(d.gold == FINISH for d in first),
                               "answers_right": sum(d.gold == FINISH == d.chosen for d in first)},
            "split": {"right": round(calibration.accuracy * calibration.n_decisions),
                      "decisions": calibration.n_decisions, "ece": calibration.ece,
                      "coverage_at_95": calibration.coverage_at_95,
                      "by_domain": {domain: {"right": round(c.accuracy * c.n_decisions), "decisions": c.n_decisions}
                                    for domain, c in live.items()}}}


def measure_online_bfcl(episodes: dict[str, list[Episode]], config: TrainConfig, out: Path,
                        encoder: StateEncoder) -> dict[str, Any]:
    """Train the default's recipe without BFCL's validation scenarios; return online BFCL's figures on them.

    The base variant's summary is at the top level, as ``evaluate --env bfcl`` reports the test
    split; ``variants`` holds every variant's turns and scenarios, the base one included.
    """
    trained = [episode for domain, group in episodes.items() for episode in default_training_split(group)
               if not (domain == "bfcl" and _online_validation_scenario(episode))]
    train_on_episodes(trained, config, out / "bfcl_online", encoder=encoder, show_progress=True)
    policy = ToolPolicy.load(out / "bfcl_online", encoder=encoder)
    return online_bfcl_figures(policy)


def _online_validation_scenario(episode: Episode) -> bool:
    """Return whether a BFCL task or log is one of the online validation scenarios."""
    return bfcl_scenario_number(episode) % 5 == ONLINE_VALIDATION_MOD


def online_bfcl_figures(policy: ToolPolicy) -> dict[str, Any]:
    """Roll ``policy`` out on every BFCL variant of the validation scenarios; return its figures."""
    figures: dict[str, Any] = {"variants": {}}
    for variant in BFCL_VARIANTS:
        setup = load_environment("bfcl", variant=variant, split="train")
        tasks = [task for task in setup.tasks if _online_validation_scenario(task)]
        report = evaluate_online(setup.env, tasks, [PolicyChooser(policy)], env_name=f"bfcl-{variant}-validation")
        runs = report.results["policy"]
        counts = {"turns": sum(run.turns for run in runs), "turns_succeeded": sum(run.turns_succeeded for run in runs),
                  "tasks": len(runs), "tasks_succeeded": sum(bool(run.success) for run in runs)}
        figures["variants"][variant] = counts
        if variant == "base":
            figures.update(report.summary()["policy"], turns=counts["turns"], turns_succeeded=counts["turns_succeeded"])
    return figures


def print_figures(results: dict[str, Any]) -> None:
    """Print the left-out domains' row, the multi-turn domain's line, the default recipe's row and online BFCL."""
    table = Table(title="validation domains left out")
    for column in ("left out", "top-1", "FINISH acc", "live top-1", "ECE", "coverage at 95%", "similarity"):
        table.add_column(column, justify="right")
    for domain in VALIDATION:
        r = results[domain]
        table.add_row(domain, f"{r['metrics']['policy']['top1']:.3f}", f"{r['finish_accuracy']:.3f}",
                      f"{r['calibration']['accuracy']:.3f}", f"{r['calibration']['ece']:.3f}",
                      f"{r['calibration']['coverage_at_95']:.3f}",
                      f"{r['metrics']['embedding_similarity']['top1']:.3f}")
    console.print(table)
    multi = results["multi_turn"]
    console.print(f"multi-turn, {MULTI_TURN}'s training tasks without the retail group: top-1 "
                  f"{multi['metrics']['policy']['top1']:.3f}, top-3 {multi['metrics']['policy']['top3']:.3f}, "
                  f"FINISH acc {multi['finish_accuracy']:.3f}, live top-1 {multi['calibration']['accuracy']:.3f} "
                  f"of {multi['calibration']['n_decisions']} decisions, similarity "
                  f"{multi['metrics']['embedding_similarity']['top1']:.3f}")
    suite, split = results["default_recipe"]["suite"], results["default_recipe"]["split"]
    right = round(suite["step_accuracy"] * suite["n_decisions"])
    exact = round(suite["task_exact"] * suite["n_tasks"])
    console.print(f"validation suite: {right} of {suite['n_decisions']} decisions right, task exact {exact} of "
                  f"{suite['n_tasks']}, repeats {suite['repeat_rate']:.3f}, ECE {suite['ece']:.3f}, "
                  f"coverage at 95% {suite['coverage_at_95']:.3f}")
    first = results["default_recipe"]["first_requests"]
    console.print(f"first requests: {first['right']} of {first['decisions']} right; of the {first['answers']} to "
                  f"answer at once {first['answers_right']} answered, and {first['tool_requests_answered']} of the "
                  f"{first['decisions'] - first['answers']} for a tool answered")
    domains = ", ".join(f"{d} {c['right']}/{c['decisions']}" for d, c in split["by_domain"].items())
    console.print(f"the default's validation split: {split['right']} of {split['decisions']} live decisions "
                  f"right ({domains}), ECE {split['ece']:.3f}, coverage at 95% {split['coverage_at_95']:.3f}")
    online = results["online_bfcl"]
    console.print(f"online BFCL, validation scenarios (base, gold arguments): {online['turns_succeeded']} of "
                  f"{online['turns']} turns, {online['success_rate']:.3f} of {online['tasks']} scenarios, "
                  f"invalid calls {online['invalid_call_rate']:.3f}")
    many = results["many_tools"]
    console.print(f"many tools, the bfcl_single policy among 100 random tools: recall@1 "
                  f"{many['policy']['recall@1']:.3f} of {many['policy']['n']} requests (similarity "
                  f"{many['embedding_similarity']['recall@1']:.3f})")
    variants = online["variants"].values()
    console.print(f"online BFCL, validation scenarios, every variant: {sum(v['turns_succeeded'] for v in variants)} of "
                  f"{sum(v['turns'] for v in variants)} turns ("
                  + ", ".join(f"{name} {v['turns_succeeded']}/{v['turns']}" for name, v in online["variants"].items())
                  + ")")


def main(argv: list[str] | None = None) -> None:
    """Train the recipe's five validation policies, print their figures and write JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    add_recipe_arguments(parser, Path("runs/validation"))
    args = parser.parse_args(argv)
    config = config_for(args)
    episodes = all_domain_episodes()
    encoder = config.model.state_encoder()
    results: dict[str, Any] = {domain: run(domain, episodes, config, args.out, encoder) for domain in VALIDATION}
    results["multi_turn"] = measure_multi_turn(episodes, config, args.out, encoder)
    results["default_recipe"] = measure_default_recipe(episodes, config, args.out, encoder)
    results["online_bfcl"] = measure_online_bfcl(episodes, config, args.out, encoder)
    results["many_tools"] = measure_many_tools(args.out, encoder)
    print_figures(results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"config": config.model_dump(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
