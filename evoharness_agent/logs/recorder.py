"""Record agent runs as training logs: a LangChain callback handler that scrubs what it writes.

Pass an :class:`EpisodeRecorder` as a callback to any agent run and every finished run is
appended to a JSONL file as one native :class:`~evoharness_agent.schema.Episode`, ready for
``evoharness-agent train``: run, record, re-train. It understands three kinds of runs:

* a :class:`~evoharness_agent.agents.executor.PolicyAgentExecutor` run (including steps whose tool
  did not run: refusals, invalid arguments);
* a langchain-classic ``AgentExecutor`` run;
* a ``langchain.agents.create_agent`` graph (any LangGraph whose state has ``messages``).

Give it in the run's config (``agent.invoke(inputs, {"callbacks": [recorder]})`` or
``agent.with_config(callbacks=[recorder])``): handlers given to an executor's constructor are
not inherited by its tool and model calls, so they would see no steps.

The task is the run's ``input`` (or its latest user message), each top-level tool call is a
step (tools called inside a tool belong to that tool), and the answer ends the episode. The
tools offered come from the ``tools`` given here, the models' bound tools and the tools that
ran. A run that raises is not recorded. A run stopped by a limit, or ended by a
``return_direct`` tool, records no answer step: nothing decided to answer there.

Everything is scrubbed before it reaches the file: by default :class:`PIIScrubber` replaces
secrets, e-mail addresses, phone numbers, IBANs, card numbers, SSNs and IP addresses with
placeholders, in keys, values and numbers alike, tools' descriptions and metadata included.
Scrubbing and writing happen on a writer thread, off the agent's path: the callback only hands
the finished run over. Call :meth:`EpisodeRecorder.flush` before reading the log in the same
process (runs still queued at exit are written then); ``background=False`` writes in the callback.
"""

from __future__ import annotations

import ast
import atexit
import json
import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from uuid import UUID

from langchain_core.agents import AgentFinish
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage, convert_to_messages

from evoharness_agent.logs.events import RUN_EVENT, STEP_EVENT
from evoharness_agent.logs.scrubber import PIIScrubber, scrub_value
from evoharness_agent.runtime import append_line
from evoharness_agent.schema import Episode, Step, ToolSpec, as_tool_spec, tool_error_text

__all__ = ["EpisodeRecorder"]

logger = logging.getLogger(__name__)
_LIVE: weakref.WeakSet[EpisodeRecorder] = weakref.WeakSet()
"""Recorders whose writer may hold runs: flushed at exit, so that no finished run is lost."""


@atexit.register
def _flush_all() -> None:
    """Write every run still queued when the interpreter exits."""
    for recorder in list(_LIVE):
        recorder.flush()


@dataclass
class _Recording:
    """What one top-level run did so far."""

    task: str
    source: str
    tools: dict[str, ToolSpec]
    steps: list[Step] = field(default_factory=list)
    pending: dict[UUID, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    answer: str | None = None
    answered: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)


class EpisodeRecorder(BaseCallbackHandler):
    """A callback handler that appends every finished agent run to a native JSONL log.

    Args:
        path: the ``.jsonl`` file to append to (created when missing).
        tools: the tools the agent may call, for runs whose callbacks do not show them all.
        scrubber: applied to every recorded string (keys and integers' digits too) before it is
            written; ``None`` uses :class:`PIIScrubber` (pass ``lambda text: text`` to record
            verbatim). What it fails on is written as ``[REDACTED]``; what UTF-8 cannot encode
            (a lone surrogate) as U+FFFD.
        reward: scores a finished (scrubbed) episode, on the writer thread (``None``: leave the
            reward unset, for ``load_episodes(default_reward=...)`` to fill).
        metadata: added to every episode's metadata.
        background: scrub and write on a writer thread (default), not in the run's callback.

    """

    run_inline = True  # handle async runs' events in order, on the loop, like sync ones

    def __init__(self, path: str | Path, *, tools: Sequence[Any] = (), scrubber: Callable[[str], str] | None = None,
                 reward: Callable[[Episode], float | None] | None = None,
                 metadata: Mapping[str, Any] | None = None, background: bool = True) -> None:
        self.path = Path(path)
        if self.path.name.endswith(".gz"):
            raise ValueError(f"{self.path}: the recorder appends plain JSONL; use a .jsonl path")
        self.tools = [as_tool_spec(tool) for tool in tools]
        self.scrubber = scrubber or PIIScrubber()
        self.reward = reward
        self.metadata = dict(metadata or {})
        self.background = background
        self.n_recorded = 0
        """How many episodes this recorder has written."""
        # Batched runs call back from several threads at once.
        self._lock = threading.Lock()
        self._queue: deque[tuple[UUID, _Recording]] = deque()
        self._writing = False  # a writer thread is draining the queue
        self._idle = threading.Condition(self._lock)
        self._recordings: dict[UUID, _Recording] = {}
        self._root: dict[UUID, UUID] = {}
        self._in_tool: set[UUID] = set()

    # -- tracking runs ---------------------------------------------------------------------------

    def _recording(self, run_id: UUID) -> _Recording | None:
        """Return the recording that ``run_id`` belongs to (lock held)."""
        root = self._root.get(run_id)
        return self._recordings.get(root) if root is not None else None

    def _register(self, run_id: UUID, parent_run_id: UUID | None, *, tool: bool = False) -> bool:
        """Attach a child run to its root; return whether it is a top-level tool (lock held)."""
        root = self._root.get(parent_run_id) if parent_run_id is not None else None
        if root is None:
            return False
        self._root[run_id] = root
        nested = parent_run_id in self._in_tool
        if nested or tool:
            self._in_tool.add(run_id)
        return tool and not nested

    def on_chain_start(self, serialized: dict[str, Any] | None, inputs: dict[str, Any] | Any, *, run_id: UUID,
                       parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        """Start recording a top-level run; attach a nested chain to its run."""
        with self._lock:
            if parent_run_id is not None:
                self._register(run_id, parent_run_id)
                return
            task = _task(inputs)
            if task is None:
                return  # not an agent run: nothing to learn from
            source = kwargs.get("name") or (serialized or {}).get("name") or "agent"
            self._root[run_id] = run_id
            self._recordings[run_id] = _Recording(task, str(source), {t.name: t for t in self.tools})

    def on_chat_model_start(self, serialized: dict[str, Any], messages: list[list[BaseMessage]], *, run_id: UUID,
                            parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        """Learn the tools a model call was offered."""
        with self._lock:
            self._register(run_id, parent_run_id)
            recording = self._recording(run_id)
            offered = (kwargs.get("invocation_params") or {}).get("tools") or []
            if recording is not None and run_id not in self._in_tool:
                for tool in offered:
                    try:
                        spec = as_tool_spec(tool)
                    except (TypeError, KeyError, ValueError):
                        continue  # a provider's built-in tool (web search, …) has no function spec
                    recording.tools.setdefault(spec.name, spec)

    def on_llm_start(self, serialized: dict[str, Any], prompts: list[str], *, run_id: UUID,
                     parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        """Attach a completion-model call to its run."""
        with self._lock:
            self._register(run_id, parent_run_id)

    def on_tool_start(self, serialized: dict[str, Any], input_str: str, *, run_id: UUID,
                      parent_run_id: UUID | None = None, inputs: dict[str, Any] | None = None,
                      **kwargs: Any) -> None:
        """Note a top-level tool call and its arguments."""
        with self._lock:
            if not self._register(run_id, parent_run_id, tool=True):
                return
            recording = self._recording(run_id)
            assert recording is not None  # _register found the run's root, which is being recorded
            name = (serialized or {}).get("name") or kwargs.get("name") or "tool"
            recording.tools.setdefault(name, ToolSpec(name=name, description=(serialized or {}).get("description")
                                                      or ""))
            recording.pending[run_id] = (name, inputs if isinstance(inputs, dict) else _arguments(input_str))

    def on_tool_end(self, output: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        """Record a tool call's result."""
        error = isinstance(output, ToolMessage) and output.status == "error"
        self._finish_tool(run_id, output.content if isinstance(output, ToolMessage) else output, error)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, parent_run_id: UUID | None = None,
                      **kwargs: Any) -> None:
        """Record a tool call that raised."""
        self._finish_tool(run_id, tool_error_text(error), True)

    def _finish_tool(self, run_id: UUID, observation: Any, error: bool) -> None:
        """Turn a pending tool call into a step."""
        with self._lock:
            recording = self._recording(run_id)
            if recording is None or run_id not in recording.pending:
                return
            name, arguments = recording.pending.pop(run_id)
            recording.steps.append(Step(tool=name, arguments=arguments, observation=observation, error=error))

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Take a PolicyAgentExecutor's tools and its steps whose tool did not run."""
        with self._lock:
            recording = self._recordings.get(run_id)
            if recording is None or not isinstance(data, dict):
                return
            if name == RUN_EVENT:
                for tool in data.get("tools", []):
                    spec = ToolSpec.model_validate(tool)
                    recording.tools.setdefault(spec.name, spec)
                recording.metadata["mode"] = data.get("mode")
            elif name == STEP_EVENT:
                recording.steps.append(Step.model_validate(data["step"]))

    def on_agent_finish(self, finish: AgentFinish, *, run_id: UUID, **kwargs: Any) -> None:
        """Note an executor's answer; an empty log means a stop or a ``return_direct`` tool."""
        with self._lock:
            recording = self._recordings.get(run_id)
            if recording is not None:
                recording.answer = str(finish.return_values.get("output", ""))
                recording.answered = bool(finish.log)

    def on_chain_end(self, outputs: dict[str, Any] | Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Write a finished top-level run."""
        with self._lock:
            recording = self._recordings.get(run_id)
            if recording is None:
                return
            self._forget(run_id)
            if recording.answer is None:
                recording.answer = _graph_answer(outputs)
                recording.answered = bool(recording.answer)
            if self.background:
                self._queue.append((run_id, recording))
                if not self._writing:
                    self._writing = True
                    _LIVE.add(self)
                    threading.Thread(target=self._drain, name=f"EpisodeRecorder:{self.path.name}",
                                     daemon=True).start()
                return
        self._write(run_id, recording)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Drop a top-level run that raised."""
        with self._lock:
            if run_id in self._recordings:
                self._forget(run_id)

    def _forget(self, root: UUID) -> None:
        """Drop every trace of a finished top-level run (lock held)."""
        self._recordings.pop(root, None)
        runs = [run for run, owner in self._root.items() if owner == root]
        for run in runs:
            del self._root[run]
            self._in_tool.discard(run)

    # -- writing ---------------------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every finished run is written; return whether it was within ``timeout`` seconds."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._writing, timeout)

    def _drain(self) -> None:
        """Write queued runs until none is left (the writer thread)."""
        while True:
            with self._lock:
                if not self._queue:
                    self._writing = False
                    self._idle.notify_all()
                    return
                run_id, recording = self._queue.popleft()
            try:
                self._write(run_id, recording)
            except Exception:  # a thread has no caller to raise to: say which run was lost
                logger.exception("%s: could not record run %s", self.path, run_id)

    def _write(self, run_id: UUID, recording: _Recording) -> None:
        """Scrub the run into an episode and append it to the log."""
        steps = list(recording.steps)
        if recording.answered and recording.answer:
            steps.append(Step(kind="assistant", content=recording.answer))
        metadata = {"source": recording.source, "recorded_at": datetime.now(timezone.utc).isoformat(),
                    **recording.metadata, **self.metadata}
        if not recording.answered:
            metadata["ended_without_answer"] = True
        episode = Episode(id=str(run_id), task=recording.task, tools=list(recording.tools.values()), steps=steps,
                          final_answer=recording.answer or "", metadata=metadata)
        episode = self.scrub(episode)
        if self.reward is not None:
            try:
                episode.reward = self.reward(episode)
            except Exception as exc:  # a failing reward costs the reward, not the episode
                logger.warning("%s: the reward failed on run %s (%s: %s); recorded without a reward", self.path,
                               run_id, type(exc).__name__, exc)
                episode.metadata["reward_error"] = scrub_value(f"{type(exc).__name__}: {exc}", self.scrubber)
        line = episode.model_dump_json()
        with self._lock:
            append_line(self.path, line)
            self.n_recorded += 1

    def scrub(self, episode: Episode) -> Episode:
        """Return ``episode`` with what it says scrubbed; its names, ids and kinds stay as they are.

        Scrubbed: the task, arguments (keys and numbers too), observations, answers, the tools'
        descriptions and parameters, and the metadata.
        """

        def clean(value: Any) -> Any:
            return scrub_value(value, self.scrubber)

        tools = [tool.model_copy(update={"description": clean(tool.description), "parameters": clean(tool.parameters)})
                 for tool in episode.tools]
        steps = [step.model_copy(update={"arguments": clean(step.arguments), "observation": clean(step.observation),
                                         "content": clean(step.content)}) for step in episode.steps]
        return episode.model_copy(update={"task": clean(episode.task), "tools": tools, "steps": steps,
                                          "final_answer": clean(episode.final_answer),
                                          "metadata": clean(episode.metadata)})


def _task(inputs: Any) -> str | None:
    """Return the request of a run: its ``input``, or its latest user message."""
    if not isinstance(inputs, Mapping):
        return None
    if isinstance(inputs.get("input"), str):
        return inputs["input"]
    try:
        messages = convert_to_messages(inputs.get("messages") or [])
    except (ValueError, TypeError, NotImplementedError):
        return None
    asked = [message.text for message in messages if isinstance(message, HumanMessage)]
    return asked[-1] if asked else None


def _graph_answer(outputs: Any) -> str | None:
    """Return a graph's answer: its last AI message, when that message calls no tool."""
    if not isinstance(outputs, Mapping):
        return None
    if isinstance(outputs.get("output"), str):
        return outputs["output"]
    messages = outputs.get("messages") or []
    last = messages[-1] if messages else None
    if isinstance(last, AIMessage) and not last.tool_calls:
        return last.text
    return None


def _arguments(input_str: str) -> dict[str, Any]:
    """Read a tool's arguments from its input string (a dict's repr or JSON, else plain text)."""
    for parse in (json.loads, ast.literal_eval):
        try:
            value = parse(input_str)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(value, dict):
            return value
    return {"input": input_str}
