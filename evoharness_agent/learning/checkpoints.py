"""What training leaves on disk: policy directories, resumable checkpoints, and warm starts.

* A **policy directory** holds ``policy.safetensors`` (the acting networks) and ``policy.json``
  (algorithm, sizes, encoder, the tools seen in training). Loading never unpickles code.
* A **checkpoint** (``OUT/checkpoint``) holds every network, the optimiser and the random
  generators, so a run killed mid-training resumes bit-identically.

Weights are flattened to ``"<module>.<parameter>"`` keys and back by one pair of functions.
Every file is replaced atomically: a crash leaves the old version or the new one.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from evoharness_agent.encoding.state import STATE_LAYOUT_VERSION
from evoharness_agent.learning.algorithms import Algorithm, Dims, ToolInputs, make_algorithm
from evoharness_agent.learning.networks import NetworkConfig
from evoharness_agent.runtime import atomic_write_bytes, atomic_write_with

__all__ = [
    "CHECKPOINT",
    "DEFAULT_POLICY",
    "POLICY_META",
    "POLICY_WEIGHTS",
    "build_algorithm",
    "flatten_modules",
    "initialise_from",
    "load_checkpoint",
    "load_policy",
    "read_policy_meta",
    "resolve_policy_dir",
    "save_checkpoint",
    "save_policy",
    "shipped_policy_dir",
    "unflatten_modules",
]

DEFAULT_POLICY = "default"
"""The name that stands for the general policy shipped inside the package."""
POLICY_WEIGHTS = "policy.safetensors"
POLICY_META = "policy.json"
CHECKPOINT = "checkpoint"


def flatten_modules(state: Mapping[str, Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Return ``{module: state_dict}`` as one flat ``"<module>.<parameter>"`` map, contiguous on the CPU."""
    return {f"{name}.{key}": value.detach().cpu().contiguous()
            for name, module_state in state.items() for key, value in module_state.items()}


def unflatten_modules(tensors: Mapping[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """Invert :func:`flatten_modules`: ``{module: {parameter: tensor}}``."""
    state: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        module, _, parameter = key.partition(".")
        state.setdefault(module, {})[parameter] = value
    return state


def shipped_policy_dir() -> Path:
    """Return the folder of the general policy shipped inside the package (package data)."""
    return Path(str(resources.files("evoharness_agent").joinpath("trained", DEFAULT_POLICY)))


def resolve_policy_dir(path: str | Path) -> Path:
    """Return ``path`` as a policy folder; ``"default"`` (when no such folder exists here) is the shipped one."""
    if str(path) == DEFAULT_POLICY and not Path(path).is_dir():
        return shipped_policy_dir()
    return Path(path)


def read_policy_meta(path: str | Path) -> dict[str, Any]:
    """Return a policy directory's metadata, or raise a clear error when ``path`` is not one of ours.

    Raises:
        FileNotFoundError: ``path`` has no ``policy.json``.
        ValueError: the policy was trained on another state layout (it would read states wrongly).

    """
    meta_file = resolve_policy_dir(path) / POLICY_META
    if not meta_file.exists():
        raise FileNotFoundError(f"{path}: not a policy directory (no {POLICY_META})")
    meta = json.loads(meta_file.read_text())
    layout = meta.get("state_layout", 1)
    if layout != STATE_LAYOUT_VERSION:
        raise ValueError(f"{meta_file}: field 'state_layout': the policy was trained on state layout {layout}, "
                         f"this version of evoharness-agent builds layout {STATE_LAYOUT_VERSION}; "
                         "train it again on its logs")
    return meta


def build_algorithm(meta: Mapping[str, Any], tool_embeddings: torch.Tensor) -> Algorithm:
    """Rebuild the (untrained) algorithm object that policy metadata describes."""
    dims = Dims(int(meta["state_dim"]), int(meta["tool_dim"]), max(1, len(meta["known_tools"])))
    return make_algorithm(meta["algorithm"], meta.get("params", {}), dims, NetworkConfig(**meta["network"]),
                          ToolInputs(tool_embeddings, None))


def save_policy(path: str | Path, algorithm: Algorithm, meta: Mapping[str, Any]) -> None:
    """Write ``policy.safetensors`` and ``policy.json`` for the algorithm's acting modules."""
    path = Path(path)
    acting = {name: module.state_dict() for name, module in algorithm.acting_modules().items()}
    tensors = {key: value.float() for key, value in flatten_modules(acting).items()}
    atomic_write_with(path / POLICY_WEIGHTS, lambda tmp: save_file(tensors, tmp))
    atomic_write_bytes(path / POLICY_META, json.dumps({**meta, "acting": list(algorithm.acting)}, indent=2).encode())


def load_policy(path: str | Path, device: str) -> tuple[Algorithm, dict[str, Any]]:
    """Load a policy directory's acting networks onto ``device``; return (algorithm, metadata)."""
    meta = read_policy_meta(path)
    algorithm = build_algorithm(meta, torch.zeros((0, int(meta["tool_dim"]))))
    state = unflatten_modules(load_file(str(resolve_policy_dir(path) / POLICY_WEIGHTS), device="cpu"))
    for name in meta["acting"]:
        algorithm.modules[name].load_state_dict(state[name])
    return algorithm.to(device), meta


def initialise_from(algorithm: Algorithm, init: str | Path, known_tools: list[str]) -> None:
    """Copy matching networks from a trained policy; per-tool biases are matched by tool name.

    A Q-network initialises both of IQL's Q-networks, an IQL policy BCQ's imitation network,
    and every target network starts equal to its source.
    """
    meta = read_policy_meta(init)
    state = unflatten_modules(load_file(str(resolve_policy_dir(init) / POLICY_WEIGHTS)))
    old_rows = {name: i for i, name in enumerate(meta["known_tools"])}
    for source in meta["acting"]:
        targets = [source] + (["q1", "q2"] if source == "q" else []) + (["imitation"] if source == "policy" else [])
        for target in (t for t in targets if t in algorithm.modules):
            module = algorithm.modules[target]
            weights = dict(state[source])
            if "bias.weight" in weights and "bias.weight" in module.state_dict():
                bias = module.state_dict()["bias.weight"].clone()
                for row, name in enumerate(known_tools):
                    if name in old_rows:
                        bias[row] = weights["bias.weight"][old_rows[name]]
                weights["bias.weight"] = bias
            module.load_state_dict(weights)
            if f"{target}_target" in algorithm.modules:
                algorithm.modules[f"{target}_target"].load_state_dict(weights)


def save_checkpoint(out: Path, step: int, algorithm: Algorithm, generator: torch.Generator,
                    meta: Mapping[str, Any]) -> None:
    """Write the checkpoint into a fresh directory, then swap it in (crash-safe)."""
    final, tmp, old = out / CHECKPOINT, out / f".{CHECKPOINT}.tmp", out / f".{CHECKPOINT}.old"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    state = algorithm.state_dict()
    optimizer = state.pop("optimizer", None)
    tensors = flatten_modules(state)
    tensors["rng"] = generator.get_state()
    # Dropout draws from torch's global generators, not ``generator``: save them too, or a
    # resumed run diverges from an uninterrupted one.
    tensors["torch_rng"] = torch.get_rng_state()
    if generator.device.type == "cuda":
        tensors["cuda_rng"] = torch.cuda.get_rng_state(generator.device)
    save_file(tensors, str(tmp / "model.safetensors"))
    torch.save(optimizer, tmp / "optimizer.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, "meta": meta}))
    for f in tmp.iterdir():
        with open(f, "rb") as handle:
            os.fsync(handle.fileno())
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(out: Path, algorithm: Algorithm, generator: torch.Generator) -> int:
    """Restore the newest complete checkpoint; return its step (0 when there is none)."""
    for candidate in (out / CHECKPOINT, out / f".{CHECKPOINT}.old"):
        if (candidate / "state.json").exists():
            tensors = load_file(str(candidate / "model.safetensors"))
            generator.set_state(tensors.pop("rng"))
            if "torch_rng" in tensors:
                torch.set_rng_state(tensors.pop("torch_rng"))
            if "cuda_rng" in tensors:
                cuda_rng = tensors.pop("cuda_rng")
                if generator.device.type == "cuda":
                    torch.cuda.set_rng_state(cuda_rng, generator.device)
            state: dict[str, Any] = dict(unflatten_modules(tensors))
            state["optimizer"] = torch.load(candidate / "optimizer.pt", weights_only=True)
            algorithm.load_state_dict(state)
            return int(json.loads((candidate / "state.json").read_text())["step"])
    return 0
