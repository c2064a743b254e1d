"""Export a policy to ONNX: the scorer graph, the sentence-encoder graph, optionally INT8.

``export_policy(policy_dir, out)`` writes an exported policy directory (see
:mod:`~evoharness_agent.inference.onnx_runtime`): the policy's own files, ``scorer.onnx``
(``Algorithm.scores`` over states, tool embeddings, tool ids and pair features, batch and
tool count dynamic), ``encoder.onnx`` (the sentence-transformer's own modules, transformer,
mean pooling and normalisation, batch and sequence length dynamic) and ``tokenizer.json``.
Graphs come from ``torch.onnx.export`` (the ``torch.export`` path); ``int8=True`` quantises
the encoder's weights with onnxruntime's dynamic quantisation, per output channel (per tensor
moves embeddings to cosine ~0.96 of fp32; per channel keeps ~0.99). The scorer stays fp32:
it is ~1 MB and well under a millisecond, so INT8 would only add error.

The policy was trained and its temperature fit on the sentence-transformer's torch fp32
embeddings; the metadata says so (``calibrated_on``) beside the encoder's precision, and
:func:`record_parity` adds what the export's embeddings and decisions were measured to differ.
INT8 moves the embeddings: :func:`record_calibration` stores a temperature fit again on the
export's own scores (``evoharness-agent export --int8`` does so on the policy's validation split),
and ``calibrated_on`` then names the export's encoder.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnxruntime
import torch
from onnxruntime.quantization import QuantType, quantize_dynamic
from torch import nn

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.encoding.state import N_PAIR_FEATURES
from evoharness_agent.inference.onnx_runtime import (
    ENCODER_FILE,
    ENCODER_INPUTS,
    ONNX_META,
    SCORER_FILE,
    SCORER_INPUTS,
    SENTENCE_OUTPUT,
    TOKEN_OUTPUT,
    TOKENIZER_FILE,
    onnx_section,
)
from evoharness_agent.learning.algorithms import Algorithm, ToolInputs
from evoharness_agent.learning.checkpoints import POLICY_META, POLICY_WEIGHTS, load_policy, resolve_policy_dir
from evoharness_agent.runtime import atomic_write_bytes, atomic_write_with

__all__ = ["PRECISIONS", "TRAINED_EMBEDDINGS", "export_encoder", "export_policy", "export_scorer",
           "quantize_int8", "record_calibration", "record_parity"]

PRECISIONS = ("fp32", "int8")
TRAINED_EMBEDDINGS = "sentence-transformers/torch-fp32"
"""What a policy's training and calibration embedded its texts with (``calibrated_on`` in the metadata)."""


class _ScoringGraph(nn.Module):
    """``Algorithm.scores`` as a module of explicit tensors: what the scorer graph computes."""

    def __init__(self, algorithm: Algorithm) -> None:
        super().__init__()
        self.algorithm = algorithm
        self.acting = nn.ModuleDict(algorithm.acting_modules())  # registers the weights with the exporter

    def forward(self, states: torch.Tensor, tool_embeddings: torch.Tensor, tool_ids: torch.Tensor,
                pairs: torch.Tensor) -> torch.Tensor:
        """Return the ``(B, N)`` scores."""
        self.algorithm.tools = ToolInputs(tool_embeddings, tool_ids)
        return self.algorithm.scores(states, pairs)


class _SentenceGraph(nn.Module):
    """A sentence-transformer's modules (transformer, pooling, normalisation) on token tensors."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the ``(B, dim)`` sentence embeddings and the ``(B, T, dim)`` token vectors they pool."""
        features = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        out = self.model(features)
        return out[SENTENCE_OUTPUT], out[TOKEN_OUTPUT]


def _to_onnx(module: nn.Module, args: tuple[torch.Tensor, ...], names: tuple[str, ...], outputs: tuple[str, ...],
             dynamic: dict[str, Any]) -> bytes:
    """Export ``module`` with ``torch.onnx.export`` (the torch.export path); return the model's bytes."""
    program = torch.onnx.export(module.eval(), args, input_names=list(names), output_names=list(outputs),
                                dynamic_shapes=dynamic, dynamo=True, verbose=False)
    if program is None:  # only the legacy exporter returns nothing
        raise RuntimeError("torch.onnx.export returned no program")
    return program.model_proto.SerializeToString()


def export_scorer(algorithm: Algorithm, state_dim: int, tool_dim: int, n_known_tools: int) -> bytes:
    """Return the ONNX bytes of ``algorithm.scores`` (eval mode), batch and tool count dynamic.

    Inputs ``states (B, state_dim)``, ``tool_embeddings (N, tool_dim)``, ``tool_ids (N,)`` (int64,
    ``-1``: unknown; dropped from the graph when the scorer has no per-tool bias) and
    ``pairs (B, N, F)``; output ``scores (B, N)``.
    """
    generator = torch.Generator().manual_seed(0)
    batch, tools = 2, 3  # neither 0 nor 1: the exporter would specialise those sizes
    embeddings = torch.nn.functional.normalize(torch.randn(tools, tool_dim, generator=generator), dim=1)
    args = (torch.randn(batch, state_dim, generator=generator), embeddings,
            torch.tensor([0, -1, n_known_tools - 1], dtype=torch.long),
            torch.randint(0, 2, (batch, tools, N_PAIR_FEATURES), generator=generator).float())
    b, n = torch.export.Dim("batch"), torch.export.Dim("tools")
    dynamic = {"states": {0: b}, "tool_embeddings": {0: n}, "tool_ids": {0: n}, "pairs": {0: b, 1: n}}
    saved = algorithm.tools
    algorithm.set_training(False)
    try:
        return _to_onnx(_ScoringGraph(algorithm), args, SCORER_INPUTS, ("scores",), dynamic)
    finally:
        algorithm.tools = saved


def export_encoder(model_name: str, max_seq_length: int, out_dir: str | Path) -> None:
    """Write ``encoder.onnx`` (fp32) and ``tokenizer.json`` of a sentence-transformer into ``out_dir``.

    ``model_name`` is resolved as :class:`StateEncoder` resolves it (the default is the
    bundled all-MiniLM-L6-v2, offline).
    """
    out_dir = Path(out_dir)
    model = StateEncoder(model_name, device="cpu", cache_dir=False, max_seq_length=max_seq_length)._load()
    tokens = model.tokenizer(["an example text to trace the graph with", "a shorter one"], padding=True,
                             return_tensors="pt")
    if "token_type_ids" not in tokens:
        tokens["token_type_ids"] = torch.zeros_like(tokens["input_ids"])
    b, s = torch.export.Dim("batch"), torch.export.Dim("sequence", max=max(max_seq_length, 2))
    dynamic = {name: {0: b, 1: s} for name in ENCODER_INPUTS}
    data = _to_onnx(_SentenceGraph(model), tuple(tokens[name] for name in ENCODER_INPUTS), ENCODER_INPUTS,
                    (SENTENCE_OUTPUT, TOKEN_OUTPUT), dynamic)
    atomic_write_bytes(out_dir / ENCODER_FILE, data)
    atomic_write_with(out_dir / TOKENIZER_FILE, lambda tmp: model.tokenizer.backend_tokenizer.save(tmp))


def quantize_int8(source: str | Path, target: str | Path) -> None:
    """Write ``target``: ``source`` with INT8 weights (dynamic quantisation, per output channel)."""
    atomic_write_with(target, lambda tmp: quantize_dynamic(Path(source), Path(tmp), weight_type=QuantType.QInt8,
                                                           per_channel=True))


def _sha256(path: Path) -> str:
    """Return a file's sha256 (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def export_policy(policy: str | Path, out: str | Path, *, int8: bool = False) -> dict[str, Any]:
    """Export a policy directory (or ``"default"``) to ``out``; return the metadata's ``"onnx"`` section.

    ``out`` gets copies of the policy's own files (it still loads on torch), the two graphs and
    the tokenizer. ``policy.json`` is written last: a directory whose metadata has the section
    has every file it names.
    """
    out = Path(out)
    algorithm, meta = load_policy(policy, "cpu")
    source = resolve_policy_dir(policy)
    scorer = export_scorer(algorithm, int(meta["state_dim"]), int(meta["tool_dim"]), max(1, len(meta["known_tools"])))
    atomic_write_bytes(out / SCORER_FILE, scorer)
    atomic_write_bytes(out / POLICY_WEIGHTS, (source / POLICY_WEIGHTS).read_bytes())
    max_seq_length = int(meta["max_seq_length"])
    if int8:
        with tempfile.TemporaryDirectory(dir=out, prefix=".fp32-") as fp32:
            export_encoder(meta["encoder"], max_seq_length, fp32)
            quantize_int8(Path(fp32) / ENCODER_FILE, out / ENCODER_FILE)
            atomic_write_bytes(out / TOKENIZER_FILE, (Path(fp32) / TOKENIZER_FILE).read_bytes())
    else:
        export_encoder(meta["encoder"], max_seq_length, out)
    section = {
        "precision": PRECISIONS[int8], "scorer": SCORER_FILE, "encoder": ENCODER_FILE, "tokenizer": TOKENIZER_FILE,
        "encoder_sha256": _sha256(out / ENCODER_FILE), "scorer_precision": "fp32",
        "calibrated_on": meta.get(ONNX_META, {}).get("calibrated_on", TRAINED_EMBEDDINGS),
        "torch": torch.__version__, "onnxruntime": onnxruntime.__version__, "parity": None,
    }
    atomic_write_bytes(out / POLICY_META, json.dumps({**meta, ONNX_META: section}, indent=2).encode())
    return section


def _read_export(out: str | Path) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """Return an export's metadata file, its metadata and its ``"onnx"`` section (a clear error if not exported)."""
    meta_file = Path(out) / POLICY_META
    meta = json.loads(meta_file.read_text())
    return meta_file, meta, onnx_section(meta, out)


def record_parity(out: str | Path, parity: Mapping[str, Any]) -> None:
    """Store measured backend parity (embedding cosine, top-1 agreement) in an export's metadata."""
    meta_file, meta, section = _read_export(out)
    atomic_write_bytes(meta_file, json.dumps({**meta, ONNX_META: {**section, "parity": dict(parity)}},
                                             indent=2).encode())


def record_calibration(out: str | Path, calibration: Mapping[str, Any]) -> None:
    """Store a temperature fit on the export's own scores: the policy's ``"calibration"``, now on this encoder.

    The torch fp32 temperature stays in the ``"onnx"`` section (``temperature_torch_fp32``).
    """
    meta_file, meta, section = _read_export(out)
    before = meta.get("calibration", {}).get("temperature", 1.0)
    section = {**section, "calibrated_on": f"onnx {section['precision']} encoder ({section['encoder_sha256'][:16]})",
               "temperature_torch_fp32": before}
    atomic_write_bytes(meta_file, json.dumps({**meta, "calibration": dict(calibration), ONNX_META: section},
                                             indent=2).encode())
