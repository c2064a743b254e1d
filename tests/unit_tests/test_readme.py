"""The README's generated references match the code they describe."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _reference_script():
    spec = importlib.util.spec_from_file_location("readme_reference", ROOT / "scripts" / "readme_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_and_config_references_are_in_sync() -> None:
    script = _reference_script()
    text = (ROOT / "README.md").read_text()
    assert script.render(text) == text, "README.md is stale: run python scripts/readme_reference.py"


def test_references_cover_every_command_and_key() -> None:
    script = _reference_script()
    cli = script.cli_reference()
    for command in ("train", "evaluate", "collect", "demo"):
        assert f"#### `evoharness-agent {command}`" in cli
    config = script.config_reference()
    assert "| `data.bundled` |" in config and "| `cql` | `alpha` | `1.0` |" in config
    # Every key has its meaning.
    assert all(not row.endswith("|  |") for row in config.splitlines())
