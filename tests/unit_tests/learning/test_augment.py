"""Distractor augmentation: more tools to tell apart, the logged decisions unchanged."""

from __future__ import annotations

from evoharness_agent.encoding.state import decisions
from evoharness_agent.learning.augment import compose_requests, tool_text_variants, with_distractors
from evoharness_agent.schema import FINISH, Episode, Step, ToolSpec


def _episodes() -> list[Episode]:
    pool = [ToolSpec(name=f"tool_{i}", description=f"Does thing {i}.") for i in range(30)]
    first = Episode(id="a", task="Do thing 1", tools=pool[:3], available_at_start=["tool_0", "tool_1"],
                    steps=[Step(tool="tool_1", observation="done"), Step(kind="assistant", content="ok")])
    second = Episode(id="b", task="Do thing 5", tools=pool[3:], steps=[Step(tool="tool_5", observation="done")])
    return [first, second]


def test_distractors_are_new_available_tools_and_actions_stay() -> None:
    episodes = _episodes()
    augmented = with_distractors(episodes, 4, seed=3)
    assert with_distractors(episodes, 4, seed=3) == augmented  # reproducible
    assert with_distractors(episodes, 0) == episodes
    first = augmented[0]
    extra = [tool.name for tool in first.tools[3:]]
    assert len(extra) == 4 and not set(extra) & {"tool_0", "tool_1", "tool_2"}
    assert first.available_at_start == ["tool_0", "tool_1", *extra]
    for before, after in zip(episodes, augmented, strict=True):
        old, new = decisions(before, 2), decisions(after, 2)
        assert [d.action for d in old] == [d.action for d in new]
        assert all(o.available < n.available for o, n in zip(old, new, strict=True))
    assert episodes[0].tools == _episodes()[0].tools  # the input is not modified


def one_call(i: int, domain: str = "single", *, error: bool = False) -> Episode:
    """A request answered after one call of its own tool."""
    tool = ToolSpec(name=f"tool_{i}", description=f"Tool {i}.")
    return Episode(id=f"e{i}", task=f"Request {i}.", tools=[tool], reward=1.0, metadata={"domain": domain},
                   steps=[Step(tool=tool.name, observation="ok", error=error), Step(kind="assistant", content="done")])


def test_composed_requests_ask_both_parts_and_call_both_tools() -> None:
    logs = [one_call(i) for i in range(10)] + [one_call(10, error=True), one_call(11, "other")]
    composed = compose_requests(logs, 1.0, seed=3)
    assert composed[: len(logs)] == logs  # the logs themselves stay, in order
    new = composed[len(logs):]
    assert len(new) == 5  # 10 clean one-call episodes of "single" pair up; the failed one and "other" stay alone
    used = [part for episode in new for part in episode.id.split("+")]
    assert len(used) == len(set(used)) == 10
    for episode in new:
        first, second = (logs[int(part[1:])] for part in episode.id.split("+"))
        assert episode.task == f"{first.task} Then: {second.task}"
        assert episode.metadata["parts"] == [first.id, second.id]  # a split by task keeps them together
        assert [step.tool for step in episode.steps[:2]] == [first.steps[0].tool, second.steps[0].tool]
        assert {tool.name for tool in episode.tools} == {first.steps[0].tool, second.steps[0].tool}
        # after the first call the request still asks for the second: FINISH comes only at the end
        assert [point.action for point in decisions(episode, 2)] == [first.steps[0].tool, second.steps[0].tool, FINISH]
    assert compose_requests(logs, 0.0) == logs
    assert len(compose_requests(logs, 0.4, seed=3)) == len(logs) + 2


def test_tool_text_variants_are_the_name_the_first_sentence_and_the_description() -> None:
    tool = ToolSpec(name="get_weather", description="Get the current weather of a city. Returns degrees Celsius.")
    assert tool_text_variants(tool) == ["get_weather:", "get_weather: Get the current weather of a city.",
                                        "Get the current weather of a city. Returns degrees Celsius."]
    assert tool_text_variants(ToolSpec(name="run")) == ["run:", "run:", "run"]  # no description: the name
