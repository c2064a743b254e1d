from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from evoharness_agent.envs.tau_airline import airline_functions, load_airline_db
from evoharness_agent.logs import bundled
from evoharness_agent.logs.bundled import (
    BFCL_VARIANTS,
    bfcl_paths,
    bfcl_scenario_number,
    gpt4o_airline_path,
    gpt4o_airline_split,
    read_native,
    split_bfcl,
    tau2_airline_path,
    tau2_airline_split,
    tau_airline_test_path,
)
from evoharness_agent.schema import FINISH, Episode, Step


@pytest.fixture(scope="module")
def bfcl() -> dict[str, list[Episode]]:
    paths = zip(BFCL_VARIANTS, bfcl_paths(), strict=True)
    return {variant: read_native(path) for variant, path in paths}


@pytest.fixture(scope="module")
def gpt4o() -> list[Episode]:
    return read_native(gpt4o_airline_path())


def test_data_dir_points_at_project_data() -> None:
    assert bundled.DATA_DIR == Path(bundled.__file__).resolve().parents[1] / "data"
    for path in [*bfcl_paths(), tau2_airline_path(), gpt4o_airline_path(),
                 tau_airline_test_path()]:
        assert path.is_file(), path


def test_data_dir_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EVOHARNESS_DATA_DIR", str(tmp_path))
    assert bfcl_paths(["base"]) == [tmp_path.resolve() / "bfcl" / "multi_turn_base.jsonl.gz"]


def test_bfcl_paths_rejects_unknown_variant() -> None:
    with pytest.raises(ValueError):
        bfcl_paths(["nope"])


def test_read_native_plain_and_gzip(tmp_path: Path) -> None:
    episode = Episode(id="e", task="t", steps=[Step(kind="tool_call", tool="a")])
    plain, packed = tmp_path / "x.jsonl", tmp_path / "x.jsonl.gz"
    plain.write_text(episode.model_dump_json() + "\n\n", encoding="utf-8")
    with gzip.open(packed, "wt", encoding="utf-8") as handle:
        handle.write(episode.model_dump_json() + "\n")
    assert read_native(plain) == read_native(packed) == [episode]


def test_bfcl_counts_and_shape(bfcl: dict[str, list[Episode]]) -> None:
    for variant, episodes in bfcl.items():
        assert len(episodes) == 150
        assert all(ep.metadata["variant"] == variant and ep.reward == 1.0 for ep in episodes)
        assert all(ep.metadata["initial_config"] for ep in episodes)
        for ep in episodes:
            # Every turn ends with the agent handing back to the user.
            assert ep.steps[-1].action == FINISH
            pairs = zip(ep.steps, ep.steps[1:], strict=False)
            assert all(step.kind == "assistant" for step, nxt in pairs if nxt.kind == "user")
    assert {bfcl_scenario_number(ep) for ep in bfcl["base"]} == {
        bfcl_scenario_number(ep) for ep in bfcl["miss_func"]}
    calls = sum(s.kind == "tool_call" for ep in bfcl["base"] for s in ep.steps)
    assert calls == 860


def test_bfcl_miss_func_adds_tools_in_their_turn(bfcl: dict[str, list[Episode]]) -> None:
    for ep in bfcl["miss_func"]:
        missed = {name for names in ep.metadata["missed_function"].values() for name in names}
        assert missed and not missed & set(ep.available_at_start or [])
        added = [s for s in ep.steps if s.tools_added]
        assert {n for s in added for n in s.tools_added} == missed
        assert all(s.kind == "user" and s.content for s in added)
        flagged = {f["step"] for f in ep.metadata["gold_calls_unavailable"]}
        pairs = zip(ep.steps, ep.availability(), strict=True)
        for index, (step, available) in enumerate(pairs):
            if step.kind == "tool_call" and index not in flagged:
                assert step.tool in available
    flagged_ids = [ep.id for ep in bfcl["miss_func"] if ep.metadata["gold_calls_unavailable"]]
    assert flagged_ids == ["multi_turn_miss_func_49"]


def test_split_bfcl_by_scenario(bfcl: dict[str, list[Episode]]) -> None:
    train, test = split_bfcl(bfcl["base"])
    assert (len(train), len(test)) == (120, 30)
    assert all(bfcl_scenario_number(ep) % 5 == 0 for ep in test)
    every = [ep for episodes in bfcl.values() for ep in episodes]
    train, test = split_bfcl(every, test_mod=3)
    assert not {bfcl_scenario_number(e) for e in train} & {bfcl_scenario_number(e) for e in test}


def test_bfcl_scenario_number_from_id() -> None:
    assert bfcl_scenario_number(Episode(id="multi_turn_base_17", task="t")) == 17


def test_tau2_airline_split() -> None:
    episodes = read_native(tau2_airline_path())
    train, test = tau2_airline_split(episodes)
    assert (len(train), len(test)) == (30, 20)
    assert sum(s.kind == "tool_call" for ep in episodes for s in ep.steps) == 142
    assert all(ep.steps[-1].action == FINISH and ep.task for ep in episodes)


def test_tau2_airline_observations_are_the_airline_tools_results() -> None:
    """tau2-bench logs no results: the converter replays each task's actions on a fresh airline database."""
    for episode in read_native(tau2_airline_path()):
        functions = airline_functions(load_airline_db())
        for step in (s for s in episode.steps if s.kind == "tool_call"):
            assert step.observation == functions[step.tool](**step.arguments), (episode.id, step.tool)
            assert step.observation and not step.error


def test_gpt4o_airline_split(gpt4o: list[Episode]) -> None:
    assert len(gpt4o) == 200
    assert sum(s.kind == "tool_call" for ep in gpt4o for s in ep.steps) == 1164
    assert sum(ep.reward for ep in gpt4o) == 84
    assert sum(s.error for ep in gpt4o for s in ep.steps) == 73
    train, test = gpt4o_airline_split(gpt4o)
    assert len(train) == 160
    assert {ep.metadata["task_index"] for ep in test} == set(range(40, 50))
    assert len(test) == 25 and all(ep.reward == 1.0 for ep in test)


def test_tau_airline_test() -> None:
    episodes = read_native(tau_airline_test_path())
    assert len(episodes) == 50
    assert sum(s.kind == "tool_call" for ep in episodes for s in ep.steps) == 158
