"""Data-parallel training on 2 CPU processes (gloo) against one process at the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from evoharness_agent import cli
from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.encoding.transitions import EMBEDDINGS_FILE
from evoharness_agent.learning.distributed import Context, launch
from evoharness_agent.learning.trainer import DATASET_DIR, _build_in_turn, train_on_episodes
from evoharness_agent.logs.importers import write_episodes
from evoharness_agent.policy import ToolPolicy
from tests.kit.synthetic_logs import TOOLS, synthetic_episodes
from tests.unit_tests.learning.test_trainer_policy import make_config


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ddp-cache")


@pytest.fixture(scope="module")
def encoder(cache: Path) -> StateEncoder:
    return StateEncoder(cache_dir=cache, device="cpu")


def test_shard_splits_the_global_batch_evenly() -> None:
    assert [Context(rank, 2).shard(8) for rank in (0, 1)] == [slice(0, 4), slice(4, 8)]
    assert Context().shard(8) == slice(0, 8)
    with pytest.raises(ValueError, match="batch_size 9 is not divisible by the 2 processes"):
        Context(0, 2).shard(9)


class _Recorded(Context):
    """A rank that records its barriers instead of waiting at them."""

    def __init__(self, rank: int, world_size: int, local_rank: int, events: list[str]) -> None:
        super().__init__(rank, world_size, local_rank)
        self.events = events

    def barrier(self) -> None:
        self.events.append("barrier")


@pytest.mark.parametrize(("rank", "local_rank", "expected"), [
    (0, 0, ["build", "barrier", "barrier"]),          # rank 0 first: fills the cache, writes the table
    (2, 0, ["barrier", "build", "barrier"]),          # another machine's first rank next, for that machine
    (3, 1, ["barrier", "barrier", "build shared"]),   # the rest last: they map the table
])
def test_ranks_build_the_data_set_in_three_turns(rank: int, local_rank: int, expected: list[str]) -> None:
    events: list[str] = []

    def build(mmap_shared: bool) -> str:
        events.append("build shared" if mmap_shared else "build")
        return "dataset"

    assert _build_in_turn(_Recorded(rank, 4, local_rank, events), build) == "dataset"
    assert events == expected


@pytest.mark.slow  # ~15 s each: two spawned interpreters import torch and the package
@pytest.mark.parametrize("algorithm", ["cql", "iql"])
def test_two_gloo_processes_match_one_process(algorithm: str, tmp_path: Path, encoder: StateEncoder,
                                              cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Dropout off (its masks would fall on other rows) and fp32 (bf16 rounding depends on the
    # batch shape); what remains is float summation order (a mean of two half-batch means vs one
    # mean, and the all-reduce's sum), ~1e-7 relative per step. Adam amplifies it in one place:
    # an entry whose true gradient is zero gets a step of +-lr in whichever direction the rounding
    # falls, each step: a random walk. A softmax head has such entries: whatever adds the same to
    # every candidate's logit (the weight of ``available``, 1 for every tool scored; the tool
    # tower's last bias) changes no probability. So: all but a handful of weights within 1e-5, and
    # the scores the two policies give at every logged decision, less their mean, within 1e-6.
    config = make_config(steps=40, algorithm=algorithm, training={"bf16": False}, model={"dropout": 0.0})
    episodes = synthetic_episodes()
    train_on_episodes(episodes, config, tmp_path / "one", encoder=encoder, show_progress=False)
    # The spawned ranks build their own encoder over the cache the one-process run filled.
    monkeypatch.setenv("EVOHARNESS_CACHE_DIR", str(cache))
    # The ranks share one memory-mapped table, written by rank 0 (an in-memory one is the same data).
    mapped = config.model_copy(update={"data": config.data.model_copy(update={"mmap_embeddings": True})})
    launch(2, train_on_episodes, episodes, mapped, tmp_path / "two", show_progress=False)
    assert [p.name for p in (tmp_path / "two" / DATASET_DIR).iterdir()] == [EMBEDDINGS_FILE]

    one, two = (load_file(str(tmp_path / run / "policy.safetensors")) for run in ("one", "two"))
    assert one.keys() == two.keys()
    far = {name: int(((two[name] - one[name]).abs() > 1e-5).sum()) for name in one}
    assert sum(far.values()) <= 3, f"weights differing by more than 1e-5: {far}"
    states = [(episode.task, episode.steps[:end]) for episode in episodes for end in range(len(episode.steps))]
    scores = [ToolPolicy.load(tmp_path / run, encoder=encoder).score_matrix(states, TOOLS)[1] for run in ("one", "two")]
    one_scores, two_scores = (matrix - matrix.mean(axis=1, keepdims=True) for matrix in scores)
    np.testing.assert_allclose(two_scores, one_scores, rtol=0, atol=1e-6)
    log_one, log_two = (json.loads((tmp_path / run / "train_log.json").read_text()) for run in ("one", "two"))
    assert [row["step"] for row in log_two] == [row["step"] for row in log_one]
    for row_one, row_two in zip(log_one, log_two, strict=True):
        assert row_two == pytest.approx(row_one, rel=1e-4, abs=1e-5)
    # Only rank 0 wrote: one checkpoint, and a policy the calibration and validation ran on.
    meta = json.loads((tmp_path / "two" / "policy.json").read_text())
    assert "val/top1" in meta["metrics"] and (tmp_path / "two" / "checkpoint" / "state.json").is_file()


CLI_CONFIG = """\
training: {steps: 20, batch_size: 8, device: cpu, threads: 1, checkpoint_every: 10, eval_every: 10, bf16: false}
model: {hidden: 8, history_window: 1, dropout: 0.0}
logging: {tensorboard: false, log_every: 5}
"""


@pytest.fixture
def logs(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EVOHARNESS_CACHE_DIR", str(cache))  # never the user's cache
    write_episodes(tmp_path / "logs.jsonl", synthetic_episodes())
    (tmp_path / "config.yaml").write_text(CLI_CONFIG)
    return tmp_path


def train_args(root: Path, out: str) -> list[str]:
    return ["train", "--data", str(root / "logs.jsonl"), "--config", str(root / "config.yaml"),
            "--out", str(root / out)]


def test_cli_refuses_a_batch_the_processes_cannot_split(logs: Path) -> None:
    result = CliRunner().invoke(cli.app, [*train_args(logs, "bad"), "--nproc-per-node", "3"])
    assert result.exit_code == 2
    assert "batch_size 8 is not divisible by the 3 processes" in " ".join(result.output.split())
    assert not (logs / "bad" / "policy.json").exists()


def test_cli_refuses_cross_fitting_across_processes(logs: Path) -> None:
    result = CliRunner().invoke(cli.app, [*train_args(logs, "bad"), "--nproc-per-node", "2",
                                          "--calibration-folds", "2"])
    assert result.exit_code == 2, result.output  # before any child is spawned
    assert "cross-fitting is for logs of a few tasks; train in one process" in " ".join(result.output.split())
    assert not (logs / "bad" / "policy.json").exists()


def test_cli_reads_the_logs_before_spawning(logs: Path) -> None:
    (logs / "broken.jsonl").write_text('{"task": "t", "steps": [{"kind": "bogus"}]}\n')
    args = [*train_args(logs, "bad"), "--nproc-per-node", "2"]
    args[2] = str(logs / "broken.jsonl")
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 2, result.output  # the CLI's clean error, not a child's traceback
    assert "broken.jsonl" in " ".join(result.output.split())


@pytest.mark.slow  # three trainings, four spawned interpreters
def test_cli_nproc_per_node_and_torchrun_match_one_process(logs: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(cli.app, train_args(logs, "one")).exit_code == 0
    spawned = runner.invoke(cli.app, [*train_args(logs, "two"), "--nproc-per-node", "2"])
    assert spawned.exit_code == 0, spawned.output
    torchrun = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "evoharness_agent.cli", *train_args(logs, "torchrun")],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "400"}, check=False)
    assert torchrun.returncode == 0, torchrun.stderr
    assert torchrun.stdout.count("policy written to") == 1  # rank 0 reports, rank 1 stays quiet
    one = load_file(str(logs / "one" / "policy.safetensors"))
    for run in ("two", "torchrun"):
        other = load_file(str(logs / run / "policy.safetensors"))
        for name in one:  # CQL, 20 steps: nearly all within 1e-5, the few random-walking ones (see above) within 2 lr
            torch.testing.assert_close(other[name], one[name], rtol=0, atol=6e-4)
