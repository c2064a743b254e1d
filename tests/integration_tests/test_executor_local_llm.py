"""PolicyAgentExecutor with the shipped policy and the real local LLM, on a held-out BFCL turn.

No test double: trained/default picks the tools, Qwen2.5-Coder-0.5B (llama.cpp on CPU) fills
their arguments and writes the answer, BFCL's own API classes run the calls. Only structure
is asserted (who chose what, argument validity, shapes), not the model's wording. Skipped
without the ``local`` extra or bfcl-eval; about 20 s on 2 cores.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest

pytest.importorskip("xllamacpp")

from langchain_core.agents import AgentAction  # noqa: E402
from langchain_core.callbacks import BaseCallbackHandler  # noqa: E402
from langchain_core.tools import BaseTool  # noqa: E402

from evoharness_agent.agents.executor import PolicyAgentAction, PolicyAgentExecutor  # noqa: E402
from evoharness_agent.demo import SHIPPED_POLICY  # noqa: E402
from evoharness_agent.encoding.embedder import StateEncoder  # noqa: E402
from evoharness_agent.envs.bfcl import BFCL_INSTALL_HINT, BFCLEnvironment, bfcl_available  # noqa: E402
from evoharness_agent.local_llm import MODELS, LocalChatModel  # noqa: E402
from evoharness_agent.logs.bundled import bfcl_paths, bfcl_scenario_number, read_native  # noqa: E402
from evoharness_agent.logs.events import RANK_EVENT  # noqa: E402
from evoharness_agent.policy import ToolPolicy  # noqa: E402
from evoharness_agent.schema import FINISH  # noqa: E402

MODEL = "qwen2.5-coder-0.5b"
SCENARIO = "multi_turn_base_115"  # held out (115 ≡ 0 mod 5); its first turn needs one call
MAX_ITERATIONS = 4
_MISSING_CHUNKS = [m for m in MODELS[MODEL].chunk_modules if importlib.util.find_spec(m) is None]
_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list, "object": dict}

pytestmark = [
    pytest.mark.skipif(bool(_MISSING_CHUNKS), reason=f"the local model's weights are missing: {_MISSING_CHUNKS}"),
    pytest.mark.skipif(not bfcl_available(), reason=f"bfcl_eval is not installed ({BFCL_INSTALL_HINT})"),
]


class Rankings(BaseCallbackHandler):
    """Keeps the executor's RANK_EVENT payloads."""

    def __init__(self) -> None:
        self.rankings: list[list[dict[str, Any]]] = []

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kwargs: Any) -> None:
        if name == RANK_EVENT:
            self.rankings.append(data["ranking"])


@pytest.fixture(scope="module")
def llm() -> Iterator[LocalChatModel]:
    model = LocalChatModel.from_pretrained(MODEL).load()
    yield model
    model.close()


def schema_problems(tool: BaseTool, arguments: dict[str, Any]) -> list[str]:
    """Return why ``arguments`` do not fit the tool's (flat JSON) schema; empty when they do."""
    schema = tool.args_schema
    assert isinstance(schema, dict), "BFCL tools carry their JSON schema"
    properties = schema.get("properties", {})
    problems = [f"unknown argument {name!r}" for name in arguments if name not in properties]
    problems += [f"missing {name!r}" for name in schema.get("required", []) if name not in arguments]
    for name, value in arguments.items():
        expected = _JSON_TYPES.get(properties.get(name, {}).get("type"))
        if expected is not None and (not isinstance(value, expected) or (expected is int and isinstance(value, bool))):
            problems.append(f"{name!r} is not a {properties[name]['type']}")
    return problems


def test_shipped_policy_drives_the_local_llm_on_a_bfcl_turn(llm: LocalChatModel,
                                                            default_encoder: StateEncoder) -> None:
    episode = next(e for e in read_native(bfcl_paths(["base"])[0]) if e.id == SCENARIO)
    assert bfcl_scenario_number(episode) % 5 == 0, "a scenario the shipped policy never trained on"
    env = BFCLEnvironment(episode)
    observation, _ = env.reset()
    tools = [env.tools[name] for name in observation.available_tools]
    policy = ToolPolicy.load(SHIPPED_POLICY, encoder=default_encoder, device="cpu")
    expected_first = policy.rank(observation.user_message, [], tools)[0]
    assert expected_first.tool != FINISH, "the scenario's premise: the policy acts before answering"

    rankings = Rankings()
    executor = PolicyAgentExecutor(llm=llm, tools=tools, policy=policy, return_intermediate_steps=True,
                                   max_iterations=MAX_ITERATIONS)
    result = executor.invoke({"input": observation.user_message}, {"callbacks": [rankings]})

    steps = result["intermediate_steps"]
    assert 1 <= len(steps) <= MAX_ITERATIONS
    for action, observed in steps:
        assert isinstance(action, AgentAction) and isinstance(observed, str)
    # The policy, not the LLM, chose the first tool: the one it ranks first with no history.
    first, first_observation = steps[0]
    assert isinstance(first, PolicyAgentAction) and first.decided_by == "policy"
    assert first.tool == expected_first.tool == rankings.rankings[0][0]["tool"]
    assert first.probability == pytest.approx(expected_first.probability, abs=1e-5)
    # The LLM filled arguments that fit the tool's schema, or the run says they did not.
    problems = schema_problems(executor.lookup_tool(first.tool), first.tool_input)
    assert not problems or first_observation.startswith(("Invalid arguments", "Error")), (problems, first_observation)
    # One ranking per decision: each call, then FINISH unless the iteration cap stopped the run.
    if len(steps) < MAX_ITERATIONS:
        assert len(rankings.rankings) == len(steps) + 1 and rankings.rankings[-1][0]["tool"] == FINISH
    assert isinstance(result["output"], str) and result["output"].strip()
