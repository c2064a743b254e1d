"""Training batches score each state's own candidates: the same updates as scoring every tool."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.encoding.transitions import build_dataset
from evoharness_agent.learning.algorithms import ALGORITHMS, Algorithm, Dims, ToolInputs, make_algorithm
from evoharness_agent.learning.algorithms.base import score_decisions
from evoharness_agent.learning.calibration import fit_calibration
from evoharness_agent.learning.networks import DENSE_TABLE_FACTOR, NetworkConfig, masked_scores
from evoharness_agent.learning.trainer import next_tool_accuracy
from evoharness_agent.schema import FINISH, Episode, Step, ToolSpec

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



@pytest.mark.parametrize("name", ["bc", "cql", "iql"])
def test_validation_scores_each_decision_over_its_candidates_like_the_whole_table(name: str,
                                                                                  encoder: StateEncoder) -> None:
    data = build_dataset([episode(i) for i in range(10)], encoder, history_window=2)
    dims = Dims(data.state_dim, int(data.tools.embeddings.shape[1]), len(data.tools.specs))
    algorithm = make_algorithm(name, {}, dims, NetworkConfig(hidden=8, dropout=0.0),
                               ToolInputs(data.tools.embeddings, torch.arange(len(data.tools.specs))))
    for _ in range(5):  # away from the initial scores, so the figures are not trivially equal
        algorithm.update(data.sample(16, torch.Generator().manual_seed(1)))
    algorithm.set_training(False)
    index = torch.arange(len(data))
    finish = data.tools.index[FINISH]
    decided = score_decisions(algorithm, data, index, chunk_size=7)  # chunks of other widths
    dense = data.batch(index)
    whole = masked_scores(algorithm.scores(dense.states, dense.pairs), dense.masks)
    compact = data.batch(index, candidates_only=True)
    assert compact.candidates is not None
    rows = torch.arange(len(index))
    # Every available tool gets the score it gets in the whole table, and the logged action is found.
    width = compact.candidates.shape[1]
    expected = whole.gather(1, compact.candidates)[compact.masks]
    torch.testing.assert_close(decided.scores[:, :width][compact.masks], expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(compact.candidates[rows, decided.actions], dense.actions)
    assert torch.equal(decided.is_finish[rows, decided.actions], dense.actions == finish)
    assert decided.is_finish.sum(1).eq(1).all()  # exactly one FINISH column per decision, padding excluded
    assert not decided.masks[:, width:].any()
    # The trainer's validation figures match the same figures computed on the whole table.
    figures = next_tool_accuracy(algorithm, data, index)
    is_tool = dense.actions != finish
    others = whole.scatter(1, dense.actions[:, None], -float("inf"))
    others[:, finish] = -float("inf")
    top1 = (whole.gather(1, dense.actions[:, None]).squeeze(1) > others.max(1).values)[is_tool].float().mean()
    assert figures["val/top1"] == pytest.approx(float(top1))
    assert figures["val/finish_acc"] == pytest.approx(float(((whole.argmax(1) == finish) == ~is_tool).float().mean()))
    assert 0.0 < fit_calibration(algorithm, data, index)["temperature"]


def _recording_compile(monkeypatch: pytest.MonkeyPatch, backend: str | None = None) -> list[torch.fx.GraphModule]:
    """Make ``torch.compile`` record the graphs it captures; with no ``backend``, run them as captured."""
    graphs: list[torch.fx.GraphModule] = []
    compile_ = torch.compile

    def capture(graph: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> object:
        graphs.append(graph)
        return graph.forward if backend is None else torch._dynamo.lookup_backend(backend)(graph, example_inputs)

    torch._dynamo.reset()  # each test captures its own graphs
    monkeypatch.setattr(torch, "compile", lambda module: compile_(module, backend=capture))
    return graphs


def _compiled_against_eager(name: str, encoder: StateEncoder, steps: int) -> tuple[dict, dict, Algorithm, Algorithm]:
    """Train one algorithm eager and a copy compiled on the same batches; return their last logs and both."""
    data = build_dataset([episode(i) for i in range(10)], encoder, history_window=2)
    dims = Dims(data.state_dim, int(data.tools.embeddings.shape[1]), len(data.tools.specs))
    torch.manual_seed(0)
    eager = make_algorithm(name, {}, dims, NetworkConfig(hidden=8, dropout=0.0),
                           ToolInputs(data.tools.embeddings, torch.arange(len(data.tools.specs))))
    compiled = copy.deepcopy(eager)
    compiled.compile_training()
    generator = torch.Generator().manual_seed(2)
    for _ in range(steps):
        batch = data.sample(16, generator)
        logs_eager, logs_compiled = eager.update(batch), compiled.update(batch)
    return logs_eager, logs_compiled, eager, compiled


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_compiled_training_passes_update_as_eager_ones(name: str, encoder: StateEncoder,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # Dynamo's capture, run as captured: the wiring in seconds (inductor's code: the slow test below).
    graphs = _recording_compile(monkeypatch)
    logs_eager, logs_compiled, eager, compiled = _compiled_against_eager(name, encoder, steps=3)
    assert graphs, "no pass went through the compiled scorers"
    for key, value in logs_eager.items():
        assert float(logs_compiled[key]) == pytest.approx(float(value), rel=1e-5, abs=1e-6), key
    # The wrappers share the modules' parameters: checkpoints and policies see plain modules.
    assert compiled.state_dict().keys() == eager.state_dict().keys()
    for key, module in eager.modules.items():
        for a, b in zip(module.parameters(), compiled.modules[key].parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # Acting stays eager: scoring captures nothing more.
    captured = len(graphs)
    compiled.set_training(False)
    batch = build_dataset([episode(1)], encoder, history_window=2).batch(torch.arange(2), candidates_only=True)
    compiled.scores(batch.states, batch.pairs, batch.candidates)
    assert len(graphs) == captured


@pytest.mark.parametrize("name", ["bcq", "cql", "iql"])
def test_training_does_not_depend_on_polyak_bumping_version_counters(name: str, encoder: StateEncoder,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # On CUDA Polyak's _foreach_lerp_ is one kernel that bumps no version counter (on CPU it runs
    # as per-weight lerp_ calls, which do); writing through .data does the same here. A target
    # copy that cached its tool side on those counters trained on its first step's tool side.
    few = [Episode(id=f"f{i}", task=f"Request number {i}", tools=TOOLS[:3], reward=float(i % 2),
                   steps=[*(Step(tool=TOOLS[(i + k) % 3].name, observation=f"result {k}") for k in range(2)),
                          Step(kind="assistant", content="done")]) for i in range(8)]
    data = build_dataset(few, encoder, history_window=2)  # 4 tools, all candidates: the whole table scored
    dims = Dims(data.state_dim, int(data.tools.embeddings.shape[1]), len(data.tools.specs))
    torch.manual_seed(0)
    bumping = make_algorithm(name, {}, dims, NetworkConfig(hidden=8, dropout=0.0),
                             ToolInputs(data.tools.embeddings, torch.arange(len(data.tools.specs))))
    silent = copy.deepcopy(bumping)
    module = importlib.import_module(f"evoharness_agent.learning.algorithms.{name}")
    real_polyak = module.polyak

    @torch.no_grad()
    def polyak_without_versions(target: torch.nn.Module, source: torch.nn.Module, tau: float) -> None:
        for weight, moved in zip(target.parameters(), source.parameters(), strict=True):
            weight.data.lerp_(moved.data, tau)

    generator = torch.Generator().manual_seed(2)
    for _ in range(5):
        batch = data.sample(16, generator)
        monkeypatch.setattr(module, "polyak", real_polyak)
        logs_bumping = bumping.update(batch)
        monkeypatch.setattr(module, "polyak", polyak_without_versions)
        logs_silent = silent.update(batch)
        for key, value in logs_bumping.items():
            assert float(logs_silent[key]) == pytest.approx(float(value), rel=1e-6, abs=1e-7), key


@pytest.mark.slow
def test_inductor_compiled_cql_trains_like_eager(encoder: StateEncoder, monkeypatch: pytest.MonkeyPatch) -> None:
    graphs = _recording_compile(monkeypatch, backend="inductor")
    logs_eager, logs_compiled, _, _ = _compiled_against_eager("cql", encoder, steps=5)
    assert graphs
    for key, value in logs_eager.items():  # fused kernels sum in another order
        assert float(logs_compiled[key]) == pytest.approx(float(value), rel=1e-3, abs=1e-4), key


def test_training_passes_see_tools_by_their_variant_texts_and_acting_by_their_full_text(
        encoder: StateEncoder) -> None:
    data = build_dataset([episode(i) for i in range(10)], encoder, history_window=2)
    n, width = data.tools.embeddings.shape
    dims = Dims(data.state_dim, width, n)
    noise = torch.randn(3, n, width, generator=torch.Generator().manual_seed(0))
    variants = torch.nn.functional.normalize(noise, dim=-1)
    plain = ToolInputs(data.tools.embeddings, torch.arange(n))
    assert plain.shown_in_training() is plain.embeddings  # no variants: the table as it is
    every = ToolInputs(data.tools.embeddings, torch.arange(n), variants=variants, variant_share=1.0)
    shown = every.shown_in_training()
    torch.testing.assert_close(shown[0], data.tools.embeddings[0])  # FINISH is always itself
    for row in range(1, n):  # every real tool by one of its own variants
        assert any(torch.equal(shown[row], variants[k, row]) for k in range(3))
    torch.manual_seed(0)
    algorithm = make_algorithm("cql", {}, dims, NetworkConfig(hidden=8, dropout=0.0), every)
    twin = make_algorithm("cql", {}, dims, NetworkConfig(hidden=8, dropout=0.0), plain)
    twin.load_state_dict(algorithm.state_dict())
    batch = data.batch(torch.arange(len(data)))

    def scores(of: Algorithm) -> torch.Tensor:
        return of.score("q", batch.states, batch.pairs)

    assert not torch.allclose(scores(algorithm), scores(twin))
    algorithm.set_training(False)
    twin.set_training(False)  # acting, validation and calibration: the full texts only
    torch.testing.assert_close(scores(algorithm), scores(twin))
