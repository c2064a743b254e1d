"""Many tools, the middleware's case: the gold tool among 100 or 1,000 candidates, policy vs embedding similarity.

BFCL single-turn selection (the bundled ``bfcl_single`` domain): for each question, its gold
function is put among random distractors drawn from every other tool of the bundled data
(seeded), and both rankers order all candidates for the first decision (empty history).
Reported: recall@k (the gold tool in the top k) for k = 1, 3, 5, 10, and the p50 / p99 time
to rank all candidates of one request (the policy: embed the request and the candidates,
cached after their first use as an app would, then score; similarity: the same embeddings
and one dot product), in the same run.

Measure a policy that never trained on ``bfcl_single`` (e.g. the leave-one-out policy of
``benchmarks/transfer.py --leave-out bfcl_single``); the shipped default trains on it.

Usage: python benchmarks/many_tools.py --policy DIR [--candidates 100,1000] [--limit 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from evoharness_agent.logs.bundled import all_domain_episodes
from evoharness_agent.policy import ToolPolicy
from evoharness_agent.schema import FINISH, Episode, ToolSpec

console = Console()
KS = (1, 3, 5, 10)


def cases(limit: int, seed: int) -> tuple[list[tuple[Episode, str]], list[ToolSpec]]:
    """Return (episode, gold tool) for the first calls of BFCL single-turn, and the distractor pool."""
    domains = all_domain_episodes()
    pool: dict[str, ToolSpec] = {}
    for episodes in domains.values():
        for episode in episodes:
            for tool in episode.tools:
                pool.setdefault(tool.name, tool)
    chosen = [(ep, ep.steps[0].tool) for ep in domains["bfcl_single"] if ep.steps and ep.steps[0].tool]
    random.Random(seed).shuffle(chosen)
    return [(ep, str(gold)) for ep, gold in chosen[:limit]], list(pool.values())


def run(policy: ToolPolicy, n_candidates: int, limit: int, seed: int) -> dict[str, dict[str, float]]:
    """Rank the gold among ``n_candidates`` for each case; return recall@k and timings per ranker."""
    chosen, pool = cases(limit, seed)
    hits = {name: {k: 0 for k in KS} for name in ("policy", "embedding_similarity")}
    seconds: dict[str, list[float]] = {"policy": [], "embedding_similarity": []}
    for position, (episode, gold) in enumerate(chosen):
        rng = random.Random(f"{seed}:{position}")
        gold_spec = next(tool for tool in episode.tools if tool.name == gold)
        others = [tool for tool in rng.sample(pool, n_candidates + 1) if tool.name != gold][: n_candidates - 1]
        candidates = [gold_spec, *others]
        rng.shuffle(candidates)
        # An app embeds its tools once: their token vectors, and in the same pass their embeddings.
        policy.encoder.embed_tokens([tool.text() for tool in candidates])
        start = time.perf_counter()
        ranked = [s.tool for s in policy.rank(episode.task, [], candidates) if s.tool != FINISH]
        seconds["policy"].append(time.perf_counter() - start)
        start = time.perf_counter()
        vectors = policy.encoder.embed([tool.text() for tool in candidates])
        request = policy.encoder.embed([episode.task])[0]
        order = np.argsort(-(vectors @ request), kind="stable")
        by_similarity = [candidates[i].name for i in order]
        seconds["embedding_similarity"].append(time.perf_counter() - start)
        for name, ranking in (("policy", ranked), ("embedding_similarity", by_similarity)):
            for k in KS:
                hits[name][k] += gold in ranking[:k]
    n = max(len(chosen), 1)
    return {name: {**{f"recall@{k}": hits[name][k] / n for k in KS},
                   "p50_ms": float(np.percentile(seconds[name], 50) * 1000),
                   "p99_ms": float(np.percentile(seconds[name], 99) * 1000), "n": len(chosen)}
            for name in hits}


def main() -> None:
    """Run for each candidate count and print one table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policy", required=True)
    parser.add_argument("--candidates", default="100,1000")
    parser.add_argument("--limit", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    policy = ToolPolicy.load(args.policy, device="cpu")
    results = {n: run(policy, int(n), args.limit, args.seed) for n in args.candidates.split(",")}
    table = Table(title=f"BFCL single-turn, gold among N candidates ({args.limit} requests), policy {args.policy}")
    for column in ("N", "ranker", *(f"recall@{k}" for k in KS), "p50 ms", "p99 ms"):
        table.add_column(column, justify="right")
    for n, by_ranker in results.items():
        for name, row in by_ranker.items():
            table.add_row(n, name, *(f"{row[f'recall@{k}']:.3f}" for k in KS), f"{row['p50_ms']:.1f}",
                          f"{row['p99_ms']:.1f}")
    console.print(table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
