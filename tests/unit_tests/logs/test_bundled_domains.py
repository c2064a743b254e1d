"""The bundled domains: counts as in data/README.md, valid episodes, gold calls on offered tools."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest

from evoharness_agent.logs.bundled import (
    DOMAINS,
    METATOOL_SUBSETS,
    all_domain_episodes,
    bfcl_single_path,
    domain_paths,
    metatool_paths,
    stabletoolbench_path,
    tau2_retail_path,
    tau_retail_path,
)
from evoharness_agent.schema import FINISH, Episode

# (episodes, tool calls) per domain, as in the table of data/README.md.
EXPECTED = {
    "bfcl": (600, 3500),
    "bfcl_single": (1477, 1915),
    "metatool": (5532, 4514),
    "stabletoolbench": (765, 1799),
    "tau_retail": (520, 793),
    "tau_airline": (250, 1322),
    "tau2_retail": (74, 365),
    "tau2_airline": (50, 142),
}

# Files written with metadata.domain already in them (the older files get it on load).
NEW_FILES = {
    "bfcl_single": [bfcl_single_path()],
    "metatool": metatool_paths(),
    "stabletoolbench": [stabletoolbench_path()],
    "tau_retail": [tau_retail_path()],
    "tau2_retail": [tau2_retail_path()],
}


@pytest.fixture(scope="module")
def domains() -> dict[str, list[Episode]]:
    return all_domain_episodes()


def _calls(episodes: list[Episode]) -> int:
    return sum(step.kind == "tool_call" for ep in episodes for step in ep.steps)


def test_domains_and_paths() -> None:
    assert set(DOMAINS) == set(EXPECTED) and len(DOMAINS) == len(EXPECTED)
    for domain in DOMAINS:
        assert all(path.is_file() for path in domain_paths(domain)), domain
    assert len(domain_paths("bfcl")) == 4 and len(domain_paths("tau_airline")) == 2
    with pytest.raises(ValueError):
        domain_paths("nope")
    with pytest.raises(ValueError):
        metatool_paths(["nope"])


def test_counts_match_readme(domains: dict[str, list[Episode]]) -> None:
    assert list(domains) == list(DOMAINS)
    assert {domain: (len(eps), _calls(eps)) for domain, eps in domains.items()} == EXPECTED


def test_every_episode_is_valid_and_labelled(domains: dict[str, list[Episode]]) -> None:
    ids = Counter(ep.id for eps in domains.values() for ep in eps)
    assert not [name for name, count in ids.items() if count > 1]
    for domain, episodes in domains.items():
        for ep in episodes:
            assert ep.metadata["domain"] == domain
            assert ep.task and ep.steps, ep.id
            if "trial" not in ep.metadata:  # gold demonstrations end by handing back (FINISH)
                assert ep.steps[-1].action == FINISH, ep.id
            names = ep.tool_names()
            assert len(set(names)) == len(names), ep.id
    # Spot-check a full round trip through the schema on a slice of every domain.
    for episodes in domains.values():
        for ep in episodes[::50]:
            assert Episode.model_validate_json(ep.model_dump_json()) == ep


def test_new_files_carry_their_domain_on_disk() -> None:
    for domain, paths in NEW_FILES.items():
        for path in paths:
            with gzip.open(path, "rt", encoding="utf-8") as handle:
                found = {json.loads(line)["metadata"]["domain"] for line in handle}
            assert found == {domain}, path


def test_gold_calls_are_offered_and_available(domains: dict[str, list[Episode]]) -> None:
    for episodes in domains.values():
        for ep in episodes:
            known = set(ep.tool_names())
            flagged = {entry["step"] for entry in ep.metadata.get("gold_calls_unavailable", [])}
            for index, (step, available) in enumerate(zip(ep.steps, ep.availability(), strict=True)):
                if step.kind == "tool_call":
                    assert step.tool in known, (ep.id, step.tool)
                    assert step.tool in available or index in flagged, (ep.id, step.tool)


def test_source_splits(domains: dict[str, list[Episode]]) -> None:
    def splits(domain: str) -> Counter[str | None]:
        return Counter(ep.metadata.get("source_split") for ep in domains[domain])

    assert splits("tau_retail") == {"train": 500, "dev": 20}
    assert splits("tau2_retail") == {"train": 74}
    assert splits("tau2_airline") == {"train": 30, "test": 20}
    assert splits("tau_airline") == {"test": 250}
    assert splits("stabletoolbench") == {"test": 765}
    groups = Counter(ep.metadata["group"] for ep in domains["stabletoolbench"])
    assert groups == {"G1_category": 153, "G1_instruction": 163, "G1_tool": 158,
                      "G2_category": 124, "G2_instruction": 106, "G3_instruction": 61}


def test_metatool_subsets(domains: dict[str, list[Episode]]) -> None:
    by_subset: dict[str, list[Episode]] = {}
    for ep in domains["metatool"]:
        by_subset.setdefault(ep.metadata["subset"], []).append(ep)
    assert {s: len(eps) for s, eps in by_subset.items()} == {
        "single_tool": 3000, "multi_tool": 497, "reliability": 995, "awareness": 1040}
    assert list(by_subset) == list(METATOOL_SUBSETS)
    # Reliability: the gold tool is withheld, so the only decision is FINISH.
    for ep in by_subset["reliability"]:
        assert [step.action for step in ep.steps] == [FINISH]
        assert len(ep.tools) == 10 and ep.metadata["excluded_gold_tool"] not in ep.tool_names()
    labels = Counter((ep.metadata["label"], len(ep.steps)) for ep in by_subset["awareness"])
    assert labels == {("negative", 1): 520, ("positive", 2): 520}
    for ep in by_subset["single_tool"] + by_subset["awareness"]:
        assert len(ep.tools) == 16
    assert all(len(ep.steps) == 3 and len(ep.tools) == 10 for ep in by_subset["multi_tool"])
    # The sample is spread evenly over all 199 tools (one tool has only 4 usable queries).
    per_tool = Counter(ep.steps[0].tool for ep in by_subset["single_tool"])
    assert len(per_tool) == 199 and max(per_tool.values()) - min(per_tool.values()) <= 12


def test_bfcl_single_and_tau_retail_shape(domains: dict[str, list[Episode]]) -> None:
    categories = Counter(ep.metadata["category"] for ep in domains["bfcl_single"])
    assert categories == {"live_multiple": 1053, "multiple": 200, "parallel_multiple": 200,
                          "live_parallel_multiple": 24}
    for ep in domains["bfcl_single"]:
        gold = [name for call in ep.metadata["ground_truth"] for name in call]
        assert [step.tool for step in ep.steps[:-1]] == gold
    # tau-bench retail gold is only the final state-changing calls: never a look-up.
    used = {s.tool for ep in domains["tau_retail"] for s in ep.steps if s.kind == "tool_call"}
    assert used and all(name.startswith(("cancel_", "modify_", "return_", "exchange_")) for name in used)
    assert all(ep.metadata["partial_gold"] for ep in domains["tau_retail"])
    # ... so the look-ups were never a choice the log could record: only the write tools are offered.
    for ep in domains["tau_retail"]:
        offered = ep.availability()[0]
        assert used <= offered and not offered & {"find_user_id_by_email", "get_order_details", "calculate"}


def test_tau2_gold_lists_without_a_look_up_offer_no_look_up(domains: dict[str, list[Episode]]) -> None:
    # tau2-bench names the look-ups for some tasks and only the writes for others ("return the
    # skateboards", no find_user_id before it): only the latter are partial logs.
    def looks_up(name: str) -> bool:
        return name.startswith(("find_", "get_", "list_", "search_"))

    for name in ("tau2_retail", "tau2_airline", "tau_airline"):
        gold = [ep for ep in domains[name] if "gpt4o" not in ep.id]  # logged runs are whole, look-ups or not
        partial = [ep for ep in gold if ep.metadata["partial_gold"]]
        whole = [ep for ep in gold if not ep.metadata["partial_gold"]]
        assert partial and whole, name
        for ep in partial:
            called = {s.tool for s in ep.steps if s.kind == "tool_call"}
            offered = ep.availability()[0]
            assert called <= offered and offered and not any(map(looks_up, offered)), ep.id
        for ep in whole:
            assert ep.available_at_start is None
            assert any(looks_up(s.tool) for s in ep.steps if s.kind == "tool_call"), ep.id
