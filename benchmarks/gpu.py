"""The GPU check: training transitions/s with the data set resident on the device, and encoder texts/s.

Run (on a machine with a GPU): ``python benchmarks/gpu.py [--json OUT]``; ``--device cpu --transitions
20000 --batch-sizes 256 --texts 64`` runs the same code on a CPU, as a smoke test.

1. Training. A synthetic data set shaped like the real ones (the default's state layout: request,
   previous tool, task and 4 history slots of 384-d embeddings, plus features; each state has
   ``--candidates`` tools available, FINISH among them, out of a ``--tools``-tool table, with the
   sparse pair features ``build_dataset`` writes) is built once and moved whole to the device: the
   text-embedding table in bf16 (``--table-dtype``), every index tensor beside it. Each update
   then draws its batch on the device (``TransitionDataset.sample``) and takes one CQL step under
   the trainer's bf16 autocast (``training_autocast``), exactly as ``train`` runs. Figures:
   transitions/s = batch x updates / seconds (after a warm-up; the device synchronised before each
   clock read), for the default's scorer (hidden 16) and a wide one (hidden 256), eager at
   ``--batch-sizes`` and compiled (``training.compile``, ``train --compile``) at
   ``--compiled-batch-sizes``, each compiled run from a fresh compiler cache as a new ``train``
   process starts, its warm-up (compiling included) timed too.
2. Encoder. ``StateEncoder`` (all-MiniLM-L6-v2, the package's default) on the device embeds
   ``--texts`` distinct step-like texts (no cache): texts/s, at ``--encode-batch``.
3. Number formats on real logs. ``train_on_episodes`` trains CQL on bundled logs (tau2-bench
   retail, BFCL multi-turn base, the gpt-4o airline runs) for ``--parity-steps`` steps of
   ``--parity-batch``, without dropout (whose masks a compiled graph draws its own way): eager
   under bf16 autocast, the same with cuBLAS's bf16 products reducing in fp32, eager in fp32, and
   compiled under bf16 autocast; it prints each run's seconds and final losses, mean Q and
   validation top-1. On the first H200 eager bf16 settled at mean Q 1.04 where compiled bf16 gave
   4.21, and bf16 on a CPU with AMX 4.08 eager and 4.12 compiled: a target copy reused its first
   step's tool side there, because CUDA's ``_foreach_lerp_`` bumps no version counter (fixed:
   ``ToolScorer._tool_features``); the four runs should now agree. It also reports whether
   Polyak's update bumps the target's version counters on the device (expected: not on CUDA).

The figures are printed (and written with ``--json``) for the README; nothing is asserted.
The issue's target: >= 5M training transitions/s on an H200-class GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.encoding.state import AVAILABLE, IS_FINISH, N_PAIR_FEATURES, N_STATE_FEATURES, n_slots
from evoharness_agent.encoding.transitions import ToolTable, TransitionDataset
from evoharness_agent.learning.algorithms import Dims, ToolInputs, make_algorithm
from evoharness_agent.learning.algorithms.base import polyak
from evoharness_agent.learning.config import load_config
from evoharness_agent.learning.networks import NetworkConfig
from evoharness_agent.learning.precision import training_autocast
from evoharness_agent.learning.trainer import train_on_episodes
from evoharness_agent.logs.bundled import bfcl_paths, gpt4o_airline_path, read_native, tau2_retail_path
from evoharness_agent.runtime import pick_device
from evoharness_agent.schema import ToolSpec, finish_spec

EMBEDDING_DIM = 384
HISTORY_WINDOW = 4


def unit_rows(n: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` random unit vectors (sentence embeddings are normalised)."""
    vectors = torch.randn(n, EMBEDDING_DIM, generator=generator)
    return vectors / vectors.norm(dim=1, keepdim=True)


def synthetic_dataset(n: int, n_texts: int, n_tools: int, candidates: int, seed: int) -> TransitionDataset:
    """Build ``n`` transitions in the real layout, over ``n_texts`` texts and ``n_tools`` tools (CPU)."""
    g = torch.Generator().manual_seed(seed)
    table = torch.cat([torch.zeros(1, EMBEDDING_DIM), unit_rows(n_texts, g)])
    specs = [finish_spec()] + [ToolSpec(name=f"tool_{i}") for i in range(1, n_tools)]
    tools = ToolTable(specs, unit_rows(n_tools, g), {spec.name: i for i, spec in enumerate(specs)})
    rows = torch.randint(1, n_texts + 1, (n, n_slots(HISTORY_WINDOW)), generator=g)
    features = torch.rand(n, N_STATE_FEATURES, generator=g)
    dones = torch.rand(n, generator=g) < 0.2  # episodes of about five decisions
    dones[-1] = True
    following = torch.arange(n) + 1
    following[dones] = torch.arange(n)[dones]
    # Each state's candidates: FINISH (row 0) and candidates - 1 distinct other tools, sorted as
    # build_dataset stores them; the logged action is one of them. k sorted draws from n_tools - k
    # values, the i-th shifted up by i, are k distinct sorted tools: n x k numbers, where a
    # permutation of every tool per state would be n x n_tools (2M x 4096: 60 GiB to argsort).
    k = candidates - 1
    if not 0 < k < n_tools:
        raise ValueError(f"--candidates must be 2 to --tools ({n_tools}), not {candidates}")
    draws = torch.randint(n_tools - k, (n, k), generator=g).sort(dim=1).values
    others = draws + torch.arange(k) + 1
    pair_tools = torch.cat([torch.zeros(n, 1, dtype=torch.long), others], dim=1)
    actions = pair_tools.gather(1, torch.randint(candidates, (n, 1), generator=g)).squeeze(1)
    pair_values = (torch.rand(n, candidates, N_PAIR_FEATURES, generator=g) < 0.1).float()
    pair_values[:, :, AVAILABLE] = 1.0
    pair_values[:, :, IS_FINISH] = 0.0
    pair_values[:, 0, IS_FINISH] = 1.0
    tensors = {
        "rows": rows, "features": features, "actions": actions, "rewards": torch.randn(n, generator=g),
        "dones": dones.float(), "next_rows": rows[following], "next_features": features[following],
        "following": following, "pair_offsets": torch.arange(n + 1) * candidates,
        "pair_tools": pair_tools.reshape(-1), "pair_values": pair_values.reshape(-1, N_PAIR_FEATURES),
        "episode_ids": torch.cumsum(dones.long(), 0) - dones.long(),
    }
    return TransitionDataset(table, tools, tensors, history_window=HISTORY_WINDOW)


def synchronize(device: str) -> None:
    """Wait for the device's queued work, so a clock read covers it."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def training_rate(dataset: TransitionDataset, device: str, hidden: int, batch_size: int, updates: int,
                  warmup: int, seed: int, compiled: bool = False) -> tuple[float, float]:
    """Transitions/s of CQL sample + update steps with ``dataset`` resident on ``device``, and the warm-up's seconds."""
    torch.manual_seed(seed)
    n_tools = len(dataset.tools.specs)
    dims = Dims(dataset.state_dim, EMBEDDING_DIM, n_tools)
    tools = ToolInputs(dataset.tools.embeddings, torch.arange(n_tools, device=device))
    network = NetworkConfig(hidden=hidden, tool_bias=False)
    algorithm = make_algorithm("cql", {}, dims, network, tools).to(device)
    algorithm.set_training(True)
    if compiled:
        torch._dynamo.reset()  # compiled as a new training process would, not from the last setting's graphs
        algorithm.compile_training()
    generator = torch.Generator(device=device).manual_seed(seed)

    def steps(count: int) -> None:
        for _ in range(count):
            with training_autocast(device, True):
                algorithm.update(dataset.sample(batch_size, generator))

    start = time.perf_counter()
    steps(warmup)
    synchronize(device)
    warm_up = time.perf_counter() - start
    start = time.perf_counter()
    steps(updates)
    synchronize(device)
    return batch_size * updates / (time.perf_counter() - start), warm_up


def encoder_rate(device: str, n_texts: int, batch_size: int) -> float:
    """Texts/s of the default sentence-transformer embedding ``n_texts`` distinct step texts on ``device``."""
    if n_texts < 1:
        raise ValueError(f"--texts must be at least 1, not {n_texts}")
    encoder = StateEncoder(device=device, cache_dir=False, batch_size=batch_size)
    texts = [f'called search_orders({{"customer_id": "C{i:06d}", "status": "open"}}) -> ok: '
             f"order O{i:07d}, 2 items (wireless earbuds, USB-C charger), shipped {i % 28 + 1} Nov"
             for i in range(n_texts + batch_size)]
    encoder.embed(texts[n_texts:])  # load the model and warm the kernels on texts the clock does not time
    synchronize(device)
    start = time.perf_counter()
    encoder.embed(texts[:n_texts])
    synchronize(device)
    return n_texts / (time.perf_counter() - start)


PARITY_METRICS = ("loss/td", "loss/cql", "q/mean", "val/top1")
PARITY_RUNS = (  # name, training.compile, training.bf16, cuBLAS's bf16 products may reduce in bf16
    ("eager", False, True, True),
    ("eager, fp32 reductions", False, True, False),
    ("eager fp32", False, False, True),
    ("compiled", True, True, True),
)


def polyak_bumps_versions(device: str) -> bool:
    """Whether Polyak's in-place update bumps a target's version counters on ``device``.

    A target copy once reused its tool side while they stood still, and on CUDA they do: its
    targets kept their first tool side there (``ToolScorer._tool_features`` no longer trusts them).
    """
    target, source = torch.nn.Linear(4, 4).to(device), torch.nn.Linear(4, 4).to(device)
    before = [p._version for p in target.parameters()]
    polyak(target, source, 0.5)
    return all(p._version > version for p, version in zip(target.parameters(), before, strict=True))


def number_format_parity(device: str, steps: int, batch_size: int, seed: int) -> list[dict[str, Any]]:
    """Train CQL on bundled logs in each of :data:`PARITY_RUNS`' ways (no dropout); return their seconds and metrics."""
    episodes = [episode for path in (tau2_retail_path(), *bfcl_paths(["base"]), gpt4o_airline_path())
                for episode in read_native(path)]
    runs: list[dict[str, Any]] = []
    matmul = torch.backends.cuda.matmul
    reduced = matmul.allow_bf16_reduced_precision_reduction
    with tempfile.TemporaryDirectory() as scratch:
        for k, (mode, compiled, bf16, bf16_reductions) in enumerate(PARITY_RUNS):
            torch._dynamo.reset()
            config = load_config(None, {
                "model": {"dropout": 0.0}, "logging": {"tensorboard": False},
                "training": {"steps": steps, "batch_size": batch_size, "device": device, "seed": seed,
                             "calibration_folds": 0, "compile": compiled, "bf16": bf16}})
            matmul.allow_bf16_reduced_precision_reduction = bf16_reductions
            start = time.perf_counter()
            try:
                result = train_on_episodes(episodes, config, Path(scratch) / str(k), show_progress=False)
            finally:
                matmul.allow_bf16_reduced_precision_reduction = reduced
            runs.append({"mode": mode, "seconds": time.perf_counter() - start,
                         **{key: float(result[key]) for key in PARITY_METRICS}})
            print(f"parity {mode:>22}: {runs[-1]['seconds']:6.1f} s  "
                  + "  ".join(f"{key} {runs[-1][key]:.4f}" for key in PARITY_METRICS))
    return runs


def main(argv: list[str] | None = None) -> None:
    """Measure and print the figures; with ``--json``, write them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--transitions", type=int, default=2_000_000)
    parser.add_argument("--unique-texts", type=int, default=500_000)
    parser.add_argument("--tools", type=int, default=4096)
    parser.add_argument("--candidates", type=int, default=24)
    parser.add_argument("--batch-sizes", type=int, nargs="*", default=[4096, 32768, 131072])
    parser.add_argument("--compiled-batch-sizes", type=int, nargs="*", default=[131072, 262144])
    parser.add_argument("--hidden", type=int, nargs="+", default=[16, 256])
    parser.add_argument("--updates", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--table-dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--texts", type=int, default=20_000, help="texts the encoder embeds")
    parser.add_argument("--encode-batch", type=int, default=512)
    parser.add_argument("--parity-steps", type=int, default=1500, help="0: no number-format comparison on real logs")
    parser.add_argument("--parity-batch", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    device = pick_device(args.device)

    build = time.perf_counter()
    dataset = synthetic_dataset(args.transitions, args.unique_texts, args.tools, args.candidates, args.seed)
    dataset = dataset.to(device)
    dataset.text_embeddings = dataset.text_embeddings.to(getattr(torch, args.table_dtype))
    build = time.perf_counter() - build
    resident = sum(t.numel() * t.element_size() for t in [dataset.text_embeddings, *dataset.tensors.values()])
    training: list[dict[str, Any]] = []
    runs = [(False, size) for size in args.batch_sizes] + [(True, size) for size in args.compiled_batch_sizes]
    for hidden in args.hidden:
        for compiled, batch_size in runs:
            rate, warm_up = training_rate(dataset, device, hidden, batch_size, args.updates, args.warmup, args.seed,
                                          compiled)
            mode = "compiled" if compiled else "eager"
            training.append({"hidden": hidden, "batch_size": batch_size, "mode": mode, "transitions_per_s": rate,
                             "warmup_seconds": warm_up})
            print(f"train  {mode:>8}  hidden {hidden:>4}  batch {batch_size:>7}: {rate:>14,.0f} transitions/s"
                  f"  (warm-up {warm_up:.1f} s)")
    texts_per_s = encoder_rate(device, args.texts, args.encode_batch)
    print(f"encode all-MiniLM-L6-v2, batch {args.encode_batch}: {texts_per_s:,.0f} texts/s")
    name = torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu"
    peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else None
    bumps = polyak_bumps_versions(device)
    print(f"Polyak bumps the target's version counters on {device}: {bumps}")
    parity = number_format_parity(device, args.parity_steps, args.parity_batch, args.seed) if args.parity_steps else []
    report = {
        "device": device, "device_name": name, "torch": torch.__version__, "transitions": args.transitions,
        "unique_texts": args.unique_texts, "tools": args.tools, "candidates": args.candidates,
        "table_dtype": args.table_dtype, "resident_bytes": resident, "build_seconds": build,
        "peak_device_bytes": peak, "updates": args.updates, "training": training,
        "encoder": {"texts": args.texts, "batch_size": args.encode_batch, "texts_per_s": texts_per_s},
        "polyak_bumps_versions": bumps,
        "number_format_parity": {"steps": args.parity_steps, "batch_size": args.parity_batch, "runs": parity},
    }
    print(f"{name}: data set resident on {device}, {resident / 2**30:.2f} GiB ({args.table_dtype} embeddings)"
          + (f", peak {peak / 2**30:.2f} GiB allocated" if peak else ""))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)


if __name__ == "__main__":
    main()
