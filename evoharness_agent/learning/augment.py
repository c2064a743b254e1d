"""Training-data augmentation that teaches tools by their text, not their identity.

* :func:`thin_answer_only` keeps only a share of the episodes whose every decision is FINISH
  (MetaTool's "no tool fits" splits): thousands of them teach "answer at once" to every state.
* :func:`compose_requests` joins two one-call episodes of a domain into one two-part request:
  thousands of one-call logs (MetaTool, BFCL single-turn) otherwise teach "answer after the
  first call" whatever the request still asks for.

A policy trained on one tool list learns shortcuts: "in this domain, after X comes Y", or
"the answer is among these five names". :func:`with_distractors` adds tools drawn from the
other episodes (other domains, when the logs mix them) to every episode's tool list, available
from the start: the logged action stays the same, so the policy must tell it apart from
unrelated tools by what their descriptions say, as it will have to on a new user's tools.
:func:`tool_text_variants` gives the other texts a tool could be written as: training shows a
share of the tools by one of them at each pass (``data.text_variant_share``), so that the scorer
knows a tool by what its text says, not by one exact embedding.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from evoharness_agent.schema import FINISH, Episode, ToolSpec

__all__ = ["compose_requests", "thin_answer_only", "tool_text_variants", "with_distractors"]

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


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


def _one_call(episode: Episode) -> bool:
    """Whether ``episode`` is one request answered after exactly one successful tool call."""
    kinds = [step.kind for step in episode.steps]
    return (kinds == ["tool_call", "assistant"] and not episode.steps[0].error
            and episode.available_at_start is None and (episode.reward is None or episode.reward > 0))


def compose_requests(episodes: Sequence[Episode], share: float, *, seed: int = 0) -> list[Episode]:
    """Return ``episodes`` plus two-part requests made from pairs of their one-call episodes.

    Each composed episode asks both requests of two one-call episodes of one domain (episode
    metadata ``domain``) that called different tools, offers both tool lists, calls both tools
    in order and then answers: after the first call FINISH is wrong, because the request still
    asks for the second part. ``share`` of the one-call episodes (each used once) are paired.
    Metadata ``parts`` names the two, so that a split by task keeps them with the composed request.
    """
    if share <= 0.0:
        return list(episodes)
    rng = random.Random(f"compose:{seed}")
    by_domain: dict[str, list[Episode]] = {}
    for episode in episodes:
        if _one_call(episode):
            by_domain.setdefault(str(episode.metadata.get("domain", "")), []).append(episode)
    composed = []
    for domain, pool in sorted(by_domain.items()):
        pool = rng.sample(pool, int(len(pool) * share) // 2 * 2)
        for first, second in zip(pool[::2], pool[1::2], strict=True):
            if first.steps[0].tool == second.steps[0].tool:
                continue
            tools = {tool.name: tool for tool in [*first.tools, *second.tools]}
            composed.append(Episode(
                id=f"{first.id}+{second.id}", task=f"{first.task.rstrip()} Then: {second.task.strip()}",
                tools=list(tools.values()), steps=[first.steps[0], second.steps[0], second.steps[1]],
                reward=second.reward if first.reward is None else first.reward,
                metadata={"domain": domain, "composed": True, "parts": [first.id, second.id]}))
    return [*episodes, *composed]


def tool_text_variants(tool: ToolSpec) -> list[str]:
    """Return three other texts of ``tool``: its name alone, its name and first sentence, its description alone.

    Users' tools come so: bare names (a log that kept no descriptions), one terse sentence, or a
    paragraph; the name may say little ("run", "query"). A tool without a description gives its
    name for each.
    """
    description = tool.description.strip()
    first_sentence = _SENTENCE_END.split(description, maxsplit=1)[0]
    return [ToolSpec(name=tool.name).text(), ToolSpec(name=tool.name, description=first_sentence).text(),
            description or tool.name]
