"""`PolicySession` takes the logs' dict form of a step, and refuses bad input without harm (issue 9)."""

from __future__ import annotations

import numpy as np
import pytest

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.policy import ToolPolicy
from evoharness_agent.schema import FINISH, Step, ToolSpec

TOOLS = [ToolSpec(name="search_web", description="Search the web"),
         ToolSpec(name="calculator", description="Evaluate arithmetic")]
TASK = "What is 17 * 23?"


@pytest.fixture(scope="module")
def policy(encoder: StateEncoder) -> ToolPolicy:
    return ToolPolicy.load(encoder=encoder, device="cpu")


def test_observe_takes_the_documented_dict_form(policy: ToolPolicy) -> None:
    logged = {"tool": "calculator", "arguments": {"expression": "17 * 23"}, "observation": "391",
              "error": False}
    session = policy.session(TASK, TOOLS)
    session.observe(logged)
    session.observe({"kind": "user", "content": "Now halve it."})
    expected = [Step.model_validate(logged), Step(kind="user", content="Now halve it.")]
    assert session.history == expected
    ranked, full = session.rank(), policy.rank(TASK, expected, TOOLS)
    assert [r.tool for r in ranked] == [r.tool for r in full]
    np.testing.assert_allclose([r.score for r in ranked], [r.score for r in full], rtol=1e-5)


@pytest.mark.parametrize(("step", "error", "text"), [
    ({"kind": "tool_call", "observation": "391"}, ValueError, "needs a non-empty 'tool'"),
    ({"tool": "calculator", "arguments": "17 * 23"}, ValueError, "arguments: Input should be a valid dictionary"),
    ({"tool": "calculator", "reward": float("nan")}, ValueError, "reward: Input should be a finite number"),
    ({"kind": "thought"}, ValueError, "kind: Input should be"),
    ("calculator", TypeError, "takes a Step or its dict form, not str"),
])
def test_a_bad_step_is_refused_and_not_kept(policy: ToolPolicy, step: object, error: type[Exception],
                                            text: str) -> None:
    session = policy.session(TASK, TOOLS)
    session.observe(Step(tool="search_web", arguments={"q": "17*23"}, observation="391"))
    before = list(session.history)
    with pytest.raises(error) as info:
        session.observe(step)  # type: ignore[arg-type]
    assert text in str(info.value)
    assert session.history == before
    assert session.rank()[0].tool in {"search_web", "calculator", FINISH}


def test_available_names_must_be_tools_of_the_session(policy: ToolPolicy) -> None:
    session = policy.session(TASK, TOOLS)
    assert {r.tool for r in session.rank(available={"calculator"})} == {"calculator", FINISH}
    assert {r.tool for r in session.rank(available={"calculator", FINISH})} == {"calculator", FINISH}
    with pytest.raises(ValueError, match=r"names no tool of this session: \['calculater', 'serch'\]"):
        session.rank(available={"calculater", "serch", "calculator"})
    with pytest.raises(TypeError, match="not one string"):
        session.rank(available="calculator")
    session.tools.append(ToolSpec(name="convert_units"))  # a tool added to the run later
    assert "convert_units" in {r.tool for r in session.rank(available={"convert_units"})}
