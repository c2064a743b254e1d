"""What training leaves on disk: policy directories, resumable checkpoints, and warm starts.

* A **policy directory** holds ``policy.safetensors`` (the acting networks) and ``policy.json``
  (algorithm, sizes, encoder, the tools seen in training). Loading never unpickles code, and
  ``policy.json`` is untrusted input: :class:`PolicyMeta` validates it, with bounds, before
  anything is allocated. Data paths recorded in it are never read here.
* A **checkpoint** (``OUT/checkpoint``) holds every network, the optimiser and the random
  generators, so a run killed mid-training resumes bit-identically. The one before it is kept
  (``OUT/checkpoint.previous``): a damaged newest checkpoint falls back to it, with a warning.

Weights are flattened to ``"<module>.<parameter>"`` keys and back by one pair of functions.
A policy's two files are replaced together (see :func:`save_policy`), a checkpoint as a whole
directory: a crash leaves the old version or the new one, never halves that disagree.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from safetensors import SafetensorError
from safetensors.torch import load, load_file, save_file

from evoharness_agent.encoding.state import STATE_LAYOUT_VERSION, state_dim
from evoharness_agent.learning.algorithms import ALGORITHMS, Algorithm, Dims, ToolInputs, make_algorithm
from evoharness_agent.learning.networks import NetworkConfig, ToolScorer
from evoharness_agent.runtime import set_creation_mode

__all__ = [
    "CHECKPOINT",
    "DEFAULT_POLICY",
    "POLICY_META",
    "POLICY_WEIGHTS",
    "PREVIOUS_CHECKPOINT",
    "CheckpointError",
    "CheckpointWarning",
    "PolicyFormatError",
    "PolicyMeta",
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
    "weights_sha256",
]

DEFAULT_POLICY = "default"
"""The name that stands for the general policy shipped inside the package."""
POLICY_WEIGHTS = "policy.safetensors"
POLICY_META = "policy.json"
CHECKPOINT = "checkpoint"
PREVIOUS_CHECKPOINT = "checkpoint.previous"
_PENDING = ".policy.pending"
"""A complete new pair of policy files whose move into place was interrupted (see :func:`save_policy`)."""
_STAGING = ".policy.staging-"

_MAX_META_BYTES = 64 * 2**20
"""policy.json is read no further: the shipped one is 150 KB; a device file would never end."""
_MAX_PARAMETERS = 50_000_000
"""Refuse metadata whose networks would be larger (200 MB of float32) before allocating them."""


class PolicyFormatError(ValueError):
    """A policy directory's files are missing, malformed or out of bounds; the message names file and field."""


class CheckpointError(ValueError):
    """No usable checkpoint to resume from, or one written by a run with other settings."""


class CheckpointWarning(UserWarning):
    """The newest checkpoint was damaged: training resumes from the previous one."""


class _NetworkMeta(BaseModel):
    """Bounds of :class:`~evoharness_agent.learning.networks.NetworkConfig` as stored in policy.json."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

    hidden: int = Field(default=NetworkConfig.hidden, ge=1, le=4096)
    layers: int = Field(default=NetworkConfig.layers, ge=0, le=16)
    tool_bias: bool = NetworkConfig.tool_bias
    dropout: float = Field(default=NetworkConfig.dropout, ge=0.0, lt=1.0)
    similarity_scale: float = Field(default=NetworkConfig.similarity_scale, ge=-1e4, le=1e4)
    pair_hidden: int = Field(default=NetworkConfig.pair_hidden, ge=0, le=4096)
    prerequisite_penalty: float = Field(default=NetworkConfig.prerequisite_penalty, ge=0.0, le=1e4)
    prerequisite_finish_penalty: float = Field(default=NetworkConfig.prerequisite_finish_penalty, ge=0.0, le=1e4)
    prerequisite_fit_threshold: float = Field(default=NetworkConfig.prerequisite_fit_threshold, ge=-1.0, le=1.0)
    asked_provider_margin: float = Field(default=NetworkConfig.asked_provider_margin, ge=0.0, le=1e4)
    open_part_finish_penalty: float = Field(default=NetworkConfig.open_part_finish_penalty, ge=0.0, le=1e4)
    open_part_threshold: float = Field(default=NetworkConfig.open_part_threshold, ge=-2.0, le=2.0)
    open_part_asked_threshold: float | None = Field(default=NetworkConfig.open_part_asked_threshold, ge=-2.0, le=2.0)
    asked_action_finish_penalty: float = Field(default=NetworkConfig.asked_action_finish_penalty, ge=0.0, le=1e4)
    retry_penalty: float = Field(default=NetworkConfig.retry_penalty, ge=0.0, le=1e4)
    reads_listed_bonus: float = Field(default=NetworkConfig.reads_listed_bonus, ge=0.0, le=1e4)
    first_similarity_bonus: float = Field(default=NetworkConfig.first_similarity_bonus, ge=0.0, le=1e4)
    best_fit_called_bonus: float = Field(default=NetworkConfig.best_fit_called_bonus, ge=0.0, le=1e4)
    tower_rank_weight: float = Field(default=NetworkConfig.tower_rank_weight, ge=0.0, le=1.0)


class _CalibrationMeta(BaseModel):
    """The temperature fit on the validation split (other calibration figures are kept as they are)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    temperature: float = Field(default=1.0, gt=0.0, le=1e3)


class PolicyMeta(BaseModel):
    """The schema of ``policy.json``: every field that sizes a network or a table is bounded.

    Extra top-level keys (``config``, ``metrics``, later additions) are kept but never acted on.
    """

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    algorithm: str
    params: dict[str, Any] = Field(default_factory=dict, max_length=64)
    network: _NetworkMeta
    encoder: str = Field(min_length=1, max_length=256)
    step_encoder: str | None = Field(default=None, min_length=1, max_length=256)
    max_seq_length: int = Field(ge=1, le=8192)
    history_window: int = Field(ge=0, le=64)
    state_layout: int = 1
    state_dim: int = Field(ge=1, le=1_000_000)
    tool_dim: int = Field(ge=1, le=16_384)
    known_tools: list[Annotated[str, Field(max_length=1024)]] = Field(min_length=1, max_length=1_000_000)
    acting: list[str] = Field(min_length=1, max_length=16)
    calibration: _CalibrationMeta | None = None
    config: dict[str, Any] = Field(default_factory=dict)

    @field_validator("params")
    @classmethod
    def _scalar_params(cls, params: dict[str, Any]) -> dict[str, Any]:
        """Algorithm settings are numbers, flags or names; anything nested is not ours."""
        for key, value in params.items():
            finite = not isinstance(value, float) or math.isfinite(value)
            if not isinstance(value, bool | int | float | str) or not finite:
                raise ValueError(f"field 'params.{key}': expected a finite number, a flag or a name, got {value!r:.80}")
        return params

    @model_validator(mode="after")
    def _consistent(self) -> PolicyMeta:
        """Check the algorithm exists and the sizes agree with each other and stay allocatable."""
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"field 'algorithm': unknown algorithm {self.algorithm!r}; one of {sorted(ALGORITHMS)}")
        expected = state_dim(self.tool_dim, self.history_window)
        if self.state_dim != expected:
            raise ValueError(f"field 'state_dim': {self.state_dim} does not match tool_dim {self.tool_dim} and "
                             f"history_window {self.history_window} (expected {expected})")
        hidden = self.network.hidden
        parameters = (self.state_dim + self.tool_dim) * hidden + self.network.layers * hidden * hidden
        if parameters > _MAX_PARAMETERS:
            raise ValueError(f"field 'network': about {parameters:,} parameters per tower, more than the "
                             f"{_MAX_PARAMETERS:,} a policy may have")
        return self


def _format_errors(source: Path, error: ValidationError) -> str:
    """Return ``"FILE: field 'a.b': why"`` for the first few problems pydantic found."""
    parts = []
    for problem in error.errors()[:3]:
        location = ".".join(str(part) for part in problem["loc"])
        message = problem["msg"].removeprefix("Value error, ")
        parts.append(message if message.startswith("field '") or not location
                     else f"field '{location}': {message}")
    more = f" (and {error.error_count() - 3} more)" if error.error_count() > 3 else ""
    return f"{source}: " + "; ".join(parts) + more


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


def weights_sha256(path: str | Path) -> str:
    """Return the sha256 of a policy folder's weights (``"default"``: the shipped one's): which policy it is."""
    with _policy_file(resolve_policy_dir(path), POLICY_WEIGHTS).open("rb") as weights:
        return hashlib.file_digest(weights, "sha256").hexdigest()


def _policy_file(directory: Path, name: str) -> Path:
    """Return where ``name`` of a policy directory is read from: an interrupted save's new copy, if any."""
    pending = directory / _PENDING / name
    return pending if pending.exists() else directory / name


def _read_bounded(path: Path, limit: int) -> bytes:
    """Read at most ``limit`` bytes of ``path``; a longer file is a format error, not a memory exhaustion."""
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise PolicyFormatError(f"{path}: larger than {limit // 2**20} MB; not a policy file")
    return data


def _parse_meta(source: Path, data: bytes) -> dict[str, Any]:
    """Validate policy.json bytes with :class:`PolicyMeta`; return the metadata dict."""
    try:
        raw = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise PolicyFormatError(f"{source}: not UTF-8 text (byte {error.start})") from None
    except json.JSONDecodeError as error:
        raise PolicyFormatError(f"{source}: line {error.lineno}: not valid JSON ({error.msg})") from None
    except RecursionError:
        raise PolicyFormatError(f"{source}: nested too deeply") from None
    if not isinstance(raw, dict):
        raise PolicyFormatError(f"{source}: expected a JSON object, got {type(raw).__name__}")
    layout = raw.get("state_layout", 1)
    if isinstance(layout, int) and layout != STATE_LAYOUT_VERSION:
        raise PolicyFormatError(f"{source}: field 'state_layout': the policy was trained on state layout {layout}, "
                                f"this version of evoharness-agent builds layout {STATE_LAYOUT_VERSION}; "
                                "train it again on its logs")
    try:
        PolicyMeta.model_validate(raw)
    except ValidationError as error:
        raise PolicyFormatError(_format_errors(source, error)) from None
    return raw


def read_policy_meta(path: str | Path) -> dict[str, Any]:
    """Return a policy directory's validated metadata, or raise a clear error when ``path`` is not one of ours.

    Raises:
        FileNotFoundError: ``path`` has no ``policy.json``.
        PolicyFormatError: ``policy.json`` is not valid JSON, misses a field, or has a value out of
            bounds (an absurd size, a NaN temperature, another state layout...); the message names
            the file and the field.

    """
    directory = resolve_policy_dir(path)
    meta_file = _policy_file(directory, POLICY_META)
    if not meta_file.exists():
        raise FileNotFoundError(f"{path}: not a policy directory (no {POLICY_META})")
    return _parse_meta(meta_file, _read_bounded(meta_file, _MAX_META_BYTES))


def build_algorithm(meta: Mapping[str, Any], tool_embeddings: torch.Tensor) -> Algorithm:
    """Rebuild the (untrained) algorithm object that policy metadata describes."""
    dims = Dims(int(meta["state_dim"]), int(meta["tool_dim"]), max(1, len(meta["known_tools"])))
    return make_algorithm(meta["algorithm"], meta.get("params", {}), dims, NetworkConfig(**meta["network"]),
                          ToolInputs(tool_embeddings, None))


def _fsync_dir(path: Path) -> None:
    """Make a directory's entries (renames, new files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    """Fsync every file of a directory, then the directory itself."""
    for entry in path.iterdir():
        with open(entry, "rb") as handle:
            os.fsync(handle.fileno())
    _fsync_dir(path)


def _finish_pending(directory: Path) -> None:
    """Move the files of an interrupted (but committed) save into place and drop its folder."""
    pending = directory / _PENDING
    if not pending.is_dir():
        return
    for name in (POLICY_WEIGHTS, POLICY_META):
        if (pending / name).exists():
            os.replace(pending / name, directory / name)
    _fsync_dir(directory)
    pending.rmdir()


def save_policy(path: str | Path, algorithm: Algorithm, meta: Mapping[str, Any]) -> None:
    """Write ``policy.safetensors`` and ``policy.json`` for the algorithm's acting modules, as one update.

    Both files are written and fsynced in a staging folder inside ``path``, which is then
    renamed to ``.policy.pending`` (one atomic rename: the commit point), and its files are
    moved into place. A crash before the commit leaves the old policy; a crash after it leaves
    a complete new pair in ``.policy.pending``, which readers here prefer and the next save
    moves into place. So the weights and the metadata a reader sees always belong together.
    (The folder itself is not swapped because a training output also holds checkpoints and logs.)
    """
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    _finish_pending(directory)
    for stale in directory.glob(f"{_STAGING}*"):  # left by a crash before a commit
        shutil.rmtree(stale, ignore_errors=True)
    acting = {name: module.state_dict() for name, module in algorithm.acting_modules().items()}
    tensors = {key: value.float() for key, value in flatten_modules(acting).items()}
    staging = Path(tempfile.mkdtemp(dir=directory, prefix=_STAGING))
    try:
        save_file(tensors, str(staging / POLICY_WEIGHTS))
        set_creation_mode(staging / POLICY_WEIGHTS)
        (staging / POLICY_META).write_bytes(
            json.dumps({**meta, "acting": list(algorithm.acting)}, indent=2).encode())
        _fsync_tree(staging)
        os.rename(staging, directory / _PENDING)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _fsync_dir(directory)
    _finish_pending(directory)


def _read_weights(weights_file: Path) -> dict[str, torch.Tensor]:
    """Read a policy's safetensors file; a damaged file is a :class:`PolicyFormatError`."""
    if not weights_file.is_file():
        raise PolicyFormatError(f"{weights_file}: missing (the policy directory is incomplete)")
    try:
        return load(_read_bounded(weights_file, 4 * _MAX_PARAMETERS * 8))
    except SafetensorError as error:
        raise PolicyFormatError(f"{weights_file}: not a readable safetensors file ({error})") from None


def _load_acting(directory: Path, meta: Mapping[str, Any], algorithm: Algorithm) -> None:
    """Load the acting modules' weights into ``algorithm``, naming the file and module on a mismatch."""
    weights_file = _policy_file(directory, POLICY_WEIGHTS)
    state = unflatten_modules(_read_weights(weights_file))
    for name in meta["acting"]:
        if name not in algorithm.modules:
            raise PolicyFormatError(f"{directory / POLICY_META}: field 'acting': {meta['algorithm']} has no "
                                    f"network {name!r}; it has {sorted(algorithm.modules)}")
        if name not in state:
            raise PolicyFormatError(f"{weights_file}: no weights for network {name!r}")
        try:
            algorithm.modules[name].load_state_dict(state[name])
        except RuntimeError as error:
            detail = " ".join(str(error).split())[:500]
            raise PolicyFormatError(f"{weights_file}: the weights of {name!r} do not fit the sizes in "
                                    f"{POLICY_META}: {detail}") from None


def load_policy(path: str | Path, device: str) -> tuple[Algorithm, dict[str, Any]]:
    """Load a policy directory's acting networks onto ``device``; return (algorithm, metadata).

    Raises:
        FileNotFoundError: ``path`` is not a policy directory.
        PolicyFormatError: a file is damaged, out of bounds, or the two files disagree.

    """
    meta = read_policy_meta(path)
    directory = resolve_policy_dir(path)
    try:
        algorithm = build_algorithm(meta, torch.zeros((0, int(meta["tool_dim"]))))
    except (TypeError, ValueError) as error:  # settings the algorithm does not have, or of the wrong kind
        raise PolicyFormatError(f"{directory / POLICY_META}: field 'params': {error}") from None
    _load_acting(directory, meta, algorithm)
    for module in algorithm.modules.values():
        if isinstance(module, ToolScorer):
            module.freeze_for_acting()  # a policy acts: its scorers reuse their tool side between decisions
        else:
            module.requires_grad_(False)
    return algorithm.to(device), meta


def initialise_from(algorithm: Algorithm, init: str | Path, known_tools: list[str]) -> None:
    """Copy matching networks from a trained policy; per-tool biases are matched by tool name.

    A Q-network initialises both of IQL's Q-networks, an IQL policy BCQ's imitation network,
    and every target network starts equal to its source.
    """
    meta = read_policy_meta(init)
    state = unflatten_modules(_read_weights(_policy_file(resolve_policy_dir(init), POLICY_WEIGHTS)))
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
    """Write the checkpoint into a fresh directory, then swap it in; the one before becomes the previous."""
    final, tmp, previous = out / CHECKPOINT, out / f".{CHECKPOINT}.tmp", out / PREVIOUS_CHECKPOINT
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
    _fsync_tree(tmp)
    if final.exists():
        shutil.rmtree(previous, ignore_errors=True)
        final.rename(previous)
    tmp.rename(final)
    _fsync_dir(out)


# What makes a checkpoint resumable by this run: the shapes of its networks and what it learns from.
_SAME_RUN_KEYS = ("algorithm", "params", "network", "encoder", "step_encoder", "max_seq_length", "history_window",
                  "state_layout", "state_dim", "tool_dim", "known_tools")
_SAME_RUN_CONFIG = ("data", "rewards", "algorithm", "model")
# How the data is embedded and held, not what it is: a resume may change these.
_HOW_NOT_WHAT = {"data": ("encode_processes", "mmap_embeddings", "encode_ray_workers", "ray_address")}


def _run_section(config: Mapping[str, Any], section: str) -> Any:
    """Return a config section without the settings that do not change what a run learns."""
    value = config.get(section)
    if isinstance(value, Mapping):
        return {key: item for key, item in value.items() if key not in _HOW_NOT_WHAT.get(section, ())}
    return value


def _differences(saved: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """Name what differs between a checkpoint's run metadata and this run's."""
    found = []
    for key in _SAME_RUN_KEYS:
        if saved.get(key) != wanted.get(key):
            if key == "known_tools":
                found.append(f"the tools seen in the data ({len(saved.get(key) or [])} vs {len(wanted[key])} "
                             "tools: other data)")
            else:
                found.append(f"{key} ({saved.get(key)!r} there, {wanted.get(key)!r} now)")
    saved_config, wanted_config = saved.get("config") or {}, wanted.get("config") or {}
    for section in _SAME_RUN_CONFIG:
        if section in wanted_config and _run_section(saved_config, section) != _run_section(wanted_config, section):
            found.append(f"the config's {section} section")
    return found


def _read_checkpoint(candidate: Path) -> tuple[int, dict[str, Any], dict[str, torch.Tensor], Any]:
    """Read one checkpoint folder whole: (step, meta, tensors, optimiser state); raise why it is unusable."""
    try:
        info = json.loads((candidate / "state.json").read_text())
        step, meta = int(info["step"]), info["meta"]
        if step < 0 or not isinstance(meta, dict):
            raise ValueError("bad step or meta")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"{candidate / 'state.json'}: unreadable ({type(error).__name__}: {error})") from None
    try:
        tensors = load_file(str(candidate / "model.safetensors"))
    except (OSError, SafetensorError) as error:
        raise CheckpointError(f"{candidate / 'model.safetensors'}: unreadable ({error})") from None
    if "rng" not in tensors:
        raise CheckpointError(f"{candidate / 'model.safetensors'}: no generator state")
    try:
        optimizer = torch.load(candidate / "optimizer.pt", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as error:
        raise CheckpointError(f"{candidate / 'optimizer.pt'}: unreadable ({type(error).__name__}: {error})") from None
    return step, meta, tensors, optimizer


def load_checkpoint(out: Path, algorithm: Algorithm, generator: torch.Generator,
                    meta: Mapping[str, Any] | None = None) -> int:
    """Restore the newest usable checkpoint; return its step (0 when there is none).

    A damaged newest checkpoint (truncated weights or optimiser, empty ``state.json``) falls
    back to the previous one with a :class:`CheckpointWarning`. With ``meta`` (this run's
    policy metadata), a checkpoint written with another algorithm, other sizes or other data
    is refused before any weight is loaded.

    Raises:
        CheckpointError: checkpoints exist but none is usable, or they belong to another run.

    """
    present = [c for c in (out / CHECKPOINT, out / PREVIOUS_CHECKPOINT) if c.is_dir()]
    problems: list[str] = []
    for candidate in present:
        try:
            step, saved_meta, tensors, optimizer = _read_checkpoint(candidate)
        except CheckpointError as error:
            problems.append(str(error))
            continue
        if meta is not None and (differences := _differences(saved_meta, meta)):
            raise CheckpointError(f"{candidate}: cannot resume: the checkpoint was written by a run with other "
                                  f"settings: {'; '.join(differences)}. Train into another --out, or without --resume")
        generator.set_state(tensors.pop("rng"))
        if "torch_rng" in tensors:
            torch.set_rng_state(tensors.pop("torch_rng"))
        if "cuda_rng" in tensors:
            cuda_rng = tensors.pop("cuda_rng")
            if generator.device.type == "cuda":
                torch.cuda.set_rng_state(cuda_rng, generator.device)
        state: dict[str, Any] = dict(unflatten_modules(tensors))
        state["optimizer"] = optimizer
        try:
            algorithm.load_state_dict(state)
        except (RuntimeError, KeyError, ValueError) as error:
            detail = " ".join(str(error).split())[:500]
            raise CheckpointError(f"{candidate}: does not fit this run's networks: {detail}") from None
        if problems:
            warnings.warn(f"{'; '.join(problems)}: resuming from the previous checkpoint {candidate} (step {step})",
                          CheckpointWarning, stacklevel=2)
        return step
    if problems:
        raise CheckpointError(f"no usable checkpoint in {out}: {'; '.join(problems)}")
    return 0
