"""Convert the shared public benchmark data into the native Episode JSONL format.

Writes gzip-compressed JSONL (one ``Episode.model_dump_json()`` per line) under ``data/``,
copies each source's licence beside its files, re-reads every line to validate it and
prints per-file counts. Output is byte-for-byte deterministic (gzip mtime pinned to 0).

Usage (from the project root)::

    python scripts/convert_shared_data.py [--shared ../shared/data] [--out data]
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import re
import shutil
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# Importable without installing the package (e.g. plain `python scripts/...`).
sys.path.insert(0, str(PROJECT_ROOT))

from evoharness_agent.schema import Episode, Step, ToolSpec  # noqa: E402

BFCL_VARIANTS = ("base", "miss_func", "miss_param", "long_context")

# BFCL's own inference loop sends this user message on a holdout turn (a turn whose
# question is empty because its only event is the missing functions becoming available):
# bfcl_eval.constants.default_prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC.
BFCL_ADDED_FUNCTIONS_PROMPT = (
    "I have updated some more functions you can choose from. What about now?"
)

# tau-bench tools return "Error: ..." strings on failure, and the environment wraps any
# exception raised by a tool the same way; no other observation in the logs is an error.
TAU_ERROR_RE = re.compile(r"^Error:")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read a JSONL file into a list of dicts, skipping blank lines."""
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def write_episodes(path: Path, episodes: Iterable[Episode]) -> None:
    """Write episodes as gzip JSONL with a fixed header so reruns give identical bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as raw, gzip.GzipFile(
        filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9
    ) as gz, io.TextIOWrapper(gz, encoding="utf-8", newline="\n") as text:
        for episode in episodes:
            text.write(episode.model_dump_json())
            text.write("\n")


def read_episodes(path: Path) -> Iterator[Episode]:
    """Re-read a written file, validating every line against the schema."""
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            yield Episode.model_validate_json(line)


def copy_licence(src: Path, dst_dir: Path) -> None:
    """Copy a licence file beside the converted data."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst_dir / src.name)


def unavailable_calls(episode: Episode) -> list[dict[str, Any]]:
    """List the tool calls made while their tool was not (yet) available."""
    pairs = zip(episode.steps, episode.availability(), strict=True)
    return [{"step": index, "tool": step.tool} for index, (step, available) in enumerate(pairs)
            if step.kind == "tool_call" and step.tool not in available]


def _check_tools(episode: Episode) -> Episode:
    """Fail loudly if a step calls an unavailable tool, unless the source's flaw is flagged."""
    found = unavailable_calls(episode)
    if found != episode.metadata.get("gold_calls_unavailable", []):
        raise ValueError(f"{episode.id}: tools called while unavailable: {found}")
    return episode


# --------------------------------------------------------------------------------- BFCL


def bfcl_tool_docs(shared: Path) -> dict[str, list[ToolSpec]]:
    """Load the multi-turn function docs per API class, checking names are unique."""
    raw = json.loads((shared / "bfcl" / "multi_turn_func_docs.json").read_text("utf-8"))
    docs = {
        cls: [ToolSpec(name=d["name"], description=d.get("description", ""),
                       parameters=d.get("parameters")) for d in funcs]
        for cls, funcs in raw.items()
    }
    owner: dict[str, str] = {}
    for cls, specs in docs.items():
        for spec in specs:
            # Episodes address tools by bare name, so a clash across classes would be ambiguous.
            if spec.name in owner:
                raise ValueError(f"BFCL tool {spec.name!r} in both {owner[spec.name]} and {cls}")
            owner[spec.name] = cls
    return docs


def bfcl_episode(row: dict[str, Any], variant: str, docs: dict[str, list[ToolSpec]]) -> Episode:
    """Convert one BFCL multi-turn scenario into an episode of gold demonstrations."""
    tools = [spec for cls in row["involved_classes"] for spec in docs[cls]]
    known = {spec.name for spec in tools}
    missed = row.get("missed_function") or {}
    turns = row["turns"]
    if [turn["turn"] for turn in turns] != list(range(len(turns))):
        raise ValueError(f"{row['id']}: turns are not numbered 0..n-1")
    if turns[0]["functions_added_this_turn"] or not turns[0]["user_messages"]:
        raise ValueError(f"{row['id']}: turn 0 must carry the task and add no functions")

    task = ""
    steps: list[Step] = []
    for turn in turns:
        added = list(turn["functions_added_this_turn"])
        if sorted(added) != sorted(missed.get(str(turn["turn"]), [])):
            raise ValueError(f"{row['id']}: functions_added_this_turn != missed_function")
        if set(added) - known:
            raise ValueError(f"{row['id']}: added functions {added} not in the tool docs")
        text = "\n".join(m["content"] for m in turn["user_messages"])
        if turn["turn"] == 0:
            task = text
        else:
            if not text and added:
                text = BFCL_ADDED_FUNCTIONS_PROMPT
            steps.append(Step(kind="user", content=text, tools_added=added))
        for call in turn["gold_calls"]:
            if call.get("positional_args"):
                raise ValueError(f"{row['id']}: positional args are not representable")
            steps.append(Step(kind="tool_call", tool=call["tool"], arguments=call["arguments"],
                              observation=call["observation"], error=bool(call["error"])))
        steps.append(Step(kind="assistant", content=""))

    episode = Episode(
        id=row["id"],
        task=task,
        tools=tools,
        available_at_start=list(row["available_functions_at_start"]),
        steps=steps,
        reward=1.0,
        metadata={
            "benchmark": "bfcl",
            "variant": variant,
            "scenario": int(row["id"].rsplit("_", 1)[1]),
            "involved_classes": row["involved_classes"],
            "initial_config": row["initial_config"],
            "path": row.get("path"),
            "missed_function": missed,
            # Kept for completeness only: bfcl-eval never reads this field, so these
            # functions stay offered to the model (they are in available_at_start).
            "excluded_function": row.get("excluded_function") or [],
        },
    )
    # Upstream ground truth has one such flaw (miss_func_49 calls `tail` two turns before
    # it is added); keep the gold calls as published and flag them for consumers.
    episode.metadata["gold_calls_unavailable"] = unavailable_calls(episode)
    return episode


def convert_bfcl(shared: Path, out: Path) -> list[Path]:
    """Convert the four BFCL multi-turn variants."""
    docs = bfcl_tool_docs(shared)
    paths = []
    for variant in BFCL_VARIANTS:
        rows = read_jsonl(shared / "bfcl" / f"multi_turn_{variant}.jsonl")
        path = out / "bfcl" / f"multi_turn_{variant}.jsonl.gz"
        write_episodes(path, (bfcl_episode(row, variant, docs) for row in rows))
        paths.append(path)
    copy_licence(shared / "bfcl" / "LICENSE_NOTE.txt", out / "bfcl")
    return paths


# ---------------------------------------------------------------------------- tau-bench


def tau_airline_tools(shared: Path) -> list[ToolSpec]:
    """Load the airline tool schemas (OpenAI function format) shared by both tau benches."""
    raw = json.loads((shared / "tau_bench" / "airline_tools.json").read_text("utf-8"))
    specs = []
    for tool in raw["tools"]:
        fn = tool.get("function", tool)
        specs.append(ToolSpec(name=fn["name"], description=fn.get("description", ""),
                              parameters=fn.get("parameters")))
    return specs




def tau2_task_text(scenario: dict[str, Any]) -> str:
    """Build what the simulated user would tell the agent from a tau2 user scenario."""
    instructions = scenario.get("instructions") or {}
    if isinstance(instructions, str):
        return instructions.strip()
    parts = [instructions.get(key) for key in ("reason_for_call", "known_info",
                                               "task_instructions")]
    return "\n\n".join(part.strip() for part in parts if part and part.strip())


def convert_tau2_airline(shared: Path, out: Path) -> list[Path]:
    """Convert the tau2-bench airline tasks (gold actions, not replayed)."""
    tools = tau_airline_tools(shared)
    rows = read_jsonl(shared / "tau2_bench" / "airline_tasks.jsonl")
    episodes = []
    for row in rows:
        steps = [Step(kind="tool_call", tool=action["name"], arguments=action["arguments"] or {})
                 for action in row["gold_actions"]]
        steps.append(Step(kind="assistant", content=""))
        episodes.append(_check_tools(Episode(
            id=f"tau2_airline_{row['id']}",
            task=tau2_task_text(row["user_scenario"]),
            tools=tools,
            steps=steps,
            reward=1.0,
            metadata={"benchmark": "tau2-bench", "domain": "airline", "task_id": row["id"],
                      "split": row["split"]},
        )))
    path = out / "tau2_bench" / "airline.jsonl.gz"
    write_episodes(path, episodes)
    copy_licence(shared / "tau2_bench" / "LICENSE.tau2-bench.txt", out / "tau2_bench")
    # The tool schemas come from tau-bench v1, so its licence applies too.
    copy_licence(shared / "tau_bench" / "LICENSE.tau-bench.txt", out / "tau2_bench")
    return [path]


def gpt4o_episode(row: dict[str, Any], tools: list[ToolSpec]) -> Episode:
    """Convert one logged gpt-4o tau-bench airline run, keeping events in logged order."""
    events = row["events"]
    if not events or events[0]["type"] != "user":
        raise ValueError(f"task {row['task_index']} trial {row['trial']}: no opening user turn")
    steps = []
    for event in events[1:]:
        kind = event["type"]
        if kind == "tool_call":
            observation = event.get("observation") or ""
            steps.append(Step(kind="tool_call", tool=event["tool"],
                              arguments=event.get("arguments") or {}, observation=observation,
                              error=bool(TAU_ERROR_RE.match(observation))))
        elif kind in ("user", "assistant"):
            steps.append(Step(kind=kind, content=event.get("content") or ""))
        else:
            raise ValueError(f"unknown event type {kind!r}")
    replies = [step.content for step in steps if step.kind == "assistant"]
    return _check_tools(Episode(
        id=f"tau_airline_gpt4o_task{row['task_index']}_trial{row['trial']}",
        task=events[0].get("content") or "",
        tools=tools,
        steps=steps,
        final_answer=replies[-1] if replies else "",
        reward=float(row["reward"]),
        metadata={"benchmark": "tau-bench", "domain": "airline",
                  "task_index": row["task_index"], "trial": row["trial"],
                  "instruction": row["instruction"], "agent": row["agent"]},
    ))


def convert_tau_airline(shared: Path, out: Path) -> list[Path]:
    """Convert tau-bench airline: the gpt-4o logged runs and the replayed gold test tasks."""
    tools = tau_airline_tools(shared)
    logs = read_jsonl(shared / "tau_bench" / "airline_gpt4o_logged_trajectories.jsonl")
    logs.sort(key=lambda r: (r["task_index"], r["trial"]))
    gpt4o_path = out / "tau_bench" / "airline_gpt4o.jsonl.gz"
    write_episodes(gpt4o_path, [gpt4o_episode(row, tools) for row in logs])

    episodes = []
    for row in read_jsonl(shared / "tau_bench" / "airline_test.jsonl"):
        steps = [Step(kind="tool_call", tool=call["tool"], arguments=call["arguments"] or {},
                      observation=call["observation"], error=bool(call["error"]))
                 for call in row["replay"]]
        steps.append(Step(kind="assistant", content=""))
        episodes.append(_check_tools(Episode(
            id=f"tau_airline_test_{row['task_index']}",
            task=row["instruction"],
            tools=tools,
            steps=steps,
            reward=1.0,
            metadata={"benchmark": "tau-bench", "domain": "airline", "split": "test",
                      "task_index": row["task_index"], "user_id": row.get("user_id")},
        )))
    test_path = out / "tau_bench" / "airline_test.jsonl.gz"
    write_episodes(test_path, episodes)
    copy_licence(shared / "tau_bench" / "LICENSE.tau-bench.txt", out / "tau_bench")
    return [gpt4o_path, test_path]


# ------------------------------------------------------------------------------- driver


def summarise(path: Path, root: Path) -> str:
    """Validate every line of a file and return a one-line count summary."""
    episodes = list(read_episodes(path))
    for episode in episodes:
        _check_tools(episode)
    calls = sum(step.kind == "tool_call" for ep in episodes for step in ep.steps)
    errors = sum(step.error for ep in episodes for step in ep.steps)
    decisions = sum(step.is_decision for ep in episodes for step in ep.steps)
    tools = {name for ep in episodes for name in ep.tool_names()}
    used = {step.tool for ep in episodes for step in ep.steps if step.kind == "tool_call"}
    flagged = sum(len(ep.metadata.get("gold_calls_unavailable", [])) for ep in episodes)
    rewards = [ep.reward for ep in episodes if ep.reward is not None]
    mean = sum(rewards) / len(rewards) if rewards else float("nan")
    return (f"{path.relative_to(root)}: {len(episodes)} episodes, {calls} tool calls "
            f"({errors} errors), {decisions} decisions, {len(tools)} tools "
            f"({len(used)} used), {flagged} flagged unavailable, mean reward {mean:.3f}, "
            f"{path.stat().st_size / 1024:.0f} KiB")


def main(argv: list[str] | None = None) -> int:
    """Run every conversion and print per-file counts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=PROJECT_ROOT.parent / "shared" / "data",
                        help="root of the shared benchmark data (default: ../shared/data)")
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "data",
                        help="output directory (default: <project>/data)")
    args = parser.parse_args(argv)
    shared, out = args.shared.resolve(), args.out.resolve()
    if not shared.is_dir():
        parser.error(f"shared data not found: {shared}")

    paths = convert_bfcl(shared, out) + convert_tau2_airline(shared, out)
    paths += convert_tau_airline(shared, out)
    for path in paths:
        print(summarise(path, out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
