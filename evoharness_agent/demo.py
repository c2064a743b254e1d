"""``evoharness-agent demo``: learn from real logs, evaluate against baselines, then act as an agent.

Part 1 trains BC and CQL on BFCL base (scenarios ≢ 0 mod 5) and evaluates next-tool prediction
on the held-out fifth against baselines. Part 2 (:func:`run_agent_demo`) runs the shipped policy
(``evoharness_agent/trained/default``, ``--policy default``) in
:class:`~evoharness_agent.agents.executor.PolicyAgentExecutor` with the local LLM on the first
turn of a few held-out BFCL scenarios, printing every step, and judges each turn with BFCL's
own checker. Part 2 needs the ``local`` extra and ``bfcl-eval``; without them it prints why
and is skipped.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from rich.console import Console
from rich.markup import escape

from evoharness_agent.agents.executor import STOPPED_OUTPUT, PolicyAgentExecutor
from evoharness_agent.envs.base import ToolAction
from evoharness_agent.envs.bfcl import BFCL_INSTALL_HINT, BFCLEnvironment, bfcl_available
from evoharness_agent.evaluation.offline import evaluate_offline
from evoharness_agent.evaluation.reports import plot_report, print_report
from evoharness_agent.learning.checkpoints import shipped_policy_dir
from evoharness_agent.learning.config import TrainConfig
from evoharness_agent.learning.trainer import train_on_episodes
from evoharness_agent.local_llm.chat_model import LocalChatModel
from evoharness_agent.logs.bundled import bfcl_paths, read_native, split_bfcl
from evoharness_agent.logs.events import RANK_EVENT
from evoharness_agent.policy import ToolPolicy
from evoharness_agent.schema import FINISH, Episode

__all__ = ["AGENT_SCENARIOS", "SHIPPED_POLICY", "checked_tools", "run_agent_demo", "run_demo"]

SHIPPED_POLICY = shipped_policy_dir()
"""The policy shipped with the project (``scripts/train_default.py``: training splits only)."""

AGENT_SCENARIOS = ("multi_turn_base_115", "multi_turn_base_25", "multi_turn_base_135")
"""Held-out BFCL base scenarios (number ≡ 0 mod 5) whose first turn needs one or two gold calls."""

LOCAL_MODEL = "qwen2.5-coder-0.5b"
SHOWN_TOOLS = 4
# A first turn here needs at most two calls; the cap keeps a looping run to a few LLM calls.
MAX_AGENT_STEPS = 5
SHOWN_CHARS = 200


def run_demo(out: str | Path, *, steps: int = 1500, agent: bool = True, policy_dir: str | Path = SHIPPED_POLICY,
             console: Console | None = None) -> dict[str, Any]:
    """Train BC and CQL on BFCL base, evaluate on the held-out fifth, then run the shipped policy as an agent.

    Args:
        out: where the trained policies and plots go.
        steps: gradient steps per algorithm.
        agent: whether to run part 2 (:func:`run_agent_demo`).
        policy_dir: the policy part 2 runs.
        console: where to print.

    Returns:
        ``{"bc": offline report, "cql": offline report, "agent": [per-scenario results]}``
        (``"agent"`` only when part 2 ran).

    """
    console = console or Console()
    out = Path(out)
    episodes = read_native(bfcl_paths(["base"])[0])
    train_set, test_set = split_bfcl(episodes)
    console.rule("[bold]evoharness-agent demo: BFCL multi-turn (base)")
    console.print(f"{len(train_set)} training scenarios, {len(test_set)} held-out scenarios "
                  "(split by scenario number, never by step)")
    reports: dict[str, Any] = {}
    for algo in ("bc", "cql"):
        # The validation split's temperature alone: its 126 decisions would make "auto" cross-fit, six
        # trainings instead of one (5.5 minutes instead of 1 here) for the same held-out ECE (CQL 0.116
        # against 0.117; BC 0.181, under-confident, against 0.134).
        config = TrainConfig.model_validate({"algorithm": {"name": algo},
                                             "training": {"steps": steps, "calibration_folds": 0}})
        train_on_episodes(train_set, config, out / algo)
        policy = ToolPolicy.load(out / algo)
        report = evaluate_offline(policy, test_set, train_set)
        print_report(report, f"{algo} on held-out BFCL scenarios", console)
        plot_report(report, out / f"{algo}_offline.png", title=f"BFCL base, {algo}")
        reports[algo] = report.to_json()

    example = test_set[0]
    console.rule("[bold]one held-out scenario, step by step")
    console.print(f"[bold]task:[/] {example.task}")
    policy = ToolPolicy.load(out / "cql", encoder=policy.encoder)
    session = policy.session(example.task, example.tools)
    for step, available in zip(example.steps, example.availability(), strict=True):
        if step.is_decision:
            ranked = session.rank(available)
            top = ", ".join(f"{s.tool} {s.probability:.2f}" for s in ranked[:3])
            mark = "[green]✓[/]" if ranked[0].tool == step.action else "[red]✗[/]"
            console.print(f"  {mark} gold [bold]{step.action}[/]   policy: {top}")
        else:
            console.print(f"[bold]user:[/] {step.content}")
        session.observe(step)
    console.print(f"plots in {out}/*.png")
    if agent:
        results = run_agent_demo(policy_dir, {episode.id: episode for episode in test_set}, console=console)
        if results is not None:
            reports["agent"] = results
    return reports


class _RankingPrinter(BaseCallbackHandler):
    """Prints the policy's ranking of each step, from the executor's :data:`RANK_EVENT`."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Print the top of the ranking as soon as the policy has ranked the step."""
        if name != RANK_EVENT:
            return
        top = data["ranking"][:SHOWN_TOOLS]
        width = max(len(score["tool"]) for score in top)
        self.console.print(f"  [bold]step {data['iteration'] + 1}[/]  policy ranking (score, probability):")
        for score in top:
            self.console.print(f"      {escape(score['tool']):<{width}}  {score['score']:+6.2f}  "
                               f"{score['probability']:.2f}", highlight=False)


def checked_tools(env: BFCLEnvironment) -> list[BaseTool]:
    """Return the env's available tools, each call going through ``env.step`` so that BFCL's check sees it.

    An erroring call raises ``ToolException`` inside the tool, which the tool handles: the
    executor gets the env's own observation text, marked as an error (as the env logged it).
    """

    def wrap(name: str, tool: BaseTool) -> BaseTool:
        def call(**arguments: Any) -> str:
            env.step(ToolAction(name, arguments))
            step = env.steps[-1]
            if step.error:
                raise ToolException(step.observation)
            return step.observation

        assert tool.args_schema is not None  # the env's tools are StructuredTools built from a JSON schema
        return StructuredTool(name=name, description=tool.description, args_schema=tool.args_schema, func=call,
                              handle_tool_error=True)

    available = set(env.available_tools())
    return [wrap(name, tool) for name, tool in env.tools.items() if name in available]


def _shown(value: Any) -> str:
    """Return a value as one escaped line, cut to ``SHOWN_CHARS``."""
    text = " ".join(str(value).split())
    return escape(text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…")


def _run_scenario(env: BFCLEnvironment, llm: BaseChatModel, policy: ToolPolicy, console: Console) -> dict[str, Any]:
    """Run the executor on the env's first user turn, printing each step; return what happened."""
    observation, _ = env.reset()
    console.print(f"[bold]user:[/] {escape(observation.user_message)}")
    gold = ", ".join(f"{a.tool}({_shown(a.arguments)})" for a in env.gold_actions(0))
    console.print(f"  [dim]gold calls (BFCL): {gold}[/]")
    executor = PolicyAgentExecutor(llm=llm, tools=checked_tools(env), policy=policy, max_iterations=MAX_AGENT_STEPS)
    started = time.perf_counter()
    output = ""
    for chunk in executor.stream({"input": observation.user_message},
                                 {"callbacks": [_RankingPrinter(console)]}):
        for action in chunk.get("actions", []):
            who = action.decided_by
            if action.probability is not None:
                who += f", p={action.probability:.2f}"
            console.print(f"  → [bold]{escape(action.tool)}[/] (chosen by {who}), "
                          f"arguments: {_shown(action.tool_input)}")
        for step in chunk.get("steps", []):
            console.print(f"    observation: {_shown(step.observation)}")
        output = chunk.get("output", output)
    seconds = time.perf_counter() - started
    if output == STOPPED_OUTPUT:
        console.print(f"  stopped after {MAX_AGENT_STEPS} calls: {output}")
    else:
        console.print(f"  → [bold]{FINISH}[/], answer written by the LLM: {_shown(output)}")
    # FINISH closes the turn; the env then runs BFCL's multi-turn checker on it.
    env.step(ToolAction.finish(output))
    passed = bool(env.turn_results[0])
    check = env.turn_checks[0]
    verdict = "[green]✓ passed[/]" if passed else f"[red]✗ failed[/] ({escape(str(check.get('error_type')))})"
    calls = sum(1 for step in env.turn_steps(0) if step.kind == "tool_call")
    console.print(f"  BFCL turn check: {verdict}   {calls} tool call(s), {seconds:.1f} s")
    return {"scenario": env.episode.id, "passed": passed, "check": check.get("error_type"), "calls": calls,
            "seconds": round(seconds, 2), "output": output}


def run_agent_demo(policy_dir: str | Path = SHIPPED_POLICY, held_out: Mapping[str, Episode] | None = None, *,
                   scenarios: Sequence[str] = AGENT_SCENARIOS,
                   console: Console | None = None) -> list[dict[str, Any]] | None:
    """Run a policy in PolicyAgentExecutor with the local LLM on the first turn of held-out BFCL scenarios.

    Every step prints the policy's ranking (score and probability of the top tools), the chosen
    tool, the arguments the LLM filled and the observation; then the final answer and whether the
    turn passes BFCL's multi-turn check.

    Args:
        policy_dir: the trained policy to run.
        held_out: BFCL base episodes by id (default: the held-out split of the bundled data).
        scenarios: the episode ids to run.
        console: where to print.

    Returns:
        One dict per scenario (``scenario``, ``passed``, ``check``, ``calls``, ``seconds``,
        ``output``), or ``None`` when the local model or bfcl-eval is not installed.

    """
    console = console or Console()
    console.rule("[bold]the shipped policy as an agent, on held-out BFCL scenarios")
    if not bfcl_available():
        console.print(f"[yellow]skipped:[/] BFCL's API classes are not installed ({BFCL_INSTALL_HINT})")
        return None
    try:
        llm = LocalChatModel.from_pretrained(LOCAL_MODEL).load()
    except ImportError as error:
        console.print(f"[yellow]skipped:[/] the local LLM is not installed: {escape(str(error))}")
        return None
    try:
        policy = ToolPolicy.load(policy_dir)
        console.print(f"PolicyAgentExecutor: policy {policy_dir} ({policy.meta['algorithm']}) picks each tool, "
                      f"the local LLM ({LOCAL_MODEL}, CPU) fills its arguments and writes the answer")
        if held_out is None:
            held_out = {episode.id: episode for episode in split_bfcl(read_native(bfcl_paths(["base"])[0]))[1]}
        results = []
        for scenario in scenarios:
            console.print(f"\n[bold]{scenario}[/] (first turn)")
            results.append(_run_scenario(BFCLEnvironment(held_out[scenario]), llm, policy, console))
    finally:
        llm.close()
    passed = sum(result["passed"] for result in results)
    console.print(f"\n{passed}/{len(results)} first turns pass BFCL's check")
    return results
