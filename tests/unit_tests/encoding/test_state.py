"""The state layout exists once: training and serving build identical states for the same prefix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.encoding.state import (
    FIXED_SLOTS,
    N_STATE_FEATURES,
    PREVIOUS_TOOL_SLOT,
    REQUEST_SLOT,
    decisions,
    state_dim,
    state_parts,
)
from evoharness_agent.encoding.transitions import build_dataset
from evoharness_agent.learning.config import TrainConfig
from evoharness_agent.learning.trainer import train_on_episodes
from evoharness_agent.policy import ToolPolicy
from evoharness_agent.schema import Episode, Step, ToolSpec

TOOLS = [
    ToolSpec(name="search_flights", description="Find flights between two airports on a date."),
    ToolSpec(name="book_flight", description="Book a flight for a passenger."),
    ToolSpec(name="send_email", description="Send an e-mail to an address."),
]
WINDOW = 2  # shorter than the history below, so truncation is exercised too


def _episode() -> Episode:
    """Two turns, a failed call, a repeat, an answer: every slot and feature is non-trivial."""
    return Episode(id="layout", task="Book me a flight from SFO to JFK on Friday", tools=TOOLS, steps=[
        Step(tool="search_flights", arguments={"from": "SFO", "to": "JFK"}, observation="UA 12, DL 3"),
        Step(tool="book_flight", arguments={"flight": "UA 12"}, observation="no seats", error=True),
        Step(tool="book_flight", arguments={"flight": "DL 3"}, observation="booked: ABC123"),
        Step(kind="assistant", content="Booked DL 3, reference ABC123."),
        Step(kind="user", content="Now e-mail the confirmation to me@example.com"),
        Step(tool="send_email", arguments={"to": "me@example.com"}, observation="sent"),
        Step(kind="assistant", content="Sent."),
    ], reward=1.0)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, encoder: StateEncoder) -> tuple[ToolPolicy, Path]:
    """A policy trained (briefly) on the episode, with the layout's history window."""
    out = tmp_path_factory.mktemp("policy")
    config = TrainConfig.model_validate({"model": {"history_window": WINDOW}, "training": {"steps": 2},
                                         "logging": {"tensorboard": False}, "data": {"val_fraction": 0.0}})
    train_on_episodes([_episode()], config, out, encoder=encoder, show_progress=False)
    return ToolPolicy.load(out, encoder=encoder, device="cpu"), out


def test_training_and_serving_build_identical_states(trained: tuple[ToolPolicy, Path],
                                                     encoder: StateEncoder) -> None:
    policy, _ = trained
    episode = _episode()
    dataset = build_dataset([episode], encoder, history_window=WINDOW)
    prefixes = [i for i, step in enumerate(episode.steps) if step.is_decision]
    assert len(dataset) == len(prefixes)
    batch = dataset.batch(torch.arange(len(dataset)))
    vectors = encoder.embed([spec.text() for spec in TOOLS])
    served, served_pairs = policy._state_inputs([(episode.task, episode.steps[:i]) for i in prefixes], TOOLS, vectors)
    assert served.shape == batch.states.shape == (len(prefixes), state_dim(encoder.dim, WINDOW))
    torch.testing.assert_close(served, batch.states, rtol=0, atol=0)
    # Pair features are per tool: compare them by name, the two paths order tools differently.
    rows = [dataset.tools.index[spec.name] for spec in TOOLS]
    assert batch.pairs is not None
    torch.testing.assert_close(served_pairs, batch.pairs[:, rows, :], rtol=0, atol=1e-7)


def test_slots_hold_the_texts_the_layout_names(encoder: StateEncoder) -> None:
    episode = _episode()
    dim = encoder.dim
    point = decisions(episode, WINDOW)[4]  # send_email, after the second user message
    assert point.action == "send_email"
    dataset = build_dataset([episode], encoder, history_window=WINDOW)
    state = dataset.batch(torch.tensor([4])).states[0]

    def slot(index: int) -> torch.Tensor:
        return state[index * dim:(index + 1) * dim]

    expected = torch.from_numpy(encoder.embed([
        "Now e-mail the confirmation to me@example.com",  # the request is the latest user message
        TOOLS[1].text(),  # the tool called last: book_flight
        episode.task,
    ]))
    torch.testing.assert_close(slot(REQUEST_SLOT), expected[0])
    torch.testing.assert_close(slot(PREVIOUS_TOOL_SLOT), expected[1])
    torch.testing.assert_close(slot(FIXED_SLOTS.index("task")), expected[2])
    assert state[-N_STATE_FEATURES:].tolist() == point.features == [0.0, 0.0]  # a new turn: no calls yet
    first = state_parts(episode.task, [], WINDOW)
    assert first.request == episode.task and first.previous_tool is None and first.history == []
