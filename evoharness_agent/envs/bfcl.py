"""BFCL multi-turn scenarios as executable environments, on bfcl-eval's own API classes.

:class:`BFCLEnvironment` turns one BFCL multi-turn :class:`~evoharness_agent.schema.Episode`
(as written by ``scripts/convert_shared_data.py``) into a :class:`~evoharness_agent.envs.base.ToolUseEnv`:

* the scenario's API classes (``GorillaFileSystem``, ``MathAPI``, ``MessageAPI``,
  ``TwitterAPI``, ``TicketAPI``, ``TradingBot``, ``TravelAPI``, ``VehicleControlAPI``) are
  instantiated from the PyPI package ``bfcl-eval`` and loaded with the scenario's
  ``initial_config`` (``long_context=True`` for the long-context variant);
* each of the episode's tools is the matching public method, wrapped as a LangChain
  ``StructuredTool`` with the episode's JSON-schema parameters; tools become available per
  turn as in the episode (missing functions appear in later turns);
* the episode's ``tool_call`` steps are the gold calls. When a turn is FINISHed, the turn's
  gold calls are executed on a second set of instances and the turn succeeds by BFCL's
  rule (``multi_turn_checker``): both sets of instances have equal public state and every
  gold result appears among the results of all the agent's calls so far. A turn without
  gold calls (the agent should not or cannot act) succeeds only if the agent made no call,
  BFCL's ``multi_turn_irrelevance_checker`` rule, unless ``strict_empty_turns=False``.

bfcl-eval is an optional dependency; its API classes import without the LLM SDKs it
declares, so install it with ``pip install --no-deps bfcl-eval==2026.3.23``.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import inspect
import json
from collections.abc import Callable
from importlib import resources
from typing import Any

from langchain_core.tools import StructuredTool

from evoharness_agent.envs.base import (
    Observation,
    RewardFn,
    Task,
    ToolAction,
    ToolUseEnv,
)
from evoharness_agent.schema import FINISH, Episode, ToolSpec

__all__ = [
    "BFCL_INSTALL_HINT",
    "BFCLEnvironment",
    "bfcl_available",
    "bfcl_result_text",
    "bfcl_turn_success",
    "load_bfcl_instances",
    "replay_gold",
]

BFCL_INSTALL_HINT = "pip install --no-deps bfcl-eval==2026.3.23"

_MULTI_TURN = "bfcl_eval.eval_checker.multi_turn_eval"
# Default budget: a turn may take its gold calls plus this many decisions (long-context
# turns have up to 34 gold calls, other variants at most 7).
_SLACK_PER_TURN = 10


def bfcl_available() -> bool:
    """Whether the ``bfcl_eval`` package is installed."""
    return importlib.util.find_spec("bfcl_eval") is not None


def _backend_config() -> Any:
    """Import bfcl-eval's table of API classes, with an install hint if it is missing."""
    try:
        return importlib.import_module("bfcl_eval.constants.executable_backend_config")
    except ImportError as exc:
        raise ImportError(f"BFCL environments need bfcl-eval: {BFCL_INSTALL_HINT}") from exc


def load_bfcl_instances(
    involved_classes: list[str], initial_config: dict[str, Any], long_context: bool = False
) -> dict[str, Any]:
    """Instantiate the scenario's API classes and load their initial state, as BFCL does."""
    config = _backend_config()
    instances = {}
    for name in involved_classes:
        instance = getattr(importlib.import_module(config.CLASS_FILE_PATH_MAPPING[name]), name)()
        if name not in config.STATELESS_CLASSES:
            # Deep copy: the classes keep references into the config and mutate them.
            instance._load_scenario(copy.deepcopy(initial_config.get(name, {})),
                                    long_context=long_context)
        instances[name] = instance
    return instances


def _methods(instances: dict[str, Any]) -> dict[str, Callable[..., Any]]:
    """Map each public method name to its bound method (later classes win, as in BFCL)."""
    methods: dict[str, Callable[..., Any]] = {}
    for instance in instances.values():
        for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
            if not name.startswith("_"):
                methods[name] = method
    return methods


def _package_docs(involved_classes: list[str]) -> list[ToolSpec]:
    """Read the function docs bfcl-eval ships for these classes (JSON lines per class)."""
    mapping = _backend_config().MULTI_TURN_FUNC_DOC_FILE_MAPPING
    folder = resources.files("bfcl_eval") / "data" / "multi_turn_func_doc"
    specs = []
    for name in involved_classes:
        for line in (folder / mapping[name]).read_text("utf-8").splitlines():
            if line.strip():
                doc = json.loads(line)
                specs.append(ToolSpec(name=doc["name"], description=doc.get("description", ""),
                                      parameters=doc.get("parameters")))
    return specs


def bfcl_result_text(value: Any) -> str:
    """Render a BFCL method's return value exactly as BFCL's executor does."""
    # multi_turn_utils.execute_multi_turn_func_call: str as is, dict as JSON, else str().
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        try:
            return json.dumps(value)
        except (TypeError, ValueError):  # objects inside the dict: BFCL falls back to str()
            return str(value)
    return str(value)


class BFCLEnvironment(ToolUseEnv):
    """One BFCL multi-turn scenario as a :class:`~evoharness_agent.envs.base.ToolUseEnv`."""

    def __init__(
        self,
        episode: Episode,
        *,
        max_steps: int | None = None,
        reward_fn: RewardFn | None = None,
        long_context: bool | None = None,
        strict_empty_turns: bool = True,
    ) -> None:
        """Build the env for ``episode``; ``max_steps`` defaults to the gold calls + 10 per turn."""
        # max_steps=1 is a placeholder: _load sets the budget, which depends on the episode.
        super().__init__([], success_fn=bfcl_turn_success, reward_fn=reward_fn, max_steps=1)
        self.strict_empty_turns = strict_empty_turns
        self._long_context = long_context
        self._steps_override = max_steps
        self.model_instances: dict[str, Any] = {}
        self.gold_instances: dict[str, Any] = {}
        # BFCL's verdict for each FINISHed turn: ``valid``, and if not, why (for debugging).
        self.turn_checks: list[dict[str, Any]] = []
        self._load(episode)

    def _load(self, episode: Episode) -> None:
        """Parse the scenario: classes, initial state, tool docs and gold calls per turn."""
        meta = episode.metadata
        for key in ("involved_classes", "initial_config"):
            if key not in meta:
                raise ValueError(f"{episode.id}: a BFCL episode needs metadata[{key!r}]")
        self.episode = episode
        self.involved_classes: list[str] = list(meta["involved_classes"])
        self.initial_config: dict[str, Any] = meta["initial_config"]
        variant = f"{meta.get('variant', '')} {episode.id}"
        self.long_context = ("long_context" in variant if self._long_context is None
                             else self._long_context)
        self.specs = list(episode.tools) or _package_docs(self.involved_classes)
        self.gold: list[list[ToolAction]] = [[]]
        for step in episode.steps:
            if step.kind == "user":
                self.gold.append([])
            elif step.kind == "tool_call" and step.tool:
                self.gold[-1].append(ToolAction(step.tool, copy.deepcopy(step.arguments)))
        self.default_task = Task.from_episode(episode)
        self.max_steps = self._steps_override or sum(len(calls) + _SLACK_PER_TURN
                                                    for calls in self.gold)

    def reset(self, task: Task | Episode | str | None = None) -> tuple[Observation, dict[str, Any]]:
        """Restart the scenario (or switch to another BFCL ``Episode``) on fresh instances."""
        if isinstance(task, Episode):
            self._load(task)
        elif task is not None:
            raise TypeError("a BFCL environment is reset with a BFCL Episode (or nothing)")
        self.model_instances = load_bfcl_instances(self.involved_classes, self.initial_config,
                                                   self.long_context)
        self.gold_instances = load_bfcl_instances(self.involved_classes, self.initial_config,
                                                  self.long_context)
        self.turn_checks = []
        methods = _methods(self.model_instances)
        self.tools = {
            spec.name: StructuredTool(name=spec.name, description=spec.description,
                                      args_schema=spec.parameters, func=methods[spec.name])
            for spec in self.specs if spec.name in methods
        }
        return super().reset()

    def tool_specs(self) -> list[ToolSpec]:
        """Return the scenario's tool docs as given (not re-derived from the wrappers)."""
        return [spec.model_copy(deep=True) for spec in self.specs]

    def format_output(self, output: Any) -> str:
        """Render a return value as BFCL does, so results compare like BFCL's."""
        return bfcl_result_text(output)

    def format_exception(self, exc: Exception) -> str:
        """Render an exception as BFCL's executor does."""
        return f"Error during execution: {exc}"

    def gold_actions(self, turn: int | None = None) -> list[ToolAction]:
        """Return the gold calls of ``turn`` (default: the current turn), without FINISH."""
        turn = self.turn if turn is None else turn
        return [ToolAction(a.tool, copy.deepcopy(a.arguments)) for a in self.gold[turn]]

    def gold_action(self, tool: str) -> ToolAction:
        """Return ``tool`` with gold arguments: its next unused gold call in this turn, or none.

        The k-th call to ``tool`` in the current turn gets the arguments of the k-th gold
        call to ``tool`` in the turn. A tool with no such gold call is a wrong choice and
        gets empty arguments (it usually fails). This isolates tool choice from arguments.
        A call that failed does not use its gold arguments up: called again (after logging in,
        say) it gets them again, as an LLM filling the arguments would give them again.
        """
        if tool == FINISH:
            return ToolAction.finish()
        used = sum(1 for step in self.turn_steps() if step.tool == tool and not step.error)
        calls = [action for action in self.gold[self.turn] if action.tool == tool]
        if used < len(calls):
            return ToolAction(tool, copy.deepcopy(calls[used].arguments))
        return ToolAction(tool)

    def _run_gold_turn(self, turn: int) -> list[str]:
        """Execute ``turn``'s gold calls on the gold instances; return their results."""
        methods = _methods(self.gold_instances)
        results = []
        for action in self.gold[turn]:
            try:
                value = methods[action.tool](**copy.deepcopy(action.arguments))
            except Exception as exc:  # BFCL records failing gold calls as results too
                results.append(self.format_exception(exc))
            else:
                results.append(self.format_output(value))
        return results


def bfcl_turn_success(env: ToolUseEnv, turn: int) -> bool:
    """Judge a FINISHed turn of a :class:`BFCLEnvironment` by BFCL's multi-turn rule."""
    if not isinstance(env, BFCLEnvironment):
        raise TypeError("bfcl_turn_success needs a BFCLEnvironment")
    if turn != len(env.turn_checks):
        raise ValueError(f"turns are judged in order: expected turn {len(env.turn_checks)}")
    checker = importlib.import_module(f"{_MULTI_TURN}.multi_turn_checker")
    # The gold instances advance turn by turn, like BFCL's per-entry ground-truth instances.
    gold_results = env._run_gold_turn(turn)
    calls = [step for step in env.turn_steps(turn) if step.kind == "tool_call"]
    if not env.gold[turn]:
        valid = not calls or not env.strict_empty_turns
        check = {"valid": valid} if valid else {
            "valid": False, "error_type": "multi_turn:irrelevance_error",
            "error_message": f"Model called tools in turn {turn}, which has no gold calls."}
    elif not calls:
        check = {"valid": False, "error_type": "multi_turn:empty_turn_model_response",
                 "error_message": f"Model response list is empty for turn {turn}"}
    else:
        check = checker.state_checker(env.model_instances, env.gold_instances)
        if check["valid"]:
            # All calls of all turns so far: a result obtained in an earlier turn counts.
            results = [step.observation for step in env.steps if step.kind == "tool_call"]
            check = checker.response_checker(results, gold_results, turn)
    env.turn_checks.append(check)
    return bool(check["valid"])


def replay_gold(env: BFCLEnvironment) -> bool | None:
    """Reset ``env`` and play every turn's gold calls then FINISH; return episode success."""
    env.reset()
    for turn in range(len(env.gold)):
        for action in [*env.gold_actions(turn), ToolAction.finish()]:
            if env.truncated:  # a max_steps smaller than the gold needs
                return env.success
            env.step(action)
    return env.success
