"""`ToolPolicy`: a trained policy that ranks the tools available at a step.

A policy is loaded from a directory that training wrote (see
:mod:`evoharness_agent.learning.checkpoints`; loading never unpickles code). Its states are
built by the same code as the training states (:mod:`evoharness_agent.encoding.state`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import torch
from pydantic import ValidationError

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.encoding.state import (
    N_PAIR_FEATURES,
    N_STATE_FEATURES,
    SlotRows,
    gather_states,
    matched_part_texts,
    n_slots,
    request_part_texts,
    request_parts,
    state_parts,
    state_rows,
    step_text,
    tool_coverage,
)
from evoharness_agent.learning.algorithms import Algorithm, ToolInputs
from evoharness_agent.learning.calibration import softmax_with_temperature
from evoharness_agent.learning.checkpoints import DEFAULT_POLICY, load_policy, resolve_policy_dir, save_policy
from evoharness_agent.runtime import pick_device
from evoharness_agent.schema import FINISH, Step, ToolSpec, as_tool_spec, finish_spec

if TYPE_CHECKING:  # onnxruntime is the optional ``onnx`` extra: imported only for backend="onnx"
    from evoharness_agent.inference.onnx_runtime import OnnxScorer

__all__ = ["CONTINUE_RATIO", "CONTINUE_THRESHOLD", "PolicySession", "RankingPolicy", "RankingSession", "ToolPolicy",
           "ToolScore", "call_is_due"]

TOOL_TABLES_KEPT = 16
"""Tool tables a :class:`ToolPolicy` keeps embedded (one per tool set it ranks; a server sees several)."""

@dataclass(frozen=True)
class ToolScore:
    """One ranked tool: its name, raw score and calibrated probability among the tools ranked.

    The probability is ``softmax(score / T)`` over the tools ranked, ``T`` the temperature fit
    on the validation split when training ended (1 for policies trained before calibration).
    """

    tool: str
    score: float
    probability: float


CONTINUE_THRESHOLD = 0.15
"""The agents' default ``continue_threshold`` (:func:`call_is_due`). On the shipped default's validation
split 141 of the 157 decisions right after a call that worked, with another tool ranked first and
FINISH at 0.15 or less, are tool calls (90%; the validation suite 22 of 23)."""
CONTINUE_RATIO = 2.5
"""The agents' default ``continue_ratio`` (:func:`call_is_due`). On the shipped default's validation split,
of the decisions right after a call that worked, with another tool ranked first and FINISH above 0.15,
13 of 30 answer; of those whose best tool is at least 2.5 times as likely as FINISH, 1 of 10."""


def call_is_due(ranking: Sequence[ToolScore], just_worked: str | None, threshold: float | None,
                ratio: float | None = None) -> bool:
    """Return whether the agent must call a tool now rather than answer.

    True right after a call of ``just_worked`` that worked (``None``: no such call), while another
    tool is ranked first and FINISH's calibrated probability is at most ``threshold`` (``None``:
    never), or the best tool is at least ``ratio`` times as likely as FINISH (``None``: only the
    threshold): answering there is right about ``threshold`` of the time or less, or far less
    likely than the call. Never when the best tool is the one just called (a poll, a retry): when
    to stop is then the LLM's call.
    """
    finish = next((score.probability for score in ranking if score.tool == FINISH), None)
    if threshold is None or just_worked is None or finish is None or ranking[0].tool in (FINISH, just_worked):
        return False
    return finish <= threshold or (ratio is not None and ranking[0].probability >= ratio * finish)


@runtime_checkable
class RankingSession(Protocol):
    """What the executor uses of a live run's policy view: :class:`PolicySession`, or a remote one."""

    def observe(self, step: Step) -> None:
        """Record a step of the run."""

    def rank(self, available: Collection[str] | None = None) -> list[ToolScore]:
        """Rank the tools (and FINISH) for the current state, best first."""


@runtime_checkable
class RankingPolicy(Protocol):
    """What the executor and the middleware use of a policy, local or remote.

    A :class:`ToolPolicy`, or a client of a policy server
    (``evoharness_agent.server.client.PolicyClient``): agents work against either alike.
    """

    def rank(self, task: str, history: Sequence[Step] = (), tools: Sequence[Any] = (), *,
             available: Collection[str] | None = None) -> list[ToolScore]:
        """Rank the available tools (and FINISH) for one state, best first."""

    def session(self, task: str, tools: Sequence[Any]) -> RankingSession:
        """Start an incremental session for one run."""


class ToolPolicy:
    """Ranks tools for a (task, history) state with a trained offline-RL policy."""

    def __init__(self, algorithm: Algorithm, meta: dict[str, Any], encoder: StateEncoder,
                 device: str = "cpu", *, backend: str = "torch", onnx_scorer: OnnxScorer | None = None) -> None:
        """Wrap a trained algorithm; prefer :meth:`load`.

        ``backend="onnx"`` scores on onnxruntime (CPU): with ``onnx_scorer`` (an export's
        ``scorer.onnx``), else with the algorithm's scorer exported now, in memory. Texts are
        embedded by ``encoder`` as given: ``load(dir, backend="onnx")`` passes the export's
        :class:`~evoharness_agent.inference.onnx_runtime.OnnxStateEncoder`.
        """
        if backend not in ("torch", "onnx"):
            raise ValueError(f"backend={backend!r}: expected 'torch' or 'onnx'")
        if encoder.step_model != meta.get("step_encoder"):
            # Its history slots were trained on one model's vectors: another's would be served skewed.
            raise ValueError(f"the policy embeds history steps with {meta.get('step_encoder')!r}, the encoder "
                             f"given with {encoder.step_model!r}: pass StateEncoder(..., step_model="
                             f"{meta.get('step_encoder')!r}), or no encoder")
        if backend == "onnx" and onnx_scorer is None:
            from evoharness_agent.inference.onnx_export import export_scorer
            from evoharness_agent.inference.onnx_runtime import OnnxScorer

            onnx_scorer = OnnxScorer(export_scorer(algorithm, int(meta["state_dim"]), int(meta["tool_dim"]),
                                                   max(1, len(meta["known_tools"]))))
        self.backend = backend
        self._onnx_scorer = onnx_scorer if backend == "onnx" else None
        self.algorithm = algorithm
        self.meta = meta
        self.encoder = encoder
        self.device = device
        self.history_window = int(meta["history_window"])
        self.known_tools = {name: i for i, name in enumerate(meta["known_tools"])}
        self.temperature = float(meta.get("calibration", {}).get("temperature", 1.0))
        """Divides the scores before the softmax of :attr:`ToolScore.probability`."""
        self._lock = threading.Lock()
        self._tool_tables: OrderedDict[tuple[tuple[str, str], ...], tuple[ToolInputs, np.ndarray]] = OrderedDict()
        algorithm.set_training(False)

    @classmethod
    def load(cls, path: str | Path = DEFAULT_POLICY, *, encoder: StateEncoder | None = None,
             device: str | None = None, backend: str = "torch", threads: int | None = None,
             cache_dir: str | Path | bool | None = None) -> ToolPolicy:
        """Load a policy directory written by training or :meth:`save` (safetensors, no pickle).

        ``"default"`` (the default) is the general policy shipped inside the package.
        ``backend="onnx"`` runs a directory that ``evoharness-agent export`` wrote on onnxruntime
        (scorer and encoder, CPU, ``threads`` intra-op threads; ``None``: onnxruntime's default).
        Without ``encoder``, the policy's own encoder is built, with its embedding cache in
        ``cache_dir`` (as for :class:`~evoharness_agent.encoding.embedder.StateEncoder`).

        Raises:
            FileNotFoundError: ``path`` is not a policy directory.
            PolicyFormatError: a file is damaged or out of bounds; the message names the file and field.

        """
        if backend == "onnx":
            from evoharness_agent.inference.onnx_runtime import OnnxScorer, OnnxStateEncoder, onnx_section

            algorithm, meta = load_policy(path, "cpu")
            folder = resolve_policy_dir(path)
            scorer = OnnxScorer(folder / onnx_section(meta, path)["scorer"], threads)
            encoder = encoder or OnnxStateEncoder(folder, meta, threads=threads, cache_dir=cache_dir)
            return cls(algorithm, meta, encoder, "cpu", backend=backend, onnx_scorer=scorer)
        device = pick_device(device)
        algorithm, meta = load_policy(path, device)
        encoder = encoder or StateEncoder(meta["encoder"], max_seq_length=int(meta["max_seq_length"]),
                                          cache_dir=cache_dir, step_model=meta.get("step_encoder"))
        return cls(algorithm, meta, encoder, device, backend=backend)  # an unknown backend fails here

    def save(self, path: str | Path) -> None:
        """Write the acting networks and metadata to a directory, both files as one atomic update."""
        # An ONNX export's section names graph files that this directory will not have.
        save_policy(path, self.algorithm, {key: value for key, value in self.meta.items() if key != "onnx"})

    def _tool_inputs(self, specs: Sequence[ToolSpec]) -> tuple[ToolInputs, np.ndarray]:
        """Return the tool table of ``specs`` (embeddings and bias rows) and its embeddings as an array.

        A live run ranks the same tools at every decision: the last :data:`TOOL_TABLES_KEPT`
        tables are kept, so the scorer sees the same tensors and reuses its tool-side features.
        """
        key = tuple((spec.name, spec.description) for spec in specs)
        with self._lock:
            table = self._tool_tables.get(key)
            if table is not None:
                self._tool_tables.move_to_end(key)
                return table
        texts = [s.text() for s in specs]
        # Token vectors first: their pass gives the embeddings too (one pass), and the request-part
        # coverage matches some of them at each decision.
        self.encoder.embed_tokens(texts)
        array = self.encoder.embed(texts)
        ids = torch.tensor([self.known_tools.get(s.name, -1) for s in specs], device=self.device)
        table = (ToolInputs(torch.from_numpy(array).to(self.device), ids), array)
        with self._lock:
            self._tool_tables[key] = table
            while len(self._tool_tables) > TOOL_TABLES_KEPT:
                self._tool_tables.popitem(last=False)
        return table

    def _state_inputs(self, states: Sequence[tuple[str, Sequence[Step]]], specs: Sequence[ToolSpec],
                      tool_vectors: np.ndarray, available: Sequence[Collection[str] | None] | None = None,
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """Build state vectors and per-tool pair features, embedding each distinct text once.

        ``tool_vectors`` are the embeddings of ``specs``, in order.
        """
        by_name = {spec.name: spec for spec in specs}
        names = [spec.name for spec in specs]
        slots = SlotRows()

        def tool_text(name: str) -> str:
            return (by_name.get(name) or ToolSpec(name=name)).text()

        all_parts = [state_parts(task, history, self.history_window) for task, history in states]
        # New requests in one encoder pass: the token vectors of their clauses matched after a call, and the
        # embeddings of the tasks, the requests and all their clauses (for a session observed with
        # embed=False, the server's); tool_coverage and the state's slots find them cached.
        requests = [parts.request for parts in all_parts]
        texts = request_part_texts(requests)
        self.encoder.embed_tokens(matched_part_texts(requests),
                                  embed_also=[*texts, *dict.fromkeys(parts.task for parts in all_parts), *requests])
        self.encoder.embed(texts)
        rows, features, pairs = [], [], []
        for parts, allowed in zip(all_parts, available or [None] * len(states), strict=True):
            rows.append(state_rows(parts, tool_text, slots, self.history_window))
            features.append(parts.features)
            coverage = tool_coverage(parts, specs, tool_vectors, self.encoder.embed, self.encoder.match_tokens,
                                     tool_text)
            pairs.append(parts.pair_features(specs, allowed, coverage))
        dim = int(self.meta["tool_dim"])
        table = np.zeros((len(slots) + 1, dim), dtype=np.float32)
        slots.fill(table, self.encoder.embed, self.encoder.embed_steps)
        row_tensor = torch.tensor(rows, dtype=torch.long).reshape(len(states), n_slots(self.history_window))
        feature_tensor = torch.tensor(features, dtype=torch.float32).reshape(len(states), N_STATE_FEATURES)
        # Through numpy: torch.tensor reads nested lists one float at a time.
        pair_array = np.asarray(pairs, dtype=np.float32).reshape(len(states), len(names), N_PAIR_FEATURES)
        pair_tensor = torch.from_numpy(pair_array)
        states_tensor = gather_states(torch.from_numpy(table), row_tensor, feature_tensor)
        return states_tensor.to(self.device), pair_tensor.to(self.device)

    @torch.no_grad()
    def score_matrix(self, states: Sequence[tuple[str, Sequence[Step]]], tools: Sequence[Any], *,
                     include_finish: bool = True, available: Sequence[Collection[str] | None] | None = None,
                     ) -> tuple[list[str], np.ndarray]:
        """Return the tool names (FINISH last) and a ``(len(states), n_tools)`` score matrix.

        ``available[i]`` names the tools callable in state ``i`` (``None``: all of ``tools``); the
        scores of the others are not meaningful.
        """
        specs = [spec for spec in map(as_tool_spec, tools) if spec.name != FINISH]
        if include_finish:
            specs.append(finish_spec())
        tool_inputs, tool_vectors = self._tool_inputs(specs)
        state_inputs = self._state_inputs(states, specs, tool_vectors, available)
        if self._onnx_scorer is not None:
            assert tool_inputs.ids is not None  # _tool_inputs always looks the ids up
            scores = self._onnx_scorer.scores(state_inputs[0].numpy(), tool_inputs.embeddings.numpy(),
                                              tool_inputs.ids.numpy(), state_inputs[1].numpy())
            return [s.name for s in specs], scores
        with self._lock:  # the algorithm scores against one tool table at a time
            self.algorithm.tools = tool_inputs
            scores = self.algorithm.scores(*state_inputs).float().cpu().numpy()
        return [s.name for s in specs], scores

    def rank_batch(
        self,
        states: Sequence[tuple[str, Sequence[Step]]],
        tools: Sequence[Any],
        *,
        available: Sequence[Collection[str] | None] | None = None,
        include_finish: bool = True,
    ) -> list[list[ToolScore]]:
        """Rank ``tools`` (plus FINISH) for many (task, history) states in one forward pass."""
        names, scores = self.score_matrix(states, tools, include_finish=include_finish, available=available)
        ranked = []
        for row, allowed in zip(scores, available or [None] * len(states), strict=True):
            keep = [j for j, name in enumerate(names)
                    if allowed is None or name in allowed or name == FINISH]
            kept = row[keep]
            probabilities = softmax_with_temperature(kept, self.temperature)
            order = np.argsort(-kept, kind="stable")
            ranked.append([ToolScore(names[keep[j]], float(kept[j]), float(probabilities[j])) for j in order])
        return ranked

    def rank(self, task: str, history: Sequence[Step] = (), tools: Sequence[Any] = (), *,
             available: Collection[str] | None = None, include_finish: bool = True) -> list[ToolScore]:
        """Rank the available tools (and FINISH) for one state, best first."""
        return self.rank_batch([(task, history)], tools, available=[available],
                               include_finish=include_finish)[0]

    def session(self, task: str, tools: Sequence[Any], *, embed: bool = True) -> PolicySession:
        """Start an incremental session for one run: each new step is embedded once (see :class:`PolicySession`)."""
        return PolicySession(self, task, tools, embed=embed)


class PolicySession:
    """The policy's view of one live run: add steps as they happen, rank at each decision."""

    def __init__(self, policy: ToolPolicy, task: str, tools: Sequence[Any], *, embed: bool = True) -> None:
        """Embed the task (and its clauses) now, or with ``embed=False`` at the first ranking (as :meth:`observe`)."""
        self.policy = policy
        self.task = task
        self.tools = list(tools)
        specs = [spec for spec in map(as_tool_spec, self.tools) if spec.name != FINISH]
        self._tool_names = {spec.name for spec in specs} | {FINISH}
        self._tool_texts = [spec.text() for spec in (*specs, finish_spec())]
        self.history: list[Step] = []
        if embed:
            self._embed_request(task)  # now, not at the first rank

    def _embed_request(self, request: str) -> None:
        """Embed a new request and its clauses, and match the clauses with every tool token by token.

        The request's arrival pays an encoder call anyway. The matches that its decisions after
        a call read (:func:`~evoharness_agent.encoding.state.tool_coverage`) are then kept by the
        encoder, so such a decision looks them up instead of paying the product.
        """
        encoder = self.policy.encoder
        texts, matched = [request, *request_part_texts([request])], request_parts(request, after_call=True)
        # One encoder pass: the clauses' token vectors, and the embeddings of the request and its clauses.
        encoder.embed_tokens(matched, embed_also=texts)
        encoder.match_tokens(matched, self._tool_texts)
        encoder.embed(texts)

    def observe(self, step: Step | Mapping[str, Any], *, embed: bool = True) -> None:
        """Record a step (tool call, reply or user message) and embed its text once.

        Args:
            step: a :class:`~evoharness_agent.schema.Step`, or its dict form as in the logs, e.g.
                ``{"tool": "search", "arguments": {...}, "observation": "...", "error": False}``
                (``kind`` defaults to ``"tool_call"``).
            embed: ``False`` leaves the embedding to the next ranking, which embeds every new text
                of the states it ranks in one encoder call (the policy server ranks many sessions
                together).

        Raises:
            TypeError: ``step`` is neither a Step nor a mapping.
            ValueError: the step is not valid (the message names the field); it is not kept,
                so the session ranks on as before.

        """
        if isinstance(step, Mapping):
            try:
                step = Step.model_validate(dict(step))
            except ValidationError as err:
                problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'step'}: {e['msg']}" for e in err.errors())
                raise ValueError(f"not a valid step ({problems})") from None
        elif not isinstance(step, Step):
            raise TypeError(f"observe() takes a Step or its dict form, not {type(step).__name__}")
        if embed and step.kind == "user":
            self._embed_request(step.content)
        elif embed:
            self.policy.encoder.embed_steps([step_text(step)])
        self.history.append(step)  # only now: a step that failed above must not break later ranks

    def rank(self, available: Collection[str] | None = None) -> list[ToolScore]:
        """Rank the tools for the current state.

        Args:
            available: the names of the tools callable now (FINISH is always ranked);
                ``None``: all of the session's tools.

        Raises:
            TypeError: ``available`` is one string (a set of its characters is never meant).
            ValueError: a name in ``available`` is none of the session's tools.

        """
        if available is not None:
            if isinstance(available, str):
                raise TypeError("available= takes a collection of tool names, not one string")
            unknown = sorted(set(available) - self._tool_names)
            if unknown:  # `tools` may have grown since the names were read: read them again
                self._tool_names = {as_tool_spec(tool).name for tool in self.tools} | {FINISH}
                unknown = sorted(set(available) - self._tool_names)
            if unknown:
                raise ValueError(f"available= names no tool of this session: {unknown}; "
                                 f"its tools are {sorted(self._tool_names - {FINISH})}")
        return self.policy.rank(self.task, self.history, self.tools, available=available)
