"""Training throughput of our discrete CQL against d3rlpy's ``DiscreteCQL`` on the same synthetic data.

Run: ``python benchmarks/train_throughput.py`` (needs the ``bench`` extra: ``pip install -e '.[bench]'``).

Both learners see the same random offline data: 384-d state vectors, 32 discrete actions
(our 32 tools are 32 random 384-d "tool embeddings", FINISH among them), random rewards and
terminals. Both use an MLP of 256×256 hidden units without dropout (d3rlpy's has none; our default
state tower has 0.1), Adam, and torch's default thread count. Ours runs
its updates as the trainer does: under bf16 autocast where the CPU multiplies bf16 natively
(``--no-bf16``: fp32); d3rlpy runs as it does by default, in fp32.
Each measurement is a fixed number of updates after a warm-up, and the two libraries run
interleaved in one process (ours, theirs, ours, theirs, ...), so that a noisy machine slows
both alike. A throughput is transitions per second: ``batch_size * updates / seconds``.

Two figures per library:

* ``sample+update``: draw a batch with the library's own sampler, then one gradient step;
  this is what a training loop pays (d3rlpy's ``fit`` does exactly this).
* ``update``: one gradient step on a batch drawn beforehand (pure model compute).

The printed notes say what differs between the two models. Figures only: nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import evoharness_agent.encoding.transitions as dataset_module
from evoharness_agent.encoding.state import N_STATE_FEATURES
from evoharness_agent.encoding.transitions import ToolTable, TransitionDataset
from evoharness_agent.learning.algorithms import Dims, ToolInputs, make_algorithm
from evoharness_agent.learning.networks import NetworkConfig
from evoharness_agent.learning.precision import cpu_has_native_bf16, training_autocast
from evoharness_agent.schema import ToolSpec, finish_spec

STATE_DIM = 384
N_TOOLS = 32
HIDDEN = 256
# Text slots before the history window (request, previous tool, task in the current layout).
N_SLOTS = int(getattr(dataset_module, "N_FIXED_TEXTS", 2))


@dataclass
class Synthetic:
    """The shared random data: states, actions, rewards, terminals and our tables."""

    states: np.ndarray  # (n, 384): the state vector both learners see
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
    rows[:, 0] = torch.arange(1, n + 1)
    actions = torch.randint(N_TOOLS, (n,), generator=g)
    rewards = torch.randn(n, generator=g)
    dones = torch.rand(n, generator=g) < 0.1
    dones[-1] = True
    following = torch.arange(n) + 1
    following[dones] = torch.arange(n)[dones]  # a terminal's next state is itself, as in build_dataset
    features = torch.zeros(n, N_STATE_FEATURES)
    masks = torch.ones(n, N_TOOLS, dtype=torch.bool)
    tensors = {
        "rows": rows, "features": features, "actions": actions, "rewards": rewards,
        "dones": dones.float(), "masks": masks, "next_rows": rows[following],
        "next_features": features[following], "next_masks": masks[following],
        "episode_ids": torch.cumsum(dones.long(), 0) - dones.long(),
    }
    dataset = TransitionDataset(table, tools, tensors, history_window=0)
    return Synthetic(table[1:].numpy(), actions.numpy(), rewards.numpy(), dones.numpy(), dataset)


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


def timed(learner: Ours | Theirs, updates: int, resample: bool) -> float:
    """Seconds for ``updates`` updates (drawing a fresh batch each time when ``resample``)."""
    start = time.perf_counter()
    for _ in range(updates):
        learner.update(learner.sample() if resample else learner.fixed)
    return time.perf_counter() - start


def interleaved(learners: list[Ours | Theirs], updates: int, rounds: int, warmup: int,
                resample: bool) -> dict[str, list[float]]:
    """Per-round transitions/s of each learner, the learners alternating within every round."""
    for learner in learners:
        timed(learner, warmup, resample)
    rates: dict[str, list[float]] = {learner.name: [] for learner in learners}
    for _ in range(rounds):
        for learner in learners:
            rates[learner.name].append(learner.batch_size * updates / timed(learner, updates, resample))
    return rates


def parameters(learner: Ours | Theirs) -> int:
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
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 2048])
    parser.add_argument("--transitions", type=int, default=20_000)
    parser.add_argument("--updates", type=int, default=0,
                        help="updates per round (default: 20 at batch ≤ 512, else 5)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads for both learners (default: leave torch's default)")
    parser.add_argument("--same-input", action="store_true",
                        help="feed d3rlpy our full gathered state vector instead of the 384-d state")
    parser.add_argument("--profile", action="store_true", help="also profile our update at each batch size")
    parser.add_argument("--no-bf16", dest="bf16", action="store_false",
                        help="keep our updates in fp32 (the trainer's training.bf16: false)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    quiet_d3rlpy()

    data = make_synthetic(args.transitions, args.seed)
    rows: list[tuple[int, str, float, float]] = []
    for batch_size in args.batch_sizes:
        ours_learner = Ours(data, batch_size, args.seed, args.bf16)
        their_learner = Theirs(data, batch_size, args.seed, args.same_input)
        learners: list[Ours | Theirs] = [ours_learner, their_learner]
        updates = args.updates or (20 if batch_size <= 512 else 5)
        for mode, resample in (("sample+update", True), ("update", False)):
            rates = interleaved(learners, updates, args.rounds, args.warmup, resample)
            ours, theirs = statistics.median(rates["ours"]), statistics.median(rates["d3rlpy"])
            rows.append((batch_size, mode, ours, theirs))
        if args.profile:
            print(f"\n-- profile of our update, batch {batch_size} --")
            profile_ours(ours_learner, max(3, updates // 4))

    print(f"\npython {platform.python_version()}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, torch threads = {torch.get_num_threads()} "
          f"({'set by --threads' if args.threads else 'torch default'}, both learners)")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    bf16 = args.bf16 and cpu_has_native_bf16()
    print(f"ours: {'bf16 autocast (this CPU multiplies bf16 natively)' if bf16 else 'fp32'}, "
          "as the trainer runs; d3rlpy: fp32 (its default)")
    print(f"{args.transitions} transitions, {N_TOOLS} actions, median of {args.rounds} interleaved rounds; "
          f"load average {load} (other processes share these CPUs)\n")
    print(f"{'batch':>6}  {'measure':<14}{'ours tr/s':>12}{'d3rlpy tr/s':>13}{'ours/d3rlpy':>13}")
    for batch_size, mode, ours, theirs in rows:
        print(f"{batch_size:>6}  {mode:<14}{ours:>12,.0f}{theirs:>13,.0f}{ours / theirs:>12.2f}x")
    print(f"""
What differs (same data, same state information, same 256-wide hidden layers, Adam):
* ours: two-tower tool-conditioned scorer, {parameters(ours_learner):,} parameters. Its state input is
  {ours_learner.input_dim}-d: the layout has {N_SLOTS} text slots of 384 (request, ...) plus
  {N_STATE_FEATURES} features; only the request slot is non-zero here. Every update also runs the tool tower over the
  {N_TOOLS} tool embeddings; the score is a dot product of state and tool features. Parts:
{describe(ours_learner.modules()[0])}
  Double-DQN target, Polyak target update every step, Huber TD + alpha*CQL, fused Adam.
* d3rlpy: plain Q-MLP {their_learner.input_dim}->256->256->{N_TOOLS}, {parameters(their_learner):,} parameters.
  Double-DQN target, hard target copy every 8000 updates, Huber TD + alpha*CQL, Adam.
* samplers: ours is one randint + index_select on tensors; d3rlpy builds each batch in Python,
  one transition at a time, then converts numpy to torch inside update().""")


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
