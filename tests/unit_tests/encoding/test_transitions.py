from __future__ import annotations

import numpy as np
import pytest
import torch

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.encoding.state import (
    FIXED_SLOTS,
    N_STATE_FEATURES,
    PAIR_FEATURES,
    decisions,
    matched_part_texts,
    part_coverage,
    request_part_texts,
    request_parts,
    state_parts,
    step_text,
    tool_coverage,
)
from evoharness_agent.encoding.transitions import Batch, ToolTable, TransitionDataset, build_dataset
from evoharness_agent.rewards import RewardConfig, shape_rewards
from evoharness_agent.schema import FINISH, Episode, Step, ToolSpec, finish_spec

SEARCH = ToolSpec(name="search", description="Search the knowledge base.")
READ = ToolSpec(name="read_file", description="Read a file.")
WRITE = ToolSpec(name="write_file", description="Write a file to disk.")
TASK = "Find the report and summarise it"
FOLLOW_UP = "Now save the summary"


def multi_turn() -> Episode:
    """Two user turns; ``write_file`` only becomes available with the second one."""
    return Episode(
        id="multi", task=TASK, tools=[SEARCH, READ, WRITE], available_at_start=["search", "read_file"],
        steps=[
            Step(tool="search", arguments={"q": "report"}, observation="report.txt"),       # d0
            Step(tool="read_file", arguments={"path": "report.txt"}, observation="denied", error=True),  # d1
            Step(kind="assistant", content="I could not read it."),                         # d2 FINISH
            Step(kind="user", content=FOLLOW_UP, tools_added=["write_file"]),               # not a decision
            Step(tool="write_file", arguments={"path": "s.txt"}, observation="written"),    # d3
            Step(kind="assistant", content="Saved."),                                       # d4 FINISH
        ],
        reward=1.0,
    )


def single() -> Episode:
    return Episode(id="single", task="Look something up", tools=[SEARCH],
                   steps=[Step(tool="search", arguments={"q": "x"}, observation="y"),
                          Step(kind="assistant", content="y")], reward=0.0)


def no_decisions() -> Episode:
    return Episode(id="empty", task="Only a user message", tools=[READ],
                   steps=[Step(kind="user", content="hello?")])


def test_decisions_actions_availability_previous_tool() -> None:
    points = decisions(multi_turn(), history_window=4)
    assert [p.action for p in points] == ["search", "read_file", FINISH, "write_file", FINISH]
    first_turn = {"search", "read_file", FINISH}
    assert [p.available for p in points] == [first_turn] * 3 + [first_turn | {"write_file"}] * 2
    assert all(FINISH in p.available for p in points)
    assert [p.previous_tool for p in points] == [None, "search", "read_file", "read_file", "write_file"]
    assert [p.request for p in points] == [TASK] * 3 + [FOLLOW_UP] * 2
    assert all(p.task == TASK for p in points)


def test_decisions_features_count_calls_since_request_and_last_error() -> None:
    points = decisions(multi_turn(), history_window=4)
    calls = [p.features[0] for p in points]
    errors = [p.features[1] for p in points]
    assert calls == pytest.approx([0.0, 0.1, 0.2, 0.0, 0.1])  # reset by the user turn
    assert errors == [0.0, 0.0, 1.0, 1.0, 0.0]
    assert all(len(p.features) == N_STATE_FEATURES for p in points)


def test_decisions_history_is_newest_first_and_windowed() -> None:
    episode = multi_turn()
    s = [step_text(step) for step in episode.steps]
    points = decisions(episode, history_window=4)
    assert points[0].history == []
    assert points[1].history == [s[0]]
    assert points[2].history == [s[1], s[0]]
    assert points[3].history == [s[2], s[1], s[0]]  # user messages are the request, not history
    assert points[4].history == [s[4], s[2], s[1], s[0]]
    assert decisions(episode, history_window=2)[4].history == [s[4], s[2]]
    assert all(p.history == [] for p in decisions(episode, history_window=0))


def test_decisions_pair_features_track_calls_per_turn_and_episode() -> None:
    specs = [SEARCH, READ, WRITE, finish_spec()]
    # called_in_turn, called_before, just_called_ok, just_called_failed, failed_in_turn, calls_in_turn
    pairs = [[row[:6] for row in p.pair_features(specs).tolist()] for p in decisions(multi_turn(), history_window=1)]
    none = [0.0] * 6
    assert pairs[0] == [none] * 4
    assert pairs[1] == [[1.0, 1.0, 1.0, 0.0, 0.0, 0.2], none, none, none]  # search just worked
    assert pairs[2] == [[1.0, 1.0, 0.0, 0.0, 0.0, 0.2], [1.0, 1.0, 0.0, 1.0, 1.0, 0.2], none, none]
    # a new user turn clears "called in this turn" but not "called earlier in the episode"
    assert pairs[3] == [[0.0, 1.0, 0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0, 0.0, 0.0], none, none]
    assert pairs[4][2] == [1.0, 1.0, 1.0, 0.0, 0.0, 0.2]


def test_a_tool_the_latest_user_message_added_is_marked_until_it_is_called() -> None:
    added = PAIR_FEATURES.index("added_not_called")
    specs = [SEARCH, READ, WRITE, finish_spec()]
    columns = [p.pair_features(specs)[:, added].tolist() for p in decisions(multi_turn(), history_window=1)]
    # write_file came with the second user message: marked at that turn's first decision, not before,
    # and no longer once called (then it is a tool called in this turn like any other)
    assert columns == [[0.0] * 4] * 3 + [[0.0, 0.0, 1.0, 0.0], [0.0] * 4]
    failed = multi_turn()
    failed.steps[4] = Step(tool="search", arguments={"q": "summary"}, error=True, observation="timeout")
    assert decisions(failed, history_window=1)[-1].pair_features(specs)[:, added].tolist() == [0.0, 0.0, 1.0, 0.0]
    later = multi_turn()
    later.steps += [Step(kind="user", content="Thanks, search again"), Step(tool="search", arguments={"q": "x"})]
    assert decisions(later, history_window=1)[-1].pair_features(specs)[:, added].tolist() == [0.0] * 4


def test_pair_features_see_named_tools_and_missing_identifiers() -> None:
    lookup = ToolSpec(name="find_customer", description="Find a customer by e-mail.",
                      parameters={"type": "object", "properties": {"email": {"type": "string"}}, "required": ["email"]})
    orders = ToolSpec(name="list_orders", description="List a customer's orders.",
                      parameters={"type": "object", "properties": {"customer_id": {"type": "string"}},
                                  "required": ["customer_id"]})
    named, missing = PAIR_FEATURES.index("named_in_request"), PAIR_FEATURES.index("missing_ids")
    start = state_parts("Use find_customer, then show the orders of ann@example.com", [], 2)
    first = start.pair_features([lookup, orders])
    assert first[0][named] == 1.0 and first[1][named] == 1.0  # "orders" is named, "list" is too generic
    partly = ToolSpec(name="update_order_status")  # "orders" matches "order"; "update", "status" are absent
    assert start.pair_features([partly])[0][named] == pytest.approx(1 / 3)
    assert start.pair_features([ToolSpec(name="cancel_subscription")])[0][named] == 0.0
    assert first[0][missing] == 0.0 and first[1][missing] == 1.0  # no customer id is known yet
    found = Step(tool="find_customer", arguments={"email": "ann@example.com"}, observation='{"customer_id": "C7"}')
    after = state_parts(start.task, [found], 2).pair_features([lookup, orders])
    assert after[1][missing] == 0.0  # the lookup's result gave it


@pytest.mark.parametrize(("request_text", "given"), [
    ("Return order #W6067464, please", {"order_id"}),
    ("Check whether order ORD-88213 has shipped", {"order_id"}),
    ("Cancel reservation EHGLP3", {"reservation_id"}),
    ("My user id is mia_li_3668", {"user_id"}),
    ("Refund item 1008292230", {"item_id"}),
    ("You are mei_kovacs_8020 living in zipcode 28236", set()),
    ("For #W5564375, exchange the lamp", set()),
    ("Move my dentist appointment on Friday, March 14 to 5pm", set()),
    ("Tag my Q3 OKRs note, due 2025-03-14", set()),
    ("Show Ann's last order", set()),
    # An id of something no identifier here names: the user knows the API, so it may be any of them.
    ("Message my colleague, id USR003", {"order_id", "reservation_id", "user_id", "item_id"}),
])
def test_a_value_the_user_gave_fills_the_identifiers_its_preceding_words_speak_of(request_text: str,
                                                                                   given: set[str]) -> None:
    arguments = ("order_id", "reservation_id", "user_id", "item_id")
    tools = [ToolSpec(name=f"handle_{argument.removesuffix('_id')}", description="Handle it.",
                      parameters={"type": "object", "properties": {argument: {"type": "string"}},
                                  "required": [argument]}) for argument in arguments]
    rows = state_parts(request_text, [], 2).pair_features(tools)
    missing = PAIR_FEATURES.index("missing_ids")
    assert {argument for argument, row in zip(arguments, rows, strict=True) if row[missing] == 0.0} == given


def test_a_value_fills_an_identifier_its_description_says_it_identifies() -> None:
    def send_message(receiver: dict[str, str]) -> ToolSpec:
        return ToolSpec(name="send_message", description="Send a message to a user.",
                        parameters={"type": "object", "properties": {"receiver_id": receiver, "text": {}},
                                    "required": ["receiver_id", "text"]})

    login = ToolSpec(name="message_login", description="Log in a user.",
                     parameters={"type": "object", "properties": {"user_id": {"type": "string"}},
                                 "required": ["user_id"]})
    missing = PAIR_FEATURES.index("missing_ids")
    request = "Tell my cousin, user id USR002, that dinner is at 8"
    described = send_message({"type": "string", "description": "User ID of the user to send the message to."})
    assert state_parts(request, [], 2).pair_features([login, described])[1][missing] == 0.0
    # Without the description, "user" says nothing of a receiver, and the receiver's id looks missing.
    plain = send_message({"type": "string"})
    assert state_parts(request, [], 2).pair_features([login, plain])[1][missing] == 1.0


def test_a_credential_is_missing_only_when_the_user_asks_to_log_in() -> None:
    book = ToolSpec(name="book_flight", description="Book a flight.",
                    parameters={"type": "object", "properties": {"access_token": {"type": "string"},
                                                                 "flight_id": {"type": "string"}},
                                "required": ["access_token", "flight_id"]})
    authenticate = ToolSpec(name="get_access_token", description="Authenticate the saved account.",
                            parameters={"type": "object", "properties": {}})
    missing, provides = PAIR_FEATURES.index("missing_ids"), PAIR_FEATURES.index("provides_missing")
    # A logged-in app holds its token: only the flight id is missing, and nothing waits for a log-in.
    held = state_parts("Book me a flight to Boston", [], 2).pair_features([book, authenticate])
    assert held[0][missing] == 0.5 and held[1][provides] == 0.0
    # Asked to log in, the session has no token yet: the booking waits for the token's lookup.
    asked = state_parts("Log in to my travel account and book a flight to Boston", [], 2)
    features = asked.pair_features([book, authenticate])
    assert features[0][missing] == 1.0 and features[1][provides] == 1.0


def test_a_call_that_asks_to_log_in_waits_for_a_log_in_tool() -> None:
    def tool(name: str, *required: str) -> ToolSpec:
        return ToolSpec(name=name, description=f"{name}.", parameters={
            "type": "object", "properties": {arg: {"type": "string"} for arg in required}, "required": list(required)})

    tools = [tool("post_tweet", "content"), tool("authenticate_twitter", "username", "password"),
             tool("posting_get_login_status"), tool("get_tweet", "tweet_id")]
    missing, provides = PAIR_FEATURES.index("missing_ids"), PAIR_FEATURES.index("provides_missing")
    unblocked = PAIR_FEATURES.index("just_unblocked")
    request = "Post 'Postponing my plans.' for me; my username is john and my password john1234"
    failed = Step(tool="post_tweet", arguments={"content": "Postponing my plans."}, error=True,
                  observation='{"error": "User not authenticated. Please authenticate before posting."}')
    rows = state_parts(request, [failed], 2).pair_features(tools)
    assert rows[0][missing] == 1.0 and rows[1][provides] == 1.0
    assert rows[2][provides] == 0.0  # a lookup of the log-in state logs no one in
    logged_in = Step(tool="authenticate_twitter", arguments={"username": "john", "password": "john1234"},
                     observation='{"authentication_status": true}')
    rows = state_parts(request, [failed, logged_in], 2).pair_features(tools)
    assert rows[0][missing] == 0.0 and rows[1][provides] == 0.0 and rows[0][unblocked] == 1.0
    # Any other error, or a new request, leaves nothing waiting for a log-in.
    other = failed.model_copy(update={"observation": '{"error": "Tweet too long."}'})
    assert state_parts(request, [other], 2).pair_features(tools)[0][missing] == 0.0
    moved_on = [failed, Step(kind="assistant", content="Log in first."), Step(kind="user", content="Never mind.")]
    assert state_parts(request, moved_on, 2).pair_features(tools)[0][missing] == 0.0


def test_a_credential_that_is_no_longer_good_asks_to_log_in_again() -> None:
    def tool(name: str, *required: str) -> ToolSpec:
        return ToolSpec(name=name, description=f"{name}.", parameters={
            "type": "object", "properties": {arg: {"type": "string"} for arg in required}, "required": list(required)})

    tools = [tool("register_credit_card", "card_number"), tool("authenticate_travel", "client_id")]
    missing, provides = PAIR_FEATURES.index("missing_ids"), PAIR_FEATURES.index("provides_missing")
    for error in ("Token not initialized", "Token expired", "Invalid access token", "Session expired"):
        failed = Step(tool="register_credit_card", arguments={"card_number": "4111"}, error=True,
                      observation=f'{{"error": "{error}"}}')
        rows = state_parts("Register my card 4111", [failed], 2).pair_features(tools)
        assert rows[0][missing] == 1.0 and rows[1][provides] == 1.0, error
    # A token that is merely mentioned asks for nothing.
    other = Step(tool="register_credit_card", arguments={}, error=True,
                 observation='{"error": "Card number must be 16 digits; see the token format."}')
    assert state_parts("Register my card", [other], 2).pair_features(tools)[1][provides] == 0.0


def test_a_value_shaped_like_a_record_key_gives_an_identifier() -> None:
    get_issue = ToolSpec(name="get_tracker_issue", description="Get an issue.", parameters={
        "type": "object", "properties": {"issue_id": {"type": "string"}}, "required": ["issue_id"]})
    search = ToolSpec(name="search_tracker_issues", description="Search issues; returns issue_id and title.",
                      parameters={"type": "object", "properties": {"query": {"type": "string"}}})
    missing, provides = PAIR_FEATURES.index("missing_ids"), PAIR_FEATURES.index("provides_missing")
    rows = state_parts("Where are we with MOB-88?", [], 2).pair_features([get_issue, search])
    assert rows[0][missing] == 0.0 and rows[1][provides] == 0.0
    # Other values with digits (a version, a disease's name) are no record's key: the id is missing.
    for request in ("Where are we with release v2beta3?", "Any news on COVID-19 at work?"):
        rows = state_parts(request, [], 2).pair_features([get_issue, search])
        assert rows[0][missing] == 1.0 and rows[1][provides] == 1.0, request


def test_a_call_waits_for_the_tool_its_error_asks_for() -> None:
    tools = [ToolSpec(name=name, description=f"{name}.", parameters={"type": "object", "properties": {}})
             for name in ("startEngine", "lockDoors", "pressBrakePedal", "releaseBrakePedal", "cat")]
    missing, provides = PAIR_FEATURES.index("missing_ids"), PAIR_FEATURES.index("provides_missing")
    unblocked = PAIR_FEATURES.index("just_unblocked")
    failed = Step(tool="startEngine", arguments={"ignitionMode": "START"}, error=True,
                  observation='{"error": "All doors must be locked before starting the engine."}')
    rows = state_parts("Start the car", [failed], 2).pair_features(tools)
    # Every word of lockDoors' name, in any form it starts ("locked"); not of releaseBrakePedal's.
    assert [row[provides] for row in rows] == [0.0, 1.0, 0.0, 0.0, 0.0] and rows[0][missing] == 1.0
    locked = Step(tool="lockDoors", arguments={"unlock": False}, observation='{"lockStatus": "locked"}')
    rows = state_parts("Start the car", [failed, locked], 2).pair_features(tools)
    assert rows[0][missing] == 0.0 and rows[0][unblocked] == 1.0
    # Its own name in its error asks for nothing, nor does a name of one word.
    own = Step(tool="cat", arguments={}, error=True, observation="cat() missing 1 required positional argument")
    assert not any(row[provides] for row in state_parts("Show notes.txt", [own], 2).pair_features(tools))


def test_an_identifier_in_a_tool_result_counts_only_by_name() -> None:
    returns = ToolSpec(name="return_items", description="Return items of an order.",
                       parameters={"type": "object", "properties": {"item_ids": {"type": "array"}},
                                   "required": ["item_ids"]})
    missing = PAIR_FEATURES.index("missing_ids")
    # An observation's values say nothing of what they identify; its keys do, in the singular too.
    values_only = Step(tool="get_order", arguments={}, observation="W123 shipped: 1008292230, 6086499569")
    assert state_parts("Return my headphones", [values_only], 2).pair_features([returns])[0][missing] == 1.0
    keyed = Step(tool="get_order", arguments={}, observation='{"items": [{"item_id": "1008292230"}]}')
    assert state_parts("Return my headphones", [keyed], 2).pair_features([returns])[0][missing] == 0.0


def test_a_qualified_identifier_is_known_by_its_subject() -> None:
    transfer = ToolSpec(name="transfer_between_accounts", description="Move money between two accounts.",
                        parameters={"type": "object", "properties": {"from_account_id": {"type": "string"},
                                                                     "to_account_id": {"type": "string"}},
                                    "required": ["from_account_id", "to_account_id"]})
    missing = PAIR_FEATURES.index("missing_ids")
    listed = Step(tool="list_bank_accounts", arguments={}, observation='[{"account_id": "ACC-1174"}]')
    assert state_parts("Move 500 into savings", [], 2).pair_features([transfer])[0][missing] == 1.0
    # A list of accounts gives the source and the target: "account_id" names both.
    assert state_parts("Move 500 into savings", [listed], 2).pair_features([transfer])[0][missing] == 0.0
    # The subject must match: an order id is no account id.
    orders = Step(tool="list_orders", arguments={}, observation='[{"order_id": "W1"}]')
    assert state_parts("Move 500 into savings", [orders], 2).pair_features([transfer])[0][missing] == 1.0


def test_a_call_that_worked_gives_the_identifier_its_tool_is_named_for() -> None:
    by_name = ToolSpec(name="find_customer", description="Look up customers by name.")
    by_email = ToolSpec(name="find_customer_by_email", description="Look up a customer by e-mail.")
    orders = ToolSpec(name="list_orders", description="List a customer's orders.",
                      parameters={"type": "object", "properties": {"customer_id": {"type": "string"}},
                                  "required": ["customer_id"]})
    tools = [by_name, by_email, orders]
    missing, provides = PAIR_FEATURES.index("missing_ids"), PAIR_FEATURES.index("provides_missing")
    unblocked = PAIR_FEATURES.index("just_unblocked")
    before = state_parts("Show Ann's orders", [], 2).pair_features(tools)
    assert [row[provides] for row in before] == [1.0, 1.0, 0.0] and before[2][missing] == 1.0
    # The result calls the id "id" (or a gold action list logs no result): the lookup gave it all the same,
    # so the other lookup is no prerequisite any more and the orders are just unblocked.
    found = Step(tool="find_customer", arguments={"name": "Ann"}, observation='[{"id": "C7", "name": "Ann"}]')
    after = state_parts("Show Ann's orders", [found], 2).pair_features(tools)
    assert [row[provides] for row in after] == [0.0, 0.0, 0.0]
    assert after[2][missing] == 0.0 and after[2][unblocked] == 1.0
    # A failed lookup gives nothing; nor does a call of the tool that needs the id (logged without it).
    failed = Step(tool="find_customer", arguments={"name": "Ann"}, observation="error: timeout", error=True)
    assert state_parts("Show Ann's orders", [failed], 2).pair_features(tools)[2][missing] == 1.0
    needer = Step(tool="list_orders", arguments={}, observation="[]")
    assert state_parts("Show Ann's orders", [needer], 2).pair_features(tools)[2][missing] == 1.0


@pytest.mark.parametrize(("request_text", "asked"), [
    ("Book the cheapest flight to Lyon", True),
    ("Find a flight to Lyon, then please book it.", True),
    ("Can you book a table for two?", True),
    ("Which flights can I book to Lyon?", False),   # "which" leads: a question about booking
    ("Search flights to Lyon", False),
])
def test_a_request_asks_for_the_tool_its_clause_verb_names(request_text: str, asked: bool) -> None:
    search = ToolSpec(name="search_flights", description="Search flights, cheapest first.")
    book = ToolSpec(name="bookFlight", description="Book a flight by its number.")
    rows = state_parts(request_text, [], 2).pair_features([search, book, finish_spec()])
    lookup, by_verb = PAIR_FEATURES.index("is_lookup"), PAIR_FEATURES.index("asked_by_verb")
    assert [row[lookup] for row in rows] == [1.0, 0.0, 0.0]  # search_ changes nothing; book and FINISH do
    assert rows[1][by_verb] == float(asked)
    assert rows[2][by_verb] == 0.0  # FINISH is never asked for by name


def test_a_lookup_that_gives_a_tool_its_identifier_unblocks_it() -> None:
    lookup = ToolSpec(name="find_customer", description="Look up customers by name.")
    orders = ToolSpec(name="list_orders", description="List a customer's orders.",
                      parameters={"type": "object", "properties": {"customer_id": {"type": "string"}},
                                  "required": ["customer_id"]})
    unblocked = PAIR_FEATURES.index("just_unblocked")
    found = Step(tool="find_customer", arguments={"name": "Ann"}, observation='[{"customer_id": "C7"}]')
    assert [row[unblocked] for row in state_parts("Show Ann's orders", [], 2).pair_features([lookup, orders])] == [0, 0]
    after = state_parts("Show Ann's orders", [found], 2).pair_features([lookup, orders])
    assert [row[unblocked] for row in after] == [0.0, 1.0]
    # Only the call just made unblocks: one step later, or after a failed call, nothing does.
    later = state_parts("Show Ann's orders", [found, Step(tool="find_customer", arguments={}, observation="[]")], 2)
    assert later.pair_features([lookup, orders])[1][unblocked] == 0.0
    failed = Step(tool="find_customer", arguments={"name": "Ann"}, observation="error: customer_id lookup failed",
                  error=True)
    assert state_parts("Show Ann's orders", [failed], 2).pair_features([lookup, orders])[1][unblocked] == 0.0


def test_a_call_unblocks_nothing_by_the_arguments_it_was_given() -> None:
    def needs_order(name: str) -> ToolSpec:
        return ToolSpec(name=name, description="Change an order.", parameters={
            "type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]})

    exchange, cancel = needs_order("exchange_items"), needs_order("cancel_order")
    unblocked = PAIR_FEATURES.index("just_unblocked")
    # The user gave the order by value alone: the exchange's argument names it, its result gives nothing new.
    done = Step(tool="exchange_items", arguments={"order_id": "#W5564375"}, observation='{"status": "exchanged"}')
    parts = state_parts("For #W5564375, exchange the lamp", [done], 2)
    assert [row[unblocked] for row in parts.pair_features([exchange, cancel])] == [0.0, 0.0]


def test_request_parts_split_the_pieces_of_work_a_request_asks_for() -> None:
    assert request_parts("What is the weather in Paris right now, in Fahrenheit?") == [
        "What is the weather in Paris right now", "in Fahrenheit?"]
    assert request_parts("Refund it in full and note it on her timeline. Thanks") == [
        "Refund it in full", "note it on her timeline.", "Thanks"]
    assert request_parts("Convert 451 F, then email ray@example.org") == ["Convert 451 F", "email ray@example.org"]
    assert request_parts("ok") == ["ok"]  # nothing left after dropping tiny pieces: the request itself


def test_request_parts_read_further_once_a_call_was_made() -> None:
    context = "The smart home has many devices in every room of the old house. " * 8  # ~520 characters
    request = f"Start the engine. {context}Then lock all the doors."
    assert "Then lock all the doors." not in request_parts(request)  # the first call is ranked on the first 400
    late = request_parts(request, after_call=True)
    assert late[0] == "Start the engine." and late[-1] == "Then lock all the doors."
    assert request_parts("Convert 451 F, then email ray@example.org", after_call=True) == [
        "Convert 451 F", "email ray@example.org"]
    # Both sets in one batch for the encoder.
    assert set(request_part_texts([request])) == {*request_parts(request), *late}
    assert matched_part_texts([request, request]) == sorted(set(late))  # what token matching reads, once each


def vectors_of(tools: list[ToolSpec], encoder: StateEncoder) -> np.ndarray:
    return encoder.embed([tool.text() for tool in tools])


def test_tool_coverage_reads_a_late_ask_only_after_a_call(encoder: StateEncoder) -> None:
    start = ToolSpec(name="startEngine", description="Start the car's engine.")
    lock = ToolSpec(name="lockDoors", description="Lock the doors of the car.")
    tools = [start, lock]
    request = f"Start the engine. {'The car is parked on the street near the old market square. ' * 7}Lock the doors."
    called = Step(kind="tool_call", tool="startEngine", arguments={}, observation="engine on")
    before = tool_coverage(state_parts(request, [], 2), tools, vectors_of(tools, encoder), encoder.embed,
                encoder.match_tokens, lambda name: name)
    after = tool_coverage(state_parts(request, [called], 2), tools, vectors_of(tools, encoder), encoder.embed,
                encoder.match_tokens,
                          lambda name: name)
    assert after[1] > before[1]  # "Lock the doors." counts once a call was made, and the called tool does not serve it
    assert after[0] <= 0.0


def test_part_coverage_is_what_a_tool_adds_over_the_tools_called_in_this_turn() -> None:
    parts = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])  # two parts of the request
    tools = np.array([[0.9, 0.1, 0.0], [0.1, 0.8, 0.0], [0.0, 0.0, 1.0]])
    similarity = parts @ tools.T
    nothing = part_coverage(similarity, np.array([False, False, False]))
    assert nothing.tolist() == pytest.approx([0.9, 0.8, 0.0])  # before any call: the best part similarity
    after_first = part_coverage(similarity, np.array([True, False, False]))
    # part 1 is served (0.9), part 2 only at 0.1: the second tool still adds 0.7, the first nothing
    assert after_first.tolist() == pytest.approx([0.0, 0.7, -0.1])


def test_tool_coverage_sees_an_unserved_part_after_the_first_call(encoder: StateEncoder) -> None:
    weather = ToolSpec(name="get_weather", description="Get the current weather in a city, in Celsius.")
    convert = ToolSpec(name="convert_temperature", description="Convert a temperature between Celsius and Fahrenheit.")
    email = ToolSpec(name="send_email", description="Send an email to an address.")
    tools = [weather, convert, email]
    called = Step(kind="tool_call", tool="get_weather", arguments={"city": "Paris"}, observation="14 C, rain")
    parts = state_parts("What is the weather in Paris right now, in Fahrenheit?", [called], 2)
    coverage = tool_coverage(parts, tools, vectors_of(tools, encoder), encoder.embed,
                encoder.match_tokens, lambda name: name)
    assert coverage[0] <= 0.0 < coverage[1]  # the called tool adds nothing; the conversion serves "in Fahrenheit"
    assert coverage[1] > coverage[2]
    # A call of a tool not offered now still covers its part.
    alone = tool_coverage(parts, [convert, email], vectors_of([convert, email], encoder), encoder.embed,
                encoder.match_tokens, lambda name: weather.text())
    assert alone == pytest.approx(coverage[1:], abs=1e-6)
    # Before any call, a tool's best part by the cosine of embeddings, not by tokens.
    first = tool_coverage(state_parts(parts.request, [], 2), tools, vectors_of(tools, encoder), encoder.embed,
                encoder.match_tokens,
                          lambda name: name)
    vectors, clauses = encoder.embed([tool.text() for tool in tools]), encoder.embed(request_parts(parts.request))
    assert first == pytest.approx((clauses @ vectors.T).max(axis=0).tolist(), abs=1e-6)


def test_pair_features_see_the_prerequisite_of_a_missing_identifier() -> None:
    lookup = ToolSpec(name="find_customer", description="Look up customers by name.",
                      parameters={"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]})
    needs_customer = {"type": "object", "properties": {"customer_id": {"type": "string"}}, "required": ["customer_id"]}
    orders = ToolSpec(name="list_orders", description="List a customer's orders.", parameters=needs_customer)
    profile = ToolSpec(name="get_profile", description="A customer's profile.", parameters=needs_customer)
    weather = ToolSpec(name="get_weather", description="Current weather in a city.")
    provides = PAIR_FEATURES.index("provides_missing")
    tools = [lookup, orders, profile, weather]
    start = state_parts("Show Ann's last order", [], 2)
    # find_customer speaks of what customer_id identifies and needs no id itself; list_orders and
    # get_profile speak of customers too, but cannot be called before the id is known.
    assert [row[provides] for row in start.pair_features(tools)] == [1.0, 0.0, 0.0, 0.0]
    # Nothing open needs a customer id: no prerequisite (list_orders is not available).
    assert start.pair_features(tools, available={"find_customer", "get_weather"})[0][provides] == 0.0
    found = Step(tool="find_customer", arguments={"name": "Ann"}, observation='[{"customer_id": "C7"}]')
    after = state_parts(start.task, [found], 2).pair_features(tools)
    assert [row[provides] for row in after] == [0.0] * 4  # the id is known now


def test_the_prerequisite_is_found_among_many_kinds_of_identifier() -> None:
    # More kinds of missing identifier than a tool has words: provides_missing looks the
    # tool's words up instead of scanning every kind, with the same answers.
    subjects = ["customer", "invoice", "shipment", "warehouse", "payroll", "ticket", "sensor", "campaign",
                "sample", "vendor", "contract", "project", "account", "device", "order", "booking", "patient",
                "course", "listing", "policy", "claim", "session", "profile", "report", "folder"]
    needers = [ToolSpec(name=f"get_{subject}_details", description=f"Details of one {subject}.",
                        parameters={"type": "object", "properties": {f"{subject}_id": {"type": "string"}},
                                    "required": [f"{subject}_id"]}) for subject in subjects]
    lookups = [ToolSpec(name="find_shipments", description="Search shipments by destination."),
               ToolSpec(name="lookup", description="Look up a warehouse by city."),  # description speaks of it
               ToolSpec(name="list_colours", description="Every colour we sell.")]  # speaks of none
    provides = PAIR_FEATURES.index("provides_missing")
    rows = state_parts("Where is my parcel?", [], 2).pair_features([*lookups, *needers])
    assert [row[provides] for row in rows[:3]] == [1.0, 1.0, 0.0]  # "shipments" matches shipment by stem
    assert all(row[provides] == 0.0 for row in rows[3:])  # each needs its own identifier


def test_a_tool_that_changes_something_gives_no_identifier_its_description_only_mentions() -> None:
    ids = {"order_id": {"type": "string"}, "payment_method_id": {"type": "string"}}
    refund = ToolSpec(name="return_order_items", description="Return items of an order, refunded to a payment method.",
                      parameters={"type": "object", "properties": ids, "required": list(ids)})
    cancel = ToolSpec(name="cancel_order", description="Cancel an order; the payment method gets a refund.",
                      parameters={"type": "object", "properties": {"order_id": {"type": "string"}},
                                  "required": ["order_id"]})
    profile = ToolSpec(name="get_user_details", description="A user's details: orders and payment methods.")
    created = ToolSpec(name="add_payment_method", description="Add a card to the user's wallet.")
    provides = PAIR_FEATURES.index("provides_missing")
    missing = PAIR_FEATURES.index("missing_ids")
    tools = [refund, cancel, profile, created]
    rows = state_parts("Return the lamp I ordered last week", [], 2).pair_features(tools)
    # cancel_order changes something: its description's "payment method" gives no id; the lookup's
    # description and the name of the tool that adds one do.
    assert [row[provides] for row in rows] == [0.0, 0.0, 1.0, 1.0]
    # Nor does a call of it that worked give one: the refund still needs its payment method.
    cancelled = Step(tool="cancel_order", arguments={"order_id": "W1"}, observation="cancelled")
    assert state_parts("Cancel my order and return the lamp", [cancelled], 2).pair_features(tools)[0][missing] == 0.5


def test_a_lookup_is_marked_while_a_result_in_this_turn_lists_values_it_was_not_called_with() -> None:
    def by_id(name: str, argument: str) -> ToolSpec:
        return ToolSpec(name=name, description=f"{name} by {argument}.",
                        parameters={"type": "object", "properties": {argument: {"type": "string"}},
                                    "required": [argument]})

    read_order, cancel = by_id("get_order_details", "order_id"), by_id("cancel_order", "order_id")
    read_card, read_item = by_id("get_payment_method", "paymentMethodId"), by_id("get_item_details", "item_id")
    tools = [read_order, cancel, read_card, by_id("get_user_details", "user_id"), read_item]
    listed = PAIR_FEATURES.index("reads_listed")
    profile = Step(tool="get_user_details", arguments={"user_id": "u1"},
                   observation='{"user_id": "u1", "orders": ["#W1", "#W2"], '
                               '"payment_methods": {"card_7": {"brand": "visa"}}, "name": {"first": "Ann"}}')

    def marked(*steps: Step) -> list[float]:
        parts = state_parts("Cancel the order with the lamp", [profile, *steps], 2)
        return parts.pair_features(tools)[:, listed].tolist()

    # The profile lists two orders: their lookup is marked, the change never, nor the lookup the
    # profile came from (it lists no other user). Its cards are records keyed by id: held, not listed.
    assert marked() == [1.0, 0.0, 0.0, 0.0, 0.0]
    # An order lists its items' ids beside their records: only an item without one is left to read.
    first = Step(tool="get_order_details", arguments={"order_id": "#W1"},
                 observation='{"order_id": "#W1", "items": [{"item_id": "42", "price": 9}], "item_ids": ["42"]}')
    assert marked(first) == [1.0, 0.0, 0.0, 0.0, 0.0]
    more = first.model_copy(update={"observation": first.observation.replace('["42"]', '["42", "43"]')})
    assert marked(more) == [1.0, 0.0, 0.0, 0.0, 1.0]
    # A read that failed was still tried; once both orders were, nothing lists an unread one.
    second = Step(tool="get_order_details", arguments={"order_id": "#W2"}, observation="timeout", error=True)
    assert marked(first, second) == [0.0] * 5
    # Ids listed by a camel-case key, without records, are what a camel-case argument reads.
    cards = profile.model_copy(update={"observation": '{"user_id": "u1", "paymentMethodIds": ["card_7"]}'})
    assert state_parts("Pay", [cards], 2).pair_features(tools)[:, listed].tolist() == [0.0, 0.0, 1.0, 0.0, 0.0]
    # The user moved on: a list from an earlier turn is not what this one reads.
    assert marked(Step(kind="user", content="Thanks. What is my balance?")) == [0.0] * 5
    # A result that is not JSON, or a profile that failed, lists nothing.
    text = profile.model_copy(update={"observation": "orders: #W1, #W2"})
    failed = profile.model_copy(update={"error": True})
    for start in (text, failed):
        assert state_parts("Cancel it", [start], 2).pair_features(tools)[:, listed].tolist() == [0.0] * 5


def test_decisions_default_availability_is_all_tools() -> None:
    episode = multi_turn().model_copy(update={"available_at_start": None})
    assert all(p.available == {"search", "read_file", "write_file", FINISH}
               for p in decisions(episode, history_window=1))
    assert decisions(no_decisions(), history_window=4) == []


def test_tool_table_finish_first_and_dedup(encoder: StateEncoder) -> None:
    renamed = ToolSpec(name="search", description="A different description, ignored.")
    table = ToolTable.from_specs([SEARCH, READ, renamed, WRITE], encoder)
    assert table.names == [FINISH, "search", "read_file", "write_file"]
    assert table.specs[1].description == SEARCH.description
    assert table.index == {FINISH: 0, "search": 1, "read_file": 2, "write_file": 3}
    np.testing.assert_allclose(table.embeddings[0].numpy(), encoder.embed([finish_spec().text()])[0])
    np.testing.assert_allclose(table.embeddings[3].numpy(), encoder.embed([WRITE.text()])[0])


Built = tuple[list[Episode], TransitionDataset]


@pytest.fixture(scope="module")
def built(encoder: StateEncoder) -> tuple[list[Episode], TransitionDataset]:
    episodes = [multi_turn(), no_decisions(), single()]
    return episodes, build_dataset(episodes, encoder, history_window=3)


def test_build_dataset_actions_masks_and_tools(built: Built) -> None:
    episodes, data = built
    names = data.tools.names
    assert names == [FINISH, "search", "read_file", "write_file"]
    assert len(data) == 7
    t = data.tensors
    assert [names[a] for a in t["actions"].tolist()] == [
        "search", "read_file", FINISH, "write_file", FINISH, "search", FINISH]
    assert t["episode_ids"].tolist() == [0, 0, 0, 0, 0, 2, 2]
    masks = data.masks(torch.arange(len(data))).tolist()
    first, second = [True, True, True, False], [True, True, True, True]
    assert masks[:5] == [first, first, first, second, second]
    # the single-tool episode only offers its own tool, although the table knows more
    assert masks[5:] == [[True, True, False, False]] * 2


def test_build_dataset_next_state_and_done_wiring(built: Built) -> None:
    _, data = built
    t = data.tensors
    assert t["dones"].tolist() == [0, 0, 0, 0, 1, 0, 1]
    following = [1, 2, 3, 4, 4, 6, 6]  # terminal transitions point at themselves
    assert torch.equal(t["next_rows"], t["rows"][following])
    assert torch.equal(t["next_features"], t["features"][following])
    everything = torch.arange(len(data))
    assert torch.equal(data.batch(everything).next_masks, data.masks(everything)[following])
    # the episode boundary is never crossed
    ends = t["dones"].bool()
    ids = t["episode_ids"]
    assert torch.equal(ids[following], ids)
    assert not ends[:4].any()


def test_build_dataset_pair_features(built: Built) -> None:
    _, data = built
    pairs = data.pairs(torch.arange(len(data)))
    assert pairs.shape == (7, 4, len(PAIR_FEATURES)) and pairs.dtype == torch.float32
    # table order: FINISH, search, read_file, write_file; transition 4 is the reply after write_file
    history = pairs[:, :, :6]  # called_in_turn, called_before, just_ok, just_failed, failed_in_turn, calls_in_turn
    expected = torch.tensor([[0.0] * 6, [0, 1, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0.2]])
    torch.testing.assert_close(history[4], expected)
    assert not history[5].any()  # the second episode starts from scratch
    batch = data.batch(torch.tensor([0, 4, 5]))
    assert batch.pairs is not None and batch.next_pairs is not None
    assert torch.equal(batch.pairs, pairs[[0, 4, 5]])
    assert torch.equal(batch.next_pairs, pairs[[1, 4, 6]])  # a terminal transition's next state is itself


def test_build_dataset_rewards_aligned(built: Built, encoder: StateEncoder) -> None:
    episodes, data = built
    expected = [r for ep in episodes for r in shape_rewards(ep, RewardConfig())]
    assert data.tensors["rewards"].tolist() == pytest.approx(expected)
    # the success bonus sits on each episode's terminal transition
    rewards = data.tensors["rewards"]
    assert rewards[4] == pytest.approx(10.0)
    assert rewards[6] == pytest.approx(0.0)
    custom = build_dataset(episodes[:1], encoder, history_window=3,
                           reward_config=RewardConfig(success_reward=3.0, step_cost=0.5))
    assert custom.tensors["rewards"].tolist() == pytest.approx([-0.5, -1.5, 0.0, -0.5, 3.0])


def test_gathered_states_hold_the_right_texts(built: Built, encoder: StateEncoder) -> None:
    _, data = built
    window = 3
    dim = 384
    assert data.state_dim == dim * (len(FIXED_SLOTS) + window) + N_STATE_FEATURES
    batch = data.batch(torch.arange(len(data)))
    assert batch.states.shape == (7, data.state_dim)
    episode = multi_turn()
    s = [step_text(step) for step in episode.steps]

    def slots(row: int) -> list[torch.Tensor]:
        return [batch.states[row, k * dim:(k + 1) * dim] for k in range(len(FIXED_SLOTS) + window)]

    def vec(text: str) -> torch.Tensor:
        return torch.from_numpy(encoder.embed([text])[0])

    zero = torch.zeros(dim)
    # decision 4 of the first episode: request = follow-up, previous = write_file, history newest first
    request, previous, task, h0, h1, h2 = slots(4)
    torch.testing.assert_close(request, vec(FOLLOW_UP))
    torch.testing.assert_close(previous, vec(WRITE.text()))
    torch.testing.assert_close(task, vec(TASK))
    torch.testing.assert_close(h0, vec(s[4]))
    torch.testing.assert_close(h1, vec(s[2]))
    torch.testing.assert_close(h2, vec(s[1]))
    torch.testing.assert_close(batch.states[4, -N_STATE_FEATURES:], torch.tensor([0.1, 0.0]))
    # decision 0: no previous tool and no history -> zero padding
    request, previous, task, h0, h1, h2 = slots(0)
    torch.testing.assert_close(request, vec(TASK))
    for padding in (previous, h0, h1, h2):
        assert torch.equal(padding, zero)
    # the batch's next state is the following decision's state
    torch.testing.assert_close(batch.next_states[3], batch.states[4])
    torch.testing.assert_close(batch.next_states[4], batch.states[4])
    assert torch.equal(batch.next_masks[0], batch.masks[1])


def test_sample_is_seeded_and_respects_subset(built: Built) -> None:
    _, data = built
    subset = torch.tensor([5, 6])
    a = data.sample(64, torch.Generator().manual_seed(3), subset)
    b = data.sample(64, torch.Generator().manual_seed(3), subset)
    assert torch.equal(a.actions, b.actions) and torch.equal(a.states, b.states)

    def rows(batch: Batch) -> list[int]:  # sampled actions are columns of each state's candidates
        assert batch.candidates is not None
        return batch.candidates.gather(1, batch.actions[:, None]).squeeze(1).tolist()

    single_ep_actions = {data.tensors["actions"][5].item(), data.tensors["actions"][6].item()}
    assert set(rows(a)) <= single_ep_actions
    assert set(a.rewards.tolist()) <= {data.tensors["rewards"][5].item(), data.tensors["rewards"][6].item()}
    whole = data.sample(200, torch.Generator().manual_seed(0))
    assert len(set(rows(whole))) == 4  # every action of the data set is reachable


def test_candidate_batches_keep_each_states_available_tools(built: Built) -> None:
    _, data = built
    index = torch.arange(len(data))
    dense, compact = data.batch(index), data.batch(index, candidates_only=True)
    assert compact.candidates is not None and compact.next_candidates is not None and compact.pairs is not None
    for row in range(len(data)):
        kept = compact.candidates[row][compact.masks[row]]
        assert kept.tolist() == torch.nonzero(dense.masks[row]).squeeze(1).tolist()
        assert torch.equal(compact.pairs[row][compact.masks[row]], dense.pairs[row][kept])
        assert not compact.pairs[row][~compact.masks[row]].any()  # padding has no features
        assert compact.candidates[row, compact.actions[row]] == dense.actions[row]
        next_kept = compact.next_candidates[row][compact.next_masks[row]]
        assert next_kept.tolist() == torch.nonzero(dense.next_masks[row]).squeeze(1).tolist()


def test_extra_tools_join_the_table(encoder: StateEncoder) -> None:
    extra = ToolSpec(name="brand_new", description="Never seen in the logs.")
    data = build_dataset([single()], encoder, history_window=1, extra_tools=[extra])
    assert data.tools.names == [FINISH, "search", "brand_new"]
    assert data.masks(torch.arange(len(data)))[:, 2].tolist() == [False, False]


def test_empty_logs_give_an_empty_dataset(encoder: StateEncoder) -> None:
    data = build_dataset([no_decisions()], encoder, history_window=2)
    assert len(data) == 0
    assert data.masks(torch.arange(len(data))).shape == (0, 2)


def test_token_matching_reads_each_parts_nearest_tools_and_floors_the_rest(encoder: StateEncoder,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import evoharness_agent.encoding.state as state

    tools = [ToolSpec(name=f"tool_{i}", description=text) for i, text in enumerate(
        ["Get the current weather in a city.", "Convert a temperature to Fahrenheit.", "Send an email.",
         "Book a flight.", "List the files in a folder.", "Translate a text.", "Play a song."])]
    called = Step(kind="tool_call", tool="tool_0", arguments={"city": "Paris"}, observation="14 C")
    parts = state_parts("What is the weather in Paris right now, in Fahrenheit?", [called], 2)
    everything = tool_coverage(parts, tools, vectors_of(tools, encoder), encoder.embed,
                encoder.match_tokens, lambda name: name)
    monkeypatch.setattr(state, "TOKEN_SHORTLIST", 2)
    shortlisted = tool_coverage(parts, tools, vectors_of(tools, encoder), encoder.embed,
                encoder.match_tokens, lambda name: name)
    clauses = request_parts(parts.request, after_call=True)
    cosine = encoder.embed(clauses) @ encoder.embed([tool.text() for tool in tools]).T
    near = set(np.argsort(-cosine, axis=1)[:, :2].ravel()) | {0}
    assert 1 in near and len(near) < len(tools)
    # A tool on some part's shortlist keeps its token-level value on it; the others sit at a floor below.
    assert shortlisted[1] == pytest.approx(everything[1])
    assert max(shortlisted[i] for i in range(len(tools)) if i not in near) <= shortlisted[1]
