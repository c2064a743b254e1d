"""Write the shipped policy's ``MODEL_CARD.md`` from the JSON the measuring commands wrote: no hand-typed figures.

Inputs (each written by the command named; a missing one is reported as "not measured"):

* ``--train``: ``scripts/train_default.py --json`` (data, algorithm, training time, hardware);
* ``--transfer``: ``benchmarks/transfer.py --json`` (leave one domain out);
* ``--zero-shot``: ``benchmarks/zero_shot.py --json`` (the zero-shot agent suite);
* ``--fine-tune``: ``benchmarks/fine_tune.py --json`` (fine-tuning from the default vs from scratch);
* the policy directory itself (``policy.json``: sizes, calibration; ``policy.safetensors``: size).

Usage: python scripts/model_card.py [--policy evoharness_agent/trained/default]
       [--train docs/default_policy/train.json]
       [--transfer docs/default_policy/transfer.json] [--zero-shot docs/default_policy/zero_shot.json]
       [--fine-tune docs/default_policy/fine_tune.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from safetensors import safe_open

from evoharness_agent.encoding.embedder import model_path
from evoharness_agent.evaluation.reports import ece_reading
from evoharness_agent.learning.calibration import cross_fitted
from evoharness_agent.learning.checkpoints import weights_sha256

MEASUREMENTS = Path("docs/default_policy")
"""Where ``make default`` writes the measuring commands' JSON, tracked so that the card can be rebuilt and checked."""


def _load(path: Path | None) -> dict[str, Any] | None:
    """Read a JSON document, or ``None`` when it was not given or not written."""
    return json.loads(path.read_text()) if path is not None and path.exists() else None


def _parameters(weights: Path) -> int:
    """Count the parameters stored in a safetensors file."""
    total = 0
    with safe_open(str(weights), framework="pt") as handle:
        for key in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
            shape = handle.get_slice(key).get_shape()
            count = 1
            for size in shape:
                count *= size
            total += count
    return total


def _step_encoder(meta: dict[str, Any]) -> str:
    """Return the clause naming the model of the history steps, and its size, when it is not the encoder."""
    if not meta.get("step_encoder"):
        return ""
    folder = Path(model_path(meta["step_encoder"]))
    size = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) if folder.is_dir() else 0
    return f", history steps embedded by `{meta['step_encoder']}` ({size / 1e6:.1f} MB)"


def _asked_threshold(network: dict[str, Any]) -> str:
    """Return " (T for a tool the request asks for)" when the network sets its own threshold for those, else ""."""
    asked = network.get("open_part_asked_threshold")
    return "" if asked is None else f" ({asked} for a tool the request asks for by its verb or names)"


def _asked_waits(network: dict[str, Any]) -> str:
    """Return the clause on ``asked_provider_margin`` when the network sets it, else ""."""
    margin = network.get("asked_provider_margin")
    if not margin:
        return ""
    return (" (at a turn's first decision, while every tool the request asks for by its verb waits, the best "
            f"lookup that provides one ranks first, above answering too, if it scores within {margin} of the best "
            "tool)")


def _training(meta: dict[str, Any], train: dict[str, Any] | None, weights: Path, shipped_sha256: str) -> list[str]:
    """Return the data / algorithm / size section (``shipped_sha256``: the sha256 of ``weights``)."""
    lines = ["## What it is", ""]
    lines.append(f"- Algorithm: `{meta['algorithm']}` (params {meta.get('params') or 'default'}), network "
                 f"{meta['network']}, encoder `{meta['encoder']}` (max {meta['max_seq_length']} tokens)"
                 f"{_step_encoder(meta)}, history "
                 f"window {meta['history_window']}, state layout {meta.get('state_layout')}.")
    lines.append(f"- Size: {_parameters(weights):,} parameters, `policy.safetensors` "
                 f"{weights.stat().st_size / 1024:.0f} KiB; tools seen in training: {len(meta['known_tools']):,}.")
    if train is None:
        lines.append("- Training run: not measured (run `scripts/train_default.py --json`).")
        return lines
    data = train.get("data") or {}
    lines.append(f"- Data: {train.get('n_episodes', '?'):,} episodes, {train.get('n_transitions', '?'):,} "
                 "decisions, every bundled domain minus its held-out split (episode counts before "
                 f"keeping a share {config_share(train)} of the answer-only ones):")
    for domain, count in sorted(data.items()):
        lines.append(f"  - `{domain}`: {count:,} episodes")
    config = train.get("config", {})
    training = config.get("training", {})
    composed = config.get("data", {}).get("composed_share", 0.0)
    variants = config.get("data", {}).get("text_variant_share", 0.0)
    lines.append(f"- Recipe: {config.get('data', {}).get('distractors', 0)} distractor tools per episode, "
                 f"a share {composed} of the one-call episodes joined in pairs into two-part requests, "
                 f"each tool shown by another text of itself (its name alone, its name and first sentence, or its "
                 f"description alone) at a share {variants} of the training passes, "
                 f"per-tool bias {'on' if config.get('model', {}).get('tool_bias') else 'off'}, "
                 f"{training.get('steps')} steps of batch {training.get('batch_size')}.")
    network = meta["network"]
    if "prerequisite_penalty" in network:
        lines.append(f"- Decision rule (when it acts, not learned): a tool waiting for a prerequisite lookup loses "
                     f"{network['prerequisite_penalty']} and ranks below the best tool that provides the identifier"
                     f"{_asked_waits(network)}, "
                     "answering while that would leave the lookup chain half "
                     f"done loses {network.get('prerequisite_finish_penalty', 0.0)} (at a turn's first decision only "
                     "while some open tool serves a request part by at least "
                     f"{network.get('prerequisite_fit_threshold', -1.0)}; also after a call whose error asks "
                     "for a tool, a log-in say, which then ranks first, until that tool and the call again), "
                     "and answering after a call "
                     f"while an open tool serves a request part no called tool serves by at least "
                     f"{network.get('open_part_threshold', 0.25)}{_asked_threshold(network)} loses "
                     f"{network.get('open_part_finish_penalty', 0.0)}, "
                     "answering while only lookups ran and the request's verb names an open action loses "
                     f"{network.get('asked_action_finish_penalty', 0.0)}, "
                     "and answering right after the best-fitting tool's first call of the turn failed, or calling "
                     f"again a tool just retried, loses {network.get('retry_penalty', 0.0)}; "
                     "a lookup of records a result in this turn listed without holding them and it has not read gains "
                     f"{network.get('reads_listed_bonus', 0.0)}; "
                     "at a turn's first decision each open tool gains "
                     f"{network.get('first_similarity_bonus', 0.0)} times its request similarity; "
                     "after a call that worked, answering gains "
                     f"{network.get('best_fit_called_bonus', 0.0)} while a tool called in this turn matches the "
                     "request at least as well as every open tool; "
                     f"the towers' term ranks one tool above another at {network.get('tower_rank_weight', 1.0)} "
                     "of its trained weight, the best tool keeping its score "
                     "(`learning/networks.py`, `waiting_for_prerequisite`, `below_providers`, "
                     "`provider_after_failure`, `provider_before_asked`, `answer_waits`, "
                     "`answer_leaves_part`, `answer_skips_action`, `answer_skips_retry`, `repeats_retry`, "
                     "`first_decision_similarity`, `answer_after_best_fit`, `tower_ranking_narrowed`).")
    hardware = train.get("hardware", {})
    trained = train.get("weights_sha256")
    if trained is not None and trained != shipped_sha256:
        lines.append(f"- Training run measured on a rerun of the recipe (weights sha256 {trained[:12]}…), not the run "
                     f"that wrote these weights ({shipped_sha256[:12]}…): the same data and recipe; its weights differ "
                     "in float rounding.")
    folds = ("; the policy, then the models its temperature is cross-fitted with (`training.calibration_folds`)"
             if cross_fitted(train) else "")
    lines.append(f"- Training time: {train.get('seconds', 0):.0f} s on {hardware.get('device', '?')} "
                 f"({hardware.get('cpu_count', '?')} CPU cores, torch {hardware.get('torch', '?')}; wall time, "
                 f"other jobs may have shared the machine{folds}).")
    return lines


def config_share(train: dict[str, Any]) -> float:
    """Return the share of answer-only episodes the run kept."""
    return float(train.get("config", {}).get("data", {}).get("answer_only_share", 1.0))


def _calibration(meta: dict[str, Any]) -> list[str]:
    """Return the calibration section from the policy's metadata."""
    calibration = meta.get("calibration")
    lines = ["", "## Confidence", ""]
    if not calibration:
        return [*lines, "Not calibrated (the policy has no `calibration` metadata)."]
    held_out, unseen = calibration.get("n_out_of_fold"), calibration.get("out_of_fold_by", "task")
    if held_out:
        # A run cross-fitted by task trains on every task: it has no validation episodes to add.
        validation = ("" if "temperature_validation" not in calibration else
                      f", plus the validation episodes (alone they give {calibration['temperature_validation']:.3f})")
        lines.append(f"Temperature scaling fit when training ended on {held_out:,} decisions each scored by a model "
                     f"trained without its {unseen} (`training.calibration_folds`){validation}:")
    else:
        lines.append("Temperature scaling fit on the validation episodes when training ended:")
    lines.append("")
    lines.append("| temperature | decisions | ECE before | ECE after | coverage at 95% accuracy |")
    lines.append("|---|---|---|---|---|")
    nan = float("nan")
    lines.append(f"| {calibration.get('temperature', nan):.3f} | {calibration.get('n_decisions', 0)} | "
                 f"{calibration.get('ece_before', nan):.3f} | {calibration.get('ece_after', nan):.3f} | "
                 f"{calibration.get('coverage_at_95', nan):.3f} |")
    return lines


def _transfer(transfer: dict[str, Any] | None) -> list[str]:
    """Return the leave-one-domain-out table."""
    lines = ["", "## Transfer: leave one domain out", ""]
    if transfer is None:
        return [*lines, "Not measured (run `benchmarks/transfer.py --json`)."]
    partial = [f"`{domain}` {result['n_partial_log_episodes']} of {result['n_episodes']}"
               for domain, result in transfer["results"].items() if result.get("n_partial_log_episodes")]
    lines.append("Trained on every other domain (siblings sharing users left out too), evaluated on the left-out "
                 "domain's logged tool calls (top-1, ties against the policy), baselines in the same run. "
                 "Each decision is scored among the tools its log could have recorded (`available_at_start`)"
                 + (f"; episodes whose logs record only some of their tools: {', '.join(partial)}." if partial
                    else "."))
    lines.append("")
    lines.append("| left out | decisions | policy | embedding similarity | gap | bigram | FINISH accuracy |")
    lines.append("|---|---|---|---|---|---|---|")
    for domain, result in transfer["results"].items():
        metrics = result["metrics"]
        policy, similarity = metrics["policy"]["top1"], metrics["embedding_similarity"]["top1"]
        lines.append(f"| {domain} | {result['n_decisions']} | {policy:.3f} | {similarity:.3f} | "
                     f"{policy - similarity:+.3f} | {metrics['bigram']['top1']:.3f} | "
                     f"{result['finish_accuracy']:.3f} |")
    folds = ((transfer.get("config") or {}).get("training") or {}).get("calibration_folds", 0)
    fit_on = ("on decisions about the other training domains, each scored by a model trained without it, plus "
              "the training domains' validation episodes (`training.calibration_folds: domain`, as the default's)"
              if folds == "domain" else "on the training domains' validation episodes")
    lines += ["", "Calibration on the left-out domain: every live decision (FINISH among the candidates), "
              f"with the temperature fit {fit_on}.", "",
              "| left out | live decisions | accuracy | mean confidence | ECE | ECE if calibrated (95th percentile) | "
              "coverage at 95% accuracy |",
              "|---|---|---|---|---|---|---|"]
    lines += [_calibration_row(domain, result["calibration"]) for domain, result in transfer["results"].items()]
    return lines


def _calibration_row(label: str, calibration: dict[str, Any]) -> str:
    """Return one table row of a held-out calibration report (``CalibrationReport.to_json``)."""
    return (f"| {label} | {calibration['n_decisions']} | {calibration['accuracy']:.3f} | "
            f"{calibration['mean_confidence']:.3f} | {calibration['ece']:.3f} | {_if_calibrated(calibration)} | "
            f"{calibration['coverage_at_95']:.3f} |")


def _if_calibrated(result: dict[str, Any]) -> str:
    """Return the ECE a calibrated policy would show on a report's decisions, "mean (95th percentile)"."""
    if "ece_if_calibrated" not in result:  # JSON written before it was measured
        return "not measured"
    return f"{result['ece_if_calibrated']:.3f} ({result['ece_if_calibrated_95']:.3f})"


def _fine_tune(fine_tune: dict[str, Any] | None, shipped_sha256: str) -> list[str]:
    """Return the fine-tuning table: from scratch vs from the default (``shipped_sha256``: its weights'), held out."""
    lines = ["", "## Fine-tuning: from the default vs from scratch", ""]
    if fine_tune is None:
        return [*lines, "Not measured (run `benchmarks/fine_tune.py --json`)."]
    start = fine_tune.get("start")
    folds = (fine_tune.get("config") or {}).get("calibration_folds") if start is not None else None
    domains = fine_tune["domains"] if start is not None else fine_tune
    if folds == 0:
        fit = ("The temperature is fit on the validation split alone when training ends (`--calibration-folds 0`; "
               "cross-fitting it over the training tasks costs each run five more trainings).")
    else:
        fit = ("The temperature is cross-fitted (`training.calibration_folds`: every training task scored by a "
               "model that did not train on it), so each run trains on all its tasks, with no validation split.")
    lines.append("Trained on the first N training tasks of a domain (same config; steps: the gradient steps the "
                 "run took, 1,500 from scratch and, from the default, about 100 passes over the training decisions "
                 "within 500-1,500 when `training.steps` is unset), evaluated on its "
                 "held-out tasks, which the default never saw: top-1 over tool calls (FINISH excluded), live "
                 "top-1 (FINISH among the candidates), and the live decisions' ECE and coverage at 95% accuracy. "
                 + fit)
    if start is None:  # JSON written before benchmarks/fine_tune.py recorded the policy it started from
        lines += ["", "The default these runs started from is not recorded: it may be an earlier one than this "
                      "card's (rerun `benchmarks/fine_tune.py --json`)."]
    elif start["weights_sha256"] != shipped_sha256:
        lines += ["", f"These runs started from an earlier default (weights sha256 {start['weights_sha256'][:12]}…; "
                      f"this card's: {shipped_sha256[:12]}…): rerun `benchmarks/fine_tune.py --json` to measure "
                      "this one."]
    lines.append("")
    lines.append("| domain | training tasks | start | steps | top-1 | top-3 | live top-1 | ECE | "
                 "ECE if calibrated (95th percentile) | coverage at 95% | embedding similarity |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
    config_steps = (fine_tune.get("config") or {}).get("steps", "") if start is not None else ""
    for domain, rows in domains.items():
        for row in rows:
            for kind in ("scratch", "default"):
                result = row[kind]
                ece = f"{result['ece']:.3f}" if "ece" in result else "not measured"
                coverage = f"{result['coverage_at_95']:.3f}" if "coverage_at_95" in result else "not measured"
                steps = result.get("steps", config_steps)  # JSON from before runs recorded their own
                lines.append(f"| {domain} | {row['n_tasks']} | {kind} | {steps} | {result['top1']:.3f} | "
                             f"{result['top3']:.3f} | {result['live_top1']:.3f} | {ece} | {_if_calibrated(result)} | "
                             f"{coverage} | "
                             f"{result['embedding_similarity_top1']:.3f} |")
    return lines


def _zero_shot(zero_shot: dict[str, Any] | None, meta: dict[str, Any]) -> list[str]:
    """Return the zero-shot suite table (``meta``: the policy's, for how its temperature was fit)."""
    lines = ["", "## Zero-shot agent suite", ""]
    if zero_shot is None:
        return [*lines, "Not measured (run `benchmarks/zero_shot.py --json`)."]
    suite = zero_shot["suite"]
    lines.append(f"{len(suite['toolsets'])} invented toolsets, {suite['n_tasks']} tasks, {suite['n_decisions']} "
                 "decisions, gold history, FINISH among the candidates. Tool accuracy: over the decisions whose "
                 "gold is a tool, the best-ranked tool with FINISH left out (the choice of tool, apart from when "
                 "to answer).")
    lines.append("")
    lines.append("| chooser | step accuracy | tool accuracy | task exact | repeats a call that just worked |")
    lines.append("|---|---|---|---|---|")
    for name, report in zero_shot["reports"].items():
        overall = report["overall"]
        tool = overall.get("tool_accuracy")  # absent from JSON written before it was measured
        lines.append(f"| {name} | {overall['step_accuracy']:.3f} | {'not measured' if tool is None else f'{tool:.3f}'} "
                     f"| {overall['task_exact']:.3f} | {overall['repeat_rate']:.3f} |")
    fit = meta.get("calibration") or {}
    unseen = fit.get("out_of_fold_by", "task") if cross_fitted(fit) else None
    fit_on = {"domain": "Its temperature was fit on decisions about domains their scorer never saw, plus the "
                        "training domains' validation split (`training.calibration_folds: domain`).",
              "task": "Its temperature was fit on every training decision scored by a model that had not trained "
                      "on its task (`training.calibration_folds`; such a run trains on every task).",
              }.get(unseen or "", "Its temperature was fit on the training domains' validation split.")
    for name, report in zero_shot["reports"].items():
        calibration = report.get("calibration")  # absent from JSON written before it was measured
        if calibration:
            confidence, accuracy = calibration["mean_confidence"], calibration["accuracy"]
            lean = "more sure than right" if confidence > accuracy else "no more sure than right"
            lines += ["", f"The {name}'s reported probability of its top choice on these new tools: {confidence:.3f} "
                      f"on average against {accuracy:.3f} right ({lean}), {ece_reading(calibration)}, coverage at "
                      f"95% accuracy {calibration['coverage_at_95']:.3f}. {fit_on}"]
    return lines


def card(policy: Path, train: dict[str, Any] | None, transfer: dict[str, Any] | None,
         zero_shot: dict[str, Any] | None, fine_tune: dict[str, Any] | None) -> str:
    """Return the model card of the policy directory ``policy`` from the measuring commands' JSON documents."""
    meta = json.loads((policy / "policy.json").read_text())
    lines = ["# Model card: the shipped default policy", "",
             "Generated by `scripts/model_card.py` from the measuring commands' JSON (kept in "
             f"`{MEASUREMENTS.as_posix()}/`); rebuild everything with `make default`.", ""]
    shipped_sha256 = weights_sha256(policy)  # hashed once: the training line and the fine-tuning table use it
    lines += _training(meta, train, policy / "policy.safetensors", shipped_sha256)
    lines += _calibration(meta)
    lines += _transfer(transfer)
    lines += _zero_shot(zero_shot, meta)
    lines += _fine_tune(fine_tune, shipped_sha256)
    return "\n".join(lines) + "\n"


def main() -> None:
    """Assemble the card and write it beside the policy."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policy", type=Path, default=Path("evoharness_agent/trained/default"))
    parser.add_argument("--train", type=Path, default=MEASUREMENTS / "train.json")
    parser.add_argument("--transfer", type=Path, default=MEASUREMENTS / "transfer.json")
    parser.add_argument("--zero-shot", type=Path, default=MEASUREMENTS / "zero_shot.json")
    parser.add_argument("--fine-tune", type=Path, default=MEASUREMENTS / "fine_tune.json")
    args = parser.parse_args()
    text = card(args.policy, _load(args.train), _load(args.transfer), _load(args.zero_shot), _load(args.fine_tune))
    (args.policy / "MODEL_CARD.md").write_text(text)
    print(f"wrote {args.policy / 'MODEL_CARD.md'}")


if __name__ == "__main__":
    main()
