"""The model card's tables come from the measuring commands' JSON, and say what was not measured."""

from __future__ import annotations

import json

from tests.kit.scripts import ROOT, load_script

model_card = load_script("model_card")


def _calibration(ece: float, coverage: float) -> dict[str, float]:
    return {"n_decisions": 40, "accuracy": 0.55, "mean_confidence": 0.6, "ece": ece, "coverage_at_95": coverage}


def test_transfer_table_reports_each_left_out_domains_calibration() -> None:
    metrics = {"policy": {"top1": 0.41}, "embedding_similarity": {"top1": 0.38}, "bigram": {"top1": 0.06}}
    transfer = {"results": {"bfcl": {"n_decisions": 30, "metrics": metrics, "finish_accuracy": 0.67,
                                     "calibration": _calibration(0.112, 0.006)}}}
    lines = model_card._transfer(transfer)
    assert "| bfcl | 30 | 0.410 | 0.380 | +0.030 | 0.060 | 0.670 |" in lines
    assert "| bfcl | 40 | 0.550 | 0.600 | 0.112 | not measured | 0.006 |" in lines
    floor = {**_calibration(0.112, 0.006), "ece_if_calibrated": 0.041, "ece_if_calibrated_95": 0.058}
    measured = model_card._transfer({"results": {"bfcl": {**transfer["results"]["bfcl"], "calibration": floor}}})
    assert "| bfcl | 40 | 0.550 | 0.600 | 0.112 | 0.041 (0.058) | 0.006 |" in measured
    assert any("fit on the training domains' validation episodes." in line for line in lines)
    by_domain = model_card._transfer({**transfer, "config": {"training": {"calibration_folds": "domain"}}})
    assert any("each scored by a model trained without it" in line for line in by_domain)
    assert not any("record only some" in line for line in lines)


def test_transfer_table_names_the_domains_whose_logs_record_only_some_tools() -> None:
    metrics = {"policy": {"top1": 0.58}, "embedding_similarity": {"top1": 0.41}, "bigram": {"top1": 0.1}}
    result = {"n_decisions": 30, "metrics": metrics, "finish_accuracy": 0.7, "calibration": _calibration(0.1, 0.0)}
    transfer = {"results": {"bfcl": {**result, "n_episodes": 200, "n_partial_log_episodes": 0},
                            "tau_retail": {**result, "n_episodes": 520, "n_partial_log_episodes": 520}}}
    assert any(line.endswith("episodes whose logs record only some of their tools: `tau_retail` 520 of 520.")
               for line in model_card._transfer(transfer))


def test_fine_tune_table_has_both_starts_and_marks_runs_without_calibration() -> None:
    result = {"steps": 1500, "top1": 0.6, "top3": 0.8, "live_top1": 0.62, "embedding_similarity_top1": 0.2}
    fine_tune = {"tau2_retail": [{"n_tasks": 10, "scratch": result,
                                  "default": {**result, "steps": 500, "top1": 0.7, "ece": 0.2,
                                              "ece_if_calibrated": 0.11, "ece_if_calibrated_95": 0.16,
                                              "coverage_at_95": 0.04}}]}
    for document in (fine_tune, {"start": {"policy": "default", "weights_sha256": "ab" * 32}, "domains": fine_tune}):
        lines = model_card._fine_tune(document, "ab" * 32)
        assert ("| tau2_retail | 10 | default | 500 | 0.700 | 0.800 | 0.620 | 0.200 | 0.110 (0.160) | 0.040 | 0.200 |"
                in lines)
        assert ("| tau2_retail | 10 | scratch | 1500 | 0.600 | 0.800 | 0.620 | not measured | not measured | "
                "not measured | 0.200 |" in lines)
    assert model_card._fine_tune(None, "ab" * 32)[-1] == "Not measured (run `benchmarks/fine_tune.py --json`)."


def test_fine_tune_table_says_how_its_temperature_was_fit() -> None:
    result = {"top1": 0.6, "top3": 0.8, "live_top1": 0.62, "embedding_similarity_top1": 0.2, "ece": 0.1,
              "coverage_at_95": 0.0}
    rows = {"bfcl": [{"n_tasks": 10, "scratch": result, "default": result}]}
    start = {"policy": "default", "weights_sha256": "ab" * 32}
    alone = model_card._fine_tune({"start": start, "config": {"calibration_folds": 0}, "domains": rows}, "ab" * 32)
    assert any("fit on the validation split alone" in line for line in alone)
    assert not any("cross-fitted" in line or "validation T alone" in line for line in alone)
    crossed = model_card._fine_tune({"start": start, "config": {"calibration_folds": 5}, "domains": rows}, "ab" * 32)
    assert any("cross-fitted" in line and "trains on all its tasks" in line for line in crossed)
    assert any("| live top-1 | ECE |" in line for line in crossed)


def test_fine_tune_table_says_when_it_started_from_another_default() -> None:
    result = {"top1": 0.6, "top3": 0.8, "live_top1": 0.62, "embedding_similarity_top1": 0.2}
    rows = {"bfcl": [{"n_tasks": 10, "scratch": result, "default": result}]}
    recorded = {"start": {"policy": "default", "weights_sha256": "ab" * 32}, "domains": rows}
    assert not any("earlier default" in line or "not recorded" in line
                   for line in model_card._fine_tune(recorded, "ab" * 32))
    assert any("started from an earlier default (weights sha256 abababababab" in line
               for line in model_card._fine_tune(recorded, "cd" * 32))
    assert any("not recorded" in line for line in model_card._fine_tune(rows, "cd" * 32))


def test_confidence_says_what_the_temperature_was_fit_on() -> None:
    fit = {"temperature": 0.9, "n_decisions": 1200, "ece_before": 0.2, "ece_after": 0.04, "coverage_at_95": 0.3}
    assert "fit on the validation episodes" in model_card._calibration({"calibration": fit})[3]
    by_task = {**fit, "n_out_of_fold": 1200}  # cross-fitted by task: trained on every task, no validation split
    assert model_card._calibration({"calibration": by_task})[3].endswith(
        "trained without its task (`training.calibration_folds`):")
    by_domain = {**fit, "n_out_of_fold": 1000, "out_of_fold_by": "domain", "temperature_validation": 0.675}
    assert ("on 1,000 decisions each scored by a model trained without its domain (`training.calibration_folds`), "
            "plus the validation episodes (alone they give 0.675)") in model_card._calibration(
                {"calibration": by_domain})[3]
    suite = {"suite": {"toolsets": ["a"], "n_tasks": 2, "n_decisions": 5}, "reports": {"policy": {
        "overall": {"step_accuracy": 0.6, "tool_accuracy": 0.7, "task_exact": 0.5, "repeat_rate": 0.0},
        "calibration": _calibration(0.1, 0.0)}}}
    assert "domains their scorer never saw" in model_card._zero_shot(suite, {"calibration": by_domain})[-1]
    assert "validation split." in model_card._zero_shot(suite, {"calibration": fit})[-1]
    by_task = {**fit, "n_out_of_fold": 900, "out_of_fold_by": "task"}
    assert "had not trained on its task" in model_card._zero_shot(suite, {"calibration": by_task})[-1]


def test_training_section_says_when_its_run_wrote_other_weights() -> None:
    policy = ROOT / "evoharness_agent" / "trained" / "default"
    meta = json.loads((policy / "policy.json").read_text())
    shipped = model_card.weights_sha256(policy)
    train = {"n_episodes": 3, "n_transitions": 9, "data": {"bfcl": 3}, "seconds": 5.0, "config": {}}

    def training(sha256: str) -> list[str]:
        return model_card._training(meta, {**train, "weights_sha256": sha256}, policy / "policy.safetensors",
                                   shipped)

    assert not any("rerun of the recipe" in line for line in training(shipped))
    assert any(f"rerun of the recipe (weights sha256 {'cd' * 6}…), not the run that wrote these weights "
               f"({shipped[:12]}…)" in line for line in training("cd" * 32))


def test_shipped_card_is_what_the_committed_measurements_give() -> None:
    """MODEL_CARD.md holds no figure the JSON in docs/default_policy does not give (``make default`` writes both)."""
    measured = ROOT / model_card.MEASUREMENTS

    def document(name: str) -> dict[str, object]:
        return json.loads((measured / f"{name}.json").read_text())

    policy = ROOT / "evoharness_agent" / "trained" / "default"
    expected = model_card.card(policy, document("train"), document("transfer"), document("zero_shot"),
                               document("fine_tune"))
    assert (policy / "MODEL_CARD.md").read_text() == expected, "run `python scripts/model_card.py`"


def test_fine_tune_rows_without_their_own_steps_take_the_runs_config() -> None:
    # JSON written before each run recorded its steps: the config's steps were every run's.
    result = {"top1": 0.6, "top3": 0.8, "live_top1": 0.62, "embedding_similarity_top1": 0.2}
    document = {"start": {"policy": "default", "weights_sha256": "ab" * 32}, "config": {"steps": 1500},
                "domains": {"bfcl": [{"n_tasks": 10, "scratch": result, "default": result}]}}
    assert ("| bfcl | 10 | default | 1500 | 0.600 | 0.800 | 0.620 | not measured | not measured | not measured | "
            "0.200 |") in model_card._fine_tune(document, "ab" * 32)
