"""Offline RL algorithms, one module each, behind one small interface.

Every algorithm has a frozen config dataclass, pure loss functions, and a class with
``update(batch) -> dict`` (one gradient step, returns scalar logs), ``scores(states)``
(the scores it acts on, higher is better), ``acting_modules()`` (what a policy needs at
inference) and ``state_dict()`` / ``load_state_dict()`` (what a checkpoint needs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from evoharness_agent.learning.algorithms.base import Algorithm, Dims, ToolInputs
from evoharness_agent.learning.algorithms.bc import BC, BCConfig
from evoharness_agent.learning.algorithms.bcq import BCQ, BCQConfig
from evoharness_agent.learning.algorithms.cql import CQL, CQLConfig
from evoharness_agent.learning.algorithms.iql import IQL, IQLConfig
from evoharness_agent.learning.networks import NetworkConfig

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["ALGORITHMS", "BC", "Algorithm", "BCQ", "CQL", "IQL", "BCConfig", "BCQConfig", "CQLConfig",
           "Dims", "IQLConfig", "ToolInputs", "make_algorithm"]

AlgorithmFactory = Callable[[Any, Dims, NetworkConfig, ToolInputs], Algorithm]
"""An algorithm class: built from its config (an instance of the paired config class), sizes, network and tools."""

ALGORITHMS: dict[str, tuple[AlgorithmFactory, type[DataclassInstance]]] = {
    "bc": (BC, BCConfig),
    "cql": (CQL, CQLConfig),
    "iql": (IQL, IQLConfig),
    "bcq": (BCQ, BCQConfig),
}


def make_algorithm(name: str, params: dict[str, Any], dims: Dims, network: NetworkConfig,
                   tools: ToolInputs) -> Algorithm:
    """Build algorithm ``name`` with config fields from ``params`` (unknown keys are errors)."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {sorted(ALGORITHMS)}")
    algorithm_cls, config_cls = ALGORITHMS[name]
    known = set(config_cls.__dataclass_fields__)
    unknown = set(params) - known
    if unknown:
        raise ValueError(f"algorithm {name!r} has no settings {sorted(unknown)}; known: {sorted(known)}")
    return algorithm_cls(config_cls(**params), dims, network, tools)
