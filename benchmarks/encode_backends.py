"""Embedding throughput of the three ways to encode texts the cache lacks, side by side in one run.

Run: ``python benchmarks/encode_backends.py [--texts 2000] [--workers 2] [--json PATH]``.

Each way encodes the same ``--texts`` distinct step texts with the real all-MiniLM-L6-v2 encoder and
no cache: one process (``StateEncoder.embed``), sentence-transformers' multi-process pool of
``--workers`` (``data.encode_processes``), and ``--workers`` Ray Data actors on a local Ray cluster
(``data.encode_ray_workers``, the ``ray`` extra; skipped without it). Start-up is included (the
pool's and the actors' model loads, Ray's start), as a run pays it. The figure is texts/s, and its
ratio to one process in the same run; the vectors of each way are checked against one process's.
On one machine Ray only adds start-up to the pool: it is for the many machines one pool cannot use.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.encoding.ray_encoding import RayEncoding


def step_texts(n: int) -> list[str]:
    """Return ``n`` distinct texts shaped like a logged tool call and its observation."""
    return [f'called search_orders({{"customer_id": "C-{i:05d}", "limit": {i % 9 + 1}}}) -> ok: '
            f'{{"orders": ["ORD-{i * 7:06d}", "ORD-{i * 11:06d}"], "total": {i * 3.5:.2f}}}' for i in range(n)]


def timed(encode: Callable[[], np.ndarray]) -> tuple[np.ndarray, float]:
    """Return what ``encode`` returned and the seconds it took."""
    start = time.perf_counter()
    vectors = encode()
    return vectors, time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    """Encode the texts each way and print texts/s beside one process."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    texts = step_texts(args.texts)

    def fresh() -> StateEncoder:
        return StateEncoder(device="cpu", cache_dir=False)

    ways: dict[str, Callable[[], np.ndarray]] = {
        "one process": lambda: fresh().embed(texts),
        f"multi-process pool x{args.workers}": lambda: fresh().embed(texts, processes=args.workers),
    }
    try:
        import ray
    except ImportError:
        ray = None
        print("ray is not installed (pip install 'evoharness-agent[ray]'): its row is skipped")
    else:
        ways[f"Ray Data actors x{args.workers}"] = lambda: fresh().embed(texts, ray=RayEncoding(args.workers))
    results: list[dict[str, Any]] = []
    reference: np.ndarray | None = None
    for name, encode in ways.items():
        vectors, seconds = timed(encode)
        reference = vectors if reference is None else reference
        results.append({"way": name, "seconds": seconds, "texts_per_s": len(texts) / seconds,
                        "max_abs_diff": float(np.abs(vectors - reference).max())})
    if ray is not None:
        ray.shutdown()
    base = results[0]["texts_per_s"]
    table = Table(title=f"{len(texts):,} texts, all-MiniLM-L6-v2 on CPU, start-up included")
    for column in ("way", "seconds", "texts/s", "vs one process", "max |diff|"):
        table.add_column(column, justify="left" if column == "way" else "right")
    for row in results:
        table.add_row(row["way"], f"{row['seconds']:.1f}", f"{row['texts_per_s']:.0f}",
                      f"{row['texts_per_s'] / base:.2f}x", f"{row['max_abs_diff']:.1e}")
    Console().print(table)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"texts": len(texts), "workers": args.workers, "results": results},
                                        indent=2))


if __name__ == "__main__":
    main()
