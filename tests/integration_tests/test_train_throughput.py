"""The training-throughput benchmark: its arithmetic ceiling, and a short run against d3rlpy end to end."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from evoharness_agent.learning.networks import mlp
from tests.kit.scripts import load_script

throughput = load_script("train_throughput", "benchmarks")


def _floor(batch_size: int) -> object:
    """A floor learner on a small synthetic set, its initial MLP a fresh one in place of d3rlpy's."""
    data = throughput.make_synthetic(64, seed=0)
    initial = mlp(throughput.STATE_DIM, throughput.HIDDEN, 2, throughput.N_TOOLS)
    theirs = SimpleNamespace(input_dim=throughput.STATE_DIM, observations=data.states, modules=lambda: [initial])
    return throughput.Floor(data, batch_size, seed=0, bf16=False, theirs=theirs)


def test_the_floor_update_counts_three_forward_passes_and_one_backward() -> None:
    # Per transition: q(next), target(next) and q(states) forward; the backward of q(states) needs every
    # layer's weight gradient and the input gradient of every layer but the first (the states need none).
    layers = [(throughput.STATE_DIM, throughput.HIDDEN), (throughput.HIDDEN, throughput.HIDDEN),
              (throughput.HIDDEN, throughput.N_TOOLS)]
    forward = sum(2 * n_in * n_out for n_in, n_out in layers)
    backward = forward + sum(2 * n_in * n_out for n_in, n_out in layers[1:])
    floor = _floor(batch_size=16)
    before = [p.detach().clone() for p in floor.q.parameters()]
    assert throughput.flops_per_transition(floor) == 3 * forward + backward
    # Counting ran a step on a copy: the learner about to be timed starts where it was.
    assert all(torch.equal(a, b) for a, b in zip(before, floor.q.parameters(), strict=True))


def test_the_matmul_rate_is_a_positive_rate() -> None:
    assert throughput.matmul_gflops(32, throughput.STATE_DIM, bf16=True, repeats=5) > 0.0


@pytest.mark.slow
def test_a_short_run_reports_every_learner_and_the_ceiling(tmp_path: Path) -> None:
    pytest.importorskip("d3rlpy", reason="the `bench` extra (make test-slow installs it)")
    out = tmp_path / "throughput.json"
    throughput.main(["--batch-sizes", "32", "--transitions", "400", "--updates", "2", "--rounds", "1",
                     "--warmup", "1", "--threads", "1", "--compile", "--json", str(out)])
    report = json.loads(out.read_text())
    assert [row["mode"] for row in report["results"]] == ["sample+update", "update"]
    for row in report["results"]:
        assert set(row["transitions_per_s"]) == {*throughput.LEARNERS, throughput.COMPILED}
        assert row["ratio_ceiling_over_d3rlpy"] == pytest.approx(
            row["matmul_gflops"] / row["gflops"]["d3rlpy"])
