"""Training batches score each state's own candidates: the same updates as scoring every tool."""

from __future__ import annotations

import copy

import pytest
import torch

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.encoding.transitions import build_dataset
from evoharness_agent.learning.algorithms import ALGORITHMS, Dims, ToolInputs, make_algorithm
from evoharness_agent.learning.networks import DENSE_TABLE_FACTOR, NetworkConfig
from evoharness_agent.schema import Episode, Step, ToolSpec

TOOLS = [ToolSpec(name=f"tool_{i}", description=f"Does thing number {i} for the user.") for i in range(30)]


def episode(i: int) -> Episode:
    """An episode that may call three of the thirty tools, in its own order."""
    own = [TOOLS[(3 * i + k) % 30] for k in range(3)]
    steps = [Step(tool=tool.name, arguments={"n": i}, observation=f"result {i}", error=(i + k) % 4 == 0)
             for k, tool in enumerate(own)]
    return Episode(id=f"e{i}", task=f"Request number {i}", tools=own, reward=float(i % 2),
                   steps=[*steps, Step(kind="assistant", content="done")])


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_candidate_batches_give_the_same_update_as_the_whole_tool_table(name: str, encoder: StateEncoder) -> None:
    data = build_dataset([episode(i) for i in range(10)], encoder, history_window=2)
    dims = Dims(data.state_dim, int(data.tools.embeddings.shape[1]), len(data.tools.specs))
    tools = ToolInputs(data.tools.embeddings, torch.arange(len(data.tools.specs)))
    torch.manual_seed(0)
    whole = make_algorithm(name, {}, dims, NetworkConfig(hidden=8, dropout=0.0), tools)
    own = copy.deepcopy(whole)
    index = torch.arange(len(data))
    dense, compact = data.batch(index), data.batch(index, candidates_only=True)
    assert compact.candidates is not None  # 4 candidates (with FINISH) of 31 tools: scored alone
    assert dense.masks.shape[1] > DENSE_TABLE_FACTOR * compact.candidates.shape[1]
    for _ in range(3):
        logs_whole, logs_own = whole.update(dense), own.update(compact)
        for key, value in logs_whole.items():
            assert float(logs_own[key]) == pytest.approx(float(value), rel=1e-4, abs=1e-5), key
    # Adam turns a gradient that is zero up to rounding (a feature shared by every candidate
    # shifts a softmax by a constant) into a step of up to lr either way: 3 steps apart, 2 * 3 * lr.
    for key, module in whole.modules.items():
        for a, b in zip(module.parameters(), own.modules[key].parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=0.0, atol=2 * 3 * 3e-4 + 1e-5)

