"""How far fine-tuning could go on its held-out tasks: ceilings beside the policy, in one run.

``benchmarks/fine_tune.py`` measures the policy fine-tuned from the default on held-out tasks
(tau2-bench retail 60 -> 14 tasks, BFCL scenarios 0 mod 5 held out). This script asks why that
figure is what it is. For each domain, with the same training settings:

* ``held out``: fine-tuned on the training tasks, scored on the held-out ones (the reported figure),
  and again with other seeds (``--seeds``): how far a figure moves by the seed alone;
* ``memorised``: fine-tuned on the training and the held-out tasks, scored on the held-out ones:
  what the model reaches when it has seen those very tasks (a generalisation gap, not capacity,
  is what lies between the two);
* ``training fit``: the held-out run scored on its own training tasks;
* ``logistic regression``: a supervised peer that knows the tools by name (the request's
  embedding, the previous tool and the tools called in this turn, one-hot), fit on the
  training tasks: what a classifier of the user's own tools gets;
* ``consistent states``: the share of held-out decisions a majority vote over identical states
  (request, history, available tools) gets: how much the logs contradict themselves;
* the baselines of ``evaluate`` (bigram, embedding similarity) for the held-out run.

Then, for the held-out run's live decisions (FINISH among the candidates), the most confident
first: what its errors are (answering while the logged turn goes on, a tool when the turn is
done, a tool the turn calls later, another tool). That is what bounds coverage at 95% accuracy.
Top-1 is over tool calls (FINISH excluded), as ``evaluate`` counts it; "any order" counts a top
choice the logged turn calls later as right too.

Usage: python benchmarks/fine_tune_ceiling.py [--domains tau2_retail,bfcl] [--steps N] [--seeds 3]
       [--json runs/fine_tune_ceiling.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))  # fine_tune.py, beside this script

from fine_tune import run_config, splits  # noqa: E402

from evoharness_agent.encoding.embedder import StateEncoder  # noqa: E402
from evoharness_agent.encoding.state import Decision, decisions  # noqa: E402
from evoharness_agent.evaluation.offline import evaluate_offline  # noqa: E402
from evoharness_agent.learning.calibration import softmax_with_temperature  # noqa: E402
from evoharness_agent.learning.trainer import train_on_episodes  # noqa: E402
from evoharness_agent.policy import ToolPolicy  # noqa: E402
from evoharness_agent.schema import FINISH, Episode  # noqa: E402

console = Console()
SHARES = (0.1, 0.3, 0.5, 1.0)
"""The most confident shares of live decisions whose errors are counted by kind."""


def fine_tuned(train: list[Episode], init: str, steps: int | None, out: Path, encoder: StateEncoder,
               seed: int = 0) -> ToolPolicy:
    """Fine-tune from ``init`` on ``train`` (the temperature on the validation split alone) and load it."""
    train_on_episodes(train, run_config(encoder, steps, seed=seed), out, encoder=encoder, init=init,
                      show_progress=False)
    return ToolPolicy.load(out, encoder=encoder)


def offline_figures(policy: ToolPolicy, test: list[Episode], train: list[Episode]) -> dict[str, float]:
    """Return top-1, top-3 and live top-1 on ``test`` (baselines fit on ``train``)."""
    report = evaluate_offline(policy, test, train, encoder=policy.encoder)
    return {"top1": report.metrics["policy"]["top1"], "top3": report.metrics["policy"]["top3"],
            "live_top1": report.calibration.accuracy, "bigram_top1": report.metrics["bigram"]["top1"],
            "embedding_similarity_top1": report.metrics["embedding_similarity"]["top1"]}


def logged_decisions(episodes: Sequence[Episode], history_window: int) -> list[tuple[Episode, int, Decision]]:
    """Return every decision of ``episodes`` with its episode and step index."""
    out = []
    for episode in episodes:
        at = [i for i, step in enumerate(episode.steps) if step.is_decision]
        out += [(episode, i, point) for i, point in zip(at, decisions(episode, history_window), strict=True)]
    return out


def later_in_turn(episode: Episode, index: int) -> set[str]:
    """Return the tools the logged turn calls from step ``index`` on, up to the next user message."""
    tools: set[str] = set()
    for step in episode.steps[index:]:
        if step.kind == "user":
            break
        if step.kind == "tool_call" and step.tool:
            tools.add(step.tool)
    return tools


def consistent_states(points: list[tuple[Episode, int, Decision]]) -> float:
    """Return the share of tool-call decisions a majority vote over identical states gets right."""
    votes: dict[tuple[Any, ...], Counter[str]] = defaultdict(Counter)
    for _, _, point in points:
        if point.action != FINISH:
            votes[(point.request, tuple(point.history), tuple(sorted(point.available)))][point.action] += 1
    total = sum(sum(counts.values()) for counts in votes.values())
    return sum(counts.most_common(1)[0][1] for counts in votes.values()) / max(total, 1)


def classifier_features(points: list[tuple[Episode, int, Decision]], tools: list[str],
                        encoder: StateEncoder) -> torch.Tensor:
    """Return the logistic regression's inputs: request embedding, previous tool, tools called in the turn."""
    column = {name: k for k, name in enumerate(tools)}
    requests = torch.as_tensor(encoder.embed([point.request for _, _, point in points]), dtype=torch.float32)
    named = torch.zeros(len(points), 2 * len(tools) + 1)
    for row, (_, _, point) in enumerate(points):
        if point.previous_tool in column and point.features[0] > 0:  # a call was made in this turn
            named[row, column[point.previous_tool]] = 1.0
        for tool, count in point.calls_in_turn.items():
            if tool in column:
                named[row, len(tools) + column[tool]] = min(count, 3)
        named[row, -1] = point.features[0]
    return torch.cat([requests, named], dim=1)


def logistic_regression_top1(train_points: list[tuple[Episode, int, Decision]],
                             test_points: list[tuple[Episode, int, Decision]], encoder: StateEncoder) -> float:
    """Fit a multinomial logistic regression over the tools' names; return its held-out top-1 (FINISH excluded)."""
    tools = sorted({spec.name for episode, _, _ in train_points + test_points for spec in episode.tools})
    column = {name: k for k, name in enumerate(tools)}
    fit = [p for p in train_points if p[2].action in column]
    inputs, targets = classifier_features(fit, tools, encoder), torch.tensor([column[p[2].action] for p in fit])
    torch.manual_seed(0)
    model = torch.nn.Linear(inputs.shape[1], len(tools))
    optimiser = torch.optim.LBFGS(model.parameters(), max_iter=500, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimiser.zero_grad()
        # L2 as scikit-learn's default (C = 1): the sum of squared weights over the decisions' count.
        loss = (torch.nn.functional.cross_entropy(model(inputs), targets, reduction="sum")
                + 0.5 * model.weight.square().sum()) / len(fit)
        loss.backward()
        return loss

    optimiser.step(closure)
    scored = [p for p in test_points if p[2].action in column]
    with torch.no_grad():
        logits = model(classifier_features(scored, tools, encoder))
    hits = 0
    for row, (_, _, point) in enumerate(scored):
        allowed = torch.tensor([name in point.available for name in tools])
        hits += tools[int(logits[row].masked_fill(~allowed, -torch.inf).argmax())] == point.action
    return hits / max(len(scored), 1)


def error_kinds(policy: ToolPolicy, test: list[Episode]) -> dict[str, Any]:
    """Return, for the live decisions most confident first, the count of each kind of outcome per share."""
    outcomes: list[tuple[float, str]] = []
    any_order = n_tool_calls = 0
    for episode in test:
        points = logged_decisions([episode], policy.history_window)
        if not points:
            continue
        names, scores = policy.score_matrix([(episode.task, episode.steps[:i]) for _, i, _ in points],
                                            episode.tools, available=[point.available for _, _, point in points])
        for row, (_, index, point) in enumerate(points):
            if point.action not in names:
                continue
            available = np.array([name in point.available for name in names])
            probabilities = softmax_with_temperature(np.where(available, scores[row], -np.inf), policy.temperature)
            top, later = names[int(np.argmax(probabilities))], later_in_turn(episode, index)
            if point.action != FINISH:
                n_tool_calls += 1
                tools_only = np.where(available & (np.array(names) != FINISH), scores[row], -np.inf)
                any_order += names[int(np.argmax(tools_only))] in later
            if top == point.action:
                kind = "right"
            elif top == FINISH:
                kind = "answers while the turn goes on"
            elif point.action == FINISH:
                kind = "a tool when the turn is done"
            elif top in later:
                kind = "a tool the turn calls later"
            else:
                kind = "another tool"
            outcomes.append((float(probabilities.max()), kind))
    outcomes.sort(key=lambda outcome: -outcome[0])
    shares = {}
    for share in SHARES:
        head = outcomes[: max(1, int(len(outcomes) * share))]
        right = sum(kind == "right" for _, kind in head)
        shares[f"{share:.0%}"] = {"min_confidence": head[-1][0], "accuracy": right / len(head),
                                  **Counter(kind for _, kind in head)}
    return {"top1_any_order": any_order / max(n_tool_calls, 1), "most_confident": shares}


def seed_spread(runs: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Return the mean, standard deviation, lowest and highest of each figure over runs that differ in seed."""
    return {key: {"mean": float(np.mean(values)), "sd": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
                  "min": float(np.min(values)), "max": float(np.max(values))}
            for key in ("top1", "top3", "live_top1") for values in [[run[key] for run in runs]]}


def ceilings(domain: str, steps: int | None, seeds: int, out: Path, encoder: StateEncoder) -> dict[str, Any]:
    """Run every row for one domain (the held-out run with ``seeds`` seeds; seed 0 for the other rows)."""
    train, test = splits(domain)
    held_out = fine_tuned(train, "default", steps, out / "held_out", encoder)
    memorised = fine_tuned(train + test, "default", steps, out / "memorised", encoder)
    window = held_out.history_window
    train_points, test_points = logged_decisions(train, window), logged_decisions(test, window)
    figures = offline_figures(held_out, test, train)
    reseeded = [offline_figures(fine_tuned(train, "default", steps, out / f"held_out_seed{seed}", encoder, seed),
                                test, train) for seed in range(1, seeds)]
    return {"held_out": figures, "n_seeds": seeds, "held_out_seeds": seed_spread([figures, *reseeded]),
            "memorised": offline_figures(memorised, test, train),
            "training_fit": offline_figures(held_out, train, train),
            "logistic_regression_top1": logistic_regression_top1(train_points, test_points, encoder),
            "consistent_states_top1": consistent_states(test_points),
            "errors": error_kinds(held_out, test)}


def print_domain(domain: str, result: dict[str, Any]) -> None:
    """Print one domain's ceilings and its confident errors."""
    table = Table(title=f"{domain}: top-1 / top-3 (FINISH excluded) and live top-1, held-out tasks unless said")
    for column in ("row", "top-1", "top-3", "live top-1"):
        table.add_column(column, justify="right")
    for row in ("held_out", "memorised", "training_fit"):
        figures = result[row]
        table.add_row(row.replace("_", " "), f"{figures['top1']:.3f}", f"{figures['top3']:.3f}",
                      f"{figures['live_top1']:.3f}")
    spread = result["held_out_seeds"]
    table.add_row(f"held out, {result['n_seeds']} seeds: mean ± sd",
                  *(f"{spread[key]['mean']:.3f} ± {spread[key]['sd']:.3f}" for key in ("top1", "top3", "live_top1")))
    table.add_row("held out, any order", f"{result['errors']['top1_any_order']:.3f}", "", "")
    table.add_row("logistic regression", f"{result['logistic_regression_top1']:.3f}", "", "")
    table.add_row("bigram", f"{result['held_out']['bigram_top1']:.3f}", "", "")
    table.add_row("embedding similarity", f"{result['held_out']['embedding_similarity_top1']:.3f}", "", "")
    table.add_row("consistent states", f"{result['consistent_states_top1']:.3f}", "", "")
    console.print(table)
    errors = Table(title=f"{domain}: the held-out run's live decisions, most confident first")
    kinds = ("right", "answers while the turn goes on", "a tool when the turn is done", "a tool the turn calls later",
             "another tool")
    for column in ("share", "confidence ≥", "accuracy", *kinds):
        errors.add_column(column, justify="right")
    for share, row in result["errors"]["most_confident"].items():
        errors.add_row(share, f"{row['min_confidence']:.3f}", f"{row['accuracy']:.3f}",
                       *(str(row.get(kind, 0)) for kind in kinds))
    console.print(errors)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the ceilings for each domain, print them and write JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--domains", default="tau2_retail,bfcl")
    parser.add_argument("--steps", type=int, default=None,
                        help="gradient steps (default: training.steps unset, as `train --init` leaves it)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds of the held-out run (its spread)")
    parser.add_argument("--out", type=Path, default=Path("runs/fine_tune_ceiling"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    encoder = ToolPolicy.load("default").encoder
    results = {}
    for domain in args.domains.split(","):
        results[domain] = ceilings(domain, args.steps, args.seeds, args.out / domain, encoder)
        print_domain(domain, results[domain])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"steps": args.steps, "seeds": args.seeds, "domains": results}, indent=2))


if __name__ == "__main__":
    main()
