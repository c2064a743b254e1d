"""Per-step decision overhead of a policy (the shipped one by default) on CPU, beside one LLM tool-selection call.

Run: ``python benchmarks/decision_latency.py [--policy DIR] [--json OUT]`` (the LLM part needs the ``local``
extra; without it only the policy is measured).

What one agent step costs the policy, measured as :class:`PolicyAgentExecutor` pays it: a
:class:`~evoharness_agent.policy.PolicySession` observes the newest step (embedding its text,
once) and ranks every tool plus FINISH. The sessions replay real BFCL multi-turn runs that use
the file-system tools (their tasks, their file-system calls with arguments and observations,
their user turns); a step whose text was already embedded in the run is skipped, so every
measured step encodes one new text (the output counts the steps that did). The embedding
cache on disk is a fresh temporary folder, and each tool set gets its own encoder, so nothing
is served from an earlier run or configuration.

Two tool sets: 16 tools (GorillaFileSystem's 18 BFCL tools without ``du`` and ``rmdir``) and
200 tools (the 128 distinct BFCL tools plus 72 synthetic ones with distinct names and
descriptions). A tool's name+description is embedded once per tool set and cached in memory;
that one-time cost is reported apart from the per-step figures.

In the same run, the local LLM (Qwen2.5-Coder-0.5B, llama.cpp on CPU) makes a few tool-selection
calls over the same 16 tools (``bind_tools(tools, tool_choice="any")``, requests from held-out
BFCL file-system scenarios): what an LLM-driven agent pays at every step instead. One call
before them warms llama.cpp up and is not counted; its prompt cache stays on, as in real use.

Torch runs with its own default thread count (all cores), as in an app that runs the
executor: only training sets its own default (``trainer.set_threads``: 1 thread on machines
with ≤ 2 cores); ``--threads`` overrides it. llama.cpp uses all available cores. Figures only: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from evoharness_agent.agents.llm_calls import build_messages
from evoharness_agent.demo import SHIPPED_POLICY
from evoharness_agent.encoding.state import step_text
from evoharness_agent.learning.trainer import set_threads
from evoharness_agent.logs.bundled import bfcl_paths, read_native, split_bfcl
from evoharness_agent.policy import ToolPolicy
from evoharness_agent.schema import Episode, Step, ToolSpec

FILE_SYSTEM = "GorillaFileSystem"
FILE_TOOLS_LEFT_OUT = ("du", "rmdir")
LARGE_TOOL_SET = 200
LOCAL_MODEL = "qwen2.5-coder-0.5b"
TARGET_P50_MS = 15.0

# Synthetic tools for the 200-tool set: verb x object, each with its own description and argument.
_VERBS = ("create", "delete", "list", "update", "archive", "export", "import", "validate", "schedule")
_OBJECTS = ("invoice", "customer", "shipment", "warehouse_bin", "payroll_run", "support_case", "sensor_reading",
            "marketing_campaign", "lab_sample", "vendor_contract")

console = Console()


def percentiles(samples_ms: Sequence[float]) -> dict[str, float]:
    """Return n, p50, p99 and mean of a list of milliseconds."""
    values = np.asarray(samples_ms, dtype=np.float64)
    return {"n": len(values), "p50_ms": float(np.percentile(values, 50)), "p99_ms": float(np.percentile(values, 99)),
            "mean_ms": float(values.mean())}


def bfcl_tool_specs(episodes: Sequence[Episode]) -> list[ToolSpec]:
    """Return every distinct BFCL tool spec, in order of first appearance."""
    specs: dict[str, ToolSpec] = {}
    for episode in episodes:
        for spec in episode.tools:
            specs.setdefault(spec.name, spec)
    return list(specs.values())


def synthetic_tools(count: int) -> list[ToolSpec]:
    """Return ``count`` made-up tools with distinct names, descriptions and one string argument."""
    specs = []
    for verb in _VERBS:
        for thing in _OBJECTS:
            label = thing.replace("_", " ")
            specs.append(ToolSpec(
                name=f"{verb}_{thing}",
                description=f"{verb.capitalize()} a {label} record in the operations back office, by its {label} id.",
                parameters={"type": "object", "properties": {f"{thing}_id": {"type": "string",
                                                                            "description": f"The {label} id."}},
                            "required": [f"{thing}_id"]}))
    if count > len(specs):
        raise ValueError(f"only {len(specs)} synthetic tools are defined, {count} asked")
    return specs[:count]


def tool_sets(episodes: Sequence[Episode]) -> dict[int, list[ToolSpec]]:
    """Return the 16-tool (file system) and the 200-tool sets."""
    every = bfcl_tool_specs(episodes)
    file_system = next(episode.tools for episode in episodes
                       if episode.metadata["involved_classes"] == [FILE_SYSTEM])
    small = [spec for spec in file_system if spec.name not in FILE_TOOLS_LEFT_OUT]
    large = every + synthetic_tools(LARGE_TOOL_SET - len(every))
    return {len(small): small, len(large): large}


def file_system_runs(episodes: Sequence[Episode]) -> list[Episode]:
    """Return the BFCL runs that use the file-system tools (every variant)."""
    return [episode for episode in episodes if FILE_SYSTEM in episode.metadata["involved_classes"]]


def fresh_steps(runs: Sequence[Episode], tools: Collection[str],
                steps_per_run: int) -> Iterator[tuple[str, list[Step]]]:
    """Yield (task, steps) per run: calls of ``tools`` and user turns whose text no earlier step had."""
    seen: set[str] = set()
    for run in runs:
        steps = []
        for step in run.steps:
            # The executor observes its tool calls (and new user turns), not its own answers; a call
            # of a tool outside the set could not happen, and would embed that tool's name as well.
            if step.kind == "assistant" or (step.kind == "tool_call" and step.tool not in tools):
                continue
            text = step.content if step.kind == "user" else step_text(step)
            if text not in seen:
                seen.add(text)
                steps.append(step)
            if len(steps) == steps_per_run:
                break
        if steps and run.task not in seen:
            seen.add(run.task)
            yield run.task, steps


def measure_policy(tools: list[ToolSpec], runs: Sequence[Episode], called: Collection[str], n_steps: int,
                   steps_per_run: int, warmup_steps: int, cache_root: Path,
                   policy_dir: Path = SHIPPED_POLICY) -> dict[str, Any]:
    """Time the one-time tool embedding, run starts and per-step observe+rank for one tool set.

    The replayed runs call only the tools in ``called`` (the same steps for every tool set). The
    policy embeds with the encoder it was trained on (its ``policy.json``).
    """
    policy = ToolPolicy.load(policy_dir, device="cpu", cache_dir=cache_root / f"tools{len(tools)}")
    encoder = policy.encoder
    encoder.embed(["load the sentence-transformer before timing anything"])
    encoder.embed_steps(["called load_the_step_model({}) -> ok: before timing anything"])
    started = time.perf_counter()
    policy.rank("first ranking with this tool set", [], tools)  # embeds every tool's text once
    tool_embedding_ms = (time.perf_counter() - started) * 1e3
    starts_ms, steps_ms, observe_ms, rank_ms, encoded_per_step = [], [], [], [], []
    warmup = warmup_steps
    for task, steps in fresh_steps(runs, called, steps_per_run):
        started = time.perf_counter()
        session = policy.session(task, tools)
        starts_ms.append((time.perf_counter() - started) * 1e3)
        for step in steps:
            encoded_before, started = encoder.n_encoded, time.perf_counter()
            session.observe(step)
            observed = time.perf_counter()
            session.rank()
            ranked = time.perf_counter()
            if warmup > 0:
                warmup -= 1
                continue
            steps_ms.append((ranked - started) * 1e3)
            observe_ms.append((observed - started) * 1e3)
            rank_ms.append((ranked - observed) * 1e3)
            encoded_per_step.append(encoder.n_encoded - encoded_before)
            if len(steps_ms) == n_steps:
                break
        if len(steps_ms) == n_steps:
            break
    if len(steps_ms) < n_steps:
        console.print(f"[yellow]note:[/] only {len(steps_ms)} fresh steps in the data, {n_steps} asked")
    return {"tools": len(tools), "step": percentiles(steps_ms), "observe": percentiles(observe_ms),
            "rank": percentiles(rank_ms), "run_start": percentiles(starts_ms),
            "tool_embedding_once_ms": tool_embedding_ms,
            "steps_encoding_one_new_text": sum(count == 1 for count in encoded_per_step)}


def measure_llm(tools: list[ToolSpec], requests: Sequence[str], calls: int) -> dict[str, Any] | None:
    """Time LocalChatModel tool-selection calls over ``tools``; ``None`` without the local extra."""
    from evoharness_agent.local_llm.chat_model import LocalChatModel

    try:
        llm = LocalChatModel.from_pretrained(LOCAL_MODEL).load()
    except ImportError as error:
        console.print(f"[yellow]LLM part skipped:[/] {error}")
        return None
    functions = [{"type": "function", "function": {"name": spec.name, "description": spec.description,
                                                   "parameters": spec.parameters}} for spec in tools]
    chooser = llm.bind_tools(functions, tool_choice="any")
    if len(requests) < calls + 1:
        raise ValueError(f"{calls} LLM calls and a warm-up need {calls + 1} requests, got {len(requests)}")
    try:
        chooser.invoke(build_messages(requests[0], []))  # warm-up, not counted
        samples_ms, chosen = [], []
        for request in requests[1 : calls + 1]:
            started = time.perf_counter()
            reply = chooser.invoke(build_messages(request, []))
            samples_ms.append((time.perf_counter() - started) * 1e3)
            chosen.append(reply.tool_calls[0]["name"] if reply.tool_calls else None)
    finally:
        llm.close()
    return {"tools": len(tools), "call": percentiles(samples_ms), "chosen": chosen, "threads": llm.n_threads}


def print_results(policy_results: list[dict[str, Any]], llm_result: dict[str, Any] | None) -> None:
    """Print the per-step table, the one-time costs and the target check."""
    llm_p50 = llm_result["call"]["p50_ms"] if llm_result else None
    table = Table(title="Per-step decision cost on CPU (ms)")
    for column in ("measure", "n", "p50", "p99", "mean", "LLM/this p50"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    for result in policy_results:
        step = result["step"]
        ratio = f"{llm_p50 / step['p50_ms']:,.0f}x" if llm_p50 else "-"
        table.add_row(f"policy step, {result['tools']} tools", str(step["n"]), f"{step['p50_ms']:.2f}",
                      f"{step['p99_ms']:.2f}", f"{step['mean_ms']:.2f}", ratio)
        for part, label in (("observe", "embed the new step"), ("rank", "rank tools + FINISH")):
            figures = result[part]
            table.add_row(f"  {label}", "", f"{figures['p50_ms']:.2f}", f"{figures['p99_ms']:.2f}",
                          f"{figures['mean_ms']:.2f}", "", style="dim")
    if llm_result:
        call = llm_result["call"]
        table.add_row(f"LLM tool choice, {llm_result['tools']} tools", str(call["n"]),
                      f"{call['p50_ms']:,.0f}", f"{call['p99_ms']:,.0f}", f"{call['mean_ms']:,.0f}", "1x")
    console.print(table)
    once = Table(title="One-time costs (ms)")
    for column in ("tools", "embed tool texts (once per set)", "per text", "run start p50 (request)"):
        once.add_column(column, justify="right")
    for result in policy_results:
        once.add_row(str(result["tools"]), f"{result['tool_embedding_once_ms']:.0f}",
                     f"{result['tool_embedding_once_ms'] / (result['tools'] + 1):.2f}",
                     f"{result['run_start']['p50_ms']:.2f}")
    console.print(once)
    for result in policy_results:
        met = "met" if result["step"]["p50_ms"] <= TARGET_P50_MS else "NOT met"
        console.print(f"target policy p50 ≤ {TARGET_P50_MS:g} ms, {result['tools']} tools: {met}; "
                      f"{result['steps_encoding_one_new_text']}/{result['step']['n']} timed steps encoded exactly "
                      "one new text")
    if llm_result:
        console.print(f"LLM picked {llm_result['chosen']} (llama.cpp threads: {llm_result['threads']})")


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark, print the tables and optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", type=Path, default=SHIPPED_POLICY, help="policy directory (default: shipped)")
    parser.add_argument("--steps", type=int, default=200, help="measured policy steps per tool set")
    parser.add_argument("--steps-per-run", type=int, default=10, help="steps replayed per BFCL run (history grows)")
    parser.add_argument("--warmup", type=int, default=10, help="policy steps run before timing")
    parser.add_argument("--llm-calls", type=int, default=5, help="timed LLM tool-selection calls (0: none)")
    parser.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write the figures as JSON")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's own, what an app running the executor gets; "
                             "0: the training default, 1 thread on ≤ 2 cores)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads is not None:
        set_threads(args.threads or None)
    threads_source = "torch default" if args.threads is None else "--threads"

    episodes = [episode for path in bfcl_paths() for episode in read_native(path)]
    sets = tool_sets(read_native(bfcl_paths(["base"])[0]))
    runs = file_system_runs(episodes)
    with tempfile.TemporaryDirectory(prefix="evoharness-latency-") as cache:
        small = sets[min(sets)]
        called = {spec.name for spec in small}
        policy_results = [measure_policy(tools, runs, called, args.steps, args.steps_per_run, args.warmup,
                                         Path(cache), args.policy) for tools in sets.values()]
    held_out = split_bfcl(read_native(bfcl_paths(["base"])[0]))[1]
    requests = [episode.task for episode in file_system_runs(held_out)]
    requests += [episode.task for episode in held_out if episode.task not in requests]
    llm_result = measure_llm(small, requests, args.llm_calls) if args.llm_calls > 0 else None

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    console.print(f"{os.cpu_count()} CPUs, torch {torch.__version__} with {torch.get_num_threads()} thread(s) "
                  f"({threads_source}), load average {load} (other processes share these CPUs)")
    print_results(policy_results, llm_result)
    if args.json:
        args.json.write_text(json.dumps({"policy": policy_results, "llm": llm_result,
                                         "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count()}, indent=2))
        console.print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
