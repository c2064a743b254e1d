"""The shipped default on onnxruntime decides as on torch: held-out BFCL, fp32 asserted, INT8 reported."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from evoharness_agent.evaluation.parity import backend_parity  # noqa: E402
from evoharness_agent.inference.onnx_export import export_policy, record_parity  # noqa: E402
from evoharness_agent.logs.bundled import bfcl_paths, read_native, split_bfcl  # noqa: E402
from evoharness_agent.policy import ToolPolicy  # noqa: E402

pytestmark = pytest.mark.slow  # two exports of MiniLM (~1 min of CPU each) and ~400 texts embedded thrice


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> ToolPolicy:
    """The shipped default on torch, with a fresh embedding cache."""
    return ToolPolicy.load("default", device="cpu", cache_dir=tmp_path_factory.mktemp("torch"))


@pytest.fixture(scope="module")
def held_out() -> list:
    """The held-out BFCL base scenarios (scenario % 5 == 0), never trained on."""
    return split_bfcl(read_native(bfcl_paths(["base"])[0]))[1]


@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])
def test_default_policy_parity_on_held_out_bfcl(int8: bool, reference: ToolPolicy, held_out: list,
                                                tmp_path: Path) -> None:
    export_policy("default", tmp_path / "export", int8=int8)
    candidate = ToolPolicy.load(tmp_path / "export", backend="onnx")
    parity = backend_parity(reference, candidate, held_out)
    record_parity(tmp_path / "export", parity.as_dict())
    print(f"\n{'int8' if int8 else 'fp32'}: {parity}")
    assert parity.n_decisions > 200
    meta = json.loads((tmp_path / "export" / "policy.json").read_text())["onnx"]
    assert meta["precision"] == ("int8" if int8 else "fp32") and meta["parity"]["n_decisions"] == parity.n_decisions
    if not int8:
        assert parity.top1_agreement >= 0.99
        assert parity.embedding_cosine_min > 0.9999
    else:  # INT8 moves embeddings (measured: cosine mean 0.992, min 0.981; 96.6% same top-1): reported, and
        assert parity.embedding_cosine_mean > 0.98  # bounded so a broken quantisation cannot pass
