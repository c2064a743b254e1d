"""The environment registry: the bundled executable environments by name, with their task splits.

:func:`load_environment` builds one from the data bundled in
:mod:`evoharness_agent.logs.bundled` (``bfcl``: BFCL multi-turn scenarios; ``tau-airline``:
the tau-bench airline tasks) and returns it with the tasks of a split and the training logs
that baselines are fit on.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from evoharness_agent.schema import Episode

if TYPE_CHECKING:
    from collections.abc import Callable

    # Annotations only (the environments themselves are imported on use): the CLI reads
    # ENVIRONMENTS and SPLITS at start, and the env base loads LangChain's tools.
    from evoharness_agent.envs.base import ToolUseEnv

__all__ = ["ENVIRONMENTS", "SPLITS", "EnvSetup", "load_environment"]

ENVIRONMENTS = ("bfcl", "tau-airline")
SPLITS = ("train", "test", "all")


@dataclass
class EnvSetup:
    """An environment, the tasks to run in it, and the training logs baselines are fit on."""

    name: str
    env: ToolUseEnv
    tasks: list[Episode]
    train_episodes: list[Episode]


def load_environment(name: str, *, variant: str = "base", split: str = "test",
                     limit: int | None = None) -> EnvSetup:
    """Build a bundled environment with its tasks and training logs.

    ``bfcl``: BFCL multi-turn ``variant`` scenarios, test = scenario % 5 == 0. ``tau-airline``:
    the 50 tau-bench airline tasks with replayed gold calls, test = task index 40-49 (the
    held-out tasks of the gpt-4o logs too); a task succeeds when the database equals the gold
    one and every gold call's result was seen (``check_results``). ``limit`` keeps the first tasks of the split.
    """
    from evoharness_agent.logs.bundled import BFCL_VARIANTS, bfcl_paths, read_native, split_bfcl, tau_airline_test_path

    if name not in ENVIRONMENTS:
        raise ValueError(f"unknown environment {name!r}; expected one of {ENVIRONMENTS}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    make: Callable[[Episode], ToolUseEnv]  # builds the environment from its first task
    if name == "bfcl":
        if variant not in BFCL_VARIANTS:
            raise ValueError(f"unknown BFCL variant {variant!r}; expected one of {BFCL_VARIANTS}")
        from evoharness_agent.envs.bfcl import BFCLEnvironment

        episodes = read_native(bfcl_paths([variant])[0])
        train, test = split_bfcl(episodes)
        label, make = f"bfcl-{variant}-{split}", BFCLEnvironment
    else:
        from evoharness_agent.envs.tau_airline import TauAirlineEnvironment, tau_airline_split

        episodes = read_native(tau_airline_test_path())
        train, test = tau_airline_split(episodes)
        # Reads count too: with the state check alone, the 20 read-only tasks succeed by
        # answering at once, and a policy that never calls a tool scores 0.7 on the test tasks.
        label, make = f"tau-airline-{split}", partial(TauAirlineEnvironment, check_results=True)
    tasks = {"train": train, "test": test, "all": episodes}[split][:limit]
    if not tasks:
        raise ValueError(f"no {split} tasks in {label}")
    env = make(tasks[0])
    return EnvSetup(label, env, tasks, train)
