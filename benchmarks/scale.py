"""How training grows with the data: time and peak memory of import → embed + build → train at 100k and 1M transitions.

Run: ``OMP_NUM_THREADS=1 python benchmarks/scale.py`` (``--sizes 100000 1000000`` by default;
``--steps``, ``--batch-size``; ``--json PATH`` also writes the figures).

The logs are synthetic, with a bounded vocabulary: 10 domains of 20 tools each (``{domain}_{action}_{entity}``,
a one-line description, a JSON-schema with a required ``{entity}_id`` and an optional ``note``);
every episode lists its domain's 20 tools, asks (one of 5 request templates) to do one of 5 actions to
one of 4 entities numbered 0-4, makes 3-8 tool calls of its domain (an id among 10 each, 15% of them
failing), then answers. So the distinct texts are bounded (at most 5,000 requests, 4,000 step texts,
200 tools and 40 answers): the real all-MiniLM-L6-v2 encoder embeds each distinct text once (``texts``
in the table: how many at each size; on 2 CPU cores it encodes about 60 a second), while the other
costs grow with the transitions.

Each size is written once as native JSONL to a temporary folder; then each storage variant runs in a
fresh process (so that its peak memory is its own) with a fresh embedding cache (so that each
encodes every distinct text: ``encoded`` in the table):

* ``fp32``: the default (``data.embedding_dtype: float32``, the table in memory);
* ``fp16+mmap``: ``data.embedding_dtype: float16`` and ``data.mmap_embeddings: true``.

Stages, each timed, with the process's peak RSS (``ru_maxrss``) after it: ``import`` reads the JSONL back
through :func:`~evoharness_agent.logs.importers.load_episodes`; ``embed+build`` is the trainer's own
:func:`~evoharness_agent.encoding.transitions.build_dataset` call (embedding included); ``train`` is the
rest of :func:`~evoharness_agent.learning.trainer.train_on_episodes`: CQL for ``--steps`` steps of
``--batch-size``, validation, calibration, checkpoint and policy writing. Growth is each figure at the
largest size over the smallest.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

VARIANTS = {"fp32": {"embedding_dtype": "float32", "mmap_embeddings": False},
            "fp16+mmap": {"embedding_dtype": "float16", "mmap_embeddings": True}}
STAGES = ("import", "embed+build", "train")
DOMAINS = ("retail", "travel", "banking", "health", "weather", "music", "calendar", "email", "shipping", "hr")
ACTIONS = ("get", "list", "create", "update", "cancel")
ENTITIES = ("order", "profile", "booking", "invoice")
REQUESTS = ("Please {action} the {domain} {entity} number {k}.", "Can you {action} my {entity} {k} in {domain}?",
            "I need to {action} {domain} {entity} {k} today.", "{domain}: {action} {entity} {k}, thanks.",
            "Help me {action} the {entity} {k} ({domain}).")
N_REQUEST_NUMBERS = 5
N_IDS = 10
ERROR_RATE = 0.15


def tool_specs(domain: str) -> list[dict[str, Any]]:
    """Return the 20 tools of a synthetic domain as native-log tool dicts."""
    return [{"name": f"{domain}_{action}_{entity}",
             "description": f"{action.capitalize()} a {domain} {entity} given its identifier.",
             "parameters": {"type": "object",
                            "properties": {f"{entity}_id": {"type": "string", "description": f"The {entity}'s id."},
                                           "note": {"type": "string", "description": "Free text."}},
                            "required": [f"{entity}_id"]}}
            for action in ACTIONS for entity in ENTITIES]


def synthetic_episodes(transitions: int, seed: int) -> Iterator[dict[str, Any]]:
    """Yield native-log episodes (dicts) until they hold at least ``transitions`` decisions."""
    rng = random.Random(seed)
    tools = {domain: tool_specs(domain) for domain in DOMAINS}
    made = 0
    while made < transitions:
        domain, entity = rng.choice(DOMAINS), rng.choice(ENTITIES)
        task = rng.choice(REQUESTS).format(action=rng.choice(ACTIONS), domain=domain, entity=entity,
                                           k=rng.randrange(N_REQUEST_NUMBERS))
        steps = []
        for _ in range(rng.randint(3, 8)):
            tool = rng.choice(tools[domain])
            called = tool["name"].rsplit("_", 1)[1]
            ident, failed = f"{called[:2]}-{rng.randrange(N_IDS)}", rng.random() < ERROR_RATE
            steps.append({"kind": "tool_call", "tool": tool["name"], "arguments": {f"{called}_id": ident},
                          "observation": f"{called} {ident} {'not found' if failed else 'done'}", "error": failed})
        steps.append({"kind": "assistant", "content": f"Finished the {domain} {entity} request."})
        made += len(steps)
        yield {"task": task, "tools": tools[domain], "steps": steps, "reward": float(rng.random() < 0.6)}


def write_logs(path: Path, transitions: int, seed: int) -> None:
    """Write the synthetic episodes of one size as native JSONL, one line at a time."""
    with open(path, "w") as handle:
        for episode in synthetic_episodes(transitions, seed):
            handle.write(json.dumps(episode) + "\n")


def peak_rss_mib() -> float:
    """Return this process's peak resident memory so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_variant(logs: Path, variant: str, steps: int, batch_size: int, encode_processes: int) -> dict[str, Any]:
    """Import, build and train one storage variant in this process; return each stage's time and peak RSS."""
    import torch

    from evoharness_agent.encoding.embedder import StateEncoder
    from evoharness_agent.learning import trainer
    from evoharness_agent.learning.config import TrainConfig
    from evoharness_agent.logs.importers import load_episodes

    torch.set_num_threads(1)  # the encoder too: one thread per process on a shared machine
    stages: dict[str, dict[str, float]] = {}
    started = time.perf_counter()
    episodes = load_episodes([logs], "native").episodes
    stages["import"] = {"seconds": time.perf_counter() - started, "peak_rss_mib": peak_rss_mib()}
    built: dict[str, Any] = {}
    build = trainer.build_dataset

    def timed_build(*args: Any, **kwargs: Any) -> Any:
        """The trainer builds its data set itself: time that call inside the real run."""
        begun = time.perf_counter()
        dataset = build(*args, **kwargs)
        stages["embed+build"] = {"seconds": time.perf_counter() - begun, "peak_rss_mib": peak_rss_mib()}
        table = dataset.text_embeddings
        built.update(transitions=len(dataset), texts=int(table.shape[0]) - 1,
                     table_mib=table.numel() * table.element_size() / 2**20,
                     other_mib=sum(t.numel() * t.element_size() for t in dataset.tensors.values()) / 2**20)
        return dataset

    trainer.build_dataset = timed_build
    config = TrainConfig.model_validate({
        "data": {**VARIANTS[variant], "encode_processes": encode_processes},
        "training": {"steps": steps, "batch_size": batch_size, "device": "cpu", "threads": 1,
                     "eval_every": steps, "checkpoint_every": steps, "calibration_folds": 0},  # one run timed
        "logging": {"tensorboard": False},
    })
    with tempfile.TemporaryDirectory(prefix="scale-") as scratch:
        encoder = StateEncoder(cache_dir=Path(scratch) / "cache", device="cpu")
        begun = time.perf_counter()
        result = trainer.train_on_episodes(episodes, config, Path(scratch) / "run", encoder=encoder,
                                           show_progress=False)
        total = time.perf_counter() - begun
    stages["train"] = {"seconds": total - stages["embed+build"]["seconds"], "peak_rss_mib": peak_rss_mib()}
    return {"variant": variant, "episodes": len(episodes), "n_encoded": result["n_encoded"],
            "torch_threads": torch.get_num_threads(), "stages": stages, **built}


def growth(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Return, per variant and stage, the largest size's time and peak RSS over the smallest's."""
    out: dict[str, dict[str, float]] = {}
    for variant in VARIANTS:
        rows = sorted((r for r in results if r["variant"] == variant), key=lambda r: r["transitions"])
        if len(rows) < 2:
            continue
        small, large = rows[0], rows[-1]
        out[variant] = {"transitions": large["transitions"] / small["transitions"]}
        for stage in STAGES:
            out[variant][f"{stage} time"] = large["stages"][stage]["seconds"] / small["stages"][stage]["seconds"]
        out[variant]["peak RSS"] = (large["stages"]["train"]["peak_rss_mib"]
                                    / small["stages"]["train"]["peak_rss_mib"])
    return out


def show(size: int, rows: list[dict[str, Any]]) -> None:
    """Print one size's table: per variant, each stage's time and the peak RSS after it."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{size:,} synthetic transitions (s: seconds; peak: peak RSS after the stage, MiB)")
    for column in ("variant", "transitions", "texts", "encoded", "table MiB", "tensors MiB",
                   *(f"{stage} s" for stage in STAGES), *(f"peak {stage}" for stage in STAGES)):
        table.add_column(column, justify="left" if column == "variant" else "right")
    for row in rows:
        stages = row["stages"]
        table.add_row(row["variant"], f"{row['transitions']:,}", f"{row['texts']:,}", f"{row['n_encoded']:,}",
                      f"{row['table_mib']:.1f}", f"{row['other_mib']:,.0f}",
                      *(f"{stages[s]['seconds']:.1f}" for s in STAGES),
                      *(f"{stages[s]['peak_rss_mib']:,.0f}" for s in STAGES))
    Console(width=200).print(table)


def main(argv: list[str] | None = None) -> None:
    """Run every size and variant, each in a fresh process, and print the tables and growth ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000], help="transitions per run")
    parser.add_argument("--steps", type=int, default=200, help="CQL gradient steps (training.steps)")
    parser.add_argument("--batch-size", type=int, default=256, help="transitions per step (training.batch_size)")
    parser.add_argument("--encode-processes", type=int, default=1, help="data.encode_processes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the figures to this JSON file")
    parser.add_argument("--child", nargs=2, metavar=("LOGS", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        report = run_variant(Path(args.child[0]), args.child[1], args.steps, args.batch_size, args.encode_processes)
        print(json.dumps(report))
        return

    results: list[dict[str, Any]] = []
    for size in args.sizes:
        with tempfile.TemporaryDirectory(prefix="scale-logs-") as folder:
            logs = Path(folder) / "episodes.jsonl"
            write_logs(logs, size, args.seed)
            rows = []
            for variant in VARIANTS:
                command = [sys.executable, __file__, "--child", str(logs), variant, "--steps", str(args.steps),
                           "--batch-size", str(args.batch_size), "--encode-processes", str(args.encode_processes)]
                done = subprocess.run(command, check=True, capture_output=True, text=True)
                rows.append({"size": size, **json.loads(done.stdout.strip().splitlines()[-1])})
        show(size, rows)
        results += rows

    ratios = growth(results)
    for variant, figures in ratios.items():
        print(f"growth {variant} (largest / smallest size): "
              + ", ".join(f"{name} x{value:.1f}" for name, value in figures.items()))
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, torch threads 1, "
          f"load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"python": platform.python_version(), "cpus": os.cpu_count(), "steps": args.steps,
                       "batch_size": args.batch_size, "results": results, "growth": ratios}, handle, indent=2)
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
