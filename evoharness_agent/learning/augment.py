"""Training-data augmentation that teaches tools by their text, not their identity.

* :func:`thin_answer_only` keeps only a share of the episodes whose every decision is FINISH
  (MetaTool's "no tool fits" splits): thousands of them teach "answer at once" to every state.

A policy trained on one tool list learns shortcuts: "in this domain, after X comes Y", or
"the answer is among these five names". :func:`with_distractors` adds tools drawn from the
other episodes (other domains, when the logs mix them) to every episode's tool list, available
from the start: the logged action stays the same, so the policy must tell it apart from
unrelated tools by what their descriptions say, as it will have to on a new user's tools.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from evoharness_agent.schema import FINISH, Episode, ToolSpec

__all__ = ["thin_answer_only", "with_distractors"]


def with_distractors(episodes: Sequence[Episode], k: int, *, seed: int = 0,
                     pool: Sequence[ToolSpec] | None = None) -> list[Episode]:
    """Return copies of ``episodes`` whose tool lists gain ``k`` random tools of ``pool`` each.

    Args:
        episodes: the logs.
        k: distractors per episode (0 returns the episodes unchanged).
        seed: the draw is reproducible per (seed, episode position).
        pool: where distractors come from (default: every tool of ``episodes``, first
            description of each name).

    """
    if k <= 0:
        return list(episodes)
    if pool is None:
        unique: dict[str, ToolSpec] = {}
        for episode in episodes:
            for tool in episode.tools:
                unique.setdefault(tool.name, tool)
        pool = list(unique.values())
    pool = list(pool)
    out = []
    for position, episode in enumerate(episodes):
        own = {tool.name for tool in episode.tools} | {FINISH}
        rng = random.Random(f"{seed}:{position}")
        candidates = [tool for tool in rng.sample(pool, min(len(pool), k + len(own))) if tool.name not in own]
        extra = candidates[:k]
        available = None if episode.available_at_start is None else [
            *episode.available_at_start, *(tool.name for tool in extra)]
        out.append(episode.model_copy(update={"tools": [*episode.tools, *extra], "available_at_start": available}))
    return out


def thin_answer_only(episodes: Sequence[Episode], keep: float, *, seed: int = 0) -> list[Episode]:
    """Return ``episodes`` with only a seeded share ``keep`` of those that never call a tool."""
    if keep >= 1.0:
        return list(episodes)
    rng = random.Random(f"thin:{seed}")
    return [ep for ep in episodes if any(step.kind == "tool_call" for step in ep.steps) or rng.random() < keep]
