"""THE state layout: what the policy sees at a decision, for training and for serving alike.

A state is a row of slots, each the embedding of one text, then a few numbers:

====================  ======================================================================
slot                  text
====================  ======================================================================
``request``           the latest user message (the task itself in the first turn)
``previous_tool``     name+description of the tool called last (zero vector before any call)
``task``              the episode's first message
``history[0..w-1]``   the last ``history_window`` steps, newest first (zero vector past the start)
features              calls since the request (scaled), whether the last call failed
====================  ======================================================================

plus, per candidate tool, the pair features ``[called in this turn, called earlier]``.

Training (:func:`evoharness_agent.encoding.transitions.build_dataset`) and serving
(:class:`evoharness_agent.policy.ToolPolicy`) both call :func:`state_parts`,
:func:`state_rows` and :func:`gather_states`; the networks find the request and previous-tool
slots through :data:`REQUEST_SLOT` and :data:`PREVIOUS_TOOL_SLOT`. Nothing else knows the order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from evoharness_agent.schema import FINISH, Episode, Step

__all__ = [
    "FIXED_SLOTS",
    "N_PAIR_FEATURES",
    "N_STATE_FEATURES",
    "PAD",
    "PREVIOUS_TOOL_SLOT",
    "REQUEST_SLOT",
    "Decision",
    "StateParts",
    "decisions",
    "gather_states",
    "n_slots",
    "state_dim",
    "state_parts",
    "state_rows",
    "step_text",
]

FIXED_SLOTS = ("request", "previous_tool", "task")
"""The slots before the history window, in order."""
REQUEST_SLOT = FIXED_SLOTS.index("request")
PREVIOUS_TOOL_SLOT = FIXED_SLOTS.index("previous_tool")
N_STATE_FEATURES = 2
"""Calls since the request (scaled) and whether the last call failed."""
N_PAIR_FEATURES = 2
"""Per tool: called in this turn, called earlier in the episode."""
PAD = 0
"""Row 0 of every text table is the zero vector: an empty slot."""

MAX_ARGUMENT_CHARS = 200
MAX_OBSERVATION_CHARS = 300
MAX_CONTENT_CHARS = 400


def _clip(text: str, limit: int) -> str:
    """Keep the head of a long text: tool outputs put the gist first."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def step_text(step: Step) -> str:
    """Return the text embedded for one step of an episode (a history slot)."""
    if step.kind == "user":
        return f"user: {_clip(step.content, MAX_CONTENT_CHARS)}"
    if step.kind == "assistant":
        return f"assistant replied: {_clip(step.content, MAX_CONTENT_CHARS)}"
    arguments = json.dumps(step.arguments, ensure_ascii=False, sort_keys=True, default=str)
    status = "error" if step.error else "ok"
    return (f"called {step.tool}({_clip(arguments, MAX_ARGUMENT_CHARS)}) -> {status}: "
            f"{_clip(step.observation, MAX_OBSERVATION_CHARS)}")


def n_slots(history_window: int) -> int:
    """Return the number of text slots of a state."""
    return len(FIXED_SLOTS) + history_window


def state_dim(embedding_dim: int, history_window: int) -> int:
    """Return the size of one gathered state vector."""
    return embedding_dim * n_slots(history_window) + N_STATE_FEATURES


@dataclass
class StateParts:
    """What the policy sees after a prefix of an episode, before it is embedded."""

    task: str
    """The episode's first message."""
    request: str
    """The latest user message (the task itself in the first turn)."""
    history: list[str]
    """Texts of the last ``history_window`` tool calls and replies, newest first."""
    features: list[float]
    """Calls since the request (scaled) and whether the last call failed."""
    previous_tool: str | None
    """The tool called last, if any."""
    called_in_turn: set[str]
    """Tools called since the latest user message."""
    called_before: set[str]
    """Tools called anywhere earlier in the episode."""

    def slot_texts(self, tool_text: Callable[[str], str]) -> list[str | None]:
        """Return the text of each slot in order (``None`` for an empty one), history unpadded.

        ``tool_text(name)`` gives a tool's name+description text for the previous-tool slot.
        """
        previous = tool_text(self.previous_tool) if self.previous_tool else None
        return [self.request, previous, self.task, *self.history]

    def pair_features(self, names: Sequence[str]) -> list[list[float]]:
        """Per-tool features ``[called in this turn, called earlier in the episode]``.

        Few real calls repeat a tool (in BFCL 5% repeat one from earlier in the episode),
        a fact no state vector can express per tool; these two numbers let the scorer learn it.
        """
        return [[float(n in self.called_in_turn), float(n in self.called_before)] for n in names]


@dataclass
class Decision(StateParts):
    """One decision point of a logged episode: the state, what was available, what was done."""

    available: set[str] = field(default_factory=set)
    action: str = FINISH


def state_parts(task: str, prefix: Sequence[Step], history_window: int) -> StateParts:
    """Return what the policy sees after the steps in ``prefix``."""
    request, calls_since_request, last_error, previous_tool = task, 0, 0.0, None
    history: list[str] = []
    in_turn: set[str] = set()
    before: set[str] = set()
    for step in prefix:
        if step.kind == "user":
            request, calls_since_request, in_turn = step.content, 0, set()
            continue
        history.append(step_text(step))
        if step.kind == "tool_call" and step.tool:
            calls_since_request += 1
            last_error = float(step.error)
            previous_tool = step.tool
            in_turn.add(step.tool)
            before.add(step.tool)
    features = [min(calls_since_request, 20) / 10.0, last_error]
    return StateParts(task, request, history[::-1][:history_window], features, previous_tool, in_turn, before)


def decisions(episode: Episode, history_window: int) -> list[Decision]:
    """Return the episode's decision points in order (tool calls and replies)."""
    out = []
    availability = episode.availability()
    for index, step in enumerate(episode.steps):
        if step.is_decision:
            parts = state_parts(episode.task, episode.steps[:index], history_window)
            # A logged call proves its tool was callable, whatever the tool lists said.
            available = availability[index] | {FINISH, step.action}
            out.append(Decision(**vars(parts), available=available, action=step.action))
    return out


def state_rows(parts: StateParts, tool_text: Callable[[str], str], row: Callable[[str], int],
               history_window: int) -> list[int]:
    """Return the text-table row of every slot: ``row(text)`` for a text, :data:`PAD` for an empty slot."""
    rows = [PAD if text is None else row(text) for text in parts.slot_texts(tool_text)]
    return rows + [PAD] * (n_slots(history_window) - len(rows))


def gather_states(table: torch.Tensor, rows: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """Turn ``(n, slots)`` rows of ``table`` (row 0 zeros) and ``(n, F)`` features into state vectors."""
    vectors = table.index_select(0, rows.reshape(-1))
    return torch.cat([vectors.reshape(rows.shape[0], -1), features], dim=1)
