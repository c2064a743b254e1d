from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from evoharness_agent.encoding.state import N_PAIR_FEATURES, PAIR_FEATURES
from evoharness_agent.encoding.transitions import Batch
from evoharness_agent.learning.algorithms import ALGORITHMS, BCQ, Dims, ToolInputs, make_algorithm
from evoharness_agent.learning.algorithms.base import greedy, polyak, td_target
from evoharness_agent.learning.algorithms.bc import bc_loss
from evoharness_agent.learning.algorithms.bcq import allowed_actions
from evoharness_agent.learning.algorithms.cql import cql_penalty, log_call_shares, prior_adjustment
from evoharness_agent.learning.algorithms.iql import advantage_weights, expectile_loss
from evoharness_agent.learning.networks import (
    DENSE_TABLE_FACTOR,
    PROVIDER_MARGIN,
    NetworkConfig,
    ToolScorer,
    answer_after_best_fit,
    answer_leaves_part,
    answer_skips_action,
    answer_skips_retry,
    answer_waits,
    below_providers,
    first_decision_similarity,
    masked_log_softmax,
    masked_scores,
    provider_after_failure,
    provider_before_asked,
    repeats_retry,
    tower_ranking_narrowed,
    waiting_for_prerequisite,
)

TOOL_DIM = 16
N_TOOLS = 5
MASKED = 4  # the tool no state ever offers, in the algorithm tests
STATE_DIM = TOOL_DIM * 3 + 2
NET = NetworkConfig(hidden=32, layers=1, dropout=0.0)


def unit_rows(n: int, dim: int, seed: int) -> torch.Tensor:
    rows = torch.randn(n, dim, generator=torch.Generator().manual_seed(seed))
    return rows / rows.norm(dim=1, keepdim=True)


def random_mask(batch: int, n: int, seed: int) -> torch.Tensor:
    mask = torch.rand(batch, n, generator=torch.Generator().manual_seed(seed)) < 0.5
    mask[torch.arange(batch), torch.arange(batch) % n] = True  # at least one tool per row
    return mask


# --------------------------------------------------------------------------- scorer


def test_scorer_shapes_and_masked_tools_never_win() -> None:
    torch.manual_seed(0)
    scorer = ToolScorer(STATE_DIM, TOOL_DIM, N_TOOLS, NET).eval()
    with torch.no_grad():
        scorer.bias.weight.copy_(torch.arange(N_TOOLS, dtype=torch.float32)[:, None] * 100.0)
    states, tools = torch.randn(64, STATE_DIM), unit_rows(N_TOOLS, TOOL_DIM, 1)
    scores = scorer(states, tools, torch.arange(N_TOOLS))
    assert scores.shape == (64, N_TOOLS)
    assert (scores.argmax(1) == N_TOOLS - 1).all()  # the huge bias dominates unmasked
    mask = random_mask(64, N_TOOLS, 2)
    best = masked_scores(scores, mask).argmax(1)
    assert mask[torch.arange(64), best].all()
    assert torch.equal(greedy(scores, mask), best)
    probabilities = masked_log_softmax(scores, mask).exp()
    assert (probabilities[~mask] == 0).all()
    torch.testing.assert_close(probabilities.sum(1), torch.ones(64))


def test_all_masked_rows_stay_finite() -> None:
    scores = torch.randn(3, N_TOOLS)
    mask = torch.ones(3, N_TOOLS, dtype=torch.bool)
    mask[1] = False
    log_probs = masked_log_softmax(scores, mask)
    assert torch.isfinite(log_probs).all()
    torch.testing.assert_close(log_probs[1].exp(), torch.full((N_TOOLS,), 1.0 / N_TOOLS))
    actions = torch.tensor([0, 2, 1])
    assert torch.isfinite(bc_loss(scores, actions, mask))
    assert torch.isfinite(cql_penalty(scores, scores.gather(1, actions[:, None]).squeeze(1), mask))
    # bf16 too (autocast on GPU): the finite fill keeps it NaN-free
    assert torch.isfinite(masked_log_softmax(scores.bfloat16(), mask)).all()


def test_unseen_tool_scores_without_bias() -> None:
    torch.manual_seed(0)
    scorer = ToolScorer(STATE_DIM, TOOL_DIM, 2, NET).eval()
    with torch.no_grad():
        scorer.bias.weight.copy_(torch.tensor([[3.0], [-6.0]]))
    states = torch.randn(4, STATE_DIM)
    tool = unit_rows(1, TOOL_DIM, 3)
    same_tool_thrice = tool.expand(3, TOOL_DIM)
    scores = scorer(states, same_tool_thrice, torch.tensor([0, 1, -1]))
    assert torch.isfinite(scores).all()
    # the same text scored as known tool 0, known tool 1 and an unseen tool differs only by
    # the learned per-tool offsets (whatever their gain): constant over states, in ratio 3 : -6
    up, down = scores[:, 0] - scores[:, 2], scores[:, 1] - scores[:, 2]
    assert (up > 0).all() and (down < 0).all()
    torch.testing.assert_close(up, up[:1].expand(4))
    torch.testing.assert_close(down, -2 * up)
    # no ids at all: no bias either
    torch.testing.assert_close(scorer(states, tool, None)[:, 0], scores[:, 2])
    no_bias = ToolScorer(STATE_DIM, TOOL_DIM, 2, NetworkConfig(hidden=32, layers=1, dropout=0.0, tool_bias=False))
    assert no_bias.bias is None
    assert no_bias(states, same_tool_thrice, torch.tensor([0, 1, -1])).shape == (4, 3)


def test_untrained_scorer_ranks_by_request_similarity() -> None:
    torch.manual_seed(0)
    scorer = ToolScorer(STATE_DIM, TOOL_DIM, N_TOOLS, NetworkConfig(hidden=32, layers=1, dropout=0.0)).eval()
    tools = unit_rows(N_TOOLS, TOOL_DIM, 5)
    states = torch.zeros(N_TOOLS, STATE_DIM)
    states[:, :TOOL_DIM] = tools  # the request text equals tool k's text
    with torch.no_grad():
        assert torch.equal(scorer(states, tools, torch.arange(N_TOOLS)).argmax(1), torch.arange(N_TOOLS))


# --------------------------------------------------------------------------- losses


def test_inference_reuses_the_tool_side_until_the_table_or_a_weight_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    scorer = ToolScorer(STATE_DIM, TOOL_DIM, N_TOOLS, NET).eval()
    scorer.freeze_for_acting()  # as a loaded policy's
    calls = []
    encode_tools = scorer.encode_tools
    monkeypatch.setattr(scorer, "encode_tools", lambda *args: calls.append(1) or encode_tools(*args))
    states, tools, ids = torch.randn(3, STATE_DIM), unit_rows(N_TOOLS, TOOL_DIM, 1), torch.arange(N_TOOLS)
    with torch.no_grad():
        first = scorer(states, tools, ids)
        assert torch.equal(scorer(states, tools, ids), first) and len(calls) == 1  # reused
        scorer(states, tools.clone(), ids)  # another table
        scorer(states, tools, ids)
        assert len(calls) == 3
        scorer.tool_tower[0].weight.add_(0.0)  # an in-place write to a weight that bumps its version (a load)
        scorer(states, tools, ids)
        assert len(calls) == 4
        tools.mul_(-1.0)  # the table itself edited in place
        assert not torch.allclose(scorer(states, tools, ids), first) and len(calls) == 5
    scorer(states, tools, ids)  # autograd on: always computed
    scorer.train()
    with torch.no_grad():
        scorer(states, tools, ids)
    with torch.inference_mode():
        scorer(states, tools, ids)
    assert len(calls) == 8
    # A scorer being trained never reuses it: a fused optimiser step bumps no version counter.
    scorer.eval().requires_grad_(True)
    optimizer = torch.optim.Adam(scorer.parameters(), lr=0.1, fused=True)
    with torch.no_grad():
        before = scorer(states, tools, ids)
    scorer(states, tools, ids).sum().backward()
    optimizer.step()
    with torch.no_grad():
        after = scorer(states, tools, ids)
    assert not torch.allclose(after, before)
    torch.testing.assert_close(after, scorer(states, tools, ids).detach())  # autograd on: computed afresh


def test_a_target_copy_scores_with_its_current_weights_however_they_were_written() -> None:
    # CUDA's foreach kernels (Polyak's _foreach_lerp_) bump no version counter; writing through
    # .data does the same on CPU. A target copy keyed on versions would keep its first tool side.
    torch.manual_seed(0)
    online = ToolScorer(STATE_DIM, TOOL_DIM, N_TOOLS, NET)
    target = copy.deepcopy(online).requires_grad_(False).eval()  # as CQL, BCQ and IQL keep theirs
    states, tools, ids = torch.randn(3, STATE_DIM), unit_rows(N_TOOLS, TOOL_DIM, 1), torch.arange(N_TOOLS)
    with torch.no_grad():
        first = target(states, tools, ids)
        for weight, source in zip(target.parameters(), online.parameters(), strict=True):
            weight.data.lerp_(source.data + 1.0, 0.5)
        moved = target(states, tools, ids)
        target._tool_memo = None
        assert not torch.allclose(moved, first)
        torch.testing.assert_close(moved, target(states, tools, ids))


def test_bc_loss_is_masked_cross_entropy() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 4.0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    actions = torch.tensor([1, 0])
    row0 = -(2.0 - math.log(math.exp(1.0) + math.exp(2.0)))
    row1 = -(0.5 - math.log(math.exp(0.5) + math.exp(-1.0) + math.exp(4.0)))
    assert bc_loss(logits, actions, mask).item() == pytest.approx((row0 + row1) / 2, rel=1e-6)
    weights = torch.tensor([2.0, 0.5])
    assert bc_loss(logits, actions, mask, weights).item() == pytest.approx((2 * row0 + 0.5 * row1) / 2, rel=1e-6)
    # the masked logit (3.0) plays no part: changing it changes nothing
    changed = logits.clone()
    changed[0, 2] = 100.0
    assert bc_loss(changed, actions, mask).item() == pytest.approx(bc_loss(logits, actions, mask).item())


def test_cql_penalty_hand_computed_and_ignores_masked_tools() -> None:
    q = torch.tensor([[1.0, 2.0, 5.0], [0.0, 1.0, -2.0]])
    mask = torch.tensor([[True, True, False], [False, True, True]])
    taken = torch.tensor([1.0, -2.0])
    expected = ((math.log(math.exp(1.0) + math.exp(2.0)) - 1.0)
                + (math.log(math.exp(1.0) + math.exp(-2.0)) + 2.0)) / 2
    assert cql_penalty(q, taken, mask).item() == pytest.approx(expected, rel=1e-6)
    changed = q.clone()
    changed[0, 2], changed[1, 0] = 1e4, -1e4
    assert cql_penalty(changed, taken, mask).item() == pytest.approx(expected, rel=1e-6)
    # no gradient reaches masked Q-values
    q_grad = q.clone().requires_grad_(True)
    cql_penalty(q_grad, taken, mask).backward()
    assert q_grad.grad is not None and (q_grad.grad[~mask] == 0).all() and (q_grad.grad[mask] != 0).all()


def test_log_call_shares_count_tool_calls_only_and_a_tool_never_called_is_not_infinitely_rare() -> None:
    shares = log_call_shares(torch.tensor([50, 6, 0, 2]), pseudo_count=1.0)  # row 0: FINISH's 50 answers
    assert shares[1:].exp().tolist() == pytest.approx([7 / 11, 1 / 11, 3 / 11])
    assert shares[0].exp().item() == 0.0
    with pytest.raises(ValueError, match="prior_pseudo_count > 0"):
        make_algorithm("cql", {"prior_pseudo_count": 0.0}, Dims(STATE_DIM, TOOL_DIM, N_TOOLS), NET,
                       ToolInputs(unit_rows(N_TOOLS, TOOL_DIM, 0), None))


def test_prior_adjustment_reranks_tools_by_their_share_and_keeps_their_mass_against_finish() -> None:
    q = torch.tensor([[0.5, 1.0, 1.0, 1.0, 9.0], [2.0, -1.0, 0.0, 3.0, 0.0]])
    tools = torch.tensor([[False, True, True, True, False], [False, True, True, False, True]])  # column 0: FINISH
    log_shares = torch.tensor([0.0, math.log(0.6), math.log(0.1), math.log(0.3), math.log(0.5)]).expand(2, -1)
    adjusted = q + prior_adjustment(q, tools, log_shares, weight=1.0)
    allowed = tools | (torch.arange(5) == 0)
    before, after = masked_log_softmax(q, allowed).exp(), masked_log_softmax(adjusted, allowed).exp()
    assert after[:, 0] == pytest.approx(before[:, 0])  # when to answer: as without the adjustment
    assert adjusted[~tools].tolist() == q[~tools].tolist()
    # Equal Q-values: the penalty's softmax splits the tools' mass by their shares of the calls.
    assert (after[0, 1:4] / after[0, 1:4].sum()).tolist() == pytest.approx([0.6, 0.1, 0.3])
    # So the penalty pushes a rare tool down less, a frequent one more: a gradient is its softmax weight
    # (over the batch's 2 rows).
    q_grad = q.clone().requires_grad_(True)
    shifted = q_grad + prior_adjustment(q_grad, tools, log_shares, weight=1.0)
    cql_penalty(shifted, shifted[:, 0], allowed).backward()
    assert q_grad.grad is not None and 2 * q_grad.grad[0, 2] < before[0, 2] < 2 * q_grad.grad[0, 1]
    assert prior_adjustment(q, tools, torch.zeros(2, 5), weight=1.0).abs().max() == 0  # equal shares: plain CQL
    no_tools = torch.zeros_like(tools)
    assert prior_adjustment(q, no_tools, log_shares, weight=1.0).tolist() == [[0.0] * 5] * 2


def test_expectile_loss_hand_computed() -> None:
    diff = torch.tensor([-2.0, 1.0, 3.0, 0.0])
    assert expectile_loss(diff, 0.7).item() == pytest.approx((0.3 * 4 + 0.7 * 1 + 0.7 * 9 + 0.0) / 4)
    assert expectile_loss(diff, 0.5).item() == pytest.approx(0.5 * (4 + 1 + 9) / 4)
    # above 0.5 under-estimates cost more: V is pushed towards an upper expectile
    assert expectile_loss(torch.tensor([1.0]), 0.9) > expectile_loss(torch.tensor([-1.0]), 0.9)


def test_advantage_weights_hand_computed() -> None:
    advantage = torch.tensor([-1.0, 0.0, 0.5, 10.0])
    weights = advantage_weights(advantage, beta=2.0, max_weight=50.0)
    raw = [math.exp(-2.0), 1.0, math.exp(1.0), 50.0]  # min(exp(beta * A), max_weight) ...
    expected = [w / (sum(raw) / 4) for w in raw]  # ... scaled to a batch mean of 1
    assert weights.tolist() == pytest.approx(expected, rel=1e-5)
    assert weights.mean().item() == pytest.approx(1.0)
    assert advantage_weights(advantage, beta=0.0, max_weight=50.0).tolist() == [1.0] * 4
    assert advantage_weights(torch.tensor([-1e4, -1e4]), beta=3.0, max_weight=50.0).isfinite().all()


def test_bcq_allowed_actions_threshold() -> None:
    probabilities = torch.tensor([[0.5, 0.3, 0.12, 0.08, 0.0]])
    logits = torch.log(probabilities.clamp(min=1e-12))
    logits[0, 4] = 50.0  # the most likely tool under no mask, but it is unavailable
    mask = torch.tensor([[True, True, True, True, False]])
    assert allowed_actions(logits, mask, 0.3).tolist() == [[True, True, False, False, False]]
    assert allowed_actions(logits, mask, 0.2).tolist() == [[True, True, True, False, False]]
    assert allowed_actions(logits, mask, 1.0).tolist() == [[True, False, False, False, False]]
    assert allowed_actions(logits, mask, 0.0).tolist() == mask.tolist()


def test_td_target() -> None:
    rewards = torch.tensor([1.0, -0.1, 10.0])
    dones = torch.tensor([0.0, 0.0, 1.0])
    next_values = torch.tensor([2.0, -3.0, 100.0])
    assert td_target(rewards, dones, next_values, 0.9).tolist() == pytest.approx([2.8, -2.8, 10.0])


def test_polyak_moves_target_by_tau() -> None:
    torch.manual_seed(0)
    source, target = nn.Linear(3, 2), nn.Linear(3, 2)
    before = copy.deepcopy(target)
    polyak(target, source, 0.25)
    for new, old, src in zip(target.parameters(), before.parameters(), source.parameters(), strict=True):
        torch.testing.assert_close(new, old + 0.25 * (src - old))
    polyak(target, source, 1.0)
    for new, src in zip(target.parameters(), source.parameters(), strict=True):
        torch.testing.assert_close(new, src)


def test_make_algorithm_rejects_unknown_names_and_settings() -> None:
    dims, tools = Dims(STATE_DIM, TOOL_DIM, N_TOOLS), ToolInputs(unit_rows(N_TOOLS, TOOL_DIM, 0), None)
    with pytest.raises(ValueError, match="unknown algorithm"):
        make_algorithm("ppo", {}, dims, NET, tools)
    with pytest.raises(ValueError, match="expectil"):
        make_algorithm("iql", {"expectille": 0.9}, dims, NET, tools)
    assert make_algorithm("iql", {"expectile": 0.9}, dims, NET, tools).config.expectile == 0.9


# --------------------------------------------------------------------------- algorithms


def fixed_batch(n: int = 32) -> Batch:
    """A learnable batch: the logged tool is the one whose embedding the request slot holds."""
    generator = torch.Generator().manual_seed(0)
    tools = unit_rows(N_TOOLS, TOOL_DIM, 11)
    actions = torch.arange(n) % (N_TOOLS - 1)  # never the masked tool
    states = torch.randn(n, STATE_DIM, generator=generator) * 0.1
    next_states = torch.randn(n, STATE_DIM, generator=generator) * 0.1
    states[:, TOOL_DIM:2 * TOOL_DIM] = tools[(actions + 1) % (N_TOOLS - 1)]  # a misleading "previous tool"
    masks = torch.ones(n, N_TOOLS, dtype=torch.bool)
    masks[:, MASKED] = False
    fewer = torch.arange(0, n, 3)
    masks[fewer, (actions[fewer] + 2) % (N_TOOLS - 1)] = False  # some rows offer fewer tools
    return Batch(states=states, actions=actions, rewards=torch.where(actions == 0, 1.0, -0.1),
                 next_states=next_states, dones=(torch.arange(n) % 4 == 3).float(), masks=masks,
                 next_masks=masks.roll(1, 0))


PRIMARY_LOSSES = {"bc": ["loss/bc"], "cql": ["loss/td", "loss/cql"], "iql": ["loss/policy", "loss/q"],
                  "bcq": ["loss/td", "loss/imitation"]}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_update_reduces_loss_and_never_favours_masked_tools(name: str) -> None:
    torch.manual_seed(0)
    tools = ToolInputs(unit_rows(N_TOOLS, TOOL_DIM, 11), torch.arange(N_TOOLS))
    algorithm = make_algorithm(name, {"lr": 3e-3}, Dims(STATE_DIM, TOOL_DIM, N_TOOLS), NET, tools)
    batch = fixed_batch()
    with torch.no_grad():
        untrained = (greedy(algorithm.scores(batch.states), batch.masks) == batch.actions).float().mean()
    first = {k: float(v) for k, v in algorithm.update(batch).items()}
    for _ in range(40):
        last = {k: float(v) for k, v in algorithm.update(batch).items()}
    assert set(PRIMARY_LOSSES[name]) <= set(first)
    for key in PRIMARY_LOSSES[name]:
        assert math.isfinite(last[key])
        assert last[key] < first[key], (key, first[key], last[key])
    # The unavailable tool gets no gradient anywhere: its learned bias stays exactly zero.
    for module_name, module in algorithm.modules.items():
        if isinstance(module, ToolScorer):
            assert module.bias.weight[MASKED].item() == 0.0, module_name
            assert module.bias.weight[:MASKED].abs().sum() > 0, module_name
    with torch.no_grad():
        for module in algorithm.modules.values():
            module.eval()
        scores = algorithm.scores(batch.states)
    assert scores.shape == (32, N_TOOLS) and torch.isfinite(scores).all()
    best = greedy(scores, batch.masks)
    assert batch.masks[torch.arange(32), best].all()
    assert (masked_log_softmax(scores, batch.masks).exp()[:, MASKED] == 0).all()
    if name in ("bc", "iql"):  # policies learn to imitate the (learnable) logged choice
        assert untrained < 0.5
        assert (best == batch.actions).float().mean() > 0.9


def test_cql_with_prior_adjustment_pushes_a_tool_the_logs_never_call_down_less() -> None:
    batch = fixed_batch()
    batch.actions = torch.arange(32) % 3  # FINISH and tools 1-2; tool 3 is offered at most states, never called
    batch.masks[torch.arange(32), batch.actions] = True
    calls = torch.bincount(batch.actions, minlength=N_TOOLS)
    gaps = []
    for weight in (0.0, 1.0):
        torch.manual_seed(0)
        tools = ToolInputs(unit_rows(N_TOOLS, TOOL_DIM, 11), torch.arange(N_TOOLS), calls)
        algorithm = make_algorithm("cql", {"lr": 3e-3, "prior_adjustment": weight}, Dims(STATE_DIM, TOOL_DIM, N_TOOLS),
                                   NET, tools)
        for _ in range(60):
            algorithm.update(batch)
        with torch.no_grad():
            q = algorithm.scores(batch.states)
        gaps.append(float((q[:, 3] - q[:, 1:3].mean(1)).mean()))
    assert gaps[1] > gaps[0] + 0.1, gaps


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_algorithm_state_dict_roundtrip(name: str) -> None:
    torch.manual_seed(0)
    tools = ToolInputs(unit_rows(N_TOOLS, TOOL_DIM, 11), torch.arange(N_TOOLS))
    dims = Dims(STATE_DIM, TOOL_DIM, N_TOOLS)
    trained = make_algorithm(name, {}, dims, NET, tools)
    for _ in range(3):
        trained.update(fixed_batch())
    fresh = make_algorithm(name, {}, dims, NET, tools)
    fresh.load_state_dict(trained.state_dict())
    states = fixed_batch().states
    with torch.no_grad():
        torch.testing.assert_close(fresh.scores(states), trained.scores(states))
    assert set(trained.acting_modules()) == set(trained.acting) and trained.acting


def test_bcq_scores_act_within_the_imitation_support() -> None:
    torch.manual_seed(0)
    tools = ToolInputs(unit_rows(N_TOOLS, TOOL_DIM, 11), torch.arange(N_TOOLS))
    algorithm = make_algorithm("bcq", {"threshold": 0.3}, Dims(STATE_DIM, TOOL_DIM, N_TOOLS), NET, tools)
    assert isinstance(algorithm, BCQ)
    with torch.no_grad():
        algorithm.modules["imitation"].bias.weight.copy_(torch.tensor([[3.0], [3.0], [-3.0], [-3.0], [-3.0]]))
        algorithm.modules["q"].bias.weight.copy_(torch.tensor([[0.0], [1.0], [5.0], [0.0], [0.0]]))
        for module in algorithm.modules.values():
            module.eval()
        scores = algorithm.scores(torch.zeros(2, STATE_DIM))
    # tool 2 has by far the best Q but the imitation model says the logs never use it there
    assert scores.argmax(1).tolist() == [1, 1]
    assert (scores[:, 2] < scores[:, 0]).all()


def test_context_features_compare_open_tools_and_say_whether_the_work_looks_done() -> None:
    d = 4
    scorer = ToolScorer(state_dim=3 * d + 2, tool_dim=d, n_known_tools=1)
    tools = torch.eye(d)  # three real tools and FINISH (last), unit vectors
    request = torch.tensor([0.6, 0.8, 0.0, 0.0])  # similarity 0.6, 0.8, 0.0 to the real tools
    pairs = torch.zeros(1, 4, N_PAIR_FEATURES)
    column = PAIR_FEATURES.index
    pairs[0, :, column("available")] = 1.0
    pairs[0, 3, column("is_finish")] = 1.0
    pairs[0, 1, column("called_in_turn")] = 1.0  # the best-matching tool was called in this turn
    pairs[0, 2, column("named_in_request")] = 0.5
    pairs[0, 0, column("provides_missing")] = 1.0
    pairs[0, :3, column("serves_open_part")] = torch.tensor([0.1, -0.3, 0.4])
    context = scorer.context_features(request[None] @ tools.T, pairs)[0]
    # real tools: similarity and part coverage minus the best open tool's (0.6, 0.4); the called tool is not open
    assert context[:3, 0].tolist() == pytest.approx([0.0, 0.0, -0.6])
    assert context[:3, 1].tolist() == pytest.approx([-0.3, 0.0, 0.0])
    assert context[:3, 2:].abs().sum() == 0.0
    # FINISH: best open 0.6, the called tool matched 0.2 better, half a name named, something was
    # called, an open tool would give a missing identifier, and one serves an unserved part by 0.4
    assert context[3].tolist() == pytest.approx([0.0, 0.0, 0.6, 0.2, 0.5, 0.0, 1.0, 0.4])


def rule_scorer(rule: NetworkConfig, n_states: int) -> tuple[ToolScorer, torch.Tensor, torch.Tensor]:
    """Return a scorer acting with ``rule``, four unit-vector tools (FINISH last) and their pair features."""
    d = 4
    torch.manual_seed(0)  # the rules' tests compare scores: the same weights whichever tests ran before
    scorer = ToolScorer(state_dim=3 * d + 2, tool_dim=d, n_known_tools=1, config=rule).eval()
    pairs = torch.zeros(n_states, 4, N_PAIR_FEATURES)
    pairs[:, :, PAIR_FEATURES.index("available")] = 1.0
    pairs[:, 3, PAIR_FEATURES.index("is_finish")] = 1.0
    return scorer, torch.eye(d), pairs


def test_a_tool_waiting_for_its_prerequisite_loses_the_penalty_only_when_acting() -> None:
    d = 4
    penalties = NetworkConfig(dropout=0.0, prerequisite_penalty=3.0, prerequisite_finish_penalty=2.0)
    scorer, tools, pairs = rule_scorer(penalties, 2)  # find_customer, list_orders, get_weather, FINISH
    column = PAIR_FEATURES.index
    pairs[:, 1, column("missing_ids")] = 1.0  # list_orders needs a customer id nobody gave
    pairs[0, 0, column("provides_missing")] = 1.0  # state 0: find_customer can give it
    waiting = waiting_for_prerequisite(pairs)
    assert waiting.tolist() == [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]  # state 1: no lookup, no waiting
    pairs[1, 0, column("provides_missing")] = 1.0
    pairs[1, 0, column("called_in_turn")] = 1.0  # a lookup already called is not open: nothing to wait for
    assert waiting_for_prerequisite(pairs)[1].sum() == 0.0
    pairs[1, 0, column("called_in_turn")] = 0.0
    pairs[1, 0, column("available")] = 0.0  # nor is one that is not available
    assert waiting_for_prerequisite(pairs)[1].sum() == 0.0
    states = torch.randn(2, 3 * d + 2)
    with torch.no_grad():
        learned, acted = scorer(states, tools, None, pairs), scorer(states, tools, None, pairs, acting=True)
    # State 0: list_orders waits for find_customer, and answering now (FINISH) is put off too.
    assert torch.allclose(learned - acted, torch.tensor([[0.0, 3.0, 0.0, 2.0], [0.0, 0.0, 0.0, 0.0]]), atol=1e-5)
    # After a call in the turn, answering is not put off any more (the tool still waits).
    called = pairs.clone()
    called[0, 2, column("called_in_turn")] = 1.0
    with torch.no_grad():
        later = scorer(states, tools, None, called) - scorer(states, tools, None, called, acting=True)
    assert torch.allclose(later[0], torch.tensor([0.0, 3.0, 0.0, 0.0]), atol=1e-5)
    # Candidates in their own order get the same penalty.
    order = torch.tensor([[1, 0, 2, 3], [3, 2, 1, 0]])
    with torch.no_grad():
        own = scorer(states, tools, None, pairs[torch.arange(2)[:, None], order], order, acting=True)
    assert torch.allclose(own, acted.gather(1, order), atol=1e-5)
    none = NetworkConfig(dropout=0.0, prerequisite_penalty=0.0, prerequisite_finish_penalty=0.0)
    off = ToolScorer(state_dim=3 * d + 2, tool_dim=d, n_known_tools=1, config=none).eval()
    off.load_state_dict(scorer.state_dict())
    with torch.no_grad():
        assert torch.equal(off(states, tools, None, pairs, acting=True), learned)


def test_a_waiting_tool_ranks_just_below_its_best_provider() -> None:
    column = PAIR_FEATURES.index
    pairs = torch.zeros(2, 5, N_PAIR_FEATURES)  # find_customer, list_orders, lookup_2, get_weather, FINISH
    pairs[:, :, column("available")] = 1.0
    pairs[:, 4, column("is_finish")] = 1.0
    pairs[:, 1, column("missing_ids")] = 1.0
    pairs[0, [0, 2], column("provides_missing")] = 1.0  # state 0: two lookups can give the id
    pairs[1, 0, column("provides_missing")] = 1.0
    pairs[1, 0, column("called_in_turn")] = 1.0  # state 1: the only lookup was called: nothing to wait for
    scores = torch.tensor([[1.0, 9.0, 2.0, 5.0, 0.0], [1.0, 9.0, 2.0, 5.0, 0.0]])
    waiting = waiting_for_prerequisite(pairs)
    capped = below_providers(scores, pairs, waiting)
    # list_orders matched the request best; now it ranks just under the better lookup, above the first.
    assert capped[0].tolist() == pytest.approx([1.0, 2.0 - PROVIDER_MARGIN, 2.0, 5.0, 0.0])
    assert torch.equal(capped[1], scores[1])
    low = scores.clone()
    low[0, 1] = 0.5  # already below its lookups: unchanged
    assert torch.equal(below_providers(low, pairs, waiting), low)


def test_answering_waits_right_after_the_lookup_of_the_best_matching_tool() -> None:
    column = PAIR_FEATURES.index
    pairs = torch.zeros(3, 4, N_PAIR_FEATURES)  # find_customer (called), list_orders, get_weather, FINISH
    pairs[:, :, column("available")] = 1.0
    pairs[:, 3, column("is_finish")] = 1.0
    pairs[:, 0, column("called_in_turn")] = 1.0
    pairs[:, 1, column("just_unblocked")] = 1.0  # the lookup just gave list_orders its customer id
    similarity = torch.tensor([[0.3, 0.7, 0.2, 0.0],   # list_orders matches the request best: wait
                               [0.3, 0.2, 0.7, 0.0],   # the weather tool does: the lookup was beside the point
                               [0.9, 0.7, 0.2, 0.0]])  # the called lookup itself is no open tool
    waiting = waiting_for_prerequisite(pairs)
    assert waiting.sum() == 0.0
    assert answer_waits(similarity, pairs, waiting).squeeze(-1).tolist() == [1.0, 0.0, 1.0]


def test_answering_waits_while_a_failed_call_waits_for_what_it_lacks() -> None:
    column = PAIR_FEATURES.index
    pairs = torch.zeros(3, 3, N_PAIR_FEATURES)  # send_message (called), message_login, FINISH
    pairs[:, :, column("available")] = 1.0
    pairs[:, 2, column("is_finish")] = 1.0
    pairs[:, 0, column("called_in_turn")] = 1.0
    pairs[:, 0, column("failed_in_turn")] = 1.0
    pairs[0, 0, column("just_called_failed")] = 1.0  # state 0: "No user is currently logged in."
    pairs[0, 0, column("missing_ids")] = 1.0
    pairs[0, 1, column("provides_missing")] = 1.0
    pairs[1, 1, column("called_in_turn")] = 1.0  # state 1: the log-in just worked
    pairs[1, 0, column("just_unblocked")] = 1.0
    pairs[2, 0, column("just_called_failed")] = 1.0  # state 2: failed for another reason: nothing to wait for
    similarity = torch.zeros(3, 3)
    waiting = waiting_for_prerequisite(pairs)
    assert waiting[:, 0].tolist() == [1.0, 0.0, 0.0]
    assert answer_waits(similarity, pairs, waiting).squeeze(-1).tolist() == [1.0, 1.0, 0.0]


def test_after_a_call_failed_for_want_of_a_prerequisite_its_provider_ranks_first() -> None:
    column = PAIR_FEATURES.index
    pairs = torch.zeros(2, 4, N_PAIR_FEATURES)  # view_messages_sent (called), message_login, add_contact, FINISH
    pairs[:, :, column("available")] = 1.0
    pairs[:, 3, column("is_finish")] = 1.0
    pairs[:, 0, column("called_in_turn")] = 1.0
    pairs[:, 0, column("just_called_failed")] = 1.0  # "No user is currently logged in."
    pairs[:, 1, column("provides_missing")] = 1.0
    pairs[0, 0, column("missing_ids")] = 1.0  # state 0: the error asked for the log-in
    scores = torch.tensor([[6.0, 3.0, 7.0, 9.0], [6.0, 3.0, 7.0, 9.0]])
    waiting = waiting_for_prerequisite(pairs)
    ranked = provider_after_failure(below_providers(scores, pairs, waiting), pairs, waiting)
    # The log-in now leads every tool (answering is answer_waits' call), the failed call below it.
    assert ranked[0].tolist() == pytest.approx([3.0 - PROVIDER_MARGIN, 7.0 + PROVIDER_MARGIN, 7.0, 9.0])
    assert torch.equal(ranked[1], scores[1])  # state 1: failed for another reason: as it was


def test_a_lookup_provider_ranks_first_while_every_tool_the_request_asks_for_waits() -> None:
    column = PAIR_FEATURES.index
    # search_issues (lookup), open_issue (gives an issue_id too), assign_issue (asked, waits), FINISH
    pairs = torch.zeros(5, 4, N_PAIR_FEATURES)
    pairs[:, :, column("available")] = 1.0
    pairs[:, 3, column("is_finish")] = 1.0
    pairs[:, 0, column("is_lookup")] = 1.0
    pairs[:, :2, column("provides_missing")] = 1.0
    pairs[:, 2, column("missing_ids")] = 1.0
    pairs[:, 2, column("asked_by_verb")] = 1.0  # "There's an issue about … Assign it to priya.s"
    pairs[1, 1, column("asked_by_verb")] = 1.0  # state 1: "Open an issue … and assign it": it can run now
    pairs[2, 0, column("called_in_turn")] = 1.0  # state 2: after the turn's first call
    pairs[3, 2, column("asked_by_verb")] = 0.0  # state 3: nothing is asked for by its verb
    scores = torch.tensor([[5.0, 7.0, 6.0, 8.0]] * 4 + [[4.0, 7.0, 6.0, 8.0]])  # state 4: the lookup 3 below
    waiting = waiting_for_prerequisite(pairs)
    ranked = provider_before_asked(scores, pairs, waiting, margin=2.0)
    # The lookup leads every tool and the answer; the other states keep their scores.
    assert ranked[0].tolist() == pytest.approx([8.0 + PROVIDER_MARGIN, 7.0, 6.0, 8.0])
    for state in (1, 2, 3, 4):
        assert torch.equal(ranked[state], scores[state])


def test_a_first_answer_waits_only_while_some_open_tool_serves_the_request() -> None:
    column = PAIR_FEATURES.index
    pairs = torch.zeros(2, 4, N_PAIR_FEATURES)  # find_customer, list_orders, get_weather, FINISH
    pairs[:, :, column("available")] = 1.0
    pairs[:, 3, column("is_finish")] = 1.0
    pairs[:, 1, column("missing_ids")] = 1.0
    pairs[:, 0, column("provides_missing")] = 1.0  # list_orders waits for find_customer, nothing called yet
    pairs[0, 1, column("serves_open_part")] = 0.6  # state 0: "list my orders"
    pairs[1, :3, column("serves_open_part")] = 0.1  # state 1: "thanks, that's all for tonight!"
    pairs[:, 3, column("serves_open_part")] = 0.9  # FINISH is no tool: it never counts as serving
    similarity = torch.zeros(2, 4)
    waiting = waiting_for_prerequisite(pairs)
    assert answer_waits(similarity, pairs, waiting).squeeze(-1).tolist() == [1.0, 1.0]  # -1: always
    assert answer_waits(similarity, pairs, waiting, 0.25).squeeze(-1).tolist() == [1.0, 0.0]
    assert NetworkConfig().prerequisite_fit_threshold == -1.0  # off by default


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_acts_with_the_prerequisite_penalty(name: str) -> None:
    torch.manual_seed(0)
    tools = ToolInputs(unit_rows(N_TOOLS, TOOL_DIM, 11), torch.arange(N_TOOLS))
    rule = NetworkConfig(hidden=32, layers=1, dropout=0.0, prerequisite_penalty=3.0, prerequisite_finish_penalty=2.0)
    algorithm = make_algorithm(name, {}, Dims(STATE_DIM, TOOL_DIM, N_TOOLS), rule, tools)
    algorithm.set_training(False)
    column = PAIR_FEATURES.index
    pairs = torch.zeros(3, N_TOOLS, N_PAIR_FEATURES)
    pairs[:, :, column("available")] = 1.0
    pairs[:, 1, column("missing_ids")] = 1.0
    pairs[:, 0, column("provides_missing")] = 1.0
    pairs[:, 4, column("is_finish")] = 1.0
    states = torch.randn(3, STATE_DIM)
    with torch.no_grad():
        acted = algorithm.scores(states, pairs)
        scorer = algorithm.modules[algorithm.acting[0]]
        scorer.prerequisite_penalty = scorer.prerequisite_finish_penalty = 0.0
        plain = algorithm.scores(states, pairs)
    expected = torch.zeros(3, N_TOOLS)
    expected[:, 4] = 2.0
    lost = plain - acted
    assert torch.allclose(lost[:, [0, 2, 3, 4]], expected[:, [0, 2, 3, 4]], atol=1e-4)
    # The waiting tool loses at least the penalty (more where it still ranked above its lookup).
    assert (lost[:, 1] >= 3.0 - 1e-4).all()
    assert NetworkConfig().prerequisite_penalty == NetworkConfig().prerequisite_finish_penalty == 0.0  # off by default
    assert NetworkConfig().open_part_finish_penalty == 0.0


def test_answering_is_put_off_while_a_call_left_a_request_part_to_an_open_tool() -> None:
    d = 4
    rule = NetworkConfig(dropout=0.0, open_part_finish_penalty=2.0, open_part_threshold=0.25)
    scorer, tools, pairs = rule_scorer(rule, 4)  # get_weather, convert_temperature, send_email, FINISH
    column = PAIR_FEATURES.index
    pairs[:, 1, column("serves_open_part")] = torch.tensor([0.32, 0.32, 0.2, 0.32])  # "in Fahrenheit"
    pairs[:3, 0, column("called_in_turn")] = 1.0  # get_weather was called, except in state 3
    pairs[1, 1, column("called_in_turn")] = 1.0  # state 1: convert_temperature too: no open tool serves the part
    # 0: the part waits for an open tool; 1: the tool serving it was called; 2: below the threshold;
    # 3: nothing was called in this turn yet (answering at once is the scorer's own call)
    assert answer_leaves_part(pairs, 0.25).squeeze(-1).tolist() == [1.0, 0.0, 0.0, 0.0]
    pairs[0, 1, column("available")] = 0.0  # a tool that is not available serves nothing
    assert answer_leaves_part(pairs, 0.25)[0].item() == 0.0
    pairs[0, 1, column("available")] = 1.0
    # A tool the request asks for by its verb, or names, needs less: state 2's 0.2 is enough then.
    assert answer_leaves_part(pairs, 0.25, 0.1).squeeze(-1).tolist() == [1.0, 0.0, 0.0, 0.0]
    pairs[2, 1, column("asked_by_verb")] = 1.0  # "... and convert it"
    assert answer_leaves_part(pairs, 0.25, 0.1).squeeze(-1).tolist() == [1.0, 0.0, 1.0, 0.0]
    pairs[2, 1, column("asked_by_verb")] = 0.0
    pairs[2, 1, column("named_in_request")] = 0.5  # half of convert_temperature's words: "temperature"
    assert answer_leaves_part(pairs, 0.25, 0.1).squeeze(-1).tolist() == [1.0, 0.0, 1.0, 0.0]
    assert answer_leaves_part(pairs, 0.25).squeeze(-1).tolist() == [1.0, 0.0, 0.0, 0.0]  # None: one threshold
    pairs[2, 1, column("named_in_request")] = 0.0
    assert NetworkConfig().open_part_asked_threshold is None
    states = torch.randn(4, 3 * d + 2)
    with torch.no_grad():
        put_off = scorer(states, tools, None, pairs) - scorer(states, tools, None, pairs, acting=True)
    expected = torch.zeros(4, 4)
    expected[0, 3] = 2.0  # FINISH alone, and only where the part is open
    assert torch.allclose(put_off, expected, atol=1e-5)


def test_answering_is_put_off_while_only_lookups_ran_and_the_request_asks_for_an_action() -> None:
    d = 4
    rule = NetworkConfig(dropout=0.0, asked_action_finish_penalty=2.0)
    scorer, tools, pairs = rule_scorer(rule, 4)  # search, book, get_price, FINISH
    column = PAIR_FEATURES.index
    pairs[:, 0, column("is_lookup")] = pairs[:, 2, column("is_lookup")] = 1.0
    pairs[:, 1, column("asked_by_verb")] = 1.0  # "Book the cheapest flight to Lyon"
    pairs[:, 0, column("called_in_turn")] = 1.0  # search was called and worked ...
    pairs[1, 1, column("called_in_turn")] = 1.0  # state 1: book too: the action was done
    pairs[2, 0, column("just_called_failed")] = 1.0  # state 2: the search failed
    pairs[3, 0, column("called_in_turn")] = 0.0  # state 3: nothing was called in this turn yet
    assert answer_skips_action(pairs).squeeze(-1).tolist() == [1.0, 0.0, 0.0, 0.0]
    lookup_asked = pairs.clone()
    lookup_asked[0, 1, column("is_lookup")] = 1.0  # a request whose verb names a lookup is no action
    assert answer_skips_action(lookup_asked)[0].item() == 0.0
    states = torch.randn(4, 3 * d + 2)
    with torch.no_grad():
        put_off = scorer(states, tools, None, pairs) - scorer(states, tools, None, pairs, acting=True)
    expected = torch.zeros(4, 4)
    expected[0, 3] = 2.0  # FINISH alone, and only where the action is still open
    assert torch.allclose(put_off, expected, atol=1e-5)
    assert NetworkConfig().asked_action_finish_penalty == 0.0  # off by default


def test_answering_is_put_off_once_right_after_the_best_fitting_tools_first_call_failed() -> None:
    d = 4
    rule = NetworkConfig(dropout=0.0, retry_penalty=2.0)
    scorer, tools, pairs = rule_scorer(rule, 5)  # search_flights, book, get_price, FINISH
    column = PAIR_FEATURES.index
    pairs[:, 0, column("called_in_turn")] = 1.0
    pairs[:, 0, column("calls_in_turn")] = 1 / 5  # search was called once in this turn ...
    pairs[:, 0, column("just_called_failed")] = 1.0  # ... and that call failed
    pairs[:, 0, column("failed_in_turn")] = 1.0
    pairs[1, 0, column("calls_in_turn")] = 2 / 5  # state 1: its second call failed too: no more retries
    pairs[2, 0, column("failed_in_turn")] = 0.0  # state 2: the call worked
    pairs[2, 0, column("just_called_failed")] = 0.0
    pairs[2, 0, column("just_called_ok")] = 1.0
    states = torch.randn(5, 3 * d + 2)
    states[:, :d] = tools[0]  # the request matches search best ...
    states[3, :d] = tools[2]  # state 3: ... but get_price here: search was likely the wrong tool
    states[4, :d] = tools[3]  # state 4: FINISH is no tool: search is still the best fit among the tools
    similarity = states[:, :d] @ tools.T
    assert answer_skips_retry(similarity, pairs).squeeze(-1).tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]
    with torch.no_grad():
        put_off = scorer(states, tools, None, pairs) - scorer(states, tools, None, pairs, acting=True)
    expected = torch.zeros(5, 4)
    expected[0, 3] = expected[4, 3] = 2.0  # FINISH, and only after the best fit's first failure ...
    expected[1, 0] = 2.0  # ... and after its retry failed too, the tool (repeats_retry)
    assert torch.allclose(put_off, expected, atol=1e-5)
    assert NetworkConfig().retry_penalty == 0.0  # off by default


def test_a_lookup_of_listed_records_not_read_gains_the_bonus_only_when_acting() -> None:
    d = 4
    scorer, tools, pairs = rule_scorer(NetworkConfig(dropout=0.0, reads_listed_bonus=2.0), 2)
    # get_order_details, return_items, get_user_details, FINISH; the profile lists orders not read in state 0
    pairs[0, 0, PAIR_FEATURES.index("reads_listed")] = 1.0
    states = torch.randn(2, 3 * d + 2)
    with torch.no_grad():
        gained = scorer(states, tools, None, pairs, acting=True) - scorer(states, tools, None, pairs)
    expected = torch.zeros(2, 4)
    expected[0, 0] = 2.0
    assert torch.allclose(gained, expected, atol=1e-5)
    assert NetworkConfig().reads_listed_bonus == 0.0  # off by default


def test_open_tools_gain_their_request_similarity_at_a_turns_first_decision_only_when_acting() -> None:
    d = 4
    scorer, tools, pairs = rule_scorer(NetworkConfig(dropout=0.0, first_similarity_bonus=2.0), 2)
    column = PAIR_FEATURES.index
    pairs[0, 2, column("available")] = 0.0  # state 0: nothing called yet, tool 2 not offered
    pairs[1, 0, column("called_in_turn")] = 1.0  # state 1: tool 0 was called in this turn
    states = torch.randn(2, 3 * d + 2)
    states[:, :d] = torch.tensor([0.5, -0.25, 0.75, 0.9])  # the request slot: its similarity with each unit tool
    similarity = states[:, :d] @ tools.T
    assert torch.allclose(first_decision_similarity(similarity, pairs),
                          torch.tensor([[0.5, -0.25, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]))
    with torch.no_grad():
        gained = scorer(states, tools, None, pairs, acting=True) - scorer(states, tools, None, pairs)
    expected = torch.zeros(2, 4)
    expected[0, :2] = torch.tensor([1.0, -0.5])  # never FINISH, an unavailable tool, or after a call in the turn
    assert torch.allclose(gained, expected, atol=1e-5)
    assert NetworkConfig().first_similarity_bonus == 0.0  # off by default


def test_answering_gains_the_bonus_after_a_call_of_the_best_fitting_tool_worked_only_when_acting() -> None:
    d = 4
    scorer, tools, pairs = rule_scorer(NetworkConfig(dropout=0.0, best_fit_called_bonus=0.5), 5)
    column = PAIR_FEATURES.index
    pairs[:4, 0, column("called_in_turn")] = 1.0  # get_weather was called in this turn (not in state 4) ...
    pairs[:4, 0, column("just_called_ok")] = 1.0  # ... and it worked
    pairs[2, 0, column("just_called_ok")] = 0.0  # state 2: it failed
    pairs[2, 0, column("just_called_failed")] = 1.0
    pairs[3, 1, column("available")] = 0.0  # state 3: the tool that fits better is not offered
    states = torch.randn(5, 3 * d + 2)
    states[:, :d] = torch.tensor([0.6, 0.2, -0.1, 0.9])  # the request's similarity with each unit tool
    states[1, :d] = torch.tensor([0.6, 0.7, -0.1, 0.9])  # state 1: an open tool fits the request better
    states[3, :d] = torch.tensor([0.6, 0.7, -0.1, 0.9])
    similarity = states[:, :d] @ tools.T
    assert answer_after_best_fit(similarity, pairs).flatten().tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]
    with torch.no_grad():
        gained = scorer(states, tools, None, pairs, acting=True) - scorer(states, tools, None, pairs)
    expected = torch.zeros(5, 4)
    expected[[0, 3], 3] = 0.5  # FINISH alone; never after a failed call or before any call in the turn
    assert torch.allclose(gained, expected, atol=1e-5)
    assert NetworkConfig().best_fit_called_bonus == 0.0  # off by default


def test_a_tool_just_retried_is_not_called_again() -> None:
    d = 4
    scorer, tools, pairs = rule_scorer(NetworkConfig(dropout=0.0, retry_penalty=2.0), 4)
    column = PAIR_FEATURES.index
    pairs[:, 0, column("called_in_turn")] = 1.0
    pairs[:, 0, column("calls_in_turn")] = 2 / 5  # search failed, then worked: the retry did its job
    pairs[:, 0, column("just_called_ok")] = 1.0
    pairs[:, 0, column("failed_in_turn")] = 1.0
    pairs[1, 0, column("failed_in_turn")] = 0.0  # state 1: two calls that worked: the scorer's call
    pairs[2, 0, column("just_called_ok")] = 0.0  # state 2: the search failed; book's call just worked
    pairs[2, 1, column("just_called_ok")] = 1.0
    pairs[2, 1, column("called_in_turn")] = 1.0
    pairs[3, 0, column("just_called_ok")] = 0.0  # state 3: the search failed twice
    pairs[3, 0, column("just_called_failed")] = 1.0
    assert repeats_retry(pairs).tolist() == [[1.0, 0.0, 0.0, 0.0], [0.0] * 4, [0.0] * 4, [1.0, 0.0, 0.0, 0.0]]
    states = torch.randn(4, 3 * d + 2)
    with torch.no_grad():
        put_off = scorer(states, tools, None, pairs) - scorer(states, tools, None, pairs, acting=True)
    expected = torch.zeros(4, 4)
    expected[0, 0] = expected[3, 0] = 2.0  # the retried tool alone
    assert torch.allclose(put_off, expected, atol=1e-5)


@pytest.mark.parametrize("pair_hidden", [0, 5])
def test_per_state_candidates_score_like_the_shared_tool_table(pair_hidden: int) -> None:
    torch.manual_seed(0)
    d, n = 8, 6
    scorer = ToolScorer(state_dim=3 * d + 2, tool_dim=d, n_known_tools=n,
                        config=NetworkConfig(hidden=4, dropout=0.0, pair_hidden=pair_hidden)).eval()
    with torch.no_grad():
        for parameter in scorer.parameters():
            parameter.normal_()
    states = torch.randn(3, 3 * d + 2)
    tools = torch.nn.functional.normalize(torch.randn(n, d), dim=1)
    pairs = torch.rand(3, n, N_PAIR_FEATURES)
    ids = torch.arange(n)
    shared = scorer(states, tools, ids, pairs)
    # each state's candidates in its own order: the scores follow them
    order = torch.stack([torch.randperm(n) for _ in range(3)])
    rows = torch.arange(3)[:, None]
    own = scorer(states, tools, ids, pairs[rows, order], candidates=order)
    assert torch.allclose(own, shared.gather(1, order), atol=1e-4)
    # a table much larger than the candidates: those alone are scored, term by term, to the same result
    few = order[:, :1]
    assert tools.shape[0] > DENSE_TABLE_FACTOR * few.shape[1]
    one_by_one = torch.cat([scorer(states[b : b + 1], tools[few[b]], ids[few[b]], pairs[b : b + 1, few[b]])
                            for b in range(3)])
    assert torch.allclose(scorer(states, tools, ids, pairs[rows, few], candidates=few), one_by_one, atol=1e-4)


def test_acting_with_a_tower_rank_weight_narrows_the_towers_part_in_ranking_tools_only() -> None:
    torch.manual_seed(0)
    d, n = 8, 5  # four real tools (the third unavailable) and FINISH last
    narrowed = ToolScorer(state_dim=3 * d + 2, tool_dim=d, n_known_tools=n,
                          config=NetworkConfig(hidden=4, dropout=0.0, tower_rank_weight=0.25)).eval()
    with torch.no_grad():
        for parameter in narrowed.parameters():
            parameter.normal_()
    as_trained = copy.deepcopy(narrowed)
    as_trained.tower_rank_weight = 1.0
    states = torch.randn(2, 3 * d + 2)
    tools = torch.nn.functional.normalize(torch.randn(n, d), dim=1)
    pairs = torch.zeros(2, n, N_PAIR_FEATURES)
    pairs[:, :, PAIR_FEATURES.index("available")] = 1.0
    pairs[:, 2, PAIR_FEATURES.index("available")] = 0.0
    pairs[:, -1, PAIR_FEATURES.index("is_finish")] = 1.0
    ids = torch.arange(n)
    with torch.no_grad():
        tower = narrowed.state_tower(states) @ (narrowed.tool_tower(tools) * narrowed.scale).T
        acted = narrowed(states, tools, ids, pairs, acting=True)
        trained = as_trained(states, tools, ids, pairs, acting=True)
        # training's scores never see it
        assert torch.equal(narrowed(states, tools, ids, pairs), as_trained(states, tools, ids, pairs))
    real = [0, 1, 3]
    # between real tools, the towers' part counts a quarter
    expected = trained[:, real] - 0.75 * tower[:, real]
    gaps, expected_gaps = acted[:, real] - acted[:, :1], expected - expected[:, :1]
    assert torch.allclose(gaps, expected_gaps, atol=1e-4)
    # the best real tool keeps its score, so answering now against acting is decided as trained
    assert torch.allclose(acted[:, real].max(dim=1).values, trained[:, real].max(dim=1).values, atol=1e-5)
    assert torch.allclose(acted[:, -1], trained[:, -1])
    assert torch.allclose(acted[:, 2], trained[:, 2])
    # the same on each state's own candidates
    order = torch.stack([torch.randperm(n) for _ in range(2)])
    rows = torch.arange(2)[:, None]
    with torch.no_grad():
        own = narrowed(states, tools, ids, pairs[rows, order], candidates=order, acting=True)
    assert torch.allclose(own, acted.gather(1, order), atol=1e-4)
    # weight 1 is the identity
    assert torch.equal(tower_ranking_narrowed(trained, tower, pairs, 1.0), trained)


def test_a_new_pair_head_adds_nothing_until_trained() -> None:
    torch.manual_seed(0)
    d, n = 8, 6
    scorer = ToolScorer(state_dim=3 * d + 2, tool_dim=d, n_known_tools=n,
                        config=NetworkConfig(hidden=4, dropout=0.0, pair_hidden=5)).eval()
    assert scorer.pair_head is not None
    states, pairs = torch.randn(3, 3 * d + 2), torch.rand(3, n, N_PAIR_FEATURES)
    tools, ids = torch.nn.functional.normalize(torch.randn(n, d), dim=1), torch.arange(n)
    with_head = scorer(states, tools, ids, pairs)
    head, scorer.pair_head = scorer.pair_head, None
    torch.testing.assert_close(with_head, scorer(states, tools, ids, pairs))
    with torch.no_grad():
        head[-1].weight.normal_()
    scorer.pair_head = head
    assert not torch.allclose(with_head, scorer(states, tools, ids, pairs), atol=1e-3)


@pytest.mark.parametrize("pair_hidden", [0, 16])
def test_the_pair_head_learns_how_one_pair_feature_depends_on_another(pair_hidden: int) -> None:
    # Two tools whose texts and states say nothing; the logged one is the tool whose two features
    # differ (XOR): (0, 1) beats (1, 1), (1, 0) beats (0, 0). A linear score w1·f1 + w2·f2 needs w1 < 0
    # for the first kind and w1 > 0 for the second, so it gets at most one kind right.
    torch.manual_seed(0)
    d, batch = 8, 64
    scorer = ToolScorer(state_dim=3 * d + 2, tool_dim=d, n_known_tools=2,
                        config=NetworkConfig(hidden=4, dropout=0.0, tool_bias=False, pair_hidden=pair_hidden))
    tools = torch.nn.functional.normalize(torch.ones(2, d), dim=1)
    first_kind = torch.rand(batch) < 0.5
    logged = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    other = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    slot = torch.randint(0, 2, (batch,))  # which of the two tools the logged one is
    kind = first_kind[:, None]
    features = torch.where(kind, logged[0], logged[1]), torch.where(kind, other[0], other[1])
    pairs = torch.zeros(batch, 2, N_PAIR_FEATURES)
    columns = [PAIR_FEATURES.index("named_in_request"), PAIR_FEATURES.index("is_lookup")]
    rows = torch.arange(batch)
    pairs[rows, slot, columns[0]], pairs[rows, slot, columns[1]] = features[0][:, 0], features[0][:, 1]
    pairs[rows, 1 - slot, columns[0]], pairs[rows, 1 - slot, columns[1]] = features[1][:, 0], features[1][:, 1]
    pairs[..., PAIR_FEATURES.index("available")] = 1.0
    states, mask = torch.zeros(batch, 3 * d + 2), torch.ones(batch, 2, dtype=torch.bool)
    optimiser = torch.optim.Adam(scorer.parameters(), lr=1e-2)
    for _ in range(300):
        loss = bc_loss(scorer(states, tools, None, pairs), slot, mask)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    with torch.no_grad():
        accuracy = (scorer(states, tools, None, pairs).argmax(1) == slot).float().mean().item()
    if pair_hidden:
        assert accuracy == 1.0
    else:
        assert accuracy < 0.8
