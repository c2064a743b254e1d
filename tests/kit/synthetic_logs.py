"""A tiny synthetic tool-use log set shared by the unit tests."""

from __future__ import annotations

from evoharness_agent.schema import Episode, Step, ToolSpec

TOOLS = [
    ToolSpec(name="search_web", description="Search the web for pages about a query."),
    ToolSpec(name="read_file", description="Read a text file from the local disk."),
    ToolSpec(name="calculator", description="Evaluate an arithmetic expression."),
]


def synthetic_episodes(n: int = 6) -> list[Episode]:
    """Small, varied episodes: search→calculator→reply, or read_file→reply (some failing)."""
    episodes = []
    for i in range(n):
        if i % 2 == 0:
            steps = [Step(tool="search_web", arguments={"query": f"population of city {i}"},
                          observation=f"city {i} has {1000 * i} people"),
                     Step(tool="calculator", arguments={"expression": f"{i} * 2"}, observation=str(2 * i)),
                     Step(kind="assistant", content=f"The answer is {2 * i}.")]
            task = f"How many people live in city {i}, doubled?"
        else:
            steps = [Step(tool="read_file", arguments={"path": f"/tmp/notes{i}.txt"}, observation=f"note {i}",
                          error=i == 3),
                     Step(kind="assistant", content=f"The note says note {i}.")]
            task = f"What is written in notes{i}.txt?"
        episodes.append(Episode(id=f"ep{i}", task=task, tools=list(TOOLS), steps=steps,
                                reward=0.0 if i == 3 else 1.0))
    return episodes
