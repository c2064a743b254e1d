from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from evoharness_agent import cli
from evoharness_agent.logs.importers import write_episodes
from tests.kit.synthetic_logs import synthetic_episodes

runner = CliRunner()

FAST_CONFIG = """\
training: {batch_size: 8, device: cpu, threads: 1, checkpoint_every: 5, eval_every: 5}
model: {hidden: 8, history_window: 1}
logging: {tensorboard: false, log_every: 5}
"""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    write_episodes(root / "logs.jsonl", synthetic_episodes())
    good = (root / "logs.jsonl").read_text().splitlines()
    # line 3 is broken: a step kind that does not exist
    bad = [*good[:2], json.dumps({"task": "t", "steps": [{"kind": "bogus"}]}), *good[2:]]
    (root / "bad.jsonl").write_text("\n".join(bad) + "\n")
    (root / "fast.yaml").write_text(FAST_CONFIG)
    return root


@pytest.fixture(autouse=True)
def _isolated(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVOHARNESS_CACHE_DIR", str(workdir / "cache"))  # never the user's cache
    monkeypatch.setattr(cli, "console", Console(width=400))  # no line wrapping inside messages


def flat(text: str) -> str:
    return " ".join(text.split())


def test_bad_log_line_names_file_line_and_field(workdir: Path) -> None:
    result = runner.invoke(cli.app, ["train", "--data", str(workdir / "bad.jsonl"), "--out", str(workdir / "nope"),
                                     "--config", str(workdir / "fast.yaml"), "--steps", "2"])
    assert result.exit_code == 2, result.output
    output = flat(result.output)
    assert "error:" in output
    assert f"{workdir / 'bad.jsonl'}:3:" in output
    assert "steps[0].kind" in output
    assert not (workdir / "nope" / "policy.json").exists()


def test_skip_invalid_trains_and_reports(workdir: Path) -> None:
    out = workdir / "skipping"
    result = runner.invoke(cli.app, ["train", "--data", str(workdir / "bad.jsonl"), "--out", str(out),
                                     "--config", str(workdir / "fast.yaml"), "--steps", "3", "--skip-invalid",
                                     "--algo", "bc"])
    assert result.exit_code == 0, result.output
    output = flat(result.output)
    assert "skipped 1 of 7 lines" in output and "steps[0].kind" in output
    assert "policy written to" in output
    meta = json.loads((out / "policy.json").read_text())
    assert meta["algorithm"] == "bc"
    assert meta["config"]["data"]["skip_invalid"] is True
    assert meta["config"]["training"]["steps"] == 3 and meta["network"]["hidden"] == 8


def test_train_then_evaluate_json(workdir: Path) -> None:
    out = workdir / "policy"
    trained = runner.invoke(cli.app, ["train", "--data", str(workdir / "logs.jsonl"), "--out", str(out),
                                      "--config", str(workdir / "fast.yaml"), "--steps", "5", "--seed", "3"])
    assert trained.exit_code == 0, trained.output
    assert (out / "policy.safetensors").is_file()
    assert json.loads((out / "policy.json").read_text())["config"]["training"]["seed"] == 3
    report, plot = workdir / "report.json", workdir / "report.png"
    evaluated = runner.invoke(cli.app, ["evaluate", "--policy", str(out), "--data", str(workdir / "logs.jsonl"),
                                        "--baseline-data", str(workdir / "logs.jsonl"),
                                        "--json", str(report), "--plot", str(plot)])
    assert evaluated.exit_code == 0, evaluated.output
    document = json.loads(report.read_text())
    assert document["n_decisions"] == 9  # the tool calls: 2 in each even episode, 1 in each odd one
    assert set(document["metrics"]) == {"policy", "random", "most_frequent", "bigram", "embedding_similarity"}
    for metrics in document["metrics"].values():
        assert set(metrics) == {"top1", "top3", "mrr"}
    assert plot.read_bytes().startswith(b"\x89PNG")
    assert "metrics written to" in flat(evaluated.output)


def test_train_cross_fits_a_temperature_it_would_fit_on_few_decisions(workdir: Path) -> None:
    # 6 episodes, val_fraction 0.1: the validation split would be one episode, so "auto" cross-fits over all 6,
    # trained on every one.
    out = workdir / "few"
    folded = runner.invoke(cli.app, ["train", "--data", str(workdir / "logs.jsonl"), "--out", str(out),
                                     "--config", str(workdir / "fast.yaml"), "--steps", "3"])
    assert folded.exit_code == 0, folded.output
    meta = json.loads((out / "policy.json").read_text())
    fit = meta["calibration"]
    assert meta["config"]["training"]["calibration_folds"] == 5 and len(list((out / "cross_fit").glob("fold_*"))) == 5
    assert fit["n_out_of_fold"] == fit["n_decisions"] > 0 and meta["config"]["data"]["val_fraction"] == 0
    assert (f"fit on {fit['n_decisions']} decisions, all scored out of fold (by a model that had not trained on "
            "their task); the policy trained on every task") in flat(folded.output)
    assert "validation decisions only" not in flat(folded.output)
    evaluated = runner.invoke(cli.app, ["evaluate", "--policy", str(out), "--data", str(workdir / "logs.jsonl"),
                                        "--baseline-data", str(workdir / "logs.jsonl")])
    assert evaluated.exit_code == 0, evaluated.output
    assert (f"was fit on {fit['n_decisions']} decisions, each scored by a model that had not trained on its task "
            "(all out of fold)") in flat(evaluated.output)
    alone = runner.invoke(cli.app, ["train", "--data", str(workdir / "logs.jsonl"), "--out", str(out),
                                    "--config", str(workdir / "fast.yaml"), "--steps", "3",
                                    "--calibration-folds", "0"])
    assert alone.exit_code == 0, alone.output
    assert ("--calibration-folds auto (the default) fits it on every decision scored out of fold and trains on "
            "the validation tasks too") in flat(alone.output)
    assert "n_out_of_fold" not in json.loads((out / "policy.json").read_text())["calibration"]
    refused = runner.invoke(cli.app, ["train", "--data", str(workdir / "logs.jsonl"), "--out", str(out),
                                      "--config", str(workdir / "fast.yaml"), "--steps", "3",
                                      "--calibration-folds", "9"])
    assert refused.exit_code != 0 and "calibration_folds is 9" in flat(refused.output)


def test_evaluate_never_reads_data_paths_recorded_in_the_policy(workdir: Path) -> None:
    out = workdir / "recorded-paths"
    trained = runner.invoke(cli.app, ["train", "--data", str(workdir / "logs.jsonl"), "--out", str(out),
                                      "--config", str(workdir / "fast.yaml"), "--steps", "2"])
    assert trained.exit_code == 0, trained.output
    meta = json.loads((out / "policy.json").read_text())
    meta["config"]["data"]["paths"] = ["/dev/zero"]  # read, it would fill the memory
    (out / "policy.json").write_text(json.dumps(meta))
    result = runner.invoke(cli.app, ["evaluate", "--policy", str(out), "--data", str(workdir / "logs.jsonl")])
    assert result.exit_code == 2, result.output
    assert "pass --baseline-data" in flat(result.output) and "/dev/zero" in flat(result.output)


def test_evaluate_reports_bad_logs_cleanly(workdir: Path) -> None:
    result = runner.invoke(cli.app, ["evaluate", "--policy", str(workdir / "missing"),
                                     "--data", str(workdir / "logs.jsonl")])
    assert result.exit_code == 2
    assert "not a policy directory" in flat(result.output)


@pytest.mark.parametrize("content", ["", "\n  \n", json.dumps({"task": "no decision", "steps": [
    {"kind": "user", "content": "hello?"}]}) + "\n"], ids=["empty", "blank", "no-decision"])
def test_evaluate_with_nothing_to_evaluate_is_an_error(workdir: Path, content: str) -> None:
    data = workdir / "nothing.jsonl"
    data.write_text(content)
    result = runner.invoke(cli.app, ["evaluate", "--policy", "default", "--data", str(data)])
    assert result.exit_code == 2, result.output
    assert (f"no episodes to evaluate in {data}" if not content.strip() else
            "nothing to evaluate: the 1 episodes given hold no logged decision") in flat(result.output)


def test_config_with_unknown_key_errors_clearly(workdir: Path) -> None:
    config = workdir / "typo.yaml"
    config.write_text("training:\n  stepz: 10\n")
    result = runner.invoke(cli.app, ["train", "--data", str(workdir / "logs.jsonl"), "--out", str(workdir / "typo"),
                                     "--config", str(config)])
    assert result.exit_code == 2, result.output
    output = flat(result.output)
    assert str(config) in output and "training.stepz" in output
    assert "extra inputs are not permitted" in output.lower()


def test_config_that_is_not_a_mapping(workdir: Path) -> None:
    config = workdir / "list.yaml"
    config.write_text("- training\n- model\n")
    result = runner.invoke(cli.app, ["train", "--data", str(workdir / "logs.jsonl"), "--out", str(workdir / "x"),
                                     "--config", str(config)])
    assert result.exit_code == 2
    assert "must be a mapping" in flat(result.output)


def test_unknown_algorithm_setting_in_config(workdir: Path) -> None:
    config = workdir / "params.yaml"
    config.write_text(FAST_CONFIG + "algorithm: {name: cql, params: {alpah: 2.0}}\n")
    result = runner.invoke(cli.app, ["train", "--data", str(workdir / "logs.jsonl"), "--out", str(workdir / "p"),
                                     "--config", str(config), "--steps", "1"])
    assert result.exit_code == 2, result.output
    assert "alpah" in flat(result.output)


def test_algorithm_choices_match_the_registry() -> None:
    # The CLI repeats the names (the registry imports torch); the other choices come from their registries.
    from evoharness_agent.learning.algorithms import ALGORITHMS

    assert [algo.value for algo in cli.Algo] == list(ALGORITHMS)


def test_cli_starts_without_torch() -> None:
    code = "import sys, evoharness_agent.cli; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False", result.stderr


def test_int8_export_keeps_a_cross_fitted_temperature() -> None:
    # Refit on the validation split alone, the default's temperature (cross-fitted by domain) would be an in-domain one.
    bundled = {"config": {"data": {"bundled": "default"}}}
    assert cli._calibration_episodes({**bundled, "calibration": {"n_out_of_fold": 25_770}}, None, "auto") == []
    assert cli._calibration_episodes({"config": {"data": {}}}, None, "auto") == []
