"""`PolicySession` takes the logs' dict form of a step, and refuses bad input without harm (issue 9)."""

from __future__ import annotations

import numpy as np
import pytest

from evoharness_agent.encoding import embedder
from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.policy import TOOL_TABLES_KEPT, ToolPolicy, ToolScore, call_is_due
from evoharness_agent.schema import FINISH, Step, ToolSpec

TOOLS = [ToolSpec(name="search_web", description="Search the web"),
         ToolSpec(name="calculator", description="Evaluate arithmetic")]
TASK = "What is 17 * 23?"


@pytest.fixture(scope="module")
def policy(default_encoder: StateEncoder) -> ToolPolicy:
    return ToolPolicy.load(encoder=default_encoder, device="cpu")


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


def test_a_session_embeds_each_request_with_its_clauses_and_ranks_on_one_tool_table(
        default_encoder: StateEncoder, monkeypatch: pytest.MonkeyPatch) -> None:
    policy = ToolPolicy.load(encoder=default_encoder, device="cpu")
    task = "Find the cheapest flight to Oslo, then book it and email me the receipt"
    session = policy.session(task, TOOLS)
    session.rank()
    tables = list(policy._tool_tables.values())
    encoded = default_encoder.n_encoded
    session.observe(Step(tool="search_web", arguments={"q": "flights Oslo"}, observation="SK 4411, 89 EUR"))
    session.observe(Step(kind="user", content="Actually make it Bergen, and add a hotel"))
    assert default_encoder.n_encoded > encoded + 2  # the reply, and the request with its clauses
    encoded = default_encoder.n_encoded
    ranked = session.rank()
    assert default_encoder.n_encoded == encoded  # rank embeds nothing new: observe did it
    assert list(policy._tool_tables.values()) == tables  # the same tensors: the scorer reuses its tool side
    fresh = ToolPolicy.load(encoder=default_encoder, device="cpu").rank(task, session.history, TOOLS)
    assert [r.tool for r in ranked] == [r.tool for r in fresh]
    np.testing.assert_allclose([r.score for r in ranked], [r.score for r in fresh], rtol=1e-5)
    # embed=False leaves a step to the next ranking (the server embeds many sessions' steps at once).
    later = Step(tool="search_web", arguments={"q": "hotels Bergen"}, observation="Hotel Norge, 120 EUR")
    session.observe(later, embed=False)
    assert default_encoder.n_encoded == encoded and session.history[-1] == later
    products = []
    monkeypatch.setattr(embedder, "late_interaction", lambda *codes: products.append(codes))
    session.rank()
    monkeypatch.undo()
    assert default_encoder.n_encoded == encoded + 1
    # After a call, the request's clauses are matched with the tools token by token: observe did it.
    assert not products
    for i in range(TOOL_TABLES_KEPT + 1):  # a bounded number of tool sets stays embedded
        policy.rank(task, [], [*TOOLS, ToolSpec(name=f"extra_{i}", description=f"Extra tool {i}")])
    assert len(policy._tool_tables) == TOOL_TABLES_KEPT


def test_a_call_is_due_only_after_a_call_that_worked_while_answering_is_unlikely() -> None:
    ranking = [ToolScore("convert", 2.0, 0.66), ToolScore("get_weather", 1.0, 0.27), ToolScore(FINISH, 0.0, 0.07)]
    assert call_is_due(ranking, "get_weather", 0.1)
    assert not call_is_due(ranking, "get_weather", 0.05)  # answering is likelier than the threshold
    assert not call_is_due(ranking, None, 0.1)  # nothing called yet, or the call failed
    assert not call_is_due(ranking, "get_weather", None)  # off
    assert not call_is_due(ranking, "convert", 0.1)  # the best tool is the one just called: a poll or retry
    finish_first = [ToolScore(FINISH, 2.0, 0.05), *ranking[:2]]
    assert not call_is_due(finish_first, "get_weather", 0.1)
    assert not call_is_due([], "get_weather", 0.1)


def test_a_call_is_due_too_while_the_best_tool_is_far_likelier_than_answering() -> None:
    # The weather example's ranking after get_weather: FINISH just above the threshold.
    ranking = [ToolScore("convert", 2.0, 0.70), ToolScore(FINISH, 1.0, 0.16), ToolScore("get_weather", 0.9, 0.14)]
    assert not call_is_due(ranking, "get_weather", 0.15)  # the threshold alone
    assert call_is_due(ranking, "get_weather", 0.15, ratio=2.5)  # 0.70 is over 2.5 x 0.16
    assert not call_is_due(ranking, "get_weather", 0.15, ratio=5.0)
    assert not call_is_due(ranking, "get_weather", None, ratio=2.5)  # off: the LLM may always answer
    assert not call_is_due(ranking, "convert", 0.15, ratio=2.5)  # a poll or a retry
    close = [ToolScore("convert", 2.0, 0.45), ToolScore(FINISH, 1.0, 0.25), ToolScore("get_weather", 0.9, 0.30)]
    assert not call_is_due(close, "get_weather", 0.15, ratio=2.5)  # answering is nearly as likely
