"""Encoding a large log set across a Ray cluster with Ray Data (the optional ``ray`` extra).

One machine's sentence-transformers pool (``StateEncoder.embed(..., processes=N)``) stops at
its own cores. Ray Data spreads the same encoding over the nodes of a cluster: the texts become
a dataset of blocks, ``workers`` actors each load the encoder once and embed the blocks they
are handed, and the vectors come back to the driver in the texts' order, to be cached there as
any other. Every node needs this package installed (it brings the default model's weights).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["RayEncoding", "ray_encode"]

RAY_INSTALL_HINT = "pip install 'evoharness-agent[ray]'"
BLOCKS_PER_WORKER = 4  # enough blocks that a slow actor does not hold up the rest
ROWS_PER_CALL = 8  # an actor is handed this many of the encoder's batches per call


@dataclass(frozen=True)
class RayEncoding:
    """How to encode on Ray: how many actors, on which cluster."""

    workers: int
    """Ray Data actors, one encoder each (a CPU each; a GPU each when the driver encodes on one)."""
    address: str | None = None
    """The cluster to join (``"auto"``: the one this machine belongs to); ``None`` starts a local one."""


class _EncodeBlocks:
    """A Ray Data actor: one encoder, loaded once, embedding the blocks it is handed."""

    def __init__(self, model_name: str, max_seq_length: int, batch_size: int, device: str) -> None:
        """Load the encoder (no disk cache: the driver caches what comes back)."""
        from evoharness_agent.encoding.embedder import StateEncoder

        self.encoder = StateEncoder(model_name, device=device, cache_dir=False, max_seq_length=max_seq_length,
                                    batch_size=batch_size)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Return the block's rows and their embeddings."""
        return {"row": batch["row"], "vector": self.encoder.embed([str(text) for text in batch["text"]])}


def ray_encode(texts: Sequence[str], ray_encoding: RayEncoding, *, model_name: str, max_seq_length: int,
               batch_size: int, device: str, show_progress: bool = False) -> np.ndarray:
    """Return the ``(len(texts), dim)`` float32 embeddings of ``texts``, computed by Ray Data actors, in order.

    Joins ``ray_encoding.address`` (or starts a local cluster) unless Ray is running in this
    process already; the runtime stays up for the process's later calls.

    Raises:
        ImportError: the ``ray`` extra is not installed.

    """
    try:
        import ray
        import ray.data
    except ImportError as error:
        raise ImportError(f"encoding on Ray needs the ray extra: {RAY_INSTALL_HINT}") from error
    if not ray.is_initialized():
        ray.init(address=ray_encoding.address, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = show_progress
    logging.getLogger("ray.data").setLevel(logging.INFO if show_progress else logging.WARNING)
    blocks = max(1, min(len(texts), ray_encoding.workers * BLOCKS_PER_WORKER))
    dataset = ray.data.from_items([{"row": i, "text": text} for i, text in enumerate(texts)],
                                  override_num_blocks=blocks)
    encoded = dataset.map_batches(
        _EncodeBlocks, fn_constructor_kwargs={"model_name": model_name, "max_seq_length": max_seq_length,
                                              "batch_size": batch_size, "device": device},
        compute=ray.data.ActorPoolStrategy(size=ray_encoding.workers), batch_size=batch_size * ROWS_PER_CALL,
        batch_format="numpy",
        num_cpus=1, num_gpus=1 if device.startswith("cuda") else 0)
    rows, vectors = [], []
    for batch in encoded.iter_batches(batch_format="numpy", batch_size=None):
        rows.append(batch["row"])
        vectors.append(batch["vector"])
    out = np.empty((len(texts), vectors[0].shape[1]), dtype=np.float32)
    out[np.concatenate(rows)] = np.concatenate(vectors)
    return out
