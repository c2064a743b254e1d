"""THE state layout: what the policy sees at a decision, for training and for serving alike.

A state is a row of slots, each the embedding of one text, then a few numbers:

====================  ======================================================================
slot                  text
====================  ======================================================================
``request``           the latest user message (the task itself in the first turn)
``previous_tool``     name+description of the tool called last (zero vector before any call)
``task``              the episode's first message
``history[0..w-1]``   the last ``history_window`` steps, newest first (zero vector past the start)
features              calls since the request (scaled), whether the last call failed
====================  ======================================================================

plus, per candidate tool, the pair features of :data:`PAIR_FEATURES`: what the history says
about that tool (called in this turn, just called and it worked or failed, how often), whether
the request names it or a clause of the request starts with its verb ("Book the cheapest
flight": ``book``), whether it only looks things up (``get_``, ``search_``), whether its
required identifiers are still unknown, whether it is the tool that would give an identifier
another tool still needs (a prerequisite: ``find_customer`` before ``list_orders(customer_id)``;
the parameter schemas say so), whether it is a lookup a result in this turn listed records for that
it has not read (``get_order_details`` while the profile lists orders it was not called with), and
how well it serves a part of the request that no tool called in this turn serves yet
(:func:`part_coverage`: "the weather in Paris, in Fahrenheit" still needs a conversion after
``get_weather``). They describe a tool by its relation to the state, never by its identity, so they
carry over to tools never seen.

Training (:func:`evoharness_agent.encoding.transitions.build_dataset`) and serving
(:class:`evoharness_agent.policy.ToolPolicy`) both call :func:`state_parts`, :func:`state_rows`
(with :class:`SlotRows`) and :func:`gather_states`; the networks find the request and
previous-tool slots through :data:`REQUEST_SLOT` and :data:`PREVIOUS_TOOL_SLOT`. Nothing else
knows the order.
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from evoharness_agent.schema import FINISH, Episode, Step, ToolSpec

__all__ = [
    "FIXED_SLOTS",
    "N_PAIR_FEATURES",
    "AVAILABLE",
    "CALLED_IN_TURN",
    "IS_FINISH",
    "JUST_CALLED_FAILED",
    "JUST_UNBLOCKED",
    "MISSING_IDS",
    "ASKED_BY_VERB",
    "IS_LOOKUP",
    "LOOKUP_VERBS",
    "NAMED_IN_REQUEST",
    "PAIR_FEATURES",
    "PROVIDES_MISSING",
    "SERVES_OPEN_PART",
    "STATE_LAYOUT_VERSION",
    "N_STATE_FEATURES",
    "PAD",
    "PREVIOUS_TOOL_SLOT",
    "REQUEST_SLOT",
    "Decision",
    "SlotRows",
    "TOKEN_SHORTLIST",
    "StateParts",
    "decisions",
    "gather_states",
    "matched_part_texts",
    "n_slots",
    "part_coverage",
    "request_part_texts",
    "request_parts",
    "state_dim",
    "state_parts",
    "state_rows",
    "tool_coverage",
    "step_text",
]

FIXED_SLOTS = ("request", "previous_tool", "task")
"""The slots before the history window, in order."""
REQUEST_SLOT = FIXED_SLOTS.index("request")
PREVIOUS_TOOL_SLOT = FIXED_SLOTS.index("previous_tool")
N_STATE_FEATURES = 2
"""Calls since the request (scaled) and whether the last call failed."""
PAIR_FEATURES = (
    "called_in_turn",      # called since the latest user message
    "called_before",       # called anywhere earlier in the episode
    "just_called_ok",      # the step right before this decision called it, and it worked
    "just_called_failed",  # ... and it failed
    "failed_in_turn",      # a call of it failed since the latest user message
    "calls_in_turn",       # how often it was called in this turn (scaled, capped)
    "named_in_request",    # the request names it (its name, or the words of its name)
    "missing_ids",         # share of its required identifier arguments nothing gave yet (by name; users by a value
                           # after words that speak of it; or a call that worked of the tool named for it;
                           # a credential only when the user asks to log in)
    "provides_missing",    # it is named for an identifier another available tool needs and nothing gave yet
    "just_unblocked",      # the call just made gave the last of its required identifiers (missing before it)
    "serves_open_part",    # how much better it matches some part of the request than any tool called in this turn
    "is_lookup",           # its name starts with a verb of a tool that changes nothing (get_, list_, search_, ...)
    "asked_by_verb",       # a clause of the request starts with its name's verb ("Book the cheapest flight": book)
    "available",           # it may be called now (the scorer compares a tool with the others available)
    "is_finish",           # it is FINISH, "answer now"
    "added_not_called",    # it became available since the latest user message (``Step.tools_added``: BFCL's
                           # "I have updated some more functions you can choose from") and was not called since
    "reads_listed",        # a lookup, and a result in this turn listed a value of its identifier it was not called
                           # with and gave no record of (``get_order_details`` while the user's profile lists
                           # orders it has not read)
)
"""Per (state, tool) features, in order."""
N_PAIR_FEATURES = len(PAIR_FEATURES)
AVAILABLE = PAIR_FEATURES.index("available")
IS_FINISH = PAIR_FEATURES.index("is_finish")
CALLED_IN_TURN = PAIR_FEATURES.index("called_in_turn")
CALLED_BEFORE = PAIR_FEATURES.index("called_before")
PROVIDES_MISSING = PAIR_FEATURES.index("provides_missing")
MISSING_IDS = PAIR_FEATURES.index("missing_ids")
JUST_CALLED_FAILED = PAIR_FEATURES.index("just_called_failed")
JUST_CALLED_OK = PAIR_FEATURES.index("just_called_ok")
FAILED_IN_TURN = PAIR_FEATURES.index("failed_in_turn")
CALLS_IN_TURN = PAIR_FEATURES.index("calls_in_turn")
CALLS_IN_TURN_CAP = 5
"""``calls_in_turn`` is ``min(calls, CALLS_IN_TURN_CAP) / CALLS_IN_TURN_CAP``."""
JUST_UNBLOCKED = PAIR_FEATURES.index("just_unblocked")
NAMED_IN_REQUEST = PAIR_FEATURES.index("named_in_request")
SERVES_OPEN_PART = PAIR_FEATURES.index("serves_open_part")
IS_LOOKUP = PAIR_FEATURES.index("is_lookup")
ASKED_BY_VERB = PAIR_FEATURES.index("asked_by_verb")
ADDED_NOT_CALLED = PAIR_FEATURES.index("added_not_called")
READS_LISTED = PAIR_FEATURES.index("reads_listed")
STATE_LAYOUT_VERSION = 15
"""Stored in policy metadata: a policy trained on another layout must be retrained, not misread."""
TOKEN_SHORTLIST = 3
"""Tools per request part that :func:`tool_coverage` matches token by token (the nearest by cosine)."""
PAD = 0
"""Row 0 of every text table is the zero vector: an empty slot."""

MAX_ARGUMENT_CHARS = 200
MAX_OBSERVATION_CHARS = 300
MAX_CONTENT_CHARS = 400


def _clip(text: str, limit: int) -> str:
    """Keep the head of a long text: tool outputs put the gist first."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def step_text(step: Step) -> str:
    """Return the text embedded for one step of an episode (a history slot)."""
    if step.kind == "user":
        return f"user: {_clip(step.content, MAX_CONTENT_CHARS)}"
    if step.kind == "assistant":
        return f"assistant replied: {_clip(step.content, MAX_CONTENT_CHARS)}"
    arguments = json.dumps(step.arguments, ensure_ascii=False, sort_keys=True, default=str)
    status = "error" if step.error else "ok"
    return (f"called {step.tool}({_clip(arguments, MAX_ARGUMENT_CHARS)}) -> {status}: "
            f"{_clip(step.observation, MAX_OBSERVATION_CHARS)}")


_PART_BREAK = re.compile(r"(?<=[.?!;])\s+|,\s*(?:and\s+|then\s+)?|\s+(?:and then|then|and also|and|also|as well as)\s+",
                         re.IGNORECASE)
MAX_REQUEST_PARTS = 8
LATE_REQUEST_CHARS = 1000
"""How much of a request :func:`request_parts` reads once a call was made in the turn (``after_call``)."""
LATE_REQUEST_PARTS = 16


def request_parts(request: str, *, after_call: bool = False) -> list[str]:
    """Split a request into its clauses (sentences, commas, "and", "then"): the pieces of work it asks for.

    A whole request's embedding is dominated by its main ask; a clause such as "in Fahrenheit"
    or "and log the call" is what shows that more than one tool is needed. The first 400
    characters give up to 8 clauses; ``after_call`` (a call was made in this turn), the first
    1,000 give up to 16: whether the request still asks for more can be in its late sentences
    (a long BFCL turn asks to lock the doors past character 400), while for the first call they
    mostly blur how each tool matches the ask. Chosen on the validation domains, retrained: live
    top-1 on stabletoolbench / bfcl_single left out 0.593 / 0.834 -> 0.600 / 0.846 (FINISH
    accuracy 0.816 / 0.911 -> 0.827 / 0.929), top-1 over their tool calls 0.596 / 0.817 ->
    0.593 / 0.812; reading 1,000 characters before the first call too lost more there (0.589 / 0.806).
    """
    chars, most = (LATE_REQUEST_CHARS, LATE_REQUEST_PARTS) if after_call else (MAX_CONTENT_CHARS, MAX_REQUEST_PARTS)
    pieces = [piece.strip() for piece in _PART_BREAK.split(request[:chars]) if piece and piece.strip()]
    pieces = [piece for piece in pieces if len(piece) > 3]
    return pieces[:most] or [request[:chars]]


def request_part_texts(requests: Iterable[str]) -> list[str]:
    """Return the distinct :func:`request_parts` of ``requests``, before and after a call, sorted (one batch)."""
    return sorted({part for request in requests for after_call in (False, True)
                   for part in request_parts(request, after_call=after_call)})


def matched_part_texts(requests: Iterable[str]) -> list[str]:
    """Return the distinct clauses that :func:`tool_coverage` matches token by token (after a call), sorted."""
    return sorted({part for request in requests for part in request_parts(request, after_call=True)})


def part_coverage(similarity: np.ndarray, called: np.ndarray) -> np.ndarray:
    """Return, per tool, how much better it serves some request part than the tools called in this turn do.

    ``similarity`` (P, N) is each request part's (:func:`request_parts`) similarity with each
    tool, and ``called`` (N,) marks the tools called since the latest request. A part no called
    tool serves keeps its full similarity; before any call the value is the tool's best part similarity.
    """
    covered = similarity[:, called].max(axis=1) if called.any() else np.zeros(len(similarity), similarity.dtype)
    return (similarity - np.maximum(covered, 0.0)[:, None]).max(axis=0)


def tool_coverage(parts: StateParts, tools: Sequence[ToolSpec], tool_vectors: np.ndarray,
                  embed: Callable[[list[str]], np.ndarray], match_tokens: Callable[[list[str], list[str]], np.ndarray],
                  tool_text: Callable[[str], str]) -> list[float]:
    """Return each of ``tools``' :func:`part_coverage` at a state (``coverage`` of :meth:`StateParts.pair_features`).

    ``tool_vectors`` (N, E) embed ``tools``; ``embed`` gives texts' embeddings and ``match_tokens``
    two lists of texts' token-level similarity (both cached:
    :meth:`~evoharness_agent.encoding.embedder.StateEncoder.match_tokens`); ``tool_text(name)`` is
    the text of a tool called in this turn that is not among ``tools`` (it still covers its part
    of the request). Before any call in the turn a part's similarity with a tool is the cosine of
    their embeddings (how well the tool serves its best part). After one it is their token-level
    match (MaxSim), which tells whether a clause is served: "in Fahrenheit" by the word the
    conversion tool's text holds. Token matching before the first call too ranked the conversion
    first for "the weather in Paris, in Fahrenheit", by that one word.

    Token matching costs a product per token, so it reads only each part's
    :data:`TOKEN_SHORTLIST` tools nearest by cosine among ``tools``, and the called ones; a tool
    outside a part's shortlist is taken to serve it as its last shortlisted tool does (a floor).
    So a tool's value depends on the others ranked with it: training and ranking both pass the
    available tools with FINISH. With every tool matched, a decision over 200 tools cost twice
    layout 8's (``docs/experiments.md``, twenty-ninth and thirtieth stops).
    """
    if not tools:
        return []
    names = {tool.name for tool in tools}
    elsewhere = [tool_text(name) for name in parts.calls_in_turn if name not in names]
    vectors = np.concatenate([tool_vectors, embed(elsewhere)]) if elsewhere else tool_vectors
    called = np.array([tool.name in parts.calls_in_turn for tool in tools] + [True] * len(elsewhere))
    request = request_parts(parts.request, after_call=bool(parts.calls_in_turn))
    # float64: a tool's value must not depend on which other tools share the product (BLAS rounding).
    similarity = embed(request).astype(np.float64) @ vectors.astype(np.float64).T
    if parts.calls_in_turn:
        def text(i: int) -> str:
            return tools[i].text() if i < len(tools) else elsewhere[i - len(tools)]

        similarity = _token_similarity(similarity, called, request, text, match_tokens)
    return part_coverage(similarity, called)[: len(tools)].tolist()


def _token_similarity(cosine: np.ndarray, called: np.ndarray, request: list[str], text: Callable[[int], str],
                      match_tokens: Callable[[list[str], list[str]], np.ndarray]) -> np.ndarray:
    """Return the ``(P, N)`` token-level similarity of request parts and tools, on each part's shortlist.

    ``cosine`` (P, N) ranks the tools per part and ``text(i)`` is tool ``i``'s text. Each part's
    :data:`TOKEN_SHORTLIST` nearest and the ``called`` tools are matched token by token; the rest
    of a part's row is its shortlist's lowest.
    """
    shortlist = np.argsort(-cosine, axis=1, kind="stable")[:, :TOKEN_SHORTLIST]
    matched = np.zeros(cosine.shape, dtype=bool)
    np.put_along_axis(matched, shortlist, True, axis=1)
    matched[:, called] = True
    columns = np.flatnonzero(matched.any(axis=0))
    tokens = match_tokens(request, [text(i) for i in columns.tolist()])
    similarity = np.empty_like(cosine)
    similarity[:, columns] = tokens
    floor = np.where(matched[:, columns], tokens, np.inf).min(axis=1)
    return np.where(matched, similarity, floor[:, None])


def n_slots(history_window: int) -> int:
    """Return the number of text slots of a state."""
    return len(FIXED_SLOTS) + history_window


def state_dim(embedding_dim: int, history_window: int) -> int:
    """Return the size of one gathered state vector."""
    return embedding_dim * n_slots(history_window) + N_STATE_FEATURES


@dataclass
class StateParts:
    """What the policy sees after a prefix of an episode, before it is embedded."""

    task: str
    """The episode's first message."""
    request: str
    """The latest user message (the task itself in the first turn)."""
    history: list[str]
    """Texts of the last ``history_window`` tool calls and replies, newest first."""
    features: list[float]
    """Calls since the request (scaled) and whether the last call failed."""
    previous_tool: str | None
    """The tool called last, if any."""
    called_before: set[str]
    """Tools called anywhere earlier in the episode."""
    calls_in_turn: Counter[str] = field(default_factory=Counter)
    """How often each tool was called since the latest user message."""
    failed_in_turn: set[str] = field(default_factory=set)
    """Tools with a failed call since the latest user message."""
    last_call: tuple[str, bool] | None = None
    """(tool, failed) when the step right before this decision is a tool call."""
    known_text: str = ""
    """Lower-cased request, arguments and observations so far: what the agent already knows."""
    user_named_values: tuple[frozenset[str], ...] = ()
    """The words, with their stems, right before each identifier-like value the user gave ("order #W2890441": order)."""
    known_before_last_call: str | None = None
    """:attr:`known_text` without the result of the call right before this decision, when that call worked."""
    worked: Counter[str] = field(default_factory=Counter)
    """How often each tool was called earlier in the episode and worked."""
    added_not_called: set[str] = field(default_factory=set)
    """Tools that became available since the latest user message (that message included), not called since.

    Once called, such a tool is one more tool called in this turn: marked for the whole turn, it
    kept its lead after failing, and the policy called it until the run was cut (online BFCL)."""
    listed: dict[str, frozenset[str]] = field(default_factory=dict)
    """Values that results of calls that worked since the latest user message listed without their records, by key.

    (:func:`_listed_values`.) A conversation reads the records a lookup just listed; a list from an
    earlier turn stays unread for good once the user moved on (tau-bench airline's reservations)."""
    called_with: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    """The values each (tool, identifier argument) was called with earlier in the episode."""
    failed_asking: dict[str, str] = field(default_factory=dict)
    """Tools whose latest call since the latest user message failed, no call its error asks for working since: each
    one's error, lower-cased.

    An error may say what the call lacks: "No user is currently logged in.", "Please authenticate
    before posting.", "All doors must be locked before starting the engine.". A tool it asks for
    (:func:`_error_asks_for`) is then the failed tool's prerequisite, as a lookup that gives a
    missing identifier is: the policy calls it rather than retry the call or give up."""
    unblocked_by_call: frozenset[str] = frozenset()
    """The tools of :attr:`failed_asking` that the call just made (it worked) gave what their error asked for."""

    def fixed_slot_texts(self, tool_text: Callable[[str], str]) -> list[str | None]:
        """Return the text of each of the :data:`FIXED_SLOTS` in order (``None`` for an empty one).

        ``tool_text(name)`` gives a tool's name+description text for the previous-tool slot.
        """
        previous = tool_text(self.previous_tool) if self.previous_tool else None
        return [self.request, previous, self.task]

    def pair_features(self, tools: Sequence[ToolSpec], available: Collection[str] | None = None,
                      coverage: Sequence[float] | None = None) -> np.ndarray:
        """Return the :data:`PAIR_FEATURES` of each tool, in order, as float64 rows (``available``: all when ``None``).

        ``coverage`` is each tool's :func:`part_coverage` (it needs the embeddings; 0 when ``None``).

        Few real calls repeat a tool (in BFCL 5% repeat one from earlier in the episode), and
        a call that just worked is almost never repeated at once: facts no state vector can
        express per tool, and the loop a policy without them falls into.
        """
        request = self.request.lower()
        tool_set = _tool_set(tuple(_tool_key(tool) for tool in tools))
        names, ids = tool_set.names, tool_set.ids
        at = tool_set.positions
        # Most columns are the tool set's or the request's; the history touches the few tools it names.
        out = np.zeros((len(tools), N_PAIR_FEATURES))
        out[:, NAMED_IN_REQUEST], out[:, ASKED_BY_VERB] = tool_set.request_columns(request)
        out[:, IS_LOOKUP] = tool_set.is_lookup
        out[:, IS_FINISH] = tool_set.is_finish
        is_open = (np.ones(len(tools), dtype=bool) if available is None
                   else np.fromiter((name in available for name in names), dtype=bool, count=len(names)))
        out[:, AVAILABLE] = is_open | tool_set.is_finish
        if coverage is not None:
            out[:, SERVES_OPEN_PART] = np.where(tool_set.is_finish, 0.0, np.asarray(coverage, dtype=np.float64))
        for name, count in self.calls_in_turn.items():
            where = at.get(name, _NOWHERE)
            out[where, CALLED_IN_TURN] = 1.0
            out[where, CALLS_IN_TURN] = min(count, CALLS_IN_TURN_CAP) / CALLS_IN_TURN_CAP
        for name in self.called_before:
            out[at.get(name, _NOWHERE), CALLED_BEFORE] = 1.0
        for name in self.failed_in_turn:
            out[at.get(name, _NOWHERE), FAILED_IN_TURN] = 1.0
        for name in self.added_not_called:
            out[at.get(name, _NOWHERE), ADDED_NOT_CALLED] = 1.0
        if self.listed:
            # Logs read each listed record until one holds what the request is about: which one does
            # is in the results' contents, so the policy is told only that some are still unread.
            for position in tool_set.with_ids:
                if tool_set.is_lookup[position] and any(
                        self.listed.get(key, _NO_VALUES) - self.called_with.get((names[position], argument), _NO_VALUES)
                        for argument in ids[position] for key in _listing_keys(argument)):
                    out[position, READS_LISTED] = 1.0
        just_called, just_failed = self.last_call if self.last_call is not None else (None, False)
        if just_called is not None:
            out[at.get(just_called, _NOWHERE), JUST_CALLED_FAILED if just_failed else JUST_CALLED_OK] = 1.0
        for failed_tool, error in self.failed_asking.items():
            asked = [position for position, name in enumerate(names)
                     if is_open[position] and name != failed_tool and _error_asks_for(name, error)]
            if asked:
                out[at.get(failed_tool, _NOWHERE), MISSING_IDS] = 1.0
                out[asked, PROVIDES_MISSING] = 1.0
        for name in self.unblocked_by_call:
            out[at.get(name, _NOWHERE), JUST_UNBLOCKED] = 1.0
        if not tool_set.with_ids or any(tool_set.gives_any_identifier(words) for words in self.user_named_values):
            return out
        # A tool that worked, as the schema the tool set has for its name (the last, if it has several).
        givers = _givers(self.worked, {name: tools[at[name][-1]] for name in self.worked if name in at})
        user_named = frozenset().union(*self.user_named_values)
        held = _credentials_held(self.task, request)
        subjects = tool_set.subjects
        missing = {position: needed for position in tool_set.with_ids
                   if (needed := _not_given_by_calls(_missing_id_args(ids[position], subjects[position],
                                                                      self.known_text, user_named, held),
                                                     names[position], givers))}
        wanted: dict[tuple[str, ...], list[tuple[str, str]]] = {}
        for position, arguments in missing.items():
            out[position, MISSING_IDS] = max(out[position, MISSING_IDS], len(arguments) / len(ids[position]))
            if is_open[position] and names[position] != FINISH:
                for argument in arguments:
                    wanted.setdefault(_subject_words(argument), []).append((names[position], argument))
        out[[p for p in _providers(tool_set, wanted) if p not in missing], PROVIDES_MISSING] = 1.0
        before = self.known_before_last_call
        if before is not None:
            # Before the call just made (it worked whenever ``before`` is set), its tool gave nothing yet
            # unless an earlier call of it worked too.
            givers_before = ({name: giver for name, giver in givers.items() if name != just_called}
                             if self.worked[just_called or ""] == 1 else givers)
            for position in tool_set.with_ids:
                if position not in missing and _not_given_by_calls(
                        _missing_id_args(ids[position], subjects[position], before, user_named, held),
                        names[position], givers_before):
                    out[position, JUST_UNBLOCKED] = 1.0
        return out


_WORD = re.compile(r"[a-z0-9]+")
_NAME_PARTS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
_GENERIC_WORDS = frozenset({"get", "set", "the", "for", "and", "with", "from", "list", "info", "data", "api", "tool"})
_ID_ARGUMENT = re.compile(r"(?:^|_)(?:id|ids|uuid|token|key)$|[a-z]Id$|ID$")
_CREDENTIAL = re.compile(r"(?:^|_)(?:token|key)$")
"""An identifier that proves who calls (``access_token``, ``api_key``) rather than naming a record."""
_ASKS_TO_LOG_IN = re.compile(r"\b(?:log(?:ging|ged)?|sign(?:ing|ed)?)[ -]?(?:in|on)(?:to)?\b|\bauthenticat")
"""Words of a request to log in ("log into my account", "sign in", "authenticate with my credentials")."""


@functools.lru_cache(maxsize=65536)
def _name_words(name: str) -> tuple[str, ...]:
    """Return the distinctive lower-case words of a tool name (computed once per name: a hot path)."""
    words = (w.lower() for w in _NAME_PARTS.findall(name))
    return tuple(w for w in words if len(w) >= 3 and w not in _GENERIC_WORDS)


@functools.lru_cache(maxsize=256)
def _request_words(request: str) -> tuple[frozenset[str], frozenset[str]]:
    """Return a lower-cased request's words, and the first five letters of those of five letters or more."""
    words = frozenset(_WORD.findall(request))
    return words, frozenset(word[:5] for word in words if len(word) >= 5)


@functools.lru_cache(maxsize=65536)  # a live run asks again at every decision of a turn
def _named_in(name: str, request: str) -> float:
    """Return 1 when the (lower-cased) request contains the tool's name, else the share of its name's words it has."""
    if name.lower() in request:
        return 1.0
    words = _name_words(name)
    if not words:
        return 0.0
    request_words, request_stems = _request_words(request)
    # A word counts when the request has it, or a word sharing its first five letters (book/booking).
    found = sum(w in request_words or (len(w) >= 5 and w[:5] in request_stems) for w in words)
    return found / len(words)


LOOKUP_VERBS = frozenset({
    "get", "list", "search", "find", "lookup", "look", "fetch", "query", "check", "show", "read", "view", "describe",
    "retrieve", "browse", "count", "calculate", "compute", "convert", "estimate", "ls", "cat", "grep", "pwd", "du"})
"""First words of tool names that look something up or compute it and change nothing (``is_lookup``)."""
_LEAD_IN = frozenset({"please", "then", "and", "also", "now", "just", "can", "could", "you", "kindly"})


@functools.lru_cache(maxsize=65536)
def _name_verb(name: str) -> str:
    """Return the lower-cased first word of a tool name (``get_order`` -> get, ``bookFlight`` -> book)."""
    words = _NAME_PARTS.findall(name)
    return words[0].lower() if words else ""


def _is_lookup(name: str) -> bool:
    """Return whether a tool's name starts with a verb of :data:`LOOKUP_VERBS` (it changes nothing)."""
    return _name_verb(name) in LOOKUP_VERBS


@functools.lru_cache(maxsize=256)
def _clause_verbs(request: str) -> frozenset[str]:
    """Return the first five letters of the word each clause of a (lower-cased) request starts with, lead-ins skipped.

    An imperative's verb leads its clause ("book the cheapest flight", "assign it to priya"): a
    tool named for that verb is what the request asks to be done.
    """
    verbs = set()
    for part in request_parts(request):
        words = [word for word in _WORD.findall(part) if word not in _LEAD_IN]
        if words:
            verbs.add(words[0][:5])
    return frozenset(verbs)


def _required(tool: ToolSpec) -> tuple[str, ...]:
    """Return the names of the tool's required arguments."""
    return tuple(arg for arg in tool.parameters.get("required") or [] if isinstance(arg, str))


@functools.lru_cache(maxsize=65536)
def _identifiers(required: tuple[str, ...]) -> tuple[str, ...]:
    """Return the required arguments that are identifiers (``customer_id``, ``token``, ``userId``)."""
    return tuple(arg for arg in required if _ID_ARGUMENT.search(arg))


def _id_args(tool: ToolSpec) -> tuple[str, ...]:
    """Return the tool's required arguments that are identifiers (:func:`_identifiers`)."""
    return _identifiers(_required(tool))


def _missing_id_args(ids: Sequence[str], subjects: Sequence[tuple[tuple[str, ...], ...]], known_text: str,
                     user_named: frozenset[str], credentials_held: bool) -> list[str]:
    """Return the identifier arguments of ``ids`` (a tool's :func:`_id_args`) that ``known_text`` does not mention.

    ``subjects`` holds what each argument identifies (:attr:`_ToolSet.subjects`).
    ``credentials_held``: the session holds every credential (``access_token``), as an app that
    is logged in does; only a user who asks to log in has none yet (:func:`_credentials_held`).

    An argument is mentioned by its name, with spaces for underscores, or in the singular
    (``item_ids`` by an observation's ``"item_id"`` keys), or without its qualifying words
    (``from_account_id`` by ``account_id``: a list of accounts gives the source and the target).
    Users give identifiers as values, not by name: a value fills the identifiers its preceding
    words speak of (``user_named``, :func:`_words_before_values`: "Return order #W6067464" gives
    ``order_id``). "You are mei_kovacs_8020" speaks of none, and logs then look the user up.
    """
    return [arg for arg, said_as in zip(ids, subjects, strict=True)
            if not (credentials_held and _CREDENTIAL.search(arg))
            and not any(form in known_text for form in _id_forms(arg))
            and not any(_speaks_of(user_named, subject) for subject in said_as)]


_LOG_IN_WORDS = frozenset({"login", "logon", "signin", "authenticate", "auth"})


@functools.lru_cache(maxsize=65536)
def _is_log_in_tool(name: str) -> bool:
    """Return whether a tool logs the user in: ``message_login``, ``authenticate_twitter``, ``logIn``.

    Not a lookup of the log-in state (``get_login_status``): its name has a lookup verb.
    """
    words = [word.lower() for word in _NAME_PARTS.findall(name)]
    joined = {first + second for first, second in zip(words, words[1:], strict=False)}
    return bool(_LOG_IN_WORDS & (set(words) | joined)) and not LOOKUP_VERBS & set(words)


_CREDENTIAL_WORD = re.compile(r"\b(?:token|session|credentials?)\b")
_NOT_VALID = re.compile(r"\b(?:expired|invalid|not initiali[sz]ed|missing|revoked)\b")


def _asks_to_log_in(error: str) -> bool:
    """Return whether a (lower-cased) failed call's result says the user must log in first.

    "Not authenticated", "401 Unauthorized", or a credential that is no longer good ("Token
    expired", "Invalid access token", "Token not initialized": BFCL's travel API before
    ``authenticate_travel``).
    """
    return bool(_ASKS_TO_LOG_IN.search(error) or "unauthori" in error
                or (_CREDENTIAL_WORD.search(error) and _NOT_VALID.search(error)))


@functools.lru_cache(maxsize=4096)
def _error_asks_for(name: str, error: str) -> bool:
    """Return whether a (lower-cased) error asks for tool ``name``: a log-in, or every word of its name.

    "All doors must be locked before starting the engine." asks for ``lockDoors`` (a word counts
    in any form it starts: locked); "Please authenticate before posting." for a log-in tool
    (:func:`_is_log_in_tool`). A name of one word (``cat``, ``send``) is too common a word to count.
    """
    if _is_log_in_tool(name) and _asks_to_log_in(error):
        return True
    words = _name_words(name)
    if len(words) < 2:
        return False
    said = _error_words(error)
    return all(any(word == w or (len(w) >= 4 and word.startswith(w)) for word in said) for w in words)


@functools.lru_cache(maxsize=256)
def _error_words(error: str) -> frozenset[str]:
    """Return the distinct words of a (lower-cased) error, read once for every tool it is matched with."""
    return frozenset(_WORD.findall(error))


def _credentials_held(task: str, request: str) -> bool:
    """Return whether the session holds its credentials: neither the task nor the latest request asks to log in.

    In BFCL's travel logs ``book_flight(access_token, ...)`` is called without ``authenticate_travel``
    92 times in 96: the app is logged in, and nobody gives the token. Counted missing, it held
    the booking back behind a log-in the user never asked for.
    """
    return not (_ASKS_TO_LOG_IN.search(task.lower()) or _ASKS_TO_LOG_IN.search(request))


_Giver = tuple[frozenset[str], frozenset[str]]
"""A tool with a call that worked: its words (:func:`_tool_words`) and its own required identifiers."""


def _givers(worked: Collection[str], specs: Mapping[str, ToolSpec]) -> dict[str, _Giver]:
    """Return the :data:`_Giver` of each tool in ``worked`` (``specs``: the schemas known now; a name alone else)."""
    out = {}
    for name in worked:
        spec = specs.get(name)
        description = (spec.description or "") if spec is not None else ""
        out[name] = (_tool_words(name, description), frozenset(_id_args(spec)) if spec is not None else frozenset())
    return out


def _not_given_by_calls(arguments: list[str], needer: str, givers: Mapping[str, _Giver]) -> list[str]:
    """Return the identifier ``arguments`` of ``needer`` that no tool in ``givers`` (:func:`_givers`) gave.

    A tool gave an identifier when it is named for it (as :func:`_providers` reads a tool) and
    does not require it itself: after ``find_user_id_by_email`` worked, ``get_user_details``
    has its ``user_id``, whether the observation says ``"user_id"``, ``"id"`` or nothing at
    all (a gold action list logs no observations). Else the id looks missing for ever, and
    another lookup of it (``find_user_id_by_name_zip``) ranks above the tool that waits.
    """
    if not arguments or not givers:
        return arguments
    return [argument for argument in arguments
            if not any(name != needer and argument not in own and _speaks_of(words, _subject_words(argument))
                       for name, (words, own) in givers.items())]


def _speaks_of(words: frozenset[str], subject: Sequence[str]) -> bool:
    """Return whether a tool's words (:func:`_tool_words`) have each word of an identifier's subject, or its stem."""
    return all(w in words or w[:5] in words for w in subject)


def _with_stems(words: set[str]) -> frozenset[str]:
    """Return ``words`` with the 5-letter stems of those of five letters or more, as :func:`_speaks_of` reads them."""
    return frozenset(words | {word[:5] for word in words if len(word) >= 5})


@functools.lru_cache(maxsize=65536)
def _id_forms(argument: str) -> frozenset[str]:
    """Return the texts that mention an identifier argument (:func:`_missing_id_args`)."""
    words = argument.lower().split("_")
    tails = ["_".join(words[start:]) for start in range(max(len(words) - 1, 1))]  # down to "<subject>_id"
    return frozenset(form for tail in tails for singular in (tail, tail.removesuffix("s"))
                     for form in (singular, singular.replace("_", " ")))


_IDENTIFIER_VALUE = re.compile(r"#\w+|\b(?=[\w-]*\d)(?=[\w-]*[a-zA-Z])[\w-]{5,}\b|\b\d{6,}\b")
"""A token that looks like an identifier: ``#W2890441``, letters with digits (``ORD-88213``,
``EHGLP3``, ``mia_li_3668``), or six digits or more; not ``5pm``, ``Q3`` or a date."""


_ID_WORDS = frozenset({"id", "ids", "uuid"})
_RECORD_KEY = re.compile(r"[A-Za-z]{2,4}-[0-9]{2,}")
"""A value shaped like a record's key (``MOB-88``, ``EMP-2210``, ``lock-07``): a short prefix, a dash, digits."""


@functools.lru_cache(maxsize=4096)
def _words_before_values(text: str) -> tuple[frozenset[str], ...]:
    """Return the three words before each identifier-like value in a user's message, lower-cased, with their stems.

    A value shaped like a record's key (:data:`_RECORD_KEY`) says "id" by its shape, as "user id
    USR002" does by its words: "Where are we with MOB-88?" gives the issue's id, and the issue
    tracker's own tools need no lookup first (:meth:`_ToolSet.gives_any_identifier`).
    """
    return tuple(dict.fromkeys(
        _with_stems(set(_WORD.findall(text[max(match.start() - 60, 0):match.start()].lower())[-3:])
                    | ({"id"} if _RECORD_KEY.fullmatch(match.group(0)) else set()))
        for match in _IDENTIFIER_VALUE.finditer(text)))


_NOT_A_SUBJECT = "(?!(?:the|a|an|its|it|this|their|your|unique)\\b)"
_DESCRIBED_ID = re.compile(rf"\b(?:{_NOT_A_SUBJECT}([a-z]+) id|id of (?:the |a |an )?{_NOT_A_SUBJECT}([a-z]+))\b")


def _described_subjects(tool: ToolSpec, ids: tuple[str, ...]) -> tuple[str, ...]:
    """Return the word each of ``ids`` (the tool's identifier arguments) is described as identifying, or ""."""
    properties = tool.parameters.get("properties") or {}
    out = []
    for argument in ids:
        spec = properties.get(argument)
        description = spec.get("description") if isinstance(spec, dict) else None
        out.append(_described_subject(description) if isinstance(description, str) else "")
    return tuple(out)


@functools.lru_cache(maxsize=65536)
def _described_subject(description: str) -> str:
    """Return the word an identifier's description puts before "id" or after "id of", else an empty string.

    A role names an argument, an entity its description: ``receiver_id`` is "User ID of the user
    to send the message to", and the user gives it as "my cousin, user id USR002".
    """
    match = _DESCRIBED_ID.search(description.lower())
    return next((word for word in match.groups() if word), "") if match else ""


@functools.lru_cache(maxsize=65536)
def _subject_words(argument: str) -> tuple[str, ...]:
    """Return what an identifier argument identifies: ``customer_id`` -> customer, ``access_token`` -> access, token."""
    words = [w.lower() for w in _NAME_PARTS.findall(argument)]
    subject = tuple(w for w in words if w not in _ID_WORDS)
    return subject or tuple(words)


@functools.lru_cache(maxsize=65536)
def _tool_words(name: str, description: str) -> frozenset[str]:
    """Return the lower-case words of a tool's name, and of its description for a lookup, with their 5-letter stems.

    These say which identifiers a tool can give (:func:`_providers`, :func:`_givers`). A tool that
    changes something gives none its description merely mentions: ``cancel_pending_order`` says
    the payment is refunded "via the original payment method", and gives no ``payment_method_id``.
    """
    words = {w.lower() for w in _NAME_PARTS.findall(name)}
    if _is_lookup(name):
        words |= set(_WORD.findall(description.lower()))
    return _with_stems(words)


_NO_VALUES: frozenset[str] = frozenset()


@functools.lru_cache(maxsize=65536)
def _listing_keys(argument: str) -> frozenset[str]:
    """Return the keys, singular, a result lists an identifier's values under (``order_id``: orders, order_ids)."""
    return frozenset({"_".join(_subject_words(argument)), _singular_key(argument)}
                     | {form for form in _id_forms(argument) if " " not in form})


def _singular_key(key: str) -> str:
    """Return a result's key as snake case in the singular (``orderIds`` -> order_id, ``categories`` -> category)."""
    key = "_".join(word.lower() for word in _NAME_PARTS.findall(key))
    if key.endswith("ies"):
        return key[:-3] + "y"
    return key[:-1] if key.endswith("s") and not key.endswith("ss") else key


@functools.lru_cache(maxsize=4096)  # each decision rereads the episode's results
def _listed_values(observation: str) -> tuple[tuple[str, frozenset[str]], ...]:
    """Return what a JSON result lists and does not hold: (key in the singular, values) for each list of plain values.

    ``{"orders": ["#W1", "#W2"]}`` lists orders. A value the same result also gives a record of
    (an object with that identifier and more: ``"items": [{"item_id": "42", "price": 9}]``
    beside ``"item_ids": ["42"]``) is not listed: its record is read already. For the same
    reason records keyed by their ids (``"variants": {"42": {...}}``) list nothing. A result
    that is not JSON lists nothing.
    """
    if not observation.lstrip().startswith(("{", "[")):
        return ()
    try:
        result = json.loads(observation)
    except (json.JSONDecodeError, RecursionError):
        return ()
    found: dict[str, set[str]] = {}
    described: dict[str, set[str]] = {}
    pending = [result]
    while pending:
        node = pending.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            if isinstance(value, (dict, list)):
                if isinstance(key, str) and isinstance(value, list) and value and all(map(_is_plain, value)):
                    found.setdefault(_singular_key(key), set()).update(map(str, value))
                else:
                    pending.append(value)
            elif isinstance(node, dict) and len(node) > 1 and _is_plain(value) and _ID_ARGUMENT.search(str(key)):
                described.setdefault(_singular_key(str(key)), set()).add(str(value))
    listed = ((key, frozenset(values - described.get(key, set()))) for key, values in found.items())
    return tuple((key, values) for key, values in listed if values)


def _is_plain(value: object) -> bool:
    """Whether a JSON value is a string or an integer (an identifier's value can be either)."""
    return isinstance(value, (str, int)) and not isinstance(value, bool)


_Needers = Sequence[tuple[str, str]]
"""The ``(tool, argument)`` pairs of the open tools that need one kind of identifier."""
_NO_TOOLS: frozenset[int] = frozenset()
_NOWHERE = np.zeros(0, dtype=np.intp)
"""The positions of a name the tool set does not have."""


class _ToolSet(NamedTuple):
    """What a decision reads of a tool set that does not change between decisions (:func:`_tool_set`)."""

    names: list[str]
    ids: list[tuple[str, ...]]
    """Each tool's required identifiers (:func:`_identifiers`)."""
    subjects: list[tuple[tuple[tuple[str, ...], ...], ...]]
    """What each of those identifiers identifies: its name's subject, and its description's if it has one."""
    all_subjects: frozenset[tuple[str, ...]]
    """Every subject in :attr:`subjects`."""
    with_ids: list[int]
    """The positions of the tools that require an identifier."""
    positions: dict[str, np.ndarray]
    """Each name -> its positions (a tool set may list a name twice)."""
    word_index: dict[str, frozenset[int]]
    """Each word and stem of the tools' names and descriptions (:func:`_tool_words`) -> the positions that have it."""
    is_lookup: np.ndarray
    is_finish: np.ndarray
    verbs: list[str]
    """The first five letters of each tool's name verb; FINISH's is empty (no request asks for it)."""
    by_request: dict[str, tuple[np.ndarray, np.ndarray]]
    """:meth:`request_columns` of the latest requests (a turn asks at each of its decisions)."""

    def gives_any_identifier(self, words: frozenset[str]) -> bool:
        """Return whether a value the user gave after ``words`` is an id of nothing the tools' identifiers name.

        "My colleague with id USR003": the user calls it an id, and no identifier here identifies a
        colleague; the user knows the API, so it is one of its identifiers.
        """
        return bool(_ID_WORDS & words) and not any(_speaks_of(words, subject) for subject in self.all_subjects)

    def request_columns(self, request: str) -> tuple[np.ndarray, np.ndarray]:
        """Return ``named_in_request`` and ``asked_by_verb`` of each tool for a lower-cased request."""
        columns = self.by_request.get(request)
        if columns is None:
            if len(self.by_request) >= 64:
                self.by_request.clear()
            asked = _clause_verbs(request)
            columns = (np.array([_named_in(name, request) for name in self.names], dtype=np.float64),
                       np.array([bool(verb) and verb in asked for verb in self.verbs], dtype=np.float64))
            self.by_request[request] = columns
        return columns


def _tool_key(tool: ToolSpec) -> tuple[str, str, tuple[str, ...], tuple[str, ...]]:
    """Return what :func:`_tool_set` reads of a tool: name, description, required arguments, described subjects."""
    required = _required(tool)
    return tool.name, tool.description or "", required, _described_subjects(tool, _identifiers(required))


@functools.lru_cache(maxsize=32)  # a live run ranks one tool set at every decision
def _tool_set(tools: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...]], ...]) -> _ToolSet:
    """Return the :class:`_ToolSet` of the tools' (name, description, required arguments, described subjects)."""
    index: dict[str, set[int]] = {}
    positions: dict[str, list[int]] = {}
    for position, (name, description, _, _) in enumerate(tools):
        positions.setdefault(name, []).append(position)
        for word in _tool_words(name, description):
            index.setdefault(word, set()).add(position)
    names = [name for name, _, _, _ in tools]
    ids = [_identifiers(required) for _, _, required, _ in tools]
    subjects: list[tuple[tuple[tuple[str, ...], ...], ...]] = [
        tuple(((_subject_words(arg), (said,)) if said else (_subject_words(arg),))
              for arg, said in zip(own, described, strict=True))
        for own, (_, _, _, described) in zip(ids, tools, strict=True)]
    return _ToolSet(names, ids, subjects, frozenset(s for each in subjects for alts in each for s in alts),
                    [position for position, own in enumerate(ids) if own],
                    {name: np.array(where, dtype=np.intp) for name, where in positions.items()},
                    {word: frozenset(where) for word, where in index.items()},
                    np.array([_is_lookup(name) for name in names], dtype=np.float64),
                    np.array([name == FINISH for name in names]),
                    ["" if name == FINISH else _name_verb(name)[:5] for name in names], {})


def _providers(tool_set: _ToolSet, wanted: Mapping[tuple[str, ...], _Needers]) -> set[int]:
    """Return the positions of the tools named for an identifier another open tool needs, that do not need it.

    ``tool_set`` is the tools' :class:`_ToolSet`; ``wanted`` maps the subjects of open tools'
    missing identifiers (:func:`_subject_words`) to the tools that need them. A tool whose name,
    or a lookup's description, speaks of that subject (``find_customer`` for ``customer_id``;
    :func:`_tool_words`), and that does not itself require the argument, is likely where it comes
    from. Each subject looks up the tools that have all its words (or their stems), so hundreds
    of tools needing identifiers cost a few set intersections, not tools x subjects checks.
    """
    if not wanted:
        return set()
    index, ids, names = tool_set.word_index, tool_set.ids, tool_set.names
    found: set[int] = set()
    for subject, needers in wanted.items():
        if subject:
            by_word = [index.get(word, _NO_TOOLS) | index.get(word[:5], _NO_TOOLS) for word in subject]
            speakers: Iterable[int] = by_word[0].intersection(*by_word[1:])
        else:  # every tool speaks of an empty subject
            speakers = range(len(names))
        for position in speakers:
            name = names[position]
            if (position not in found and name != FINISH
                    and any(needer != name and argument not in ids[position] for needer, argument in needers)):
                found.add(position)
    return found


@dataclass
class Decision(StateParts):
    """One decision point of a logged episode: the state, what was available, what was done."""

    available: set[str] = field(default_factory=set)
    action: str = FINISH


def state_parts(task: str, prefix: Sequence[Step], history_window: int) -> StateParts:
    """Return what the policy sees after the steps in ``prefix``."""
    request, calls_since_request, last_error, previous_tool = task, 0, 0.0, None
    history: list[str] = []
    before: set[str] = set()
    counts: Counter[str] = Counter()
    worked: Counter[str] = Counter()
    failed: set[str] = set()
    known = [task]
    said_by_user = [task]
    added: set[str] = set()
    listed: dict[str, frozenset[str]] = {}
    called_with: dict[tuple[str, str], set[str]] = {}
    failed_asking: dict[str, str] = {}
    unblocked_by_call: frozenset[str] = frozenset()
    for step in prefix:
        if step.kind == "user":
            request, calls_since_request, counts, failed = step.content, 0, Counter(), set()
            added, listed = set(step.tools_added), {}
            failed_asking, unblocked_by_call = {}, frozenset()
            known.append(step.content)
            said_by_user.append(step.content)
            continue
        added.update(step.tools_added)
        history.append(step_text(step))
        if step.kind == "tool_call" and step.tool:
            calls_since_request += 1
            added.discard(step.tool)
            last_error = float(step.error)
            previous_tool = step.tool
            before.add(step.tool)
            counts[step.tool] += 1
            for argument, value in step.arguments.items():
                if _ID_ARGUMENT.search(argument):  # only identifiers are looked up (``reads_listed``)
                    given = value if isinstance(value, list) else [value]
                    called_with.setdefault((step.tool, argument), set()).update(str(item) for item in given)
            if step.error:
                failed.add(step.tool)
                failed_asking[step.tool] = step.observation.lower()
                unblocked_by_call = frozenset()
            else:
                unblocked_by_call = frozenset(tool for tool, error in failed_asking.items()
                                              if tool != step.tool and _error_asks_for(step.tool, error))
                for tool in unblocked_by_call | {step.tool}:
                    failed_asking.pop(tool, None)
                worked[step.tool] += 1
                for key, values in _listed_values(step.observation):
                    listed[key] = listed.get(key, _NO_VALUES) | values
            known += [json.dumps(step.arguments, ensure_ascii=False, default=str), step.observation]
    last = prefix[-1] if prefix else None
    last_call = (last.tool, last.error) if last is not None and last.kind == "tool_call" and last.tool else None
    features = [min(calls_since_request, 20) / 10.0, last_error]
    named_values = tuple(dict.fromkeys(words for text in said_by_user for words in _words_before_values(text)))
    # The call just made added its arguments and observation last. Its arguments were known before it:
    # after ``exchange(order_id=...)`` an order id the user gave by value alone does not unblock ``cancel``.
    known_before = "\n".join(known[:-1]).lower() if last_call is not None and not last_call[1] else None
    return StateParts(task, request, history[::-1][:history_window], features, previous_tool, before,
                      counts, failed, last_call, "\n".join(known).lower(), named_values, known_before, worked,
                      added, listed, called_with, failed_asking, unblocked_by_call)


def decisions(episode: Episode, history_window: int) -> list[Decision]:
    """Return the episode's decision points in order (tool calls and replies)."""
    out = []
    availability = episode.availability()
    for index, step in enumerate(episode.steps):
        if step.is_decision:
            parts = state_parts(episode.task, episode.steps[:index], history_window)
            # A logged call proves its tool was callable, whatever the tool lists said.
            available = availability[index] | {FINISH, step.action}
            out.append(Decision(**vars(parts), available=available, action=step.action))
    return out


class SlotRows:
    """The rows of one text table that many states' slots point at: each distinct text once, row 0 :data:`PAD`.

    The text of a history step is filed apart from the fixed slots' texts: it may be embedded by
    another model (:meth:`~evoharness_agent.encoding.embedder.StateEncoder.embed_steps`).
    """

    def __init__(self) -> None:
        """Start with no texts."""
        self._rows: dict[tuple[bool, str], int] = {}

    def __len__(self) -> int:
        """Return the number of texts (the table has one more row: PAD)."""
        return len(self._rows)

    def row(self, text: str, *, step: bool = False) -> int:
        """Return the row of a fixed slot's text (of a history step's, with ``step``), adding it if new."""
        return self._rows.setdefault((step, text), len(self._rows) + 1)

    def fill(self, table: np.ndarray, embed: Callable[[list[str]], np.ndarray],
             embed_steps: Callable[[list[str]], np.ndarray]) -> None:
        """Write each text's embedding into its row of ``table`` (``embed_steps`` embeds the history steps')."""
        for step, embed_texts in ((False, embed), (True, embed_steps)):
            filed = [(text, row) for (is_step, text), row in self._rows.items() if is_step == step]
            if filed:
                texts, rows = zip(*filed, strict=True)
                table[np.asarray(rows)] = embed_texts(list(texts))


def state_rows(parts: StateParts, tool_text: Callable[[str], str], slots: SlotRows, history_window: int) -> list[int]:
    """Return the text-table row of every slot (``slots`` places the texts), :data:`PAD` for an empty one."""
    fixed = [PAD if text is None else slots.row(text) for text in parts.fixed_slot_texts(tool_text)]
    history = [slots.row(text, step=True) for text in parts.history]
    return fixed + history + [PAD] * (n_slots(history_window) - len(fixed) - len(history))


def gather_states(table: torch.Tensor, rows: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """Turn ``(n, slots)`` rows of ``table`` (row 0 zeros) and ``(n, F)`` features into state vectors."""
    vectors = table.index_select(0, rows.reshape(-1))
    return torch.cat([vectors.reshape(rows.shape[0], -1), features], dim=1)
