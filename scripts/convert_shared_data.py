"""Convert the shared public benchmark data into the native Episode JSONL format.

Writes gzip-compressed JSONL (one ``Episode.model_dump_json()`` per line) under ``evoharness_agent/data/``,
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
import random
import re
import shutil
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# Importable without installing the package (e.g. plain `python scripts/...`).
sys.path.insert(0, str(PROJECT_ROOT))

from evoharness_agent.envs.tau_airline import AIRLINE_TABLES, airline_functions  # noqa: E402
from evoharness_agent.schema import Episode, Step, ToolSpec, as_tool_spec  # noqa: E402

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


THINK_TOOL_TYPE = {"think": "generic"}
"""tau-bench v1's ``think`` tool (tau2-bench dropped it) changes nothing and looks nothing up."""
# tau2-bench's tool types for the airline tools (its ``@is_tool(ToolType.…)`` marks; the shared data
# ships them for retail only, in retail_tools.json).
AIRLINE_TOOL_TYPES = {**THINK_TOOL_TYPE,
    "book_reservation": "write", "cancel_reservation": "write", "send_certificate": "write",
    "update_reservation_baggages": "write", "update_reservation_flights": "write",
    "update_reservation_passengers": "write", "get_reservation_details": "read", "get_user_details": "read",
    "get_flight_status": "read", "list_all_airports": "read", "search_direct_flight": "read",
    "search_onestop_flight": "read", "calculate": "generic", "transfer_to_human_agents": "generic",
}


def retail_tool_types(shared: Path) -> dict[str, str]:
    """Return each retail tool's type (read / write / generic): tau2-bench's ``tool_types``, tau-bench's tools too."""
    kinds = json.loads((shared / "tau2_bench" / "retail_tools.json").read_text("utf-8"))["tool_types"]
    return {**kinds, **THINK_TOOL_TYPE}


def recorded_without_lookups(tools: list[ToolSpec], kinds: dict[str, str], calls: Iterable[str],
                             recorded: tuple[str, ...] = ("write", "generic")) -> list[str] | None:
    """Return the tools a gold list that names no look-up could record (those of the ``recorded`` kinds), or None.

    tau-bench keeps only a task's calls that change the store (``recorded=("write",)``), and
    tau2-bench does so for about half its tasks, with the generic calls (a transfer to a human)
    kept: "return the skateboards" with no ``find_user_id_by_name_zip`` before it, while a real
    agent looks the user and the order up first. Offering the look-ups at such an episode's
    decisions would teach, and score, "change before looking up"; so it offers only the tools its
    log could have recorded. None: the list names a look-up, so it was kept whole.
    """
    if any(kinds[name] == "read" for name in calls):
        return None
    return [tool.name for tool in tools if kinds[tool.name] in recorded]




def tau2_task_text(scenario: dict[str, Any]) -> str:
    """Build what the simulated user would tell the agent from a tau2 user scenario."""
    instructions = scenario.get("instructions") or {}
    if isinstance(instructions, str):
        return instructions.strip()
    parts = [instructions.get(key) for key in ("reason_for_call", "known_info",
                                               "task_instructions")]
    return "\n\n".join(part.strip() for part in parts if part and part.strip())


def replay_airline(database: str, actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Replay gold airline actions on a fresh copy of ``database`` (JSON text); return tau-bench's replay entries.

    tau2-bench publishes the airline tasks' gold actions without their results (``replay`` is
    null). The package's airline tools reproduce tau-bench's own replay of its airline test tasks
    call for call, on the same database, so they give each action the observation an agent
    would have read: ``{tool, arguments, observation, error}``, as tau-bench's replays are.
    """
    functions = airline_functions(json.loads(database))
    replay = []
    for action in actions:
        arguments = action["arguments"] or {}
        observation = functions[action["name"]](**arguments)
        replay.append({"tool": action["name"], "arguments": arguments, "observation": observation,
                       "error": bool(TAU_ERROR_RE.match(observation))})
    return replay


def convert_tau2_airline(shared: Path, out: Path) -> list[Path]:
    """Convert the tau2-bench airline tasks (gold actions, replayed on tau-bench's airline DB)."""
    tools = tau_airline_tools(shared)
    # Read once; each task replays on its own fresh copy (its writes must not reach the next task).
    database = json.dumps({table: json.loads((shared / "tau_bench" / "db" / "airline" / f"{table}.json")
                                             .read_text("utf-8")) for table in AIRLINE_TABLES})
    episodes = []
    for row in read_jsonl(shared / "tau2_bench" / "airline_tasks.jsonl"):
        offered = recorded_without_lookups(tools, AIRLINE_TOOL_TYPES, (a["name"] for a in row["gold_actions"]))
        episodes.append(_check_tools(Episode(
            id=f"tau2_airline_{row['id']}",
            task=tau2_task_text(row["user_scenario"]),
            tools=tools, available_at_start=offered,
            steps=_replayed_steps({**row, "replay": replay_airline(database, row["gold_actions"])}),
            reward=1.0,
            metadata={"benchmark": "tau2-bench", "domain": "airline", "task_id": row["id"],
                      "split": row["split"], "partial_gold": offered is not None},
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
        offered = recorded_without_lookups(tools, AIRLINE_TOOL_TYPES, (call["tool"] for call in row["replay"]))
        episodes.append(_check_tools(Episode(
            id=f"tau_airline_test_{row['task_index']}",
            task=row["instruction"],
            tools=tools, available_at_start=offered,
            steps=steps,
            reward=1.0,
            metadata={"benchmark": "tau-bench", "domain": "airline", "split": "test",
                      "task_index": row["task_index"], "user_id": row.get("user_id"),
                      "partial_gold": offered is not None},
        )))
    test_path = out / "tau_bench" / "airline_test.jsonl.gz"
    write_episodes(test_path, episodes)
    copy_licence(shared / "tau_bench" / "LICENSE.tau-bench.txt", out / "tau_bench")
    return [gpt4o_path, test_path]


# ----------------------------------------------------------------- BFCL single-turn


# BFCL ground truth lists the acceptable values of each parameter; "" among them means the
# parameter may be left out.
_OMIT = object()


def _bfcl_pick(options: Any) -> Any:
    """Return one acceptable value from a BFCL ground-truth option list (the first one)."""
    if not isinstance(options, list):
        return options  # a raw value nested inside a dict option
    if not options or options[0] == "":
        return _OMIT
    first = options[0]
    if isinstance(first, dict):
        return _bfcl_pick_dict(first)
    if isinstance(first, list):
        # An array value; its dict elements (arrays of objects) again hold option lists.
        return [_bfcl_pick_dict(item) if isinstance(item, dict) else item for item in first]
    return first


def _bfcl_pick_dict(options: dict[str, Any]) -> dict[str, Any]:
    """Pick a value for every key of a dict whose values are BFCL option lists."""
    picked = {key: _bfcl_pick(value) for key, value in options.items()}
    return {key: value for key, value in picked.items() if value is not _OMIT}


def bfcl_single_episode(row: dict[str, Any]) -> Episode:
    """Convert one BFCL single-turn row: the gold call(s), then FINISH."""
    if len(row["question"]) != 1:
        raise ValueError(f"{row['id']}: expected a single turn")
    messages = row["question"][0]
    users = [m["content"] for m in messages if m["role"] == "user"]
    system = [m["content"] for m in messages if m["role"] == "system"]
    if len(users) != 1 or len(users) + len(system) != len(messages):
        raise ValueError(f"{row['id']}: expected one user message (and optionally a system one)")
    tools = [ToolSpec(name=f["name"], description=f.get("description", ""),
                      parameters=f.get("parameters")) for f in row["functions"]]
    names = [tool.name for tool in tools]
    if len(set(names)) != len(names):
        raise ValueError(f"{row['id']}: duplicate candidate names")
    steps = []
    for call in row["ground_truth"]:
        if len(call) != 1:
            raise ValueError(f"{row['id']}: a ground-truth call must name one function")
        [(name, options)] = call.items()
        steps.append(Step(kind="tool_call", tool=name, arguments=_bfcl_pick_dict(options)))
    if [step.tool for step in steps] != row["gold_function_names"]:
        raise ValueError(f"{row['id']}: ground_truth disagrees with gold_function_names")
    steps.append(Step(kind="assistant", content=""))
    metadata: dict[str, Any] = {"benchmark": "bfcl", "domain": "bfcl_single",
                                "category": row["category"], "ground_truth": row["ground_truth"]}
    if system:
        metadata["system"] = "\n".join(system)
    return _check_tools(Episode(id=row["id"], task=users[0], tools=tools, steps=steps, reward=1.0,
                                metadata=metadata))


def convert_bfcl_single(shared: Path, out: Path) -> list[Path]:
    """Convert BFCL's single-turn selection rows (multiple / parallel_multiple, live and not)."""
    rows = read_jsonl(shared / "bfcl" / "single_turn_selection.jsonl")
    path = out / "bfcl" / "single_turn_selection.jsonl.gz"
    write_episodes(path, [bfcl_single_episode(row) for row in rows])
    return [path]


# ---------------------------------------------------------------------------- MetaTool

METATOOL_SEED = "evoharness-metatool-v1"
METATOOL_SINGLE_SAMPLE = 3000
METATOOL_DISTRACTORS = 15


def metatool_tools(shared: Path) -> dict[str, ToolSpec]:
    """Load MetaTool's 199 tools (name -> description; they take no arguments)."""
    raw = json.loads((shared / "metatool" / "tool_descriptions.json").read_text("utf-8"))
    return {name: ToolSpec(name=name, description=text) for name, text in raw.items()}


def _metatool_candidates(gold: list[str], every: list[str], key: str) -> list[str]:
    """Return the gold tools plus seeded random distractors, in a seeded random order."""
    rng = random.Random(f"{METATOOL_SEED}:{key}")
    others = [name for name in every if name not in gold]
    names = list(gold) + rng.sample(others, METATOOL_DISTRACTORS + 1 - len(gold))
    rng.shuffle(names)
    return names


def _metatool_episode(key: str, subset: str, query: str, gold: list[str], candidates: list[str],
                      tools: dict[str, ToolSpec], **extra: Any) -> Episode:
    """Build a MetaTool episode: one argument-free call per gold tool, then FINISH."""
    steps = [Step(kind="tool_call", tool=name) for name in gold]
    steps.append(Step(kind="assistant", content=""))
    return _check_tools(Episode(
        id=f"metatool_{subset}_{key}", task=query, tools=[tools[name] for name in candidates],
        steps=steps, reward=1.0,
        metadata={"benchmark": "metatool", "domain": "metatool", "subset": subset, **extra},
    ))


def metatool_single_sample(rows: list[dict[str, Any]], exclude: set[str]) -> list[dict[str, Any]]:
    """Pick a seeded sample of single-tool rows, as even over the tools as the data allows."""
    labels: dict[str, set[str]] = {}
    for row in rows:
        labels.setdefault(row["query"], set()).add(row["tool"])
    by_tool: dict[str, list[dict[str, Any]]] = {}
    seen: set[str] = set()
    for row in rows:
        # Drop queries labelled with several tools (ambiguous), exact repeats, and queries
        # that the awareness / reliability files reuse (kept clean for within-domain tests).
        if len(labels[row["query"]]) > 1 or row["query"] in seen or row["query"] in exclude:
            continue
        seen.add(row["query"])
        by_tool.setdefault(row["tool"], []).append(row)
    for tool, group in by_tool.items():
        random.Random(f"{METATOOL_SEED}:sample:{tool}").shuffle(group)
    picked: list[dict[str, Any]] = []
    depth = 0
    # Round robin over the tools (sorted) until the sample is full: every tool gets the same
    # number of queries, except those that run out.
    while len(picked) < METATOOL_SINGLE_SAMPLE:
        layer = [group[depth] for _, group in sorted(by_tool.items()) if depth < len(group)]
        if not layer:
            break
        picked.extend(layer[:METATOOL_SINGLE_SAMPLE - len(picked)])
        depth += 1
    return sorted(picked, key=lambda row: row["id"])


def convert_metatool(shared: Path, out: Path) -> list[Path]:
    """Convert MetaTool: a single-tool sample, multi-tool pairs, reliability and awareness."""
    src = shared / "metatool"
    tools = metatool_tools(shared)
    every = list(tools)
    awareness = read_jsonl(src / "task1_awareness.jsonl")
    reliability = read_jsonl(src / "task2_subtask3_reliability.jsonl")
    paths = []

    exclude = {row["query"] for row in awareness + reliability}
    sample = metatool_single_sample(read_jsonl(src / "single_tool_queries.jsonl"), exclude)
    paths.append(out / "metatool" / "single_tool.jsonl.gz")
    write_episodes(paths[-1], [
        _metatool_episode(str(row["id"]), "single_tool", row["query"], [row["tool"]],
                          _metatool_candidates([row["tool"]], every, f"single:{row['id']}"), tools,
                          source_id=row["id"])
        for row in sample])

    # task2_subtask4_multi is the same 497 queries and gold pairs with MetaTool's own 10
    # candidates: use those as the tool list.
    multi = read_jsonl(src / "multi_tool_queries.jsonl")
    picks = read_jsonl(src / "task2_subtask4_multi.jsonl")
    episodes = []
    for row, pick in zip(multi, picks, strict=True):
        if (row["query"], row["tools"]) != (pick["query"], pick["gold_tools"]):
            raise ValueError(f"MetaTool multi row {row['id']}: subtask4 row does not match")
        if len(row["tools"]) != 2 or set(row["tools"]) - set(pick["candidates"]):
            raise ValueError(f"MetaTool multi row {row['id']}: gold pair not in candidates")
        episodes.append(_metatool_episode(str(row["id"]), "multi_tool", row["query"], row["tools"],
                                          pick["candidates"], tools, source_id=row["id"]))
    paths.append(out / "metatool" / "multi_tool.jsonl.gz")
    write_episodes(paths[-1], episodes)

    episodes = []
    for index, row in enumerate(reliability):
        if row["expected_answer"] != "None" or row["excluded_gold_tool"] in row["candidates"]:
            raise ValueError(f"MetaTool reliability row {index}: gold tool among candidates")
        episodes.append(_metatool_episode(str(index), "reliability", row["query"], [],
                                          row["candidates"], tools, source_line=index,
                                          excluded_gold_tool=row["excluded_gold_tool"]))
    paths.append(out / "metatool" / "reliability.jsonl.gz")
    write_episodes(paths[-1], episodes)

    episodes = []
    for index, row in enumerate(awareness):
        if row["label"] == "positive" and not row["tool"]:
            continue  # needs a tool but names none: no gold action (none in this release)
        gold = [row["tool"]] if row["label"] == "positive" else []
        if row["label"] not in ("positive", "negative") or (row["label"] == "negative" and row["tool"]):
            raise ValueError(f"MetaTool awareness row {index}: unexpected label/tool")
        episodes.append(_metatool_episode(
            str(index), "awareness", row["query"], gold,
            _metatool_candidates(gold, every, f"awareness:{index}"), tools,
            source_line=index, label=row["label"]))
    paths.append(out / "metatool" / "awareness.jsonl.gz")
    write_episodes(paths[-1], episodes)
    copy_licence(src / "LICENSE.MetaTool.txt", out / "metatool")
    return paths


# -------------------------------------------------------------------- StableToolBench

STB_GROUPS = ("G1_category", "G1_instruction", "G1_tool", "G2_category", "G2_instruction",
              "G3_instruction")
# RapidAPI parameter types -> JSON schema (ENUM, DATE, TIME, BINARY are strings on the wire).
STB_TYPES = {"STRING": "string", "NUMBER": "number", "BOOLEAN": "boolean", "ARRAY": "array",
             "OBJECT": "object"}


def _stb_slug(text: str) -> str:
    """Lower-case a RapidAPI name to a snake_case identifier (non-word runs become '_')."""
    return re.sub(r"_+", "_", re.sub(r"\W+", "_", text)).strip("_").lower() or "api"


def stb_tool_name(tool_name: str, api_name: str) -> str:
    """Name an API as ToolBench does, ``<api>_for_<tool>`` (not truncated to 64 characters)."""
    return f"{_stb_slug(api_name)}_for_{_stb_slug(tool_name)}"


def stb_parameters(api: dict[str, Any]) -> dict[str, Any]:
    """Build a JSON schema from an API's required and optional RapidAPI parameters."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    for is_required, params in ((True, api["required_parameters"]),
                                (False, api["optional_parameters"])):
        for param in params:
            name = param["name"]
            if name in properties:
                continue  # two APIs list a parameter twice: keep the first
            kind = str(param.get("type") or "STRING")
            schema: dict[str, Any] = {"type": STB_TYPES.get(kind.upper(), "string")}
            if param.get("description"):
                schema["description"] = param["description"]
            if kind.upper() not in STB_TYPES:
                schema["format"] = kind  # ENUM, DATE (YYYY-MM-DD), TIME (24-hour HH:MM), BINARY
            if param.get("default") not in (None, ""):
                # RapidAPI's "default" is an example value (ToolBench's example_value).
                schema["examples"] = [param["default"]]
            properties[name] = schema
            if is_required:
                required.append(name)
    return {"type": "object", "properties": properties, "required": required}


def stb_episode(row: dict[str, Any]) -> Episode:
    """Convert one StableToolBench query: a call per relevant API (listed order), then FINISH."""
    key = f"{row['group']}_{row['query_id']}"
    names: dict[tuple[str, str], str] = {}
    tools = []
    for api in row["api_list"]:
        pair = (api["tool_name"], api["api_name"])
        if pair in names:
            raise ValueError(f"{key}: API {pair} listed twice")
        name = base = stb_tool_name(*pair)
        suffix = 2
        while name in names.values():
            name, suffix = f"{base}_{suffix}", suffix + 1
        names[pair] = name
        tools.append(ToolSpec(name=name, description=(api.get("api_description") or "").strip(),
                              parameters=stb_parameters(api)))
    steps = []
    for tool_name, api_name in row["relevant_apis"]:
        if (tool_name, api_name) not in names:
            raise ValueError(f"{key}: relevant API {(tool_name, api_name)} not in api_list")
        steps.append(Step(kind="tool_call", tool=names[(tool_name, api_name)]))
    steps.append(Step(kind="assistant", content=""))
    return _check_tools(Episode(
        id=f"stabletoolbench_{key}", task=row["query"], tools=tools, steps=steps, reward=1.0,
        metadata={"benchmark": "stabletoolbench", "domain": "stabletoolbench",
                  "source_split": "test", "group": row["group"], "query_id": row["query_id"],
                  "relevant_apis": row["relevant_apis"],
                  "categories": sorted({api["category_name"] for api in row["api_list"]})},
    ))


def convert_stabletoolbench(shared: Path, out: Path) -> list[Path]:
    """Convert the six StableToolBench solvable-query groups into one file."""
    episodes = []
    for group in STB_GROUPS:
        for row in read_jsonl(shared / "stabletoolbench" / f"solvable_queries_{group}.jsonl"):
            if row["group"] != group:
                raise ValueError(f"{group}: row {row['query_id']} says group {row['group']}")
            episodes.append(stb_episode(row))
    path = out / "stabletoolbench" / "solvable_queries.jsonl.gz"
    write_episodes(path, episodes)
    copy_licence(shared / "stabletoolbench" / "LICENSE.StableToolBench.txt", out / "stabletoolbench")
    return [path]


# ----------------------------------------------------------------------- tau retail


def openai_tools(path: Path) -> list[ToolSpec]:
    """Load tool schemas in OpenAI function format from a tau tools file."""
    raw = json.loads(path.read_text("utf-8"))
    return [as_tool_spec(tool) for tool in raw["tools"]]


def _replayed_steps(row: dict[str, Any]) -> list[Step]:
    """Turn a task's replayed gold calls into tool_call steps plus a closing FINISH."""
    if [a["name"] for a in row["gold_actions"]] != [call["tool"] for call in row["replay"]]:
        raise ValueError("replay does not follow the gold actions")
    steps = [Step(kind="tool_call", tool=call["tool"], arguments=call["arguments"] or {},
                  observation=call["observation"], error=bool(call["error"]))
             for call in row["replay"]]
    steps.append(Step(kind="assistant", content=""))
    return steps


def convert_tau_retail(shared: Path, out: Path) -> list[Path]:
    """Convert tau-bench retail train + dev (final state-changing gold calls only, replayed).

    Its gold lists keep only the calls that change the store, so only those tools were a choice the
    log could record (:func:`recorded_without_lookups`, by tau2-bench's ``tool_types`` for the same
    tools). Offering the look-ups too would teach, and score, "change before looking up".
    """
    tools = openai_tools(shared / "tau_bench" / "retail_tools.json")
    kinds = retail_tool_types(shared)
    episodes = []
    for split in ("train", "dev"):
        for row in read_jsonl(shared / "tau_bench" / f"retail_{split}.jsonl"):
            if row["split"] != split:
                raise ValueError(f"retail_{split} task {row['task_index']}: split {row['split']}")
            offered = recorded_without_lookups(tools, kinds, (a["name"] for a in row["gold_actions"]), ("write",))
            if offered is None:
                raise ValueError(f"retail_{split} task {row['task_index']}: a look-up in a write-only gold list")
            episodes.append(_check_tools(Episode(
                id=f"tau_retail_{split}_{row['task_index']}", task=row["instruction"], tools=tools,
                available_at_start=offered,
                steps=_replayed_steps(row), reward=1.0,
                metadata={"benchmark": "tau-bench", "domain": "tau_retail", "source_split": split,
                          "task_index": row["task_index"], "user_id": row.get("user_id"),
                          "partial_gold": True},
            )))
    path = out / "tau_bench" / "retail.jsonl.gz"
    write_episodes(path, episodes)
    return [path]


def convert_tau2_retail(shared: Path, out: Path) -> list[Path]:
    """Convert the tau2-bench retail tasks (gold sequences, replayed; a write-only one offers no look-up)."""
    tools = openai_tools(shared / "tau2_bench" / "retail_tools.json")
    kinds = retail_tool_types(shared)
    episodes = []
    for row in read_jsonl(shared / "tau2_bench" / "retail_tasks.jsonl"):
        offered = recorded_without_lookups(tools, kinds, (a["name"] for a in row["gold_actions"]))
        episodes.append(_check_tools(Episode(
            id=f"tau2_retail_{row['id']}", task=tau2_task_text(row["user_scenario"]), tools=tools,
            available_at_start=offered,
            steps=_replayed_steps(row), reward=1.0,
            metadata={"benchmark": "tau2-bench", "domain": "tau2_retail",
                      "source_split": row["split"], "task_id": row["id"], "partial_gold": offered is not None},
        )))
    path = out / "tau2_bench" / "retail.jsonl.gz"
    write_episodes(path, episodes)
    return [path]


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
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "evoharness_agent" / "data",
                        help="output directory (default: <project>/evoharness_agent/data)")
    args = parser.parse_args(argv)
    shared, out = args.shared.resolve(), args.out.resolve()
    if not shared.is_dir():
        parser.error(f"shared data not found: {shared}")

    paths = convert_bfcl(shared, out) + convert_tau2_airline(shared, out)
    paths += convert_tau_airline(shared, out)
    paths += convert_bfcl_single(shared, out) + convert_metatool(shared, out)
    paths += convert_stabletoolbench(shared, out) + convert_tau_retail(shared, out)
    paths += convert_tau2_retail(shared, out)
    for path in paths:
        print(summarise(path, out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
