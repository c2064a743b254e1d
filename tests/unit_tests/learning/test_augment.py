"""Distractor augmentation: more tools to tell apart, the logged decisions unchanged."""

from __future__ import annotations

from evoharness_agent.encoding.state import decisions
from evoharness_agent.learning.augment import with_distractors
from evoharness_agent.schema import Episode, Step, ToolSpec


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
