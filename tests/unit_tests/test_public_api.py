from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest

import evoharness_agent

EXPECTED_ALL = {
    "Approval", "FINISH", "Episode", "EpisodeRecorder", "Guardrails", "LoadResult", "LocalChatModel", "LogFormatError",
    "OfflineReport",
    "PIIScrubber", "PolicyAgentExecutor", "PolicySession", "RewardConfig", "StateEncoder", "Step", "ToolPolicy",
    "ToolScore", "ToolSpec", "TrainConfig", "TransitionDataset", "build_dataset", "detect_format",
    "evaluate_offline", "load_config", "load_episodes", "shape_rewards", "train", "train_on_episodes",
    "write_episodes",
}


def _modules() -> list[ModuleType]:
    """Every module of the package; modules needing an optional extra that is absent are left out."""
    names = sorted(info.name for info in pkgutil.walk_packages(evoharness_agent.__path__, "evoharness_agent."))
    modules = [evoharness_agent]
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError as error:  # an optional dependency, never one of ours
            if (error.name or "").startswith("evoharness_agent"):
                raise
    return modules


MODULES = _modules()


def test_all_matches_expected_and_imports() -> None:
    assert set(evoharness_agent.__all__) == EXPECTED_ALL
    assert len(evoharness_agent.__all__) == len(EXPECTED_ALL), "duplicates in __all__"
    namespace: dict[str, Any] = {}
    exec("from evoharness_agent import *", namespace)  # noqa: S102 - the star import users write
    assert EXPECTED_ALL <= set(namespace)
    for name in EXPECTED_ALL:
        assert getattr(evoharness_agent, name) is namespace[name]
    assert isinstance(evoharness_agent.__version__, str) and evoharness_agent.__version__
    with pytest.raises(AttributeError):
        evoharness_agent.no_such_name  # noqa: B018


def test_package_folders_show_the_pipeline() -> None:
    """The folder tree is the way data travels: logs → encoding → learning → policy → agents."""
    names = {module.__name__ for module in MODULES}
    for core in ("schema", "rewards", "runtime", "logs.importers", "logs.recorder", "logs.scrubber", "logs.bundled",
                 "encoding.embedder", "encoding.state", "encoding.transitions", "learning.networks",
                 "learning.config", "learning.checkpoints", "learning.trainer", "learning.algorithms.base",
                 "learning.algorithms.bc", "learning.algorithms.cql", "learning.algorithms.iql",
                 "learning.algorithms.bcq", "policy", "agents.executor", "agents.guardrails", "agents.llm_calls",
                 "envs.base", "envs.bfcl", "envs.tau_airline", "envs.registry", "evaluation.offline",
                 "evaluation.online", "evaluation.choosers", "evaluation.baselines", "evaluation.reports",
                 "local_llm.weights", "local_llm.worker", "local_llm.prompting", "local_llm.chat_model", "cli", "demo"):
        assert f"evoharness_agent.{core}" in names
    assert "evoharness_agent.simulation" not in names  # a test kit, not part of the product


def test_light_imports_stay_light() -> None:
    """``import evoharness_agent`` and the recorder must not load torch (a fresh interpreter checks)."""
    import subprocess
    import sys

    code = ("import sys; import evoharness_agent; from evoharness_agent import EpisodeRecorder, Episode; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_module_all_entries_exist(module: ModuleType) -> None:
    assert module.__doc__ and module.__doc__.strip(), f"{module.__name__} has no module docstring"
    for name in getattr(module, "__all__", []):
        assert hasattr(module, name), f"{module.__name__}.__all__ lists missing {name!r}"


def _public_callables(module: ModuleType) -> Iterator[tuple[str, Callable[..., Any], bool]]:
    """Yield (qualified name, function, needs docstring) for the module's own public API."""
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            yield f"{module.__name__}.{name}", obj, True
        elif inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") and attr != "__init__":
                    continue
                if isinstance(member, property):
                    member = member.fget
                elif isinstance(member, functools.cached_property):
                    member = member.func
                elif isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if inspect.isfunction(member) and member.__module__ == module.__name__:
                    # __init__ is documented by its class (ruff D107 is off).
                    yield f"{module.__name__}.{name}.{attr}", member, attr != "__init__"


def _public_classes(module: ModuleType) -> list[tuple[str, type]]:
    return [(name, obj) for name, obj in vars(module).items()
            if inspect.isclass(obj) and not name.startswith("_") and obj.__module__ == module.__name__]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_public_objects_are_documented_and_annotated(module: ModuleType) -> None:
    problems = []
    for name, cls in _public_classes(module):
        if not (cls.__doc__ or "").strip():
            problems.append(f"{module.__name__}.{name}: class without docstring")
    for qualname, function, needs_doc in _public_callables(module):
        if needs_doc and not (function.__doc__ or "").strip():
            problems.append(f"{qualname}: no docstring")
        signature = inspect.signature(function)
        for parameter in signature.parameters.values():
            if parameter.name in ("self", "cls"):
                continue
            if parameter.annotation is inspect.Parameter.empty:
                problems.append(f"{qualname}: parameter {parameter.name!r} has no annotation")
        if signature.return_annotation is inspect.Signature.empty:
            problems.append(f"{qualname}: no return annotation")
    assert not problems, "\n".join(problems)


def test_introspection_sees_the_api() -> None:
    """Guard the checker itself: it must actually visit the functions it is meant to check."""
    seen = {qualname for module in MODULES for qualname, _, _ in _public_callables(module)}
    for expected in ("encoding.transitions.build_dataset", "policy.ToolPolicy.rank", "policy.ToolPolicy.load",
                     "encoding.embedder.StateEncoder.embed", "encoding.embedder.StateEncoder.dim",
                     "encoding.embedder.StateEncoder.cache_identity",
                     "learning.trainer.train_on_episodes", "learning.algorithms.cql.cql_penalty",
                     "learning.networks.ToolScorer.forward", "encoding.state.state_rows"):
        expected = f"evoharness_agent.{expected}"
        assert expected in seen
