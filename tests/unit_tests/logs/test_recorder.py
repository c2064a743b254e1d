"""EpisodeRecorder and PIIScrubber: runs become scrubbed native logs that re-import and train."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from types import SimpleNamespace
from uuid import UUID

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool

from evoharness_agent import (
    Episode,
    EpisodeRecorder,
    Guardrails,
    PIIScrubber,
    PolicyAgentExecutor,
    StateEncoder,
    ToolPolicy,
    TrainConfig,
    load_episodes,
    train_on_episodes,
)
from evoharness_agent.agents.executor import STOPPED_OUTPUT
from evoharness_agent.logs.scrubber import REDACTED

WEATHER = "What is the weather like in Tokyo today?"


@pytest.mark.parametrize(("text", "expected"), [
    ("mail jane.doe+tag@example.co.uk now", "mail [EMAIL] now"),
    ("call +33 6 12 34 56 78 or (555) 123-4567 or 555-123-4567", "call [PHONE] or [PHONE] or [PHONE]"),
    ("card 4111 1111 1111 1111 and 4111-1111-1111-1111", "card [CARD] and [CARD]"),
    ("from 192.168.0.1 and 2001:db8::1 and fe80::1", "from [IP] and [IP] and [IP]"),
])
def test_scrubber_replaces_personal_data(text: str, expected: str) -> None:
    assert PIIScrubber()(text) == expected


@pytest.mark.parametrize("text", [
    "on 2025-01-31 at 12:30:45", "version 1.2.3 costs 3.14", "order 1234 5678 9012 3456 (bad checksum)",
    "population 1000, ratio 0.5", "std::vector and a::b", "at 2025-01-31 12:30:45 or 2025-01-31T12:30",
    "localhost ::1",
])
def test_scrubber_keeps_ordinary_numbers(text: str) -> None:
    assert PIIScrubber()(text) == text


def test_scrubber_is_pluggable() -> None:
    scrubber = PIIScrubber(extra={"EMPLOYEE": r"EMP-\d{4}"})
    assert scrubber("EMP-1234 wrote to a@b.io") == "[EMPLOYEE] wrote to [EMAIL]"
    assert PIIScrubber(rules=[], extra={"X": "secret"}).scrub({"k": ["a secret"]}) == {"k": ["a [X]"]}


def test_records_a_policy_run_scrubbed_and_reimportable(kit: SimpleNamespace, policy: ToolPolicy,
                                                        tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    recorder = EpisodeRecorder(path, metadata={"app": "test"}, reward=lambda episode: 1.0)
    task = "What is the weather like in Tokyo today? Mail it to jane@example.com."
    llm = kit.llm(kit.call("get_weather", city="Tokyo"), "Sunny; sent to jane@example.com.")
    PolicyAgentExecutor(llm=llm, tools=kit.tools, policy=policy).invoke({"input": task}, {"callbacks": [recorder]})
    assert recorder.flush(timeout=10)
    assert "jane@example.com" not in path.read_text()
    (episode,) = load_episodes([path]).episodes
    assert episode.task == "What is the weather like in Tokyo today? Mail it to [EMAIL]."
    assert [(s.kind, s.tool, s.arguments, s.observation) for s in episode.steps] == [
        ("tool_call", "get_weather", {"city": "Tokyo"}, "Sunny, 21 C in Tokyo"),
        ("assistant", None, {}, "")]
    assert episode.final_answer == "Sunny; sent to [EMAIL]." == episode.steps[-1].content
    assert episode.tool_names() == [t.name for t in kit.tools]  # all offered tools, not just the used one
    assert episode.reward == 1.0 and episode.metadata["app"] == "test"
    assert episode.metadata["source"] == "PolicyAgentExecutor" and episode.metadata["mode"] == "policy"
    assert recorder.n_recorded == 1


def test_records_refused_and_failed_steps_and_stops(kit: SimpleNamespace, tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    recorder = EpisodeRecorder(path)
    llm = kit.llm(kit.call("delete_file", path="/tmp/a"), kit.call("calculator", expression="1 / 0"))
    PolicyAgentExecutor(llm=llm, tools=kit.tools, mode="llm", max_iterations=2,
                        guardrails=Guardrails(high_risk={"delete_file"})).invoke(
        {"input": "Delete /tmp/a then compute 1 / 0"}, {"callbacks": [recorder]})
    recorder.flush()
    (episode,) = load_episodes([path]).episodes
    assert [(s.tool, s.error) for s in episode.steps] == [("delete_file", True), ("calculator", True)]
    assert episode.steps[0].observation.startswith("Refused:")
    assert episode.steps[1].observation == "Error: ZeroDivisionError: division by zero"
    assert episode.final_answer == STOPPED_OUTPUT and episode.metadata["ended_without_answer"] is True


def test_failed_runs_are_not_recorded_and_nested_tools_belong_to_their_tool(kit: SimpleNamespace,
                                                                            tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    recorder = EpisodeRecorder(path)
    broken = AIMessage("", invalid_tool_calls=[{"name": "get_weather", "args": "{city", "id": "1", "error": "bad"}])
    with pytest.raises(ValueError, match="handle_parsing_errors"):
        PolicyAgentExecutor(llm=kit.llm(broken, broken), tools=kit.tools, mode="llm",
                            handle_parsing_errors=False).invoke({"input": "x"}, {"callbacks": [recorder]})
    recorder.flush()
    assert not path.exists()

    @tool
    def morning_report() -> str:
        """Report the time and the weather in Tokyo."""
        return f"{kit.by_name['get_time'].invoke({})}; {kit.by_name['get_weather'].invoke({'city': 'Tokyo'})}"

    llm = kit.llm(kit.call("morning_report"), "Noon and sunny.")
    PolicyAgentExecutor(llm=llm, tools=[*kit.tools, morning_report], mode="llm").invoke(
        {"input": "Morning report please"}, {"callbacks": [recorder]})
    recorder.flush()
    (episode,) = load_episodes([path]).episodes
    assert [s.tool for s in episode.steps if s.kind == "tool_call"] == ["morning_report"]
    assert episode.steps[0].observation == "2025-01-01 12:00; Sunny, 21 C in Tokyo"


def test_async_and_batched_runs_are_recorded_separately(kit: SimpleNamespace, policy: ToolPolicy,
                                                         tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    recorder = EpisodeRecorder(path)
    executor = PolicyAgentExecutor(llm=kit.llm(kit.fill, "Sunny.", "Noon."), tools=kit.tools, policy=policy)
    asyncio.run(executor.abatch([{"input": WEATHER}, {"input": "What time is it now?"}],
                                {"callbacks": [recorder], "max_concurrency": 1}))
    recorder.flush()
    episodes = {e.task: e for e in load_episodes([path]).episodes}
    assert [s.tool for s in episodes[WEATHER].steps] == ["get_weather", None]
    assert [s.tool for s in episodes["What time is it now?"].steps] == ["get_time", None]


def test_recorded_logs_train_a_new_policy(kit: SimpleNamespace, policy: ToolPolicy, agent_encoder: StateEncoder,
                                          tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    recorder = EpisodeRecorder(path)
    executor = PolicyAgentExecutor(llm=kit.llm(kit.fill, "Sunny.", kit.fill, kit.fill, "2000."), tools=kit.tools,
                                   policy=policy)
    executor.invoke({"input": WEATHER}, {"callbacks": [recorder]})
    executor.with_config(callbacks=[recorder]).invoke({"input": "Find the population of Tokyo and double it."})
    recorder.flush()
    loaded = load_episodes([path], default_reward=1.0)
    assert len(loaded.episodes) == 2 and not loaded.skipped
    config = TrainConfig.model_validate({"algorithm": {"name": "bc"}, "model": {"hidden": 32},
                                         "training": {"steps": 20, "batch_size": 8, "device": "cpu"},
                                         "logging": {"tensorboard": False}, "data": {"val_fraction": 0.0}})
    result = train_on_episodes(loaded.episodes, config, tmp_path / "retrained", encoder=agent_encoder,
                               show_progress=False)
    assert result["n_transitions"] == 5
    retrained = ToolPolicy.load(tmp_path / "retrained", encoder=agent_encoder, device="cpu")
    assert retrained.rank(WEATHER, [], kit.tools)[0].tool in {t.name for t in kit.tools} | {"FINISH"}


def test_rejects_gzip_paths_and_writes_one_json_line_per_run(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="plain JSONL"):
        EpisodeRecorder(tmp_path / "runs.jsonl.gz")
    recorder = EpisodeRecorder(tmp_path / "runs.jsonl", tools=[])
    recorder.on_chain_start(None, {"input": "hi"}, run_id=UUID(int=1))
    recorder.on_chain_end({"output": "hello"}, run_id=UUID(int=1))
    recorder.on_chain_start(None, {"not": "an agent"}, run_id=UUID(int=2))
    recorder.on_chain_end({}, run_id=UUID(int=2))
    recorder.flush()
    (line,) = (tmp_path / "runs.jsonl").read_text().splitlines()
    assert json.loads(line)["final_answer"] == "hello"


def test_scrubs_keys_numbers_tool_descriptions_and_metadata_and_keeps_bad_text(kit: SimpleNamespace,
                                                                              tmp_path: Path) -> None:
    @tool
    def lookup(customer: str, card: int) -> str:
        """Look a customer up; questions go to support@example.com."""
        return f"found {customer}: +49 30 12345678, IBAN DE89 3704 0044 0532 0130 00, note \ud800"

    path = tmp_path / "runs.jsonl"
    recorder = EpisodeRecorder(path, metadata={"operator": "ops@example.com", "ops@example.com": 5551234567})
    llm = kit.llm(kit.call("lookup", customer="jane@example.com", card=4111111111111111), "Found.")
    PolicyAgentExecutor(llm=llm, tools=[*kit.tools, lookup], mode="llm").invoke(
        {"input": "Look up jane@example.com, key sk-proj-abc123DEF456ghi789JKL012mno"}, {"callbacks": [recorder]})
    recorder.flush()
    text = path.read_text(encoding="utf-8")
    for secret in ("example.com", "4111111111111111", "12345678", "5551234567", "DE89", "sk-proj"):
        assert secret not in text
    (episode,) = load_episodes([path]).episodes
    assert episode.task == "Look up [EMAIL], key [SECRET]"
    assert episode.steps[0].arguments == {"customer": "[EMAIL]", "card": "[CARD]"}
    assert episode.steps[0].observation == "found [EMAIL]: [PHONE], IBAN [IBAN], note \ufffd"  # kept, not dropped
    assert "[EMAIL]" in next(t.description for t in episode.tools if t.name == "lookup")
    assert episode.metadata["operator"] == "[EMAIL]" and episode.metadata["[EMAIL]"] == "[PHONE]"


def test_scrubs_and_writes_off_the_agents_path(kit: SimpleNamespace, tmp_path: Path) -> None:
    release = threading.Event()

    def slow_scrubber(text: str) -> str:
        release.wait(timeout=2)  # a scrubber on the agent's path would hold invoke here
        return text.replace("Tokyo", "[CITY]")

    path = tmp_path / "runs.jsonl"
    recorder = EpisodeRecorder(path, scrubber=slow_scrubber)
    llm = kit.llm(kit.call("get_weather", city="Tokyo"), "Sunny.")
    result = PolicyAgentExecutor(llm=llm, tools=kit.tools, mode="llm").invoke({"input": WEATHER},
                                                                              {"callbacks": [recorder]})
    assert result["output"] == "Sunny." and not path.exists() and recorder.n_recorded == 0
    release.set()
    assert recorder.flush(timeout=10)
    (episode,) = load_episodes([path]).episodes
    assert episode.task == WEATHER.replace("Tokyo", "[CITY]") and recorder.n_recorded == 1


def test_a_failing_scrubber_redacts_instead_of_losing_the_run(tmp_path: Path) -> None:
    def broken(text: str) -> str:
        raise RuntimeError("boom")

    recorder = EpisodeRecorder(tmp_path / "runs.jsonl", scrubber=broken, background=False)
    recorder.on_chain_start(None, {"input": "mail jane@example.com"}, run_id=UUID(int=1))
    recorder.on_chain_end({"output": "done"}, run_id=UUID(int=1))
    (episode,) = load_episodes([tmp_path / "runs.jsonl"]).episodes
    assert episode.task == REDACTED and episode.final_answer == REDACTED

    def no_reward(episode: Episode) -> float:
        raise ValueError(f"cannot score {episode.task}")

    recorder = EpisodeRecorder(tmp_path / "scored.jsonl", reward=no_reward)
    recorder.on_chain_start(None, {"input": "mail jane@example.com"}, run_id=UUID(int=2))
    recorder.on_chain_end({"output": "done"}, run_id=UUID(int=2))
    recorder.flush()
    (episode,) = load_episodes([tmp_path / "scored.jsonl"]).episodes
    assert episode.reward is None and episode.metadata["reward_error"] == "ValueError: cannot score mail [EMAIL]"
