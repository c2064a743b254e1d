"""Training throughput of our discrete CQL against d3rlpy's ``DiscreteCQL`` on the same synthetic data.

Run: ``python benchmarks/train_throughput.py`` (needs the ``bench`` extra: ``pip install -e '.[bench]'``);
``--json PATH`` also writes the figures.

All learners see the same random offline data: 384-d state vectors, 32 discrete actions
(our 32 tools are 32 random 384-d "tool embeddings", FINISH among them), random rewards and
terminals, every tool available at every decision. Four learners, Adam at 3e-4 and torch's
default thread count for all:

* ``ours``: our CQL with our model, the two-tower tool-conditioned ``ToolScorer`` (256×256
  towers, no dropout: d3rlpy's MLP has none, our default state tower has 0.1), batches from
  our sampler ``TransitionDataset.sample``, steps from our ``update``.
* ``same-mlp``: our loop (same algorithm, sampler, ``update``, autocast) training the very
  same plain Q-MLP as d3rlpy (state -> 256 -> 256 -> 32, one Q-value per action, started
  from d3rlpy's initial weights) in place of the ToolScorer, so ``same-mlp/d3rlpy`` compares
  training loops, not models; ``ours/d3rlpy`` compares what each library trains by default.
* ``d3rlpy``: its ``DiscreteCQL`` with that MLP, fed from its replay buffer.
* ``floor``: that MLP and our update's arithmetic written out in a dozen lines of eager
  PyTorch, batches by one ``index_select``: no loop does the same arithmetic faster here, so
  ``floor/d3rlpy`` is the most that ``same-mlp/d3rlpy`` can reach on this machine.

Ours runs its updates as the trainer does with ``training.bf16: true``: under bf16 autocast
where the CPU multiplies bf16 natively (``--no-bf16``: fp32, as the trainer's CPU default, which
suits the package's narrow scorers; these learners are 256 wide); d3rlpy runs as it does by
default, in fp32. Each measurement is
a fixed number of updates after a warm-up, and the learners run interleaved in one process
(ours, same-mlp, d3rlpy, ours, ...), so that a noisy machine slows all alike. A throughput is
transitions per second: ``batch_size * updates / seconds``; a figure is the median over rounds.

Two figures per learner:

* ``sample+update``: draw a batch with the learner's own sampler, then one gradient step;
  this is what a training loop pays (d3rlpy's ``fit`` does exactly this).
* ``update``: one gradient step on a batch drawn beforehand (pure model compute).

The printed notes say what differs between the models. Figures only: nothing is asserted
about speed (the same-MLP's parameter count and initial outputs are checked against d3rlpy's).

The arithmetic ceiling: the floor's update is counted in floating-point operations per
transition (``torch.utils.flop_counter``; the same-MLP and d3rlpy do the same products), and
this machine's matrix-multiply rate is measured on the update's largest product at the same
batch size and threads, in the number format the floor and our loops run in (bf16 autocast
where the CPU multiplies bf16 natively). No loop doing this arithmetic runs faster than that rate, so
``ceiling/d3rlpy`` = matmul rate / d3rlpy's rate is the most any loop can gain over d3rlpy here.
``--compile`` adds ``floor-compiled``: the floor's update under ``torch.compile`` (inductor's
fused C++ kernels), to see whether fusing the small operations beats eager PyTorch.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from evoharness_agent.encoding.state import (
    AVAILABLE,
    FIXED_SLOTS,
    IS_FINISH,
    N_PAIR_FEATURES,
    N_STATE_FEATURES,
    REQUEST_SLOT,
    n_slots,
    state_dim,
)
from evoharness_agent.encoding.transitions import ToolTable, TransitionDataset
from evoharness_agent.learning.algorithms import Dims, ToolInputs, make_algorithm
from evoharness_agent.learning.algorithms.base import adam, polyak
from evoharness_agent.learning.algorithms.cql import CQLConfig, td_loss
from evoharness_agent.learning.networks import NetworkConfig, mlp
from evoharness_agent.learning.precision import cpu_has_native_bf16, training_autocast
from evoharness_agent.schema import ToolSpec, finish_spec

STATE_DIM = 384
N_TOOLS = 32
HIDDEN = 256
HISTORY_WINDOW = 0
"""No history slots: the state is the fixed slots (request, previous tool, task) plus the features."""
N_SLOTS = n_slots(HISTORY_WINDOW)
LEARNERS = ("ours", "same-mlp", "d3rlpy", "floor")
COMPILED = "floor-compiled"


@dataclass
class Synthetic:
    """The shared random data: states, actions, rewards, terminals and our tables."""

    states: np.ndarray  # (n, 384): the state vector d3rlpy sees
    actions: np.ndarray
    rewards: np.ndarray
    terminals: np.ndarray
    dataset: TransitionDataset


def make_synthetic(n: int, seed: int) -> Synthetic:
    """Build ``n`` random transitions as a TransitionDataset and as plain arrays."""
    g = torch.Generator().manual_seed(seed)
    unit = lambda t: t / t.norm(dim=1, keepdim=True)  # noqa: E731 -- sentence embeddings are unit vectors
    # Our dataset stores text rows into one embedding table: here every transition has its
    # own 384-d "request" text, row i + 1 (row 0 is the zero PAD vector).
    table = torch.cat([torch.zeros(1, STATE_DIM), unit(torch.randn(n, STATE_DIM, generator=g))])
    specs = [finish_spec()] + [ToolSpec(name=f"tool_{i}", description=f"synthetic tool {i}")
                               for i in range(1, N_TOOLS)]
    tools = ToolTable(specs, unit(torch.randn(N_TOOLS, STATE_DIM, generator=g)),
                      {spec.name: i for i, spec in enumerate(specs)})
    # history_window=0; every slot but the request points at PAD, so our state carries
    # exactly the same information as d3rlpy's 384-d observation (see the notes).
    rows = torch.zeros(n, N_SLOTS, dtype=torch.long)
    rows[:, REQUEST_SLOT] = torch.arange(1, n + 1)
    actions = torch.randint(N_TOOLS, (n,), generator=g)
    rewards = torch.randn(n, generator=g)
    dones = torch.rand(n, generator=g) < 0.1
    dones[-1] = True
    following = torch.arange(n) + 1
    following[dones] = torch.arange(n)[dones]  # a terminal's next state is itself, as in build_dataset
    features = torch.zeros(n, N_STATE_FEATURES)
    # Sparse pair storage as build_dataset writes it: every tool is available at every decision,
    # in table order, so each state's candidates are rows 0..N-1 (FINISH is row 0).
    pair_values = torch.zeros(n, N_TOOLS, N_PAIR_FEATURES)
    pair_values[:, :, AVAILABLE] = 1.0
    pair_values[:, 0, IS_FINISH] = 1.0
    tensors = {
        "rows": rows, "features": features, "actions": actions, "rewards": rewards,
        "dones": dones.float(), "next_rows": rows[following],
        "next_features": features[following], "following": following,
        "pair_offsets": torch.arange(n + 1) * N_TOOLS,
        "pair_tools": torch.arange(N_TOOLS).repeat(n),
        "pair_values": pair_values.reshape(-1, N_PAIR_FEATURES),
        "episode_ids": torch.cumsum(dones.long(), 0) - dones.long(),
    }
    dataset = TransitionDataset(table, tools, tensors, history_window=HISTORY_WINDOW)
    assert dataset.state_dim == state_dim(STATE_DIM, HISTORY_WINDOW)
    return Synthetic(table[1:].numpy(), actions.numpy(), rewards.numpy(), dones.numpy(), dataset)


class PlainQ(nn.Module):
    """d3rlpy's discrete Q-MLP (input -> 256 -> 256 -> one Q-value per action) behind the ToolScorer signature.

    It reads ``input_dim`` columns of our gathered state from ``offset`` (the request slot: exactly
    d3rlpy's observation; or the whole state with ``--same-input``) and ignores the tool inputs.
    """

    def __init__(self, offset: int, input_dim: int, n_actions: int) -> None:
        """Build the MLP."""
        super().__init__()
        self.offset, self.input_dim, self.n_actions = offset, input_dim, n_actions
        self.net = mlp(input_dim, HIDDEN, 2, n_actions)
        self.register_buffer("columns", torch.arange(n_actions), persistent=False)

    def forward(self, states: torch.Tensor, tool_embeddings: torch.Tensor, tool_ids: torch.Tensor | None = None,
                pairs: torch.Tensor | None = None, candidates: torch.Tensor | None = None, *,
                acting: bool = False) -> torch.Tensor:
        """Return ``(B, N)`` Q-values; the tools asked for must be the N actions in order (no decision rules)."""
        assert tool_embeddings.shape[0] == self.n_actions
        if candidates is not None:
            in_order = torch.equal(candidates, self.columns.expand(candidates.shape[0], -1))
            assert in_order, "PlainQ needs every action as a candidate, in table order"
        return self.net(states[:, self.offset : self.offset + self.input_dim])


class Ours:
    """Our CQL (two-tower scorer) with batches from ``TransitionDataset.sample``."""

    name = "ours"

    def __init__(self, data: Synthetic, batch_size: int, seed: int, bf16: bool = True) -> None:
        """Build the algorithm over the synthetic tool table."""
        torch.manual_seed(seed)
        self.bf16 = bf16
        dataset = data.dataset
        self.dataset, self.batch_size = dataset, batch_size
        self.generator = torch.Generator().manual_seed(seed)
        dims = Dims(dataset.state_dim, STATE_DIM, N_TOOLS)
        tools = ToolInputs(dataset.tools.embeddings, torch.arange(N_TOOLS))
        self.algo = make_algorithm("cql", {}, dims, NetworkConfig(hidden=HIDDEN, layers=2, dropout=0.0), tools)
        self.fixed = self.sample()
        self.input_dim = dataset.state_dim

    def sample(self) -> Any:
        """Draw one batch."""
        return self.dataset.sample(self.batch_size, self.generator)

    def update(self, batch: Any) -> None:
        """One gradient step, under the trainer's autocast (bf16 where the CPU multiplies it natively)."""
        with training_autocast("cpu", self.bf16):
            self.algo.update(batch)

    def modules(self) -> list[torch.nn.Module]:
        """The trainable modules (for the parameter count)."""
        return [self.algo.modules["q"]]


class SameMlp(Ours):
    """Our CQL loop (sampler, update, autocast) training d3rlpy's very Q-MLP instead of the ToolScorer."""

    name = "same-mlp"

    def __init__(self, data: Synthetic, batch_size: int, seed: int, bf16: bool, theirs: Theirs,
                 same_input: bool = False) -> None:
        """Build our CQL, then swap its ``q``/``q_target`` for a :class:`PlainQ` holding d3rlpy's initial weights."""
        super().__init__(data, batch_size, seed, bf16)
        offset = 0 if same_input else REQUEST_SLOT * STATE_DIM
        q = PlainQ(offset, theirs.input_dim, N_TOOLS)
        source = list(theirs.modules()[0].parameters())
        assert [p.shape for p in q.parameters()] == [p.shape for p in source], "not d3rlpy's architecture"
        with torch.no_grad():
            for mine, theirs_p in zip(q.parameters(), source, strict=True):
                mine.copy_(theirs_p)
        algo = self.algo
        algo.modules["q"] = q
        algo.modules["q_target"] = copy.deepcopy(q).requires_grad_(False)
        # The algorithm makes its Adam on the first update, over the modules it holds then: this MLP.
        algo.set_training(True)
        self.input_dim = theirs.input_dim
        self.check_outputs(data, theirs)

    def check_outputs(self, data: Synthetic, theirs: Theirs) -> None:
        """Assert that the swapped-in MLP computes d3rlpy's initial Q-values on the same states."""
        index = torch.arange(8)
        batch = self.dataset.batch(index, candidates_only=True)
        assert torch.equal(batch.candidates, torch.arange(N_TOOLS).expand(8, N_TOOLS))
        with torch.no_grad():
            mine = self.algo.score_states("q", batch)
            observations = torch.from_numpy(np.ascontiguousarray(theirs.observations[:8]))
            reference = theirs.modules()[0][0](observations).q_value
        assert torch.allclose(mine, reference, atol=1e-5), "same-MLP differs from d3rlpy's Q-function"


class Theirs:
    """d3rlpy's DiscreteCQL with batches from its replay buffer's ``sample_transition_batch``."""

    name = "d3rlpy"

    def __init__(self, data: Synthetic, batch_size: int, seed: int, same_input: bool = False) -> None:
        """Build the MDPDataset and the algorithm (Q-MLP 256×256 → 32).

        With ``same_input`` the observations are our full gathered state vectors (all slots and
        features), so both first layers do the same work; otherwise the plain 384-d state.
        """
        import d3rlpy
        from d3rlpy.constants import ActionSpace
        from d3rlpy.dataset import MDPDataset

        d3rlpy.seed(seed)
        observations = data.states
        if same_input:
            tensors = data.dataset.tensors
            observations = data.dataset.gather_states(tensors["rows"], tensors["features"]).numpy()
        self.observations = observations
        self.dataset = MDPDataset(
            observations=observations, actions=data.actions[:, None], rewards=data.rewards[:, None],
            terminals=data.terminals.astype(np.float32), action_space=ActionSpace.DISCRETE, action_size=N_TOOLS)
        self.batch_size = batch_size
        self.algo = d3rlpy.algos.DiscreteCQLConfig(
            batch_size=batch_size, learning_rate=3e-4, alpha=1.0,
            encoder_factory=d3rlpy.models.VectorEncoderFactory(hidden_units=[HIDDEN, HIDDEN]),
        ).create(device=False)
        self.algo.build_with_dataset(self.dataset)
        self.fixed = self.sample()
        self.input_dim = int(observations.shape[1])

    def sample(self) -> Any:
        """Draw one batch."""
        return self.dataset.sample_transition_batch(self.batch_size)

    def update(self, batch: Any) -> None:
        """One gradient step."""
        self.algo.update(batch)

    def modules(self) -> list[torch.nn.Module]:
        """The trainable modules (for the parameter count)."""
        return [self.algo.impl.q_function]


class Floor:
    """The least an eager PyTorch loop can do for the same update: d3rlpy's MLP stepped in a dozen lines.

    The same arithmetic as ``same-mlp`` (our CQL's double-DQN target, Huber TD + alpha * CQL,
    fused Adam, Polyak at our rate, from d3rlpy's initial weights, our autocast), with no masks,
    no pair features and no tool table, on batches drawn by one ``index_select`` from
    tensors stacked beforehand. ``floor/d3rlpy`` bounds what any training loop can gain over
    d3rlpy on this machine without changing the arithmetic.
    """

    name = "floor"

    def __init__(self, data: Synthetic, batch_size: int, seed: int, bf16: bool, theirs: Theirs) -> None:
        """Copy d3rlpy's initial Q-MLP and stack the data as d3rlpy sees it."""
        self.config, self.bf16 = CQLConfig(), bf16
        self.q = mlp(theirs.input_dim, HIDDEN, 2, N_TOOLS)
        with torch.no_grad():
            for mine, theirs_p in zip(self.q.parameters(), theirs.modules()[0].parameters(), strict=True):
                mine.copy_(theirs_p)
        self.target = copy.deepcopy(self.q).requires_grad_(False)
        self.optimizer = adam([self.q], self.config.lr)
        observations = torch.from_numpy(np.ascontiguousarray(theirs.observations))
        following = data.dataset.tensors["following"]
        self.tensors = (observations, observations[following], torch.from_numpy(data.actions).long(),
                        torch.from_numpy(data.rewards).float(), torch.from_numpy(data.terminals).float())
        self.batch_size, self.input_dim = batch_size, theirs.input_dim
        self.generator = torch.Generator().manual_seed(seed)
        self.fixed = self.sample()

    def sample(self) -> Any:
        """Draw one batch: one index, one ``index_select`` per tensor."""
        index = torch.randint(len(self.tensors[0]), (self.batch_size,), generator=self.generator)
        return tuple(t.index_select(0, index) for t in self.tensors)

    def update(self, batch: Any) -> None:
        """One gradient step."""
        states, next_states, actions, rewards, dones = batch
        cfg = self.config
        with training_autocast("cpu", self.bf16):
            with torch.no_grad():
                best = self.q(next_states).argmax(1, keepdim=True)
                next_q = self.target(next_states).gather(1, best).squeeze(1).float()
                target = rewards + cfg.gamma * (1.0 - dones) * next_q
            q_all = self.q(states).float()
            q_taken = q_all.gather(1, actions[:, None]).squeeze(1)
            loss = td_loss(q_taken, target) + cfg.alpha * (torch.logsumexp(q_all, dim=1) - q_taken).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        polyak(self.target, self.q, cfg.tau)

    def modules(self) -> list[torch.nn.Module]:
        """The trainable modules (for the parameter count)."""
        return [self.q]


class CompiledFloor(Floor):
    """The floor's update under ``torch.compile``: the same arithmetic, its small operations fused."""

    name = COMPILED

    def __init__(self, data: Synthetic, batch_size: int, seed: int, bf16: bool, theirs: Theirs) -> None:
        """Build the floor, then compile its update (the first calls, in the warm-up, pay for compiling)."""
        super().__init__(data, batch_size, seed, bf16, theirs)
        self.update = torch.compile(self.update)  # type: ignore[method-assign]


Learner = Ours | Theirs | Floor


def flops_per_transition(floor: Floor) -> float:
    """Floating-point operations of one floor update's matrix products a transition (three forwards, one backward).

    ``FlopCounterMode`` counts matrix products only. The element-wise rest (activations, the
    losses, Adam, Polyak) is left out, so the ceiling it gives is generous: the true one is lower.
    """
    from torch.utils.flop_counter import FlopCounterMode

    learner = copy.deepcopy(floor)  # counting runs a real step: keep the timed learner's weights as they are
    with FlopCounterMode(display=False) as counter:
        learner.update(learner.fixed)
    return counter.get_total_flops() / learner.batch_size


def matmul_gflops(batch_size: int, input_dim: int, bf16: bool, repeats: int = 200) -> float:
    """This machine's matrix-multiply rate (GFLOP/s) on the update's largest product, best of three.

    Measured under the autocast the floor and our loops run in (bf16 where the CPU multiplies it
    natively, ``training_autocast``): a ceiling timed in fp32 would sit below a bf16 floor.
    """
    states, weights = torch.randn(batch_size, input_dim), torch.randn(input_dim, HIDDEN)
    with training_autocast("cpu", bf16):
        for _ in range(10):
            states @ weights
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(repeats):
                states @ weights
            best = min(best, (time.perf_counter() - start) / repeats)
    return 2 * batch_size * input_dim * HIDDEN / best / 1e9


def timed(learner: Learner, updates: int, resample: bool) -> float:
    """Seconds for ``updates`` updates (drawing a fresh batch each time when ``resample``)."""
    start = time.perf_counter()
    for _ in range(updates):
        learner.update(learner.sample() if resample else learner.fixed)
    return time.perf_counter() - start


def interleaved(learners: list[Learner], updates: int, rounds: int, warmup: int,
                resample: bool) -> dict[str, list[float]]:
    """Per-round transitions/s of each learner, the learners alternating within every round."""
    for learner in learners:
        timed(learner, warmup, resample)
    rates: dict[str, list[float]] = {learner.name: [] for learner in learners}
    for _ in range(rounds):
        for learner in learners:
            rates[learner.name].append(learner.batch_size * updates / timed(learner, updates, resample))
    return rates


def parameters(learner: Learner) -> int:
    """Trainable parameters of the learner's Q-network."""
    return sum(p.numel() for m in learner.modules() for p in m.parameters())


def profile_ours(learner: Ours, updates: int) -> None:
    """Print where one of our updates spends its time (torch.profiler, CPU)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(updates):
            learner.update(learner.sample())
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def quiet_d3rlpy() -> None:
    """Keep d3rlpy's per-build info logs out of the table."""
    import logging

    import d3rlpy  # noqa: F401 -- configures structlog on import; reconfigure after it
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark, print the table and, with ``--json``, write the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 2048])
    parser.add_argument("--transitions", type=int, default=20_000)
    parser.add_argument("--updates", type=int, default=0,
                        help="updates per round (default: 20 at batch ≤ 512, else 5)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads for all learners (default: leave torch's default)")
    parser.add_argument("--same-input", action="store_true",
                        help="feed d3rlpy (and the same-MLP) our full gathered state vector instead of the 384-d state")
    parser.add_argument("--profile", action="store_true", help="also profile our update at each batch size")
    parser.add_argument("--no-bf16", dest="bf16", action="store_false",
                        help="keep our updates in fp32 (the trainer's training.bf16: false)")
    parser.add_argument("--compile", action="store_true",
                        help="also time the floor's update under torch.compile (floor-compiled)")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    quiet_d3rlpy()

    data = make_synthetic(args.transitions, args.seed)
    results: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    for batch_size in args.batch_sizes:
        ours_learner = Ours(data, batch_size, args.seed, args.bf16)
        their_learner = Theirs(data, batch_size, args.seed, args.same_input)
        same_learner = SameMlp(data, batch_size, args.seed, args.bf16, their_learner, args.same_input)
        floor_learner = Floor(data, batch_size, args.seed, args.bf16, their_learner)
        learners: list[Learner] = [ours_learner, same_learner, their_learner, floor_learner]
        if args.compile:
            learners.append(CompiledFloor(data, batch_size, args.seed, args.bf16, their_learner))
        counts = {learner.name: parameters(learner) for learner in learners}
        assert counts["same-mlp"] == counts["d3rlpy"] == counts["floor"], counts
        flops = flops_per_transition(floor_learner)
        matmul = matmul_gflops(batch_size, their_learner.input_dim, args.bf16)
        updates = args.updates or (20 if batch_size <= 512 else 5)
        for mode, resample in (("sample+update", True), ("update", False)):
            rates = interleaved(learners, updates, args.rounds, args.warmup, resample)
            medians = {name: statistics.median(values) for name, values in rates.items()}
            d3rlpy_gflops = medians["d3rlpy"] * flops / 1e9
            results.append({
                "batch_size": batch_size, "mode": mode, "updates_per_round": updates,
                "transitions_per_s": medians, "rounds": rates,
                "ratio_ours_over_d3rlpy": medians["ours"] / medians["d3rlpy"],
                "ratio_same_mlp_over_d3rlpy": medians["same-mlp"] / medians["d3rlpy"],
                "ratio_floor_over_d3rlpy": medians["floor"] / medians["d3rlpy"],
                "ratio_same_mlp_over_floor": medians["same-mlp"] / medians["floor"],
                "flops_per_transition": flops, "matmul_gflops": matmul,
                "gflops": {name: rate * flops / 1e9 for name, rate in medians.items() if name != "ours"},
                "ratio_ceiling_over_d3rlpy": matmul / d3rlpy_gflops,
            })
        if args.profile:
            print(f"\n-- profile of our update, batch {batch_size} --")
            profile_ours(ours_learner, max(3, updates // 4))

    bf16 = args.bf16 and cpu_has_native_bf16()
    print(f"\npython {platform.python_version()}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, torch threads = {torch.get_num_threads()} "
          f"({'set by --threads' if args.threads else 'torch default'}, all learners)")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"ours and same-mlp: {'bf16 autocast (this CPU multiplies bf16 natively)' if bf16 else 'fp32'}, "
          "as the trainer runs; d3rlpy: fp32 (its default)")
    print(f"{args.transitions} transitions, {N_TOOLS} actions, median of {args.rounds} interleaved rounds; "
          f"load average {load} (other processes share these CPUs)")
    print("Q-network parameters: " + ", ".join(f"{name} {counts[name]:,}" for name in LEARNERS) + "\n")
    print(f"{'batch':>6}  {'measure':<14}{'ours tr/s':>12}{'same-mlp tr/s':>15}{'d3rlpy tr/s':>13}"
          f"{'floor tr/s':>12}{'ours/d3rlpy':>13}{'same-mlp/d3rlpy':>17}{'floor/d3rlpy':>14}")
    for row in results:
        rate = row["transitions_per_s"]
        print(f"{row['batch_size']:>6}  {row['mode']:<14}{rate['ours']:>12,.0f}{rate['same-mlp']:>15,.0f}"
              f"{rate['d3rlpy']:>13,.0f}{rate['floor']:>12,.0f}{row['ratio_ours_over_d3rlpy']:>12.2f}x"
              f"{row['ratio_same_mlp_over_d3rlpy']:>16.2f}x{row['ratio_floor_over_d3rlpy']:>13.2f}x")
    print("\nThe arithmetic ceiling (the same products as the floor; ours does more):")
    for row in results:
        rate, gflops = row["transitions_per_s"], row["gflops"]
        compiled = (f"; floor-compiled {rate[COMPILED]:,.0f} tr/s ({rate[COMPILED] / rate['floor']:.2f}x the floor)"
                    if COMPILED in rate else "")
        mflops = row["flops_per_transition"] / 1e6
        print(f"  batch {row['batch_size']}, {row['mode']}: {mflops:.2f} MFLOP a transition; "
              f"d3rlpy {gflops['d3rlpy']:.1f}, floor {gflops['floor']:.1f} GFLOP/s against this machine's matmul "
              f"{row['matmul_gflops']:.1f} GFLOP/s: any loop at most {row['ratio_ceiling_over_d3rlpy']:.2f}x d3rlpy"
              f"{compiled}")
    slots = ", ".join(FIXED_SLOTS)
    reads = "our whole state" if args.same_input else "the request slot of our state"
    print(f"""
What differs (same data, same state information, same 256-wide hidden layers, Adam):
* ours: two-tower tool-conditioned scorer, {counts['ours']:,} parameters. Its state input is
  {ours_learner.input_dim}-d: the layout has {N_SLOTS} text slots of 384 ({slots}) plus
  {N_STATE_FEATURES} features; only the request slot is non-zero here. Training batches carry each state's
  own candidates (here all {N_TOOLS}; a table this small is scored whole, then each state's columns
  kept); the score is a dot product of state and tool features, plus pair terms. Parts:
{describe(ours_learner.modules()[0])}
  Double-DQN target, Polyak target update every step, Huber TD + alpha*CQL, fused Adam.
* same-mlp: our CQL loop (sampler, update, Polyak, fused Adam) around d3rlpy's plain Q-MLP
  {same_learner.input_dim}->256->256->{N_TOOLS}, {counts['same-mlp']:,} parameters, started from d3rlpy's weights; it
  reads {reads}, ignores tool embeddings and pair features.
* d3rlpy: plain Q-MLP {their_learner.input_dim}->256->256->{N_TOOLS}, {counts['d3rlpy']:,} parameters.
  Double-DQN target, hard target copy every 8000 updates, Huber TD + alpha*CQL, Adam.
* floor: d3rlpy's MLP and our update's arithmetic in a dozen lines of eager PyTorch, batches by
  one index_select: what no loop can beat here without changing the arithmetic (so same-mlp/d3rlpy
  can reach at most floor/d3rlpy).
* samplers: ours gathers states with index_select and each state's candidates (tool rows, mask,
  pair features) from the sparse pair storage; d3rlpy builds each batch in Python, one
  transition at a time, then converts numpy to torch inside update().""")
    if args.json:
        report = {
            "python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "bf16": bf16, "same_input": args.same_input,
            "transitions": args.transitions, "actions": N_TOOLS, "rounds": args.rounds, "warmup": args.warmup,
            "load_average": list(os.getloadavg()), "parameters": counts, "results": results,
        }
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)
        print(f"\nfigures written to {args.json}")


def describe(module: torch.nn.Module) -> str:
    """One line per child module: its Linear shapes and parameter count."""
    lines = []
    for name, child in module.named_children():
        linears = [m for m in child.modules() if isinstance(m, torch.nn.Linear)]
        shape = "->".join([str(linears[0].in_features)] + [str(m.out_features) for m in linears]) if linears else ""
        count = sum(p.numel() for p in child.parameters())
        lines.append(f"    - {name} {shape} ({count:,} parameters)")
    own = sum(p.numel() for p in module.parameters(recurse=False))
    if own:
        lines.append(f"    - own scalars ({own} parameters)")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
