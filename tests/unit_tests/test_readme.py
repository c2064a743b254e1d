"""The README's generated references match the code they describe."""

from __future__ import annotations

from tests.kit.scripts import ROOT, load_script

readme_reference = load_script("readme_reference")


def test_cli_and_config_references_are_in_sync() -> None:
    text = (ROOT / "README.md").read_text()
    assert readme_reference.render(text) == text, "README.md is stale: run python scripts/readme_reference.py"


def test_references_cover_every_command_and_key() -> None:
    cli = readme_reference.cli_reference()
    for command in ("train", "evaluate", "collect", "demo"):
        assert f"#### `evoharness-agent {command}`" in cli
    config = readme_reference.config_reference()
    assert "| `data.bundled` |" in config and "| `cql` | `alpha` | `1.0` |" in config
    # Every key has its meaning.
    assert all(not row.endswith("|  |") for row in config.splitlines())
