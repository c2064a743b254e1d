"""Run an exported policy on onnxruntime: the scorer graph and the sentence-encoder graph.

An exported policy directory is a policy directory (``policy.json``, ``policy.safetensors``)
plus ``scorer.onnx``, ``encoder.onnx`` and the encoder's ``tokenizer.json``; ``policy.json``
gains an ``"onnx"`` section (:data:`ONNX_META`) that names the files, the encoder's precision
and sha256, and the embeddings the policy was trained and calibrated on.

Texts are tokenised by the model's own HF fast tokenizer (``tokenizers``). Mean pooling and
L2 normalisation are inside the encoder graph, exported from the sentence-transformer's own
modules, so an embedding is one ``run`` call; the graph also gives the token vectors it pools
(what the request-part coverage matches).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import Encoding, Tokenizer

from evoharness_agent.encoding.embedder import StateEncoder, content_rows

__all__ = [
    "BACKENDS",
    "ENCODER_FILE",
    "ENCODER_INPUTS",
    "ONNX_META",
    "SCORER_FILE",
    "SCORER_INPUTS",
    "SENTENCE_OUTPUT",
    "TOKENIZER_FILE",
    "TOKEN_OUTPUT",
    "OnnxScorer",
    "OnnxSentenceEncoder",
    "OnnxStateEncoder",
    "onnx_section",
    "session_options",
]

BACKENDS = ("torch", "onnx")
"""What ``ToolPolicy(..., backend=...)`` accepts."""
ONNX_META = "onnx"
"""The key of the export's section in ``policy.json``."""
SCORER_FILE = "scorer.onnx"
ENCODER_FILE = "encoder.onnx"
TOKENIZER_FILE = "tokenizer.json"
ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
SENTENCE_OUTPUT, TOKEN_OUTPUT = "sentence_embedding", "token_embeddings"
"""The encoder graph's outputs: the pooled, normalised embedding, and the token vectors it pools."""
SCORER_INPUTS = ("states", "tool_embeddings", "tool_ids", "pairs")


def session_options(threads: int | None = None) -> ort.SessionOptions:
    """Return onnxruntime options: every graph optimisation, ``threads`` intra-op threads (``None``: ORT's default).

    One inter-op thread: the graphs are sequential, a second pool would only contend for the cores.
    """
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.inter_op_num_threads = 1
    if threads is not None:
        options.intra_op_num_threads = threads
    return options


def _session(model: str | Path | bytes, threads: int | None) -> ort.InferenceSession:
    """Open an onnxruntime CPU session on a model file or its bytes."""
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, session_options(threads), providers=["CPUExecutionProvider"])


def onnx_section(meta: Mapping[str, Any], where: str | Path) -> dict[str, Any]:
    """Return the ``"onnx"`` section of an exported policy's metadata, or raise a clear error.

    Raises:
        FileNotFoundError: ``where`` is a policy directory that was never exported.

    """
    section = meta.get(ONNX_META)
    if not isinstance(section, dict):
        raise FileNotFoundError(f"{where}: field '{ONNX_META}': this policy directory has no ONNX export; "
                                f"run `evoharness-agent export --policy {where} --out DIR [--int8]` "
                                "and load DIR with backend='onnx'")
    return section


class OnnxScorer:
    """The policy's scores (``Algorithm.scores``) from the exported scorer graph.

    Args:
        model: the ``scorer.onnx`` file, or its bytes.
        threads: intra-op threads (``None``: onnxruntime's default).

    """

    def __init__(self, model: str | Path | bytes, threads: int | None = None) -> None:
        self._session = _session(model, threads)
        # A scorer without a per-tool bias ignores tool ids, and the exporter drops unused inputs.
        self._inputs = {node.name for node in self._session.get_inputs()}

    def scores(self, states: np.ndarray, tool_embeddings: np.ndarray, tool_ids: np.ndarray,
               pairs: np.ndarray) -> np.ndarray:
        """Return the ``(B, N)`` float32 scores of ``N`` tools in ``B`` states.

        Args:
            states: ``(B, S)`` gathered state vectors (float32).
            tool_embeddings: ``(N, E)`` tool name+description embeddings (float32).
            tool_ids: ``(N,)`` per-tool bias rows, ``-1`` for tools not seen in training (int64).
            pairs: ``(B, N, F)`` pair features (float32).

        """
        feed = dict(zip(SCORER_INPUTS, (states.astype(np.float32, copy=False),
                                        tool_embeddings.astype(np.float32, copy=False),
                                        tool_ids.astype(np.int64, copy=False),
                                        pairs.astype(np.float32, copy=False)), strict=True))
        return self._session.run(None, {k: v for k, v in feed.items() if k in self._inputs})[0]


class OnnxSentenceEncoder:
    """A sentence-transformer on onnxruntime: the HF fast tokenizer, then one graph run per batch.

    Args:
        model: the ``encoder.onnx`` file (fp32 or INT8).
        tokenizer: the model's ``tokenizer.json``.
        max_seq_length: token limit per text, as the sentence-transformer's ``max_seq_length``.
        threads: intra-op threads (``None``: onnxruntime's default).

    """

    def __init__(self, model: str | Path, tokenizer: str | Path, max_seq_length: int,
                 threads: int | None = None) -> None:
        self._session = _session(model, threads)
        self._inputs = {node.name for node in self._session.get_inputs()}
        self.tokenizer = Tokenizer.from_file(str(tokenizer))
        self._pad_id = int((self.tokenizer.padding or {}).get("pad_id", 0))
        # tokenizer.json may carry a fixed padding length (MiniLM's pads to 128): a batch is padded
        # to its own longest text instead, so a one-text call runs at that text's length.
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=max_seq_length)

    def encode(self, texts: Sequence[str], *, batch_size: int = 64, **_unused: Any) -> np.ndarray:
        """Return L2-normalised float32 embeddings, shape ``(len(texts), dim)``.

        Texts are sorted by token count and batched neighbours together, so padding stays
        short. Accepts (and ignores) the other keywords :meth:`StateEncoder.embed` passes to
        ``SentenceTransformer.encode``: the graph always normalises and returns numpy.
        """
        if not texts:
            return np.zeros((0, int(self._session.get_outputs()[0].shape[-1])), dtype=np.float32)
        out = self._run(texts, (SENTENCE_OUTPUT,), batch_size)
        return np.stack([vectors for (vectors,), _ in out]).astype(np.float32, copy=False)

    def encode_tokens(self, texts: Sequence[str], *, batch_size: int = 64) -> tuple[np.ndarray, list[np.ndarray]]:
        """Return the texts' embeddings (as :meth:`encode`'s) and each one's content-token vectors, from one run.

        The content-token vectors are :func:`~evoharness_agent.encoding.embedder.content_rows`, unit length.

        Raises:
            ValueError: the graph was exported before it gave token vectors (export the policy again).

        """
        if TOKEN_OUTPUT not in {node.name for node in self._session.get_outputs()}:
            raise ValueError(f"this {ENCODER_FILE} gives no {TOKEN_OUTPUT!r}: export the policy again "
                             "(`evoharness-agent export`)")
        sentences, rows_out = [], []
        for (sentence, vectors), encoding in self._run(texts, (SENTENCE_OUTPUT, TOKEN_OUTPUT), batch_size):
            rows = vectors[content_rows(encoding.tokens, encoding.special_tokens_mask)].astype(np.float32)
            sentences.append(sentence)
            rows_out.append(rows / np.linalg.norm(rows, axis=1, keepdims=True).clip(min=1e-12))
        return np.stack(sentences).astype(np.float32, copy=False), rows_out

    def _run(self, texts: Sequence[str], outputs: Sequence[str], batch_size: int,
             ) -> list[tuple[list[np.ndarray], Encoding]]:
        """Return each text's rows of the graph's ``outputs`` (token rows cut to the text's tokens) and its encoding."""
        encodings = self.tokenizer.encode_batch(list(texts))
        order = np.argsort([len(e.ids) for e in encodings], kind="stable")
        out: list[tuple[list[np.ndarray], Encoding]] = [([], e) for e in encodings]
        for start in range(0, len(order), batch_size):
            chunk = [int(i) for i in order[start : start + batch_size]]
            width = max(len(encodings[i].ids) for i in chunk)
            arrays = {name: np.zeros((len(chunk), width), dtype=np.int64) for name in ENCODER_INPUTS}
            arrays["input_ids"].fill(self._pad_id)
            for row, i in enumerate(chunk):
                e = encodings[i]
                arrays["input_ids"][row, : len(e.ids)] = e.ids
                arrays["attention_mask"][row, : len(e.ids)] = e.attention_mask
                arrays["token_type_ids"][row, : len(e.ids)] = e.type_ids
            values = self._session.run(list(outputs), {k: v for k, v in arrays.items() if k in self._inputs})
            for row, i in enumerate(chunk):
                out[i] = ([value[row] if name == SENTENCE_OUTPUT else value[row, : len(encodings[i].ids)]
                           for name, value in zip(outputs, values, strict=True)], encodings[i])
        return out


class OnnxStateEncoder(StateEncoder):
    """A :class:`StateEncoder` whose texts are embedded by an exported encoder on onnxruntime.

    Its cache identity includes the backend, precision and the graph's sha256, so INT8
    embeddings are never served to a torch encoder from the shared disk cache, or the reverse.

    Args:
        export_dir: an exported policy directory (see :mod:`~evoharness_agent.inference.onnx_export`).
        meta: that directory's ``policy.json``.
        cache_dir: as for :class:`StateEncoder`.
        threads: intra-op threads (``None``: onnxruntime's default).
        batch_size: encoding batch size.

    """

    def __init__(self, export_dir: str | Path, meta: Mapping[str, Any], *, cache_dir: str | Path | bool | None = None,
                 threads: int | None = None, batch_size: int = 64) -> None:
        section = onnx_section(meta, export_dir)
        export_dir = Path(export_dir)
        identity = f"{meta['encoder']}@onnx-{section['precision']}-{section['encoder_sha256'][:16]}"
        # A step model (a static one) runs on torch: it has no transformer to export.
        super().__init__(identity, device="cpu", cache_dir=cache_dir, max_seq_length=int(meta["max_seq_length"]),
                         batch_size=batch_size, step_model=meta.get("step_encoder"))
        self.precision = str(section["precision"])
        self.onnx_model = OnnxSentenceEncoder(export_dir / section["encoder"], export_dir / section["tokenizer"],
                                              self.max_seq_length, threads)

    def _load(self) -> OnnxSentenceEncoder:
        """Return the onnxruntime encoder (opened in ``__init__``)."""
        return self.onnx_model

    def _encode_tokens(self, texts: list[str], show_progress: bool = False) -> tuple[np.ndarray, list[np.ndarray]]:
        """Return the texts' embeddings and content-token vectors from one run of the exported graph."""
        return self.onnx_model.encode_tokens(texts, batch_size=self.batch_size)

