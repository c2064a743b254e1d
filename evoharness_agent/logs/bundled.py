"""Locate, read and split the benchmark data bundled under the project's ``data/``.

The files are produced by ``scripts/convert_shared_data.py`` (see ``data/README.md``).
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from evoharness_agent.schema import Episode

__all__ = [
    "BFCL_VARIANTS",
    "DATA_DIR",
    "bfcl_paths",
    "bfcl_scenario_number",
    "data_dir",
    "gpt4o_airline_path",
    "gpt4o_airline_split",
    "read_native",
    "split_bfcl",
    "tau2_airline_path",
    "tau2_airline_split",
    "tau_airline_test_path",
]

BFCL_VARIANTS = ("base", "miss_func", "miss_param", "long_context")


def data_dir() -> Path:
    """Return the bundled data directory, honouring ``EVOHARNESS_DATA_DIR`` if set."""
    override = os.environ.get("EVOHARNESS_DATA_DIR")
    if override:
        return Path(override).expanduser().resolve()
    return Path(__file__).resolve().parents[2] / "data"


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
