"""`ToolPolicy`: a trained policy that ranks the tools available at a step.

A policy directory holds ``policy.safetensors`` (the acting networks) and ``policy.json``
(algorithm, sizes, encoder, the tools seen in training). Loading never unpickles code.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from evoharness_agent.algorithms import Dims, ToolInputs, make_algorithm
from evoharness_agent.dataset import N_FIXED_TEXTS, N_STATE_FEATURES, finish_spec, state_parts
from evoharness_agent.encoding import StateEncoder, step_text
from evoharness_agent.networks import NetworkConfig
from evoharness_agent.schema import FINISH, Step, ToolSpec

__all__ = ["PolicySession", "ToolPolicy", "ToolScore", "as_tool_spec"]

POLICY_WEIGHTS = "policy.safetensors"
POLICY_META = "policy.json"


@dataclass(frozen=True)
class ToolScore:
    """One ranked tool: its name, raw score and probability among the available tools."""

    tool: str
    score: float
    probability: float


def as_tool_spec(tool: Any) -> ToolSpec:
    """Accept a ToolSpec, a LangChain tool, an OpenAI function dict or a name."""
    if isinstance(tool, ToolSpec):
        return tool
    if isinstance(tool, str):
        return finish_spec() if tool == FINISH else ToolSpec(name=tool)
    if isinstance(tool, dict):
        function = tool.get("function", tool)
        return ToolSpec(name=function["name"], description=function.get("description", ""),
                        parameters=function.get("parameters") or {"type": "object"})
    if hasattr(tool, "name") and hasattr(tool, "description"):
        schema = getattr(tool, "args", None)
        parameters = {"type": "object", "properties": schema} if isinstance(schema, dict) else None
        return ToolSpec(name=tool.name, description=tool.description or "", parameters=parameters)
    raise TypeError(f"cannot use {type(tool).__name__} as a tool: give a ToolSpec, BaseTool or dict")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class ToolPolicy:
    """Ranks tools for a (task, history) state with a trained offline-RL policy."""

    def __init__(self, algorithm: Any, meta: dict[str, Any], encoder: StateEncoder,
                 device: str = "cpu") -> None:
        """Wrap a trained algorithm; prefer :meth:`load`."""
        self.algorithm = algorithm
        self.meta = meta
        self.encoder = encoder
        self.device = device
        self.history_window = int(meta["history_window"])
        self.known_tools = {name: i for i, name in enumerate(meta["known_tools"])}
        self._lock = threading.Lock()
        algorithm.set_training(False)

    @classmethod
    def load(cls, path: str | Path, *, encoder: StateEncoder | None = None,
             device: str | None = None) -> ToolPolicy:
        """Load a policy directory written by :meth:`save` (safetensors, no pickle)."""
        path = Path(path)
        meta_file = path / POLICY_META
        if not meta_file.exists():
            raise FileNotFoundError(f"{path}: not a policy directory (no {POLICY_META})")
        meta = json.loads(meta_file.read_text())
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        algorithm = build_algorithm(meta, torch.zeros((0, int(meta["tool_dim"]))))
        weights = load_file(str(path / POLICY_WEIGHTS), device="cpu")
        for name in meta["acting"]:
            prefix = f"{name}."
            algorithm.modules[name].load_state_dict(
                {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)})
        algorithm.to(device)
        encoder = encoder or StateEncoder(meta["encoder"], max_seq_length=int(meta["max_seq_length"]))
        return cls(algorithm, meta, encoder, device)

    def save(self, path: str | Path) -> None:
        """Write the acting networks and metadata to a directory, atomically per file."""
        save_policy(path, self.algorithm, self.meta)

    def _tool_inputs(self, specs: Sequence[ToolSpec]) -> ToolInputs:
        """Embed tools (cached) and look up their bias rows."""
        vectors = torch.from_numpy(self.encoder.embed([s.text() for s in specs])).to(self.device)
        ids = torch.tensor([self.known_tools.get(s.name, -1) for s in specs], device=self.device)
        return ToolInputs(vectors, ids)

    def _state_inputs(self, states: Sequence[tuple[str, Sequence[Step]]],
                      specs: Sequence[ToolSpec]) -> tuple[torch.Tensor, torch.Tensor]:
        """Build state vectors and per-tool pair features, embedding each text once."""
        by_name = {spec.name: spec for spec in specs}
        names = [spec.name for spec in specs]
        layout, texts, pairs = [], [], []
        for task, history in states:
            parts = state_parts(task, history, self.history_window)
            previous = parts.previous_tool
            previous_text = (by_name.get(previous) or ToolSpec(name=previous)).text() if previous else None
            rows = []
            for text in [parts.request, previous_text, task, *parts.history]:
                rows.append(None if text is None else len(texts))
                texts += [] if text is None else [text]
            layout.append((rows, parts.features))
            pairs.append(parts.pair_features(names))
        table = self.encoder.embed(texts) if texts else np.zeros((0, 1), dtype=np.float32)
        dim = int(self.meta["tool_dim"])
        width = dim * (N_FIXED_TEXTS + self.history_window) + N_STATE_FEATURES
        out = np.zeros((len(states), width), dtype=np.float32)
        for i, (rows, features) in enumerate(layout):
            for slot, row in enumerate(rows):
                if row is not None:
                    out[i, slot * dim : (slot + 1) * dim] = table[row]
            out[i, -N_STATE_FEATURES:] = features
        pair_tensor = torch.tensor(pairs, dtype=torch.float32).reshape(len(states), len(names), -1)
        return torch.from_numpy(out).to(self.device), pair_tensor.to(self.device)

    @torch.no_grad()
    def score_matrix(self, states: Sequence[tuple[str, Sequence[Step]]], tools: Sequence[Any], *,
                     include_finish: bool = True) -> tuple[list[str], np.ndarray]:
        """Return the tool names (FINISH last) and a ``(len(states), n_tools)`` score matrix."""
        specs = [spec for spec in map(as_tool_spec, tools) if spec.name != FINISH]
        if include_finish:
            specs.append(finish_spec())
        tool_inputs, state_inputs = self._tool_inputs(specs), self._state_inputs(states, specs)
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
        names, scores = self.score_matrix(states, tools, include_finish=include_finish)
        ranked = []
        for row, allowed in zip(scores, available or [None] * len(states), strict=True):
            keep = [j for j, name in enumerate(names)
                    if allowed is None or name in allowed or name == FINISH]
            kept = row[keep]
            probabilities = np.exp(kept - kept.max())
            probabilities /= probabilities.sum()
            order = np.argsort(-kept, kind="stable")
            ranked.append([ToolScore(names[keep[j]], float(kept[j]), float(probabilities[j])) for j in order])
        return ranked

    def rank(self, task: str, history: Sequence[Step] = (), tools: Sequence[Any] = (), *,
             available: Collection[str] | None = None, include_finish: bool = True) -> list[ToolScore]:
        """Rank the available tools (and FINISH) for one state, best first."""
        return self.rank_batch([(task, history)], tools, available=[available],
                               include_finish=include_finish)[0]

    def session(self, task: str, tools: Sequence[Any]) -> PolicySession:
        """Start an incremental session for one run: each new step is embedded once."""
        return PolicySession(self, task, tools)


class PolicySession:
    """The policy's view of one live run: add steps as they happen, rank at each decision."""

    def __init__(self, policy: ToolPolicy, task: str, tools: Sequence[Any]) -> None:
        """Embed the task now; steps are embedded when :meth:`observe` sees them."""
        self.policy = policy
        self.task = task
        self.tools = list(tools)
        self.history: list[Step] = []
        policy.encoder.embed([task])

    def observe(self, step: Step) -> None:
        """Record a step (tool call, reply or user message) and embed its text once."""
        self.history.append(step)
        policy_text = step.content if step.kind == "user" else step_text(step)
        self.policy.encoder.embed([policy_text])

    def rank(self, available: Collection[str] | None = None) -> list[ToolScore]:
        """Rank the tools for the current state."""
        return self.policy.rank(self.task, self.history, self.tools, available=available)


def build_algorithm(meta: dict[str, Any], tool_embeddings: torch.Tensor) -> Any:
    """Rebuild the algorithm object described by policy metadata."""
    dims = Dims(int(meta["state_dim"]), int(meta["tool_dim"]), max(1, len(meta["known_tools"])))
    network = NetworkConfig(**meta["network"])
    return make_algorithm(meta["algorithm"], meta.get("params", {}), dims, network,
                          ToolInputs(tool_embeddings, None))


def save_policy(path: str | Path, algorithm: Any, meta: dict[str, Any]) -> None:
    """Write ``policy.safetensors`` and ``policy.json`` for the algorithm's acting modules."""
    path = Path(path)
    tensors = {f"{name}.{key}": value.detach().float().cpu().contiguous()
               for name, module in algorithm.acting_modules().items()
               for key, value in module.state_dict().items()}
    meta = {**meta, "acting": list(algorithm.acting)}
    path.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path, prefix=".weights.")
    os.close(fd)
    save_file(tensors, tmp)
    os.replace(tmp, path / POLICY_WEIGHTS)
    atomic_write_bytes(path / POLICY_META, json.dumps(meta, indent=2).encode())
