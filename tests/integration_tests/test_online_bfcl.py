"""Online evaluation and collection on real BFCL scenarios, end to end (API, then CLI)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from evoharness_agent.cli import app
from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.envs.bfcl import BFCL_INSTALL_HINT, bfcl_available
from evoharness_agent.envs.registry import load_environment
from evoharness_agent.evaluation.baselines import CountBaselines
from evoharness_agent.evaluation.choosers import (
    BigramChooser,
    EmbeddingChooser,
    PolicyChooser,
    RandomChooser,
)
from evoharness_agent.evaluation.online import collect, evaluate_online
from evoharness_agent.learning.config import TrainConfig
from evoharness_agent.learning.trainer import train_on_episodes
from evoharness_agent.logs.importers import load_episodes
from evoharness_agent.policy import ToolPolicy
from evoharness_agent.schema import Episode, Step, ToolSpec

pytestmark = pytest.mark.skipif(not bfcl_available(),
                                reason=f"bfcl_eval is not installed ({BFCL_INSTALL_HINT})")

N_TRAIN = 5


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private embedding cache, also for the CLI (which builds its own encoder)."""
    root = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EVOHARNESS_CACHE_DIR", str(root))
        yield root


@pytest.fixture(scope="module")
def encoder(cache: Path) -> StateEncoder:
    return StateEncoder(device="cpu")


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory, encoder: StateEncoder) -> Path:
    """A small BC policy trained on a few BFCL base train scenarios (never the test ones)."""
    train = load_environment("bfcl", split="train", limit=N_TRAIN).tasks
    assert all(int(e.metadata["scenario"]) % 5 != 0 for e in train)
    out = tmp_path_factory.mktemp("policy")
    config = TrainConfig.model_validate({
        "algorithm": {"name": "bc"}, "model": {"hidden": 16},
        "training": {"steps": 100, "batch_size": 64, "device": "cpu", "eval_every": 1000},
        "logging": {"tensorboard": False}})
    train_on_episodes(train, config, out, encoder=encoder, show_progress=False)
    return out


class Replay:
    """An oracle chooser: the logged gold decisions of each scenario, in order."""

    name = "gold_replay"

    def __init__(self, episodes: Sequence[Episode]) -> None:
        self.plans = {e.task: [s.action for s in e.steps if s.is_decision] for e in episodes}

    def session(self, task: str, tools: Sequence[ToolSpec]) -> Replay:
        self.plan = iter(self.plans[task])
        return self

    def observe(self, step: Step) -> None:
        pass

    def rank(self, available: Any) -> list[str]:
        return [next(self.plan)]


def test_policy_and_baselines_on_held_out_scenarios(policy_dir: Path, encoder: StateEncoder) -> None:
    setup = load_environment("bfcl", split="test", limit=3)
    assert [e.id for e in setup.tasks] == ["multi_turn_base_5", "multi_turn_base_10", "multi_turn_base_15"]
    policy = ToolPolicy.load(policy_dir, encoder=encoder, device="cpu")
    counts = CountBaselines(setup.train_episodes)
    choosers = [Replay(setup.tasks), PolicyChooser(policy), RandomChooser(0), BigramChooser(counts),
                EmbeddingChooser(encoder, round(counts.calls_per_turn))]
    report = evaluate_online(setup.env, setup.tasks, choosers, env_name=setup.name)
    summary = report.summary()
    assert list(summary) == ["gold_replay", "policy", "random", "bigram", "embedding_similarity"]
    # Gold decisions with gold arguments pass BFCL's checker on every turn.
    assert summary["gold_replay"]["success_rate"] == 1.0
    assert summary["gold_replay"]["invalid_call_rate"] == 0.0
    for name, row in summary.items():
        assert row["tasks"] == 3
        assert 0.0 <= row["success_rate"] <= row["turn_success_rate"] + 1e-9 <= 1.0 + 1e-9
        assert 0.0 <= row["invalid_call_rate"] <= 1.0
        for run in report.results[name]:
            assert 1 <= run.steps and run.invalid_calls <= run.calls < run.steps + 1
            assert run.truncated or run.turns_succeeded <= run.turns
    # The policy acts like an agent: it makes calls and ends turns before the step budget runs out.
    assert not all(run.truncated for run in report.results["policy"])


def test_collect_then_fine_tune(policy_dir: Path, encoder: StateEncoder, tmp_path: Path) -> None:
    setup = load_environment("bfcl", split="train", limit=2)
    policy = ToolPolicy.load(policy_dir, encoder=encoder, device="cpu")
    from evoharness_agent.evaluation.choosers import behaviour_chooser

    episodes = collect(setup.env, setup.tasks, behaviour_chooser("epsilon-policy", policy, epsilon=0.5))
    assert len(episodes) == 2 and all(e.reward in (0.0, 1.0) for e in episodes)
    assert all(e.metadata["scenario"] == t.metadata["scenario"] for e, t in zip(episodes, setup.tasks, strict=True))
    config = TrainConfig.model_validate({
        "algorithm": {"name": "cql"}, "training": {"steps": 20, "device": "cpu"},
        "logging": {"tensorboard": False}})
    result = train_on_episodes([*setup.tasks, *episodes], config, tmp_path / "ft", encoder=encoder,
                               init=policy_dir, show_progress=False)
    assert result["n_episodes"] == 4 and (tmp_path / "ft" / "policy.json").is_file()


def test_cli_evaluate_env_and_collect(policy_dir: Path, tmp_path: Path, cache: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, [
        "evaluate", "--env", "bfcl", "--policy", str(policy_dir), "--limit", "2",
        "--json", str(tmp_path / "online.json"), "--markdown", str(tmp_path / "online.md"),
        "--plot", str(tmp_path / "online.png")])
    assert result.exit_code == 0, result.output
    document = json.loads((tmp_path / "online.json").read_text())
    assert document["env"] == "bfcl-base-test" and document["arguments"] == "gold"
    assert list(document["summary"]) == ["policy", "random", "bigram", "embedding_similarity"]
    assert all(row["tasks"] == 2 for row in document["summary"].values())
    assert "| multi_turn_base_10 |" in (tmp_path / "online.md").read_text()
    assert (tmp_path / "online.png").read_bytes()[:4] == b"\x89PNG"

    out = tmp_path / "random.jsonl.gz"
    result = runner.invoke(app, ["collect", "--env", "bfcl", "--behaviour", "random", "--limit", "2",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    collected = load_episodes([out]).episodes
    assert [e.id for e in collected] == ["multi_turn_base_1:random:0", "multi_turn_base_2:random:0"]

    for args, message in ((["evaluate", "--policy", str(policy_dir)], "--data"),
                          (["collect", "--env", "bfcl", "--behaviour", "policy", "--out", str(out)], "needs a policy"),
                          (["evaluate", "--env", "bfcl", "--policy", str(policy_dir), "--args", "llm"], "--llm")):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and message in result.output, result.output
