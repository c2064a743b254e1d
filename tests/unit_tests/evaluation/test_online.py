from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool, tool
from rich.console import Console

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.envs.base import Task, ToolAction, ToolUseEnv
from evoharness_agent.evaluation.baselines import CountBaselines
from evoharness_agent.evaluation.choosers import (
    BigramChooser,
    EmbeddingChooser,
    EpsilonChooser,
    LLMChooser,
    PolicyChooser,
    RandomChooser,
    behaviour_chooser,
)
from evoharness_agent.evaluation.online import (
    OnlineReport,
    collect,
    evaluate_online,
    gold_arguments,
    llm_arguments,
    reward_turns,
    rollout,
    truncate_at_failed_turn,
)
from evoharness_agent.learning.config import TrainConfig
from evoharness_agent.learning.trainer import train_on_episodes
from evoharness_agent.logs.importers import load_episodes, write_episodes
from evoharness_agent.policy import ToolPolicy
from evoharness_agent.schema import FINISH, Episode, Step, ToolSpec
from tests.kit.chat_models import ScriptedChatModel, fails


class Counter:
    """The backend the tools act on: success is checked on its real state."""

    def __init__(self) -> None:
        self.value = 0


def make_tools(counter: Counter) -> list[BaseTool]:
    @tool
    def add(amount: int) -> dict:
        """Add an amount to the counter."""
        counter.value += amount
        return {"value": counter.value}

    @tool
    def read_counter() -> int:
        """Read the current value of the counter."""
        return counter.value

    @tool
    def send_email(to: str, body: str) -> str:
        """Send an email message to a person."""
        return f"sent to {to}"

    return [add, read_counter, send_email]


GOLD = [[ToolAction("add", {"amount": 5})], [ToolAction("read_counter")]]


class CounterEnv(ToolUseEnv):
    """Two turns (add 5, then read); gold arguments as in BFCLEnvironment.gold_action."""

    def __init__(self, max_steps: int = 8) -> None:
        self.counter = Counter()
        super().__init__(make_tools(self.counter), success_fn=self._check, max_steps=max_steps)

    def reset(self, task: Task | Episode | str | None = None) -> Any:
        self.counter.value = 0
        return super().reset(task)

    def _check(self, env: ToolUseEnv, turn: int) -> bool:
        if turn == 0:
            return self.counter.value == 5
        return any(s.tool == "read_counter" and not s.error for s in self.turn_steps(1))

    def gold_action(self, tool_name: str) -> ToolAction:
        if tool_name == FINISH:
            return ToolAction.finish()
        used = sum(1 for step in self.turn_steps() if step.tool == tool_name)
        calls = [a for a in GOLD[self.turn] if a.tool == tool_name]
        return ToolAction(tool_name, dict(calls[used].arguments)) if used < len(calls) else ToolAction(tool_name)


def make_task(i: int = 0) -> Task:
    return Task(turns=["Add 5 to the counter.", "What is the counter value now?"], id=f"count-{i}")


class Scripted:
    """A chooser that plays a fixed list of actions (then FINISH)."""

    def __init__(self, plan: Sequence[str], name: str = "scripted") -> None:
        self.plan = list(plan)
        self.name = name
        self.seen: list[Step] = []
        self.offered: list[set[str]] = []

    def session(self, task: str, tools: Sequence[ToolSpec]) -> Scripted:
        self.position = 0
        return self

    def observe(self, step: Step) -> None:
        self.seen.append(step)

    def rank(self, available: Any) -> list[str]:
        self.offered.append(set(available))
        self.position += 1
        return self.plan[self.position - 1:self.position] or [FINISH]


def gold_episodes(n: int) -> list[Episode]:
    env = CounterEnv()
    episodes = []
    for i in range(n):
        rollout(env, Scripted(["add", FINISH, "read_counter", FINISH]), make_task(i))
        episodes.append(env.to_episode())
    return episodes


def test_rollout_of_the_gold_plan_succeeds() -> None:
    env = CounterEnv()
    chooser = Scripted(["add", FINISH, "read_counter", FINISH])
    result = rollout(env, chooser, make_task())
    assert result.success is True and result.task_id == "count-0"
    assert (result.steps, result.calls, result.invalid_calls) == (4, 2, 0)
    assert (result.turns, result.turns_succeeded, result.truncated) == (2, 2, False)
    assert result.episode_return == pytest.approx(sum(env.rewards)) == pytest.approx(10.0 - 0.2)
    # The chooser saw every logged step, the second turn's user message included, in order.
    assert chooser.seen == env.steps
    assert [s.kind for s in chooser.seen] == ["tool_call", "assistant", "user", "tool_call", "assistant"]
    assert chooser.offered[0] == {"add", "read_counter", "send_email"}


def test_wrong_choices_count_as_invalid_calls_and_fail() -> None:
    env = CounterEnv(max_steps=5)
    # Tools without a gold call in the turn get empty arguments and fail: send_email in the
    # first turn, add in the second.
    result = rollout(env, Scripted(["send_email", FINISH, "add", "add", "add"]), make_task())
    assert result.success is False and result.truncated
    assert result.calls == 4 and result.invalid_calls == 4
    assert result.turns_succeeded == 0 and result.steps == 5


def test_gold_arguments_needs_an_env_with_gold() -> None:
    env = CounterEnv()
    env.reset(make_task())
    assert gold_arguments(env, "add") == ToolAction("add", {"amount": 5})
    assert gold_arguments(env, FINISH) == ToolAction.finish()
    plain = ToolUseEnv(make_tools(Counter()), "x")
    with pytest.raises(TypeError, match="gold_action"):
        gold_arguments(plain, "add")


def test_random_chooser_is_reproducible_and_offers_only_available_actions() -> None:
    available = {"add", "read_counter"}
    first = RandomChooser(seed=3).session("t", [])
    second = RandomChooser(seed=3).session("t", [])
    ranks = [first.rank(available) for _ in range(20)]
    assert ranks == [second.rank(available) for _ in range(20)]
    assert all(sorted(r) == sorted([*available, FINISH]) for r in ranks)
    assert len({tuple(r) for r in ranks}) > 1


def test_count_baselines_model_finish_per_turn() -> None:
    counts = CountBaselines(gold_episodes(3))
    assert counts.calls_per_turn == pytest.approx(1.0)
    names = ["add", "read_counter", "send_email", FINISH]
    assert names[int(counts.turn_scores(names, None).argmax())] in {"add", "read_counter"}
    assert names[int(counts.turn_scores(names, "add").argmax())] == FINISH
    # The tool-only statistics of the offline evaluation are unchanged.
    assert counts.unigram == {"add": 3, "read_counter": 3}
    assert counts.bigram["add"]["read_counter"] == 3
    bigram = BigramChooser(counts).session("t", [])
    bigram.observe(Step(kind="tool_call", tool="add"))
    assert bigram.rank({"add", "read_counter"})[0] == FINISH
    bigram.observe(Step(kind="user", content="next"))
    assert bigram.rank({"add", "read_counter"})[0] in {"add", "read_counter"}


def test_embedding_chooser_follows_the_request_and_stops(encoder: StateEncoder) -> None:
    env = CounterEnv()
    report = evaluate_online(env, [make_task()], [EmbeddingChooser(encoder, calls_per_turn=1)])
    (result,) = report.results["embedding_similarity"]
    assert [s.action for s in env.steps if s.is_decision] == ["add", FINISH, "read_counter", FINISH]
    assert result.success is True
    with pytest.raises(ValueError):
        EmbeddingChooser(encoder, calls_per_turn=0)


def test_report_json_markdown_and_plot(tmp_path: Path) -> None:
    env = CounterEnv()
    tasks = [make_task(i) for i in range(3)]
    choosers = [Scripted(["add", FINISH, "read_counter", FINISH]), RandomChooser(seed=0)]
    report = evaluate_online(env, tasks, choosers, env_name="counter")
    summary = report.summary()
    assert set(summary) == {"scripted", "random"}
    assert summary["scripted"] == {"tasks": 3, "success_rate": 1.0, "turn_success_rate": 1.0, "avg_steps": 4.0,
                                   "avg_return": pytest.approx(9.8), "invalid_call_rate": 0.0, "llm_failures": 0}
    assert set(summary["random"]) == set(summary["scripted"])
    report.write_json(tmp_path / "r.json")
    document = json.loads((tmp_path / "r.json").read_text())
    assert document["env"] == "counter" and document["arguments"] == "gold"
    assert [run["task_id"] for run in document["per_task"]["random"]] == ["count-0", "count-1", "count-2"]
    report.write_markdown(tmp_path / "r.md")
    markdown = (tmp_path / "r.md").read_text()
    assert "| scripted | 3 | 1.000 | 1.000 | 4.0 | 9.80 | 0.000 |" in markdown
    assert "| count-2 | ✓ 4 |" in markdown
    report.plot(tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="distinct"):
        evaluate_online(env, tasks, [RandomChooser(), RandomChooser()])


def test_unchecked_env_reports_no_success_rate() -> None:
    env = ToolUseEnv(make_tools(Counter()), max_steps=3)
    report = OnlineReport("plain", "none")
    report.results["s"] = [rollout(env, Scripted(["read_counter"]), "Read it.",
                                   arguments=lambda env, name: ToolAction(name))]
    assert report.summary()["s"]["success_rate"] is None
    assert "| s | 1 | n/a | n/a |" in report.to_markdown()


def test_epsilon_chooser_mixes_base_and_random() -> None:
    available = {"add", "read_counter", "send_email"}
    always = Scripted(["read_counter"] * 50)
    greedy = EpsilonChooser(always, epsilon=0.0).session("t", [])
    assert {greedy.rank(available)[0] for _ in range(20)} == {"read_counter"}
    explore = EpsilonChooser(Scripted(["read_counter"] * 50), epsilon=1.0, seed=1).session("t", [])
    assert len({explore.rank(available)[0] for _ in range(30)}) > 1
    with pytest.raises(ValueError):
        EpsilonChooser(always, epsilon=1.5)
    assert EpsilonChooser(always, 0.2).name == "epsilon0.2-scripted"
    assert behaviour_chooser("random").name == "random"
    with pytest.raises(ValueError, match="needs a policy"):
        behaviour_chooser("epsilon-policy")
    with pytest.raises(ValueError, match="unknown behaviour"):
        behaviour_chooser("greedy")


def test_collect_writes_reimportable_mixed_episodes(tmp_path: Path) -> None:
    env = CounterEnv()
    episodes = collect(env, [make_task(0), make_task(1)], RandomChooser(seed=0), repeats=2)
    assert [e.id for e in episodes] == ["count-0:random:0", "count-0:random:1", "count-1:random:0",
                                        "count-1:random:1"]
    path = tmp_path / "collected.jsonl.gz"
    write_episodes(path, episodes)
    loaded = load_episodes([path]).episodes
    assert loaded == episodes
    for episode in loaded:
        assert episode.reward in (0.0, 1.0) and episode.metadata["behaviour"] == "random"
        assert episode.tool_names() == ["add", "read_counter", "send_email"]
        assert len(episode.metadata["rollout"]["rewards"]) == sum(s.is_decision for s in episode.steps)
        # A run cut short by max_steps logs only the turns it reached.
        turns = Task.from_episode(episode).turns
        assert turns == make_task().turns[:len(turns)]


def test_runs_are_cut_after_the_first_failed_turn_and_turns_rewarded() -> None:
    env = CounterEnv()
    # Turn 0 fails (FINISH before add), so turn 1 is cut although read_counter would succeed.
    [failed] = collect(env, [make_task()], Scripted([FINISH, "read_counter", FINISH]), until_failure=True,
                       turn_reward=2.0)
    assert [s.kind for s in failed.steps] == ["assistant"] and failed.reward == 0.0
    assert failed.metadata["rollout"]["turn_success"] == [False]
    assert failed.metadata["truncated_at_failed_turn"] == 0 and failed.steps[0].reward is None
    # A fully successful run is kept whole, every turn's FINISH rewarded.
    [whole] = collect(env, [make_task()], Scripted(["add", FINISH, "read_counter", FINISH]), until_failure=True,
                      turn_reward=2.0)
    assert whole.reward == 1.0 and truncate_at_failed_turn(whole) == whole
    unjudged = whole.model_copy(deep=True)
    unjudged.metadata["rollout"]["turn_success"] = [None, None]  # an env without a success check
    assert truncate_at_failed_turn(unjudged) == unjudged
    assert [s.reward for s in whole.steps if s.kind == "assistant"] == [2.0, 2.0]
    # A gold demonstration without turn outcomes: every turn counts as successful.
    demo = whole.model_copy(deep=True)
    demo.metadata.pop("rollout")
    for step in demo.steps:
        step.reward = None
    assert [s.reward for s in reward_turns(demo, 1.5).steps if s.kind == "assistant"] == [1.5, 1.5]


def test_policy_chooser_with_a_tiny_trained_policy(tmp_path: Path, encoder: StateEncoder) -> None:
    config = TrainConfig.model_validate({
        "algorithm": {"name": "bc"}, "data": {"val_fraction": 0.0}, "model": {"hidden": 16},
        "training": {"steps": 150, "batch_size": 16, "device": "cpu", "eval_every": 1000},
        "logging": {"tensorboard": False}})
    train_on_episodes(gold_episodes(4), config, tmp_path / "policy", encoder=encoder, show_progress=False)
    policy = ToolPolicy.load(tmp_path / "policy", encoder=encoder, device="cpu")
    report = evaluate_online(CounterEnv(), [make_task(9)], [PolicyChooser(policy)])
    (result,) = report.results["policy"]
    assert result.success is True and result.steps == 4 and result.invalid_calls == 0
    assert behaviour_chooser("policy", policy).name == "policy"
    assert behaviour_chooser("epsilon-policy", policy, epsilon=0.5).name == "epsilon-policy"


class ScriptedChat(BaseChatModel):
    """A chat model that replies from a script and records the tools bound to it."""

    replies: list[AIMessage]
    bound: list[list[str]] = []

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.replies.pop(0))])

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChat:
        self.bound.append([t["function"]["name"] if isinstance(t, dict) else t.name for t in tools])
        return self


def call(name: str, args: dict[str, Any] | None = None) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": name, "args": args or {}, "id": f"id-{name}"}])


def test_llm_chooser_binds_the_available_tools() -> None:
    llm = ScriptedChat(replies=[call("add"), AIMessage("Done."), call("read_counter"), AIMessage("5")])
    report = evaluate_online(CounterEnv(), [make_task()], [LLMChooser(llm)])
    (result,) = report.results["llm"]
    assert result.success is True and result.steps == 4
    assert llm.bound[0] == ["add", "read_counter", "send_email"]
    with pytest.raises(TypeError, match="bind_tools"):
        LLMChooser(object())


def test_llm_arguments_fill_the_chosen_tool() -> None:
    llm = ScriptedChat(replies=[call("add", {"amount": 5}), call("read_counter")])
    env = CounterEnv()
    result = rollout(env, Scripted(["add", FINISH, "read_counter", FINISH]), make_task(),
                     arguments=llm_arguments(llm))
    assert result.success is True
    assert env.steps[0].arguments == {"amount": 5}
    # read_counter takes no arguments: no LLM call was spent on it.
    assert llm.bound == [["add"]] and llm.replies == [call("read_counter")]


# --------------------------------------------------------------------------- failed LLM calls, results as they come

def test_a_failed_llm_choice_costs_that_task_and_the_run_goes_on(tmp_path: Path) -> None:
    overflow = RuntimeError("request (4132 tokens) exceeds the available context size (4096 tokens)")
    llm = ScriptedChatModel(script=[fails(overflow), call("add", {"amount": 5}), AIMessage("Done."),
                                    call("read_counter"), AIMessage("5")])
    results = tmp_path / "tasks.jsonl"
    report = evaluate_online(CounterEnv(), [make_task(0), make_task(1)], [LLMChooser(llm)], results_path=results)
    first, second = report.results["llm"]
    assert first.success is False and first.llm_failures == 1 and "exceeds the available context" in first.error
    assert second.success is True and second.error is None
    assert report.summary()["llm"]["llm_failures"] == 1
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert [(line["chooser"], line["task_id"], line["success"]) for line in lines] == [
        ("llm", "count-0", False), ("llm", "count-1", True)]


def test_a_failed_argument_filling_costs_that_decision() -> None:
    llm = ScriptedChatModel(script=[fails(TimeoutError("read timed out"))])
    env, arguments = CounterEnv(), llm_arguments(llm)
    result = rollout(env, Scripted(["add", FINISH, "read_counter", FINISH]), make_task(), arguments=arguments)
    assert result.llm_failures == 1 and result.error is None and result.invalid_calls == 1
    assert env.steps[0].tool == "add" and env.steps[0].error  # called without arguments: an invalid call
    assert result.turns_succeeded == 1  # the second turn still ran
    assert arguments.failures == 1 and "TimeoutError: read timed out" in (arguments.last_error or "")


class _Interrupting(Scripted):
    def session(self, task: str, tools: Sequence[ToolSpec]) -> Scripted:
        if task == "Add 5 to the counter." and self.offered:
            raise KeyboardInterrupt
        return super().session(task, tools)


def test_an_interrupted_run_keeps_the_finished_tasks_and_shows_progress(tmp_path: Path) -> None:
    results = tmp_path / "tasks.jsonl"
    output = io.StringIO()
    console = Console(file=output, force_terminal=True, width=120)
    with pytest.raises(KeyboardInterrupt):
        evaluate_online(CounterEnv(), [make_task(0), make_task(1)], [_Interrupting(["add", FINISH, "read_counter"])],
                        results_path=results, show_progress=True, console=console)
    (line,) = results.read_text().splitlines()
    assert json.loads(line)["task_id"] == "count-0"
    assert "1/2" in output.getvalue() and "1 succeeded" in output.getvalue()


def test_progress_goes_to_a_log_line_by_line() -> None:
    output = io.StringIO()
    evaluate_online(CounterEnv(), [make_task(0), make_task(1)], [Scripted(["add", FINISH, "read_counter"])],
                    env_name="counter", show_progress=True, console=Console(file=output, force_terminal=False))
    assert "counter scripted: 1/2 tasks, 1 succeeded" in output.getvalue()
    assert "counter scripted: 2/2 tasks, 2 succeeded" in output.getvalue()
