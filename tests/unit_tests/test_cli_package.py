"""The CLI as a newcomer types it: several logs after one --data, the shipped policy's recorded training data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from evoharness_agent import cli
from evoharness_agent.learning.config import load_config
from evoharness_agent.logs import bundled
from evoharness_agent.logs.importers import write_episodes
from tests.kit.synthetic_logs import synthetic_episodes

runner = CliRunner()

FAST = ["--config", "fast.yaml", "--steps", "2"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli_package")
    episodes = synthetic_episodes()
    write_episodes(root / "a.jsonl", episodes[:4])
    write_episodes(root / "b.jsonl", episodes[4:])
    (root / "fast.yaml").write_text("training: {batch_size: 8, device: cpu, threads: 1}\n"
                                    "model: {hidden: 8, history_window: 1}\nlogging: {tensorboard: false}\n")
    return root


@pytest.fixture(autouse=True)
def _isolated(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVOHARNESS_CACHE_DIR", str(workdir / "cache"))
    monkeypatch.setattr(cli, "console", Console(width=400))
    monkeypatch.chdir(workdir)


def test_train_takes_several_logs_after_one_flag(workdir: Path) -> None:
    result = runner.invoke(cli.app, ["train", "--data", "a.jsonl", "b.jsonl", "--out", "two", *FAST])
    assert result.exit_code == 0, result.output
    meta = json.loads((workdir / "two" / "policy.json").read_text())
    assert meta["config"]["data"]["paths"] == ["a.jsonl", "b.jsonl"]
    assert meta["metrics"]["n_episodes"] == len(synthetic_episodes())


@pytest.mark.parametrize("data", [["--data", "a.jsonl", "b.jsonl"], ["--data", "a.jsonl", "--data", "b.jsonl"],
                                  ["--data=a.jsonl", "b.jsonl"], ["--data", "a.jsonl", "--data=b.jsonl"]],
                         ids=["one_flag", "repeated", "equals", "mixed"])
def test_every_form_gives_the_same_paths(data: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}

    def fake_training(config, out, **_: object) -> dict[str, object]:
        seen["paths"], seen["out"] = config.data.paths, out
        return {"n_transitions": 0, "n_encoded": 0}

    monkeypatch.setattr("evoharness_agent.learning.trainer.train", fake_training)
    result = runner.invoke(cli.app, ["train", *data, "--out", "x", "--steps", "1"])
    assert result.exit_code == 0, result.output
    assert seen == {"paths": ["a.jsonl", "b.jsonl"], "out": Path("x")}


def test_a_value_after_an_ordinary_option_is_still_an_error() -> None:
    stray = runner.invoke(cli.app, ["train", "--data", "a.jsonl", "--out", "x", "b.jsonl"])
    assert stray.exit_code == 2 and "unexpected extra argument" in stray.output


def test_help_shows_both_forms() -> None:
    for command in ("train", "evaluate"):
        # The help is drawn in a box: drop its borders and the line wrapping.
        text = " ".join(runner.invoke(cli.app, [command, "--help"]).output.replace("│", " ").split())
        assert "--data a.jsonl b.jsonl" in text and "--data a.jsonl --data b.jsonl" in text


def test_shipped_default_records_its_training_data_by_name() -> None:
    meta = json.loads((Path(bundled.__file__).parents[1] / "trained" / "default" / "policy.json").read_text())
    assert meta["config"]["data"]["bundled"] == "default" and meta["config"]["data"]["paths"] == []
    # The recipe scripts/train_default.py trains with is the shipped policy's config, so a rebuilt
    # default is the same policy, and it keeps recording its data by name.
    recipe = load_config(Path(bundled.__file__).parents[2] / "scripts" / "default_policy.yaml")
    assert recipe.model_dump(mode="json") == meta["config"]


def test_evaluate_default_without_baseline_data(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    real = bundled.training_set

    def spy(name: str) -> list:
        asked.append(name)
        # The real set (9k episodes) takes ~15 s to read; the wheel test reads it whole.
        return real(name)[:300]

    monkeypatch.setattr(bundled, "training_set", spy)
    result = runner.invoke(cli.app, ["evaluate", "--policy", "default", "--data", "a.jsonl", "--json", "m.json"])
    assert result.exit_code == 0, result.output
    assert asked == ["default"]
    assert json.loads((workdir / "m.json").read_text())["metrics"]["bigram"]["top1"] >= 0.0


def test_unknown_bundled_set_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown bundled training set 'nope'"):
        bundled.training_set("nope")
