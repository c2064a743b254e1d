"""Policy files and checkpoints under damage: crafted policy.json, crashes mid-save, truncated checkpoints."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import evoharness_agent.learning.checkpoints as checkpoints
from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.encoding.state import STATE_LAYOUT_VERSION, state_dim
from evoharness_agent.learning.algorithms import Algorithm, Dims, ToolInputs, make_algorithm
from evoharness_agent.learning.checkpoints import (
    CheckpointError,
    CheckpointWarning,
    PolicyFormatError,
    _NetworkMeta,
    load_checkpoint,
    load_policy,
    read_policy_meta,
    save_checkpoint,
    save_policy,
)
from evoharness_agent.learning.config import load_config
from evoharness_agent.learning.networks import NetworkConfig
from evoharness_agent.learning.trainer import train_on_episodes
from tests.kit.synthetic_logs import synthetic_episodes

TOOL_DIM, WINDOW, TOOLS = 8, 1, ["FINISH", "a", "b"]


def _algorithm(name: str = "bc", seed: int = 0, tools: list[str] = TOOLS) -> Algorithm:
    torch.manual_seed(seed)
    dims = Dims(state_dim(TOOL_DIM, WINDOW), TOOL_DIM, len(tools))
    return make_algorithm(name, {}, dims, NetworkConfig(hidden=4), ToolInputs(torch.zeros((0, TOOL_DIM)), None))


def _meta(name: str = "bc", tools: list[str] = TOOLS, **changes: Any) -> dict[str, Any]:
    meta = {"algorithm": name, "params": {}, "network": asdict(NetworkConfig(hidden=4)), "encoder": "enc",
            "max_seq_length": 16, "history_window": WINDOW, "state_layout": STATE_LAYOUT_VERSION,
            "state_dim": state_dim(TOOL_DIM, WINDOW), "tool_dim": TOOL_DIM, "known_tools": tools,
            "config": {"data": {"paths": ["logs.jsonl"]}}, "calibration": {"temperature": 0.8}}
    return {**meta, **changes}


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    save_policy(tmp_path / "p", _algorithm(), _meta())
    return tmp_path / "p"


def test_saved_policy_loads(policy_dir: Path) -> None:
    algorithm, meta = load_policy(policy_dir, "cpu")
    assert meta["acting"] == ["policy"] and meta["known_tools"] == TOOLS
    # A loaded policy only acts: nothing of it takes gradients.
    assert not any(p.requires_grad for module in algorithm.modules.values() for p in module.parameters())
    assert sorted(os.listdir(policy_dir)) == ["policy.json", "policy.safetensors"]  # no staging left


def test_a_saved_policy_is_readable_as_a_plain_write_leaves_it(tmp_path: Path) -> None:
    # safetensors writes 0o600: a server running as another user, or a shared folder, could not read it.
    previous = os.umask(0o022)
    try:
        save_policy(tmp_path / "p", _algorithm(), _meta())
    finally:
        os.umask(previous)
    assert {name: (tmp_path / "p" / name).stat().st_mode & 0o777 for name in os.listdir(tmp_path / "p")} == {
        "policy.json": 0o644, "policy.safetensors": 0o644}


def test_a_loaded_policy_makes_no_optimiser_and_a_checkpoint_always_has_one(policy_dir: Path, tmp_path: Path) -> None:
    # Making a process's first optimiser costs ~2 s of imports: a policy that only acts needs none.
    algorithm, _ = load_policy(policy_dir, "cpu")
    assert algorithm._optimizer is None  # type: ignore[attr-defined]
    trained = _algorithm("cql")
    save_checkpoint(tmp_path / "run", 1, trained, torch.Generator(), _meta("cql"))
    optimiser = torch.load(tmp_path / "run" / "checkpoint" / "optimizer.pt", weights_only=True)
    assert optimiser is not None and optimiser["param_groups"]


def test_network_bounds_cover_every_network_setting() -> None:
    assert set(_NetworkMeta.model_fields) == set(NetworkConfig.__dataclass_fields__)


# ------------------------------------------------------------------ crafted policy.json

def _set(path: str, value: Any) -> Any:
    def change(meta: dict[str, Any]) -> dict[str, Any]:
        *parents, last = path.split(".")
        target = meta
        for key in parents:
            target = target[key]
        target[last] = value
        return meta
    return change


def _drop(key: str) -> Any:
    return lambda meta: {k: v for k, v in meta.items() if k != key}


CRAFTED = {
    "wrong type": (_set("state_dim", "2690"), "state_dim"),
    "negative dim": (_set("tool_dim", -8), "tool_dim"),
    "10 TB state": (_set("state_dim", 10**12), "state_dim"),
    "huge hidden": (_set("network.hidden", 10**9), "network.hidden"),
    "sizes disagree": (_set("state_dim", 7), "state_dim"),
    "missing key": (_drop("known_tools"), "known_tools"),
    "extra nesting": (_set("network", {"network": asdict(NetworkConfig())}), "network.network"),
    "NaN temperature": (_set("calibration.temperature", float("nan")), "calibration.temperature"),
    "zero temperature": (_set("calibration.temperature", 0.0), "calibration.temperature"),
    "tools not a list": (_set("known_tools", "FINISH"), "known_tools"),
    "unknown algorithm": (_set("algorithm", "os.system"), "algorithm"),
    "unknown network in acting": (_set("acting", ["q_target"]), "acting"),
    "nested params": (_set("params", {"lr": {"$ref": 1}}), "params.lr"),
    "unknown setting": (_set("params", {"shell": "rm -rf /"}), "params"),
    "layout as text": (_set("state_layout", "3"), "state_layout"),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_policy_json_gives_a_clear_error(policy_dir: Path, case: str) -> None:
    change, field = CRAFTED[case]
    meta_file = policy_dir / "policy.json"
    meta_file.write_text(json.dumps(change(json.loads(meta_file.read_text()))))
    with pytest.raises(PolicyFormatError) as raised:
        load_policy(policy_dir, "cpu")
    message = str(raised.value)
    assert str(meta_file) in message and f"field '{field}'" in message, message


@pytest.mark.parametrize(("content", "why"), [(b"{\"algorithm\": ", "line 1: not valid JSON"),
                                               (b"[1, 2]", "expected a JSON object"),
                                               (b"\xff\xfe{}", "not UTF-8"),
                                               (b"[" * 100_000, "nested too deeply")])
def test_unreadable_policy_json(policy_dir: Path, content: bytes, why: str) -> None:
    (policy_dir / "policy.json").write_bytes(content)
    with pytest.raises(PolicyFormatError, match=why):
        read_policy_meta(policy_dir)


def test_endless_policy_json_is_not_read_to_the_end(policy_dir: Path) -> None:
    (policy_dir / "policy.json").unlink()
    (policy_dir / "policy.json").symlink_to("/dev/zero")
    with pytest.raises(PolicyFormatError, match="larger than"):
        read_policy_meta(policy_dir)


def test_weights_that_do_not_fit_the_metadata(tmp_path: Path, policy_dir: Path) -> None:
    save_policy(tmp_path / "other", _algorithm(tools=["FINISH", "a", "b", "c", "d"]),
                _meta(tools=["FINISH", "a", "b", "c", "d"]))
    (policy_dir / "policy.safetensors").write_bytes((tmp_path / "other" / "policy.safetensors").read_bytes())
    (policy_dir / "policy.json").write_text(json.dumps(_meta() | {"acting": ["policy"], "network": asdict(
        NetworkConfig(hidden=8))}))
    with pytest.raises(PolicyFormatError, match="do not fit the sizes"):
        load_policy(policy_dir, "cpu")
    (policy_dir / "policy.safetensors").write_bytes(b"\x08\x00")
    with pytest.raises(PolicyFormatError, match="not a readable safetensors"):
        load_policy(policy_dir, "cpu")


# ------------------------------------------------------------------ one update for both files

def test_crash_between_the_two_file_moves_keeps_halves_together(policy_dir: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    new = _algorithm(seed=1)
    real_replace, moves = os.replace, []

    def crash_after_first(src: Any, dst: Any) -> None:
        if moves:
            raise KeyboardInterrupt("power cut")
        moves.append(dst)
        real_replace(src, dst)

    monkeypatch.setattr(checkpoints.os, "replace", crash_after_first)
    with pytest.raises(KeyboardInterrupt):
        save_policy(policy_dir, new, _meta(encoder="new-encoder"))
    monkeypatch.setattr(checkpoints.os, "replace", real_replace)
    # On disk the top-level files now disagree: new weights, old metadata...
    assert json.loads((policy_dir / "policy.json").read_text())["encoder"] == "enc"
    # ...but every reader sees the complete new pair, and the next save finishes the move.
    loaded, meta = load_policy(policy_dir, "cpu")
    assert meta["encoder"] == "new-encoder"
    for key, value in new.modules["policy"].state_dict().items():
        assert torch.equal(loaded.modules["policy"].state_dict()[key], value)
    save_policy(policy_dir, new, _meta(encoder="third"))
    assert sorted(os.listdir(policy_dir)) == ["policy.json", "policy.safetensors"]
    assert read_policy_meta(policy_dir)["encoder"] == "third"


def test_crash_while_writing_leaves_the_old_policy(policy_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = load_file(str(policy_dir / "policy.safetensors"))

    def crash(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt("power cut")

    monkeypatch.setattr(checkpoints, "_fsync_tree", crash)
    with pytest.raises(KeyboardInterrupt):
        save_policy(policy_dir, _algorithm(seed=1), _meta(encoder="new-encoder"))
    assert read_policy_meta(policy_dir)["encoder"] == "enc"
    after = load_file(str(policy_dir / "policy.safetensors"))
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert sorted(os.listdir(policy_dir)) == ["policy.json", "policy.safetensors"]


# ------------------------------------------------------------------ checkpoints

def _two_checkpoints(out: Path) -> Algorithm:
    algorithm, generator = _algorithm("iql"), torch.Generator().manual_seed(0)
    save_checkpoint(out, 10, algorithm, generator, _meta("iql"))
    save_checkpoint(out, 20, algorithm, generator, _meta("iql"))
    return algorithm


@pytest.mark.parametrize("damage", ["model.safetensors", "optimizer.pt", "state.json"])
def test_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path: Path, damage: str) -> None:
    _two_checkpoints(tmp_path)
    target = tmp_path / "checkpoint" / damage
    target.write_bytes(b"" if damage == "state.json" else target.read_bytes()[: target.stat().st_size // 2])
    with pytest.warns(CheckpointWarning, match=f"{damage}.*previous checkpoint"):
        step = load_checkpoint(tmp_path, _algorithm("iql", seed=3), torch.Generator(), _meta("iql"))
    assert step == 10


def test_no_usable_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    _two_checkpoints(tmp_path)
    for folder in ("checkpoint", "checkpoint.previous"):
        (tmp_path / folder / "state.json").write_text("")
    with pytest.raises(CheckpointError, match="no usable checkpoint.*state.json"):
        load_checkpoint(tmp_path, _algorithm("iql"), torch.Generator(), _meta("iql"))
    assert load_checkpoint(tmp_path / "empty", _algorithm("iql"), torch.Generator()) == 0


@pytest.mark.parametrize(("algorithm", "tools", "why"), [
    ("cql", TOOLS, "algorithm"),
    ("iql", ["FINISH", "x", "y", "z"], "other data"),
])
def test_resume_with_another_run_is_refused_before_loading(tmp_path: Path, algorithm: str, tools: list[str],
                                                           why: str) -> None:
    _two_checkpoints(tmp_path)
    with pytest.raises(CheckpointError, match=f"other settings.*{why}"):
        load_checkpoint(tmp_path, _algorithm(algorithm, tools=tools), torch.Generator(), _meta(algorithm, tools))


def test_resume_with_other_data_paths_is_refused(tmp_path: Path) -> None:
    _two_checkpoints(tmp_path)
    with pytest.raises(CheckpointError, match="config's data section"):
        load_checkpoint(tmp_path, _algorithm("iql"), torch.Generator(),
                        _meta("iql", config={"data": {"paths": ["other.jsonl"]}}))


def test_resume_may_change_how_the_data_is_embedded_and_held(tmp_path: Path) -> None:
    _two_checkpoints(tmp_path)
    how = {"data": {"paths": ["logs.jsonl"], "encode_processes": 4, "mmap_embeddings": True,
                    "encode_ray_workers": 8, "ray_address": "auto"}}
    assert load_checkpoint(tmp_path, _algorithm("iql"), torch.Generator(), _meta("iql", config=how)) == 20
    with pytest.raises(CheckpointError, match="config's data section"):  # what it is still counts
        load_checkpoint(tmp_path, _algorithm("iql"), torch.Generator(),
                        _meta("iql", config={"data": {**how["data"], "embedding_dtype": "float16"}}))


def test_train_resume_with_another_algorithm_is_a_clear_error(tmp_path: Path, encoder: StateEncoder) -> None:
    config = {"training": {"steps": 4, "batch_size": 8, "device": "cpu", "threads": 1, "checkpoint_every": 2,
                           "eval_every": 4}, "model": {"hidden": 4, "history_window": 1},
              "logging": {"tensorboard": False}}
    episodes = synthetic_episodes()
    train_on_episodes(episodes, load_config(None, {**config, "algorithm": {"name": "bc"}}), tmp_path,
                      encoder=encoder, show_progress=False)
    with pytest.raises(CheckpointError, match=r"cannot resume.*algorithm \('bc' there, 'cql' now\)"):
        train_on_episodes(episodes, load_config(None, {**config, "algorithm": {"name": "cql"}}), tmp_path,
                          encoder=encoder, show_progress=False, resume=True)


def test_weights_sha256_names_the_weights_file_and_finds_the_shipped_policy(tmp_path: Path) -> None:
    import hashlib

    (tmp_path / checkpoints.POLICY_WEIGHTS).write_bytes(b"weights")
    assert checkpoints.weights_sha256(tmp_path) == hashlib.sha256(b"weights").hexdigest()
    shipped = checkpoints.shipped_policy_dir() / checkpoints.POLICY_WEIGHTS
    assert checkpoints.weights_sha256("default") == hashlib.sha256(shipped.read_bytes()).hexdigest()
