"""The validation benchmark runs end to end (on a few episodes of each domain) and reports every figure it names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evoharness_agent.logs.bundled import all_domain_episodes
from tests.kit.scripts import load_script

validation = load_script("validation", "benchmarks")


def test_validation_run_reports_the_left_out_domains_the_suite_and_the_split(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    few = {domain: episodes[:12] for domain, episodes in all_domain_episodes().items()}
    monkeypatch.setattr(validation, "all_domain_episodes", lambda: few)
    out = tmp_path / "validation.json"
    validation.main(["--steps", "3", "--set", "data.val_fraction=0.3", "--out", str(tmp_path / "runs"),
                     "--json", str(out)])
    results = json.loads(out.read_text())["results"]
    for domain in ("stabletoolbench", "bfcl_single"):
        assert results[domain]["n_episodes"] == 12  # scored on the left-out domain alone
        assert 0.0 <= results[domain]["calibration"]["accuracy"] <= 1.0
    suite, split = results["default_recipe"]["suite"], results["default_recipe"]["split"]
    assert suite["n_tasks"] == 30 and suite["n_decisions"] == 90  # the validation suite, not the reported one
    assert split["decisions"] == sum(d["decisions"] for d in split["by_domain"].values()) > 0
    assert split["right"] == sum(d["right"] for d in split["by_domain"].values())
    many = results["many_tools"]  # the bfcl_single policy's gold tools among 100 random ones
    assert many["policy"]["n"] == many["embedding_similarity"]["n"] > 0
    assert 0.0 <= many["policy"]["recall@1"] <= many["policy"]["recall@10"] <= 1.0
