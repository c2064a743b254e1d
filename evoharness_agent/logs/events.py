"""The custom callback events an agent run emits and :class:`~evoharness_agent.logs.recorder.EpisodeRecorder` reads.

The executor announces its tools at the start of a run (:data:`RUN_EVENT`), each step whose
tool did not run (:data:`STEP_EVENT`) and the policy's ranking of each step (:data:`RANK_EVENT`);
the recorder turns them into episode steps.
"""

__all__ = ["RANK_EVENT", "RUN_EVENT", "STEP_EVENT"]

RUN_EVENT = "evoharness_agent.run"
"""Custom callback event at the start of a run: ``{"tools": [ToolSpec dicts], "mode": ...}``."""

STEP_EVENT = "evoharness_agent.step"
"""Custom callback event for a step whose tool did not run (refused, invalid arguments)."""

RANK_EVENT = "evoharness_agent.rank"
"""Custom callback event each time the policy ranks a step, before the decision is acted on:
``{"iteration": tool calls so far, "ranking": [{"tool", "score", "probability"}, ...] best first}``
(every available tool and FINISH; not fired in ``llm`` mode)."""
