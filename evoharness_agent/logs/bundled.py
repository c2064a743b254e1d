"""Locate, read and split the benchmark data bundled in the package (``evoharness_agent/data/``).

The files are produced by ``scripts/convert_shared_data.py`` (see ``evoharness_agent/data/README.md``).
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from evoharness_agent.schema import Episode

__all__ = [
    "BFCL_VARIANTS",
    "DATA_DIR",
    "DOMAINS",
    "DOMAIN_SIBLINGS",
    "METATOOL_SUBSETS",
    "TRAINING_SETS",
    "all_domain_episodes",
    "bfcl_paths",
    "bfcl_scenario_number",
    "domain_group",
    "bfcl_single_path",
    "data_dir",
    "default_training_split",
    "domain_episodes",
    "domain_paths",
    "gpt4o_airline_path",
    "gpt4o_airline_split",
    "metatool_paths",
    "read_native",
    "split_bfcl",
    "stabletoolbench_path",
    "tau2_airline_path",
    "tau2_airline_split",
    "tau2_retail_path",
    "tau2_retail_split",
    "tau_airline_test_path",
    "tau_retail_path",
    "training_set",
]

BFCL_VARIANTS = ("base", "miss_func", "miss_param", "long_context")

METATOOL_SUBSETS = ("single_tool", "multi_tool", "reliability", "awareness")

DOMAINS = ("bfcl", "bfcl_single", "metatool", "stabletoolbench", "tau_retail", "tau_airline",
           "tau2_retail", "tau2_airline")
"""The bundled domains, for leave-one-domain-out training (see ``domain_episodes``)."""

DOMAIN_SIBLINGS = {"tau_retail": {"tau2_retail"}, "tau2_retail": {"tau_retail"},
                   "tau_airline": {"tau2_airline"}, "tau2_airline": {"tau_airline"}}
"""Domains that share users, orders or scenarios: leaving one out leaves its sibling out too."""


def domain_group(domain: str) -> str:
    """Return the name of the group of ``domain`` and its siblings (:data:`DOMAIN_SIBLINGS`): the first, sorted."""
    return min({domain, *DOMAIN_SIBLINGS.get(domain, set())})


def data_dir() -> Path:
    """Return the bundled data directory, honouring ``EVOHARNESS_DATA_DIR`` if set."""
    override = os.environ.get("EVOHARNESS_DATA_DIR")
    if override:
        return Path(override).expanduser().resolve()
    # Package data, so an installed wheel has it too (the bundled environments and the shipped
    # default's baselines read it).
    return Path(__file__).resolve().parents[1] / "data"


DATA_DIR = data_dir()


def read_native(path: str | Path) -> list[Episode]:
    """Read a native JSONL file (gzip-compressed if it ends in ``.gz``) into episodes."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [Episode.model_validate_json(line) for line in handle if line.strip()]


def bfcl_paths(variants: Sequence[str] = BFCL_VARIANTS) -> list[Path]:
    """Return the BFCL multi-turn files for the given variants, in the order given."""
    unknown = [variant for variant in variants if variant not in BFCL_VARIANTS]
    if unknown:
        raise ValueError(f"unknown BFCL variants {unknown}; expected some of {BFCL_VARIANTS}")
    return [data_dir() / "bfcl" / f"multi_turn_{variant}.jsonl.gz" for variant in variants]


def tau2_airline_path() -> Path:
    """Return the tau2-bench airline gold-action file."""
    return data_dir() / "tau2_bench" / "airline.jsonl.gz"


def gpt4o_airline_path() -> Path:
    """Return the tau-bench airline file of logged gpt-4o runs."""
    return data_dir() / "tau_bench" / "airline_gpt4o.jsonl.gz"


def tau_airline_test_path() -> Path:
    """Return the tau-bench airline replayed gold test tasks file."""
    return data_dir() / "tau_bench" / "airline_test.jsonl.gz"


def bfcl_single_path() -> Path:
    """Return the BFCL single-turn selection file (multiple / parallel_multiple, live and not)."""
    return data_dir() / "bfcl" / "single_turn_selection.jsonl.gz"


def metatool_paths(subsets: Sequence[str] = METATOOL_SUBSETS) -> list[Path]:
    """Return the MetaTool files for the given subsets, in the order given."""
    unknown = [subset for subset in subsets if subset not in METATOOL_SUBSETS]
    if unknown:
        raise ValueError(f"unknown MetaTool subsets {unknown}; expected some of {METATOOL_SUBSETS}")
    return [data_dir() / "metatool" / f"{subset}.jsonl.gz" for subset in subsets]


def stabletoolbench_path() -> Path:
    """Return the StableToolBench solvable-queries file (all six groups)."""
    return data_dir() / "stabletoolbench" / "solvable_queries.jsonl.gz"


def tau_retail_path() -> Path:
    """Return the tau-bench retail file (train + dev; final state-changing gold calls only)."""
    return data_dir() / "tau_bench" / "retail.jsonl.gz"


def tau2_retail_path() -> Path:
    """Return the tau2-bench retail replayed gold tasks file."""
    return data_dir() / "tau2_bench" / "retail.jsonl.gz"


def domain_paths(domain: str) -> list[Path]:
    """Return the bundled files that make up one of :data:`DOMAINS`."""
    paths: dict[str, Callable[[], list[Path]]] = {
        "bfcl": bfcl_paths,
        "bfcl_single": lambda: [bfcl_single_path()],
        "metatool": metatool_paths,
        "stabletoolbench": lambda: [stabletoolbench_path()],
        "tau_retail": lambda: [tau_retail_path()],
        "tau_airline": lambda: [tau_airline_test_path(), gpt4o_airline_path()],
        "tau2_retail": lambda: [tau2_retail_path()],
        "tau2_airline": lambda: [tau2_airline_path()],
    }
    if domain not in paths:
        raise ValueError(f"unknown domain {domain!r}; expected one of {DOMAINS}")
    return paths[domain]()


# The files converted before domains existed carry no "domain" / "source_split" (or, for
# the tau airline files, "domain": "airline"); they are kept byte-identical, so these
# labels are set on load. Both tau-bench airline files are the benchmark's test tasks.
_LEGACY_SPLITS = {"airline_test.jsonl.gz": "test", "airline_gpt4o.jsonl.gz": "test"}


def domain_episodes(domain: str) -> list[Episode]:
    """Read every bundled file of ``domain``, each episode's ``metadata["domain"]`` set to it."""
    episodes = []
    for path in domain_paths(domain):
        for episode in read_native(path):
            metadata = episode.metadata
            metadata["domain"] = domain
            if "source_split" not in metadata:
                split = metadata.get("split", _LEGACY_SPLITS.get(path.name))
                if split is not None:
                    metadata["source_split"] = split
            episodes.append(episode)
    return episodes


def all_domain_episodes() -> dict[str, list[Episode]]:
    """Read every domain's episodes, keyed by domain in :data:`DOMAINS` order."""
    return {domain: domain_episodes(domain) for domain in DOMAINS}


def bfcl_scenario_number(episode: Episode) -> int:
    """Return a BFCL episode's scenario number (shared by all variants of the scenario)."""
    if "scenario" in episode.metadata:
        return int(episode.metadata["scenario"])
    return int(episode.id.rsplit("_", 1)[-1])


def split_bfcl(
    episodes: Iterable[Episode], test_mod: int = 5
) -> tuple[list[Episode], list[Episode]]:
    """Split BFCL episodes into (train, test) with test = scenario number % test_mod == 0."""
    # Split by scenario, not by file: the variants are rewrites of the same scenarios, so a
    # per-file split would leak test scenarios into training.
    train: list[Episode] = []
    test: list[Episode] = []
    for episode in episodes:
        (test if bfcl_scenario_number(episode) % test_mod == 0 else train).append(episode)
    return train, test


def tau2_airline_split(episodes: Iterable[Episode]) -> tuple[list[Episode], list[Episode]]:
    """Split tau2-bench airline episodes into (train, test) by the official split label."""
    train: list[Episode] = []
    test: list[Episode] = []
    for episode in episodes:
        split = episode.metadata.get("split")
        if split not in ("train", "test"):
            raise ValueError(f"{episode.id}: unexpected split {split!r}")
        (train if split == "train" else test).append(episode)
    return train, test


def gpt4o_airline_split(
    episodes: Iterable[Episode], n_test_tasks: int = 10
) -> tuple[list[Episode], list[Episode]]:
    """Split gpt-4o runs into (all runs of train tasks, successful runs of the last tasks)."""
    episodes = list(episodes)
    tasks = sorted({int(episode.metadata["task_index"]) for episode in episodes})
    test_tasks = set(tasks[-n_test_tasks:]) if n_test_tasks > 0 else set()
    train = [ep for ep in episodes if int(ep.metadata["task_index"]) not in test_tasks]
    # Only successful runs are evaluation targets: a failed run's actions are not the answer.
    test = [ep for ep in episodes
            if int(ep.metadata["task_index"]) in test_tasks and ep.reward == 1.0]
    return train, test


def tau2_retail_split(episodes: Iterable[Episode], n_test: int = 14) -> tuple[list[Episode], list[Episode]]:
    """Split tau2-bench retail's 74 (train-split) tasks into (train, test): ``n_test`` tasks spread over the ids.

    The test tasks are taken at even steps through the tasks in id order, not from the end:
    tau2's gold action lists name the lookups (``find_user_id_by_name_zip``, ``get_order_details``)
    for most tasks below id 63 and only the writes from there on, so a tail split would test
    write-only logs against a policy trained mostly on lookup-first ones.
    """
    ordered = sorted(episodes, key=lambda episode: int(episode.metadata["task_id"]))
    step = len(ordered) / max(n_test, 1)
    picked = {min(int((i + 0.5) * step), len(ordered) - 1) for i in range(min(n_test, len(ordered)))}
    return [e for i, e in enumerate(ordered) if i not in picked], [e for i, e in enumerate(ordered) if i in picked]


_HELD_OUT_AIRLINE_TASKS = range(40, 50)
"""tau-bench airline tasks 40-49: the gpt-4o runs' test tasks, whose users tau2 airline shares."""


def default_training_split(episodes: Iterable[Episode]) -> list[Episode]:
    """Return the episodes a shipped default may train on: every domain's data minus its held-out split.

    Held out: BFCL multi-turn scenarios 0 mod 5, tau2 airline's test split, tau-bench airline
    tasks 40-49, tau2 retail's :func:`tau2_retail_split` test tasks. The episodes must come from
    :func:`domain_episodes` (their ``metadata["domain"]`` says which rule applies).
    """
    episodes = list(episodes)
    kept: list[Episode] = []
    by_domain: dict[str, list[Episode]] = {}
    for episode in episodes:
        by_domain.setdefault(str(episode.metadata.get("domain")), []).append(episode)
    for domain, group in by_domain.items():
        if domain == "bfcl":
            kept += split_bfcl(group)[0]
        elif domain == "tau2_airline":
            kept += tau2_airline_split(group)[0]
        elif domain == "tau_airline":
            kept += [ep for ep in group if int(ep.metadata["task_index"]) not in _HELD_OUT_AIRLINE_TASKS]
        elif domain == "tau2_retail":
            kept += tau2_retail_split(group)[0]
        elif domain in DOMAINS:
            kept += group
        else:
            raise ValueError(f"episode {group[0].id!r}: metadata 'domain' {domain!r} is not one of {DOMAINS}")
    return kept


TRAINING_SETS = ("default",)
"""Bundled training sets a policy can record by name (``data.bundled`` in its config)."""


def training_set(name: str) -> list[Episode]:
    """Return the episodes of a bundled training set: ``"default"`` is :func:`default_training_split` of every domain.

    A policy trained on bundled data records the set's name rather than file paths, so an
    installed package finds the same episodes again (e.g. for ``evaluate``'s baselines).
    """
    if name not in TRAINING_SETS:
        raise ValueError(f"unknown bundled training set {name!r}; expected one of {TRAINING_SETS}")
    return [episode for group in all_domain_episodes().values() for episode in default_training_split(group)]
