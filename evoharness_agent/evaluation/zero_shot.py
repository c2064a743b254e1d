"""Zero-shot agent suite: whether a policy picks the right tool among tools no data set has.

Six small toolsets of this project's own invention (weather and units, a CRM, a calendar,
notes, a shop, a cloud drive; :data:`ZERO_SHOT_TOOLSETS`) and 34 tasks over them
(:data:`ZERO_SHOT_TASKS`), each a native :class:`~evoharness_agent.schema.Episode` with a gold
path of 2-4 tool calls then a reply, with plausible arguments and observations, so the
gold history a chooser sees is realistic. Several calls need an id that an earlier call
returned (``find_customer`` -> ``customer_id`` -> ``list_orders``), some requests name the
tool they want, one call fails and is retried, and three tasks are answered at once (small
talk, no tool fits). No tool name occurs in the bundled data but ``send_email``: the weather
case is specified over ``get_weather``, ``convert_temperature`` and ``send_email``, and two
BFCL single-turn episodes offer a ``send_email``; the unit tests hold the overlap to that one.

:func:`evaluate_zero_shot` replays each task with its gold history and, at every decision,
asks a chooser (any :class:`~evoharness_agent.evaluation.choosers.Chooser`, or a
:class:`~evoharness_agent.policy.ToolPolicy`, wrapped in
:class:`~evoharness_agent.evaluation.choosers.PolicyChooser`) to rank all the toolset's tools
plus FINISH, as live, and takes its top choice. :class:`ZeroShotReport` holds:

* step accuracy: top-1 correct over all decisions;
* tool accuracy: over the decisions whose gold is a tool, the best-ranked tool (FINISH left
  out, as ``evaluate``'s top-1) is it: the choice of tool, apart from when to answer;
* task exact match: every decision of the task right;
* repeat rate: over the decisions right after a successful call, how often the top choice
  is that same tool again (the loop failure mode; no gold path repeats a successful call
  at once, so every repeat is a mistake);

overall and per toolset; for a policy also the calibration of the probability it reports for its
top choice (expected calibration error, coverage at 95% accuracy), on tools it never saw, where
a new user meets it. :func:`random_expectation` gives the exact expectation of a
uniformly random choice, :func:`print_zero_shot` a rich table of several reports.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from evoharness_agent.evaluation.choosers import Chooser, ChooserSession, ConfidentSession, PolicyChooser
from evoharness_agent.evaluation.reports import ece_reading
from evoharness_agent.learning.calibration import CalibrationReport, calibration_report
from evoharness_agent.policy import ToolPolicy
from evoharness_agent.schema import FINISH, Episode, Step, ToolSpec

__all__ = [
    "ZERO_SHOT_TASKS",
    "ZERO_SHOT_TOOLSETS",
    "ZeroShotDecision",
    "ZeroShotReport",
    "ZeroShotScores",
    "evaluate_zero_shot",
    "print_zero_shot",
    "random_expectation",
]


# --------------------------------------------------------------------------- toolsets


def _param(kind: str, description: str, **extra: Any) -> dict[str, Any]:
    """Return one JSON-schema property."""
    return {"type": kind, "description": description, **extra}


def _tool(name: str, description: str, required: Mapping[str, dict[str, Any]] | None = None,
          optional: Mapping[str, dict[str, Any]] | None = None) -> ToolSpec:
    """Return a tool whose ``required`` properties are listed as required in its schema."""
    required = dict(required or {})
    parameters: dict[str, Any] = {"type": "object", "properties": {**required, **(optional or {})}}
    if required:
        parameters["required"] = list(required)
    return ToolSpec(name=name, description=description, parameters=parameters)


_UNITS = ["celsius", "fahrenheit", "kelvin"]
_EMAILS = {"type": "array", "items": {"type": "string", "format": "email"}}

WEATHER = (
    _tool("get_weather", "Get the current weather in a city: conditions, temperature in Celsius, humidity, wind.",
          {"city": _param("string", "City name, e.g. 'Paris'.")},
          {"country_code": _param("string", "ISO 3166 two-letter country code, to disambiguate the city.")}),
    _tool("get_daily_forecast", "Get the day-by-day forecast for a city for the next 1 to 7 days (Celsius).",
          {"city": _param("string", "City name."),
           "days": _param("integer", "Number of days to forecast.", minimum=1, maximum=7)}),
    _tool("convert_temperature", "Convert a temperature between Celsius, Fahrenheit and Kelvin.",
          {"value": _param("number", "The temperature to convert."),
           "from_unit": _param("string", "Unit of the value.", enum=_UNITS),
           "to_unit": _param("string", "Unit to convert to.", enum=_UNITS)}),
    _tool("convert_length", "Convert a length or distance between units such as km, miles, metres and feet.",
          {"value": _param("number", "The length to convert."),
           "from_unit": _param("string", "Unit of the value, e.g. 'miles'."),
           "to_unit": _param("string", "Unit to convert to, e.g. 'km'.")}),
    _tool("send_email", "Send an email with a subject and a plain-text body to one or more addresses.",
          {"to": {**_EMAILS, "description": "Recipient addresses."},
           "subject": _param("string", "Subject line."),
           "body": _param("string", "Plain-text body.")}),
)

CRM = (
    _tool("find_customer", "Look up customers by name, email or phone number; returns matching customer_id values.",
          {"query": _param("string", "A name, an email address or a phone number (digits only).")}),
    _tool("get_customer_profile", "Get a customer's profile: contact details, company, account tier and owner.",
          {"customer_id": _param("string", "The customer's id, from find_customer.")}),
    _tool("list_orders", "List a customer's orders, newest first, with order_id, date, items and total.",
          {"customer_id": _param("string", "The customer's id, from find_customer.")},
          {"limit": _param("integer", "Maximum number of orders to return.", minimum=1)}),
    _tool("get_order_status", "Get an order's fulfilment status (placed, packed, shipped, delivered, delayed) "
          "and its customer_id.",
          {"order_id": _param("string", "The order id, e.g. 'ORD-88213'.")}),
    _tool("issue_refund", "Refund all or part of an order to the original payment method.",
          {"order_id": _param("string", "The order to refund."),
           "amount": _param("number", "Amount to refund, in the order's currency.", exclusiveMinimum=0),
           "reason": _param("string", "Why the refund is issued.")}),
    _tool("log_interaction", "Add a note about a call, email, meeting or chat to a customer's activity timeline.",
          {"customer_id": _param("string", "The customer's id."),
           "channel": _param("string", "How the interaction happened.", enum=["call", "email", "meeting", "chat"]),
           "note": _param("string", "What was said or done.")}),
    _tool("update_customer_email", "Change the email address on file for a customer.",
          {"customer_id": _param("string", "The customer's id."),
           "email": _param("string", "The new email address.", format="email")}),
)

CALENDAR = (
    _tool("list_calendar_events", "List the events on the user's calendar for one day, with event_id, title, "
          "start, end and attendees.",
          {"date": _param("string", "The day, YYYY-MM-DD.", format="date")}),
    _tool("find_free_slot", "Find the earliest time on a day when the user and the given attendees are all free "
          "for the given duration.",
          {"date": _param("string", "The day, YYYY-MM-DD.", format="date"),
           "duration_minutes": _param("integer", "Length of the slot.", minimum=5)},
          {"attendees": {**_EMAILS, "description": "Other people who must be free."}}),
    _tool("create_calendar_event", "Create a calendar event and send invitations to its attendees.",
          {"title": _param("string", "Event title."),
           "start": _param("string", "Start, YYYY-MM-DDTHH:MM.", format="date-time"),
           "end": _param("string", "End, YYYY-MM-DDTHH:MM.", format="date-time")},
          {"attendees": {**_EMAILS, "description": "People to invite."}}),
    _tool("move_calendar_event", "Move an existing event to a new start time, keeping its length.",
          {"event_id": _param("string", "The event's id, from list_calendar_events."),
           "new_start": _param("string", "New start, YYYY-MM-DDTHH:MM.", format="date-time")}),
    _tool("cancel_calendar_event", "Cancel an event and notify its attendees.",
          {"event_id": _param("string", "The event's id, from list_calendar_events.")},
          {"message": _param("string", "A note sent to the attendees.")}),
    _tool("add_event_attendee", "Invite one more person to an existing event.",
          {"event_id": _param("string", "The event's id."),
           "email": _param("string", "The invitee's email address.", format="email")}),
)

NOTES = (
    _tool("search_notes", "Full-text search over the user's notes; returns note_id, title and a snippet per hit.",
          {"query": _param("string", "Words to look for.")},
          {"notebook": _param("string", "Only search this notebook.")}),
    _tool("read_note", "Return the full text of one note.",
          {"note_id": _param("string", "The note's id, from search_notes.")}),
    _tool("create_note", "Create a new note with a title and a body, optionally in a notebook.",
          {"title": _param("string", "Note title."), "body": _param("string", "Note text (Markdown).")},
          {"notebook": _param("string", "Notebook to put it in.")}),
    _tool("append_to_note", "Append text to the end of an existing note.",
          {"note_id": _param("string", "The note's id."), "text": _param("string", "Text to append.")}),
    _tool("tag_note", "Set the tags of a note, replacing its current tags.",
          {"note_id": _param("string", "The note's id."),
           "tags": {"type": "array", "items": {"type": "string"}, "description": "The new tags."}}),
    _tool("delete_note", "Move a note to the trash.",
          {"note_id": _param("string", "The note's id.")}),
)

SHOP = (
    _tool("search_catalog", "Search the store's catalog by keywords; returns product_id, name, price and rating.",
          {"query": _param("string", "Keywords, e.g. 'wireless earbuds'.")},
          {"max_price": _param("number", "Only products at or under this price.")}),
    _tool("get_catalog_item", "Get the full details of one product: specs, price, rating and return window.",
          {"product_id": _param("string", "The product's id, from search_catalog.")}),
    _tool("check_stock", "Check whether a product is in stock online or at stores near a postcode.",
          {"product_id": _param("string", "The product's id.")},
          {"postcode": _param("string", "Postcode to look near; online stock if omitted.")}),
    _tool("add_to_cart", "Add a quantity of a product to the shopping cart.",
          {"product_id": _param("string", "The product's id."),
           "quantity": _param("integer", "How many.", minimum=1)}),
    _tool("view_cart", "Show the items in the shopping cart and the current total."),
    _tool("apply_coupon", "Apply a coupon code to the cart and return the new total.",
          {"code": _param("string", "The coupon code.")}),
    _tool("checkout_cart", "Place the order for everything in the cart with a saved payment method; "
          "returns the order_id.",
          {"payment_method": _param("string", "How to pay.", enum=["saved_card", "paypal", "gift_card"])}),
    _tool("track_shipment", "Get the carrier, status and expected delivery date of an order.",
          {"order_id": _param("string", "The order's id, from checkout_cart.")}),
)

FILES = (
    _tool("search_drive", "Search files and folders in the user's cloud drive by name or content; returns "
          "file_id, name, type and folder.",
          {"query": _param("string", "Name or words to look for.")}),
    _tool("get_file_metadata", "Get a file's metadata: owner, size, created and modified times, last editor.",
          {"file_id": _param("string", "The file's id, from search_drive.")}),
    _tool("share_file", "Share a file with someone by email as viewer, commenter or editor.",
          {"file_id": _param("string", "The file's id."),
           "email": _param("string", "Who to share with.", format="email"),
           "role": _param("string", "Access level.", enum=["viewer", "commenter", "editor"])}),
    _tool("create_folder", "Create a folder in the drive, optionally inside a parent folder; returns its folder_id.",
          {"name": _param("string", "Folder name.")},
          {"parent_id": _param("string", "The parent folder's id; the drive root if omitted.")}),
    _tool("move_file", "Move a file into another folder.",
          {"file_id": _param("string", "The file's id."),
           "folder_id": _param("string", "The destination folder's id.")}),
    _tool("rename_file", "Rename a file or folder.",
          {"file_id": _param("string", "The file's id."), "new_name": _param("string", "The new name.")}),
)

ZERO_SHOT_TOOLSETS: dict[str, tuple[ToolSpec, ...]] = {
    "weather_units_email": WEATHER, "crm": CRM, "calendar": CALENDAR, "notes": NOTES, "shop": SHOP,
    "files": FILES,
}
"""The suite's toolsets by name: made up for this suite, none taken from a public benchmark."""


# --------------------------------------------------------------------------- tasks


def _call(tool: str, arguments: dict[str, Any], observation: Any, *, error: bool = False) -> Step:
    """Return a gold tool call with what the tool returned."""
    return Step(kind="tool_call", tool=tool, arguments=arguments, observation=observation, error=error)


def _task(task_id: str, toolset: str, request: str, calls: Sequence[Step], answer: str, *,
          toolsets: Mapping[str, tuple[ToolSpec, ...]] = ZERO_SHOT_TOOLSETS, suite: str = "zero_shot") -> Episode:
    """Return a task of ``suite`` over ``toolsets[toolset]`` whose gold path is ``calls`` then the reply ``answer``."""
    return Episode(id=f"{suite}_{toolset}_{task_id}", task=request, tools=list(toolsets[toolset]),
                   steps=[*calls, Step(kind="assistant", content=answer)], final_answer=answer, reward=1.0,
                   metadata={"suite": suite, "toolset": toolset})


_WEATHER_TASKS = [
    _task("paris_fahrenheit", "weather_units_email", "What is the weather in Paris right now, in Fahrenheit?", [
        _call("get_weather", {"city": "Paris", "country_code": "FR"},
              {"city": "Paris", "conditions": "light rain", "temperature_c": 14.0, "humidity": 82, "wind_kph": 17}),
        _call("convert_temperature", {"value": 14.0, "from_unit": "celsius", "to_unit": "fahrenheit"},
              {"value": 57.2, "unit": "fahrenheit"}),
    ], "It is 57.2 °F (14 °C) in Paris right now, with light rain."),
    _task("lisbon_forecast_email", "weather_units_email",
          "Email the 3-day forecast for Lisbon to my sister at ana.costa@example.com.", [
        _call("get_daily_forecast", {"city": "Lisbon", "days": 3},
              {"city": "Lisbon", "days": [{"date": "2025-03-11", "high_c": 19, "low_c": 11, "summary": "sunny"},
                                          {"date": "2025-03-12", "high_c": 17, "low_c": 12, "summary": "showers"},
                                          {"date": "2025-03-13", "high_c": 18, "low_c": 10, "summary": "cloudy"}]}),
        _call("send_email", {"to": ["ana.costa@example.com"], "subject": "Lisbon forecast, next 3 days",
                             "body": "Tue sunny 19/11 °C, Wed showers 17/12 °C, Thu cloudy 18/10 °C."},
              {"status": "sent", "message_id": "msg_7f3a21"}),
    ], "Sent Ana the Lisbon forecast: sunny Tuesday, showers Wednesday, cloudy Thursday."),
    _task("fahrenheit_451", "weather_units_email",
          "Use convert_temperature to turn 451 Fahrenheit into Celsius, then email the answer to "
          "ray@example.org with the subject 'Book fact'.", [
        _call("convert_temperature", {"value": 451, "from_unit": "fahrenheit", "to_unit": "celsius"},
              {"value": 232.8, "unit": "celsius"}),
        _call("send_email", {"to": ["ray@example.org"], "subject": "Book fact",
                             "body": "451 °F is about 232.8 °C, the temperature at which paper burns."},
              {"status": "sent", "message_id": "msg_0c91de"}),
    ], "451 °F is 232.8 °C; I emailed it to ray@example.org."),
    _task("chicago_race", "weather_units_email",
          "I'm running a 10-mile race in Chicago tomorrow. How far is that in kilometres, and will it be "
          "cold in the morning?", [
        _call("convert_length", {"value": 10, "from_unit": "miles", "to_unit": "km"},
              {"value": 16.09, "unit": "km"}),
        _call("get_daily_forecast", {"city": "Chicago", "days": 1},
              {"city": "Chicago", "days": [{"date": "2025-03-11", "high_c": 6, "low_c": -2,
                                            "summary": "clear, breezy"}]}),
    ], "10 miles is 16.1 km. Expect a cold start: about -2 °C in the morning, clear and breezy, up to 6 °C."),
    _task("denver_kelvin_email", "weather_units_email",
          "What's the temperature in Denver right now in Kelvin? Send it to lab@example.edu as well.", [
        _call("get_weather", {"city": "Denver", "country_code": "US"},
              {"city": "Denver", "conditions": "sunny", "temperature_c": 8.5, "humidity": 21, "wind_kph": 9}),
        _call("convert_temperature", {"value": 8.5, "from_unit": "celsius", "to_unit": "kelvin"},
              {"value": 281.65, "unit": "kelvin"}),
        _call("send_email", {"to": ["lab@example.edu"], "subject": "Denver temperature",
                             "body": "It is 281.65 K (8.5 °C) in Denver right now, sunny."},
              {"status": "sent", "message_id": "msg_b2204f"}),
    ], "Denver is at 281.65 K (8.5 °C) and sunny; I sent that to lab@example.edu."),
    _task("thanks", "weather_units_email", "Thanks, that's everything for now!", [],
          "You're welcome, have a great day!"),
]

_CRM_TASKS = [
    _task("last_order", "crm", "What did Dana Whitfield order most recently?", [
        _call("find_customer", {"query": "Dana Whitfield"},
              {"matches": [{"customer_id": "CUS-20417", "name": "Dana Whitfield", "email": "dana.w@lumenlabs.io"}]}),
        _call("list_orders", {"customer_id": "CUS-20417", "limit": 1},
              {"orders": [{"order_id": "ORD-99102", "date": "2025-02-11", "items": ["Standing desk frame"],
                           "total": 389.0}]}),
    ], "Dana Whitfield's latest order is ORD-99102 (11 Feb): a standing desk frame, $389."),
    _task("refund_blender", "crm",
          "Maria Lopez (maria.lopez@fastmail.com) says the blender from her last order arrived broken. "
          "Refund it in full and note it on her timeline.", [
        _call("find_customer", {"query": "maria.lopez@fastmail.com"},
              {"matches": [{"customer_id": "CUS-31558", "name": "Maria Lopez", "email": "maria.lopez@fastmail.com"}]}),
        _call("list_orders", {"customer_id": "CUS-31558", "limit": 3},
              {"orders": [{"order_id": "ORD-90477", "date": "2025-03-02", "items": ["Vortex 900 blender"],
                           "total": 79.99},
                          {"order_id": "ORD-87310", "date": "2025-01-19", "items": ["Glass jars x6"],
                           "total": 24.5}]}),
        _call("issue_refund", {"order_id": "ORD-90477", "amount": 79.99, "reason": "Blender arrived broken"},
              {"refund_id": "RF-5521", "order_id": "ORD-90477", "amount": 79.99, "status": "processing"}),
        _call("log_interaction", {"customer_id": "CUS-31558", "channel": "chat",
                                  "note": "Blender from ORD-90477 arrived broken; full refund RF-5521 issued."},
              {"status": "logged", "entry_id": "TL-88120"}),
    ], "Refunded $79.99 for the broken blender (refund RF-5521) and noted it on Maria's timeline."),
    _task("kenji_email", "crm",
          "Kenji Sato called: please change his email to kenji.sato@newmail.jp and log the call.", [
        _call("find_customer", {"query": "Kenji Sato"},
              {"matches": [{"customer_id": "CUS-10662", "name": "Kenji Sato", "email": "ksato@oldmail.jp"}]}),
        _call("update_customer_email", {"customer_id": "CUS-10662", "email": "kenji.sato@newmail.jp"},
              {"customer_id": "CUS-10662", "email": "kenji.sato@newmail.jp", "status": "updated"}),
        _call("log_interaction", {"customer_id": "CUS-10662", "channel": "call",
                                  "note": "Asked to change email to kenji.sato@newmail.jp; done."},
              {"status": "logged", "entry_id": "TL-88121"}),
    ], "Kenji's email is now kenji.sato@newmail.jp and the call is logged."),
    _task("late_order", "crm",
          "Check whether order ORD-88213 has shipped. If it's late, note on the customer's timeline that "
          "we chased the warehouse by email.", [
        _call("get_order_status", {"order_id": "ORD-88213"},
              {"order_id": "ORD-88213", "status": "delayed", "customer_id": "CUS-11873", "eta": "2025-03-14"}),
        _call("log_interaction", {"customer_id": "CUS-11873", "channel": "email",
                                  "note": "ORD-88213 delayed (ETA 14 Mar); chased the warehouse."},
              {"status": "logged", "entry_id": "TL-88122"}),
    ], "ORD-88213 is delayed, now due 14 March; I noted on the customer's timeline that we chased the warehouse."),
    _task("account_tier", "crm", "Which account tier is Priya Nair from Acme Corp on, and who owns the account?", [
        _call("find_customer", {"query": "Priya Nair"},
              {"matches": [{"customer_id": "CUS-40021", "name": "Priya Nair", "company": "Acme Corp"}]}),
        _call("get_customer_profile", {"customer_id": "CUS-40021"},
              {"customer_id": "CUS-40021", "name": "Priya Nair", "company": "Acme Corp", "tier": "Enterprise",
               "owner": "Tom Becker", "phone": "+44 20 7946 0101"}),
    ], "Priya Nair (Acme Corp) is on the Enterprise tier; Tom Becker owns the account."),
    _task("phone_retry", "crm", "Show the recent orders of the customer with phone number +1 (415) 555-0199.", [
        _call("find_customer", {"query": "+1 (415) 555-0199"},
              "Error: ValueError: phone numbers must be digits only, e.g. 14155550199", error=True),
        _call("find_customer", {"query": "14155550199"},
              {"matches": [{"customer_id": "CUS-27730", "name": "Lena Park", "phone": "14155550199"}]}),
        _call("list_orders", {"customer_id": "CUS-27730", "limit": 5},
              {"orders": [{"order_id": "ORD-91245", "date": "2025-03-05", "items": ["Trail shoes"], "total": 120.0},
                          {"order_id": "ORD-86002", "date": "2025-01-08", "items": ["Rain jacket"],
                           "total": 95.0}]}),
    ], "That number belongs to Lena Park: trail shoes on 5 March ($120) and a rain jacket on 8 January ($95)."),
]

_CALENDAR_TASKS = [
    _task("move_dentist", "calendar", "Move my dentist appointment on Friday, March 14 to 5pm.", [
        _call("list_calendar_events", {"date": "2025-03-14"},
              {"events": [{"event_id": "evt_5521", "title": "Dentist", "start": "2025-03-14T15:00",
                           "end": "2025-03-14T15:45", "attendees": []},
                          {"event_id": "evt_5530", "title": "1:1 with Ravi", "start": "2025-03-14T10:00",
                           "end": "2025-03-14T10:30", "attendees": ["ravi@example.com"]}]}),
        _call("move_calendar_event", {"event_id": "evt_5521", "new_start": "2025-03-14T17:00"},
              {"event_id": "evt_5521", "start": "2025-03-14T17:00", "end": "2025-03-14T17:45"}),
    ], "Your dentist appointment is now on Friday, March 14 from 5:00 to 5:45pm."),
    _task("roadmap_sync", "calendar",
          "Find 30 minutes tomorrow (March 11) when Lee and Omar are both free and book a 'Roadmap sync' "
          "with them. Their emails are lee@example.com and omar@example.com.", [
        _call("find_free_slot", {"date": "2025-03-11", "duration_minutes": 30,
                                 "attendees": ["lee@example.com", "omar@example.com"]},
              {"start": "2025-03-11T13:30", "end": "2025-03-11T14:00"}),
        _call("create_calendar_event", {"title": "Roadmap sync", "start": "2025-03-11T13:30",
                                        "end": "2025-03-11T14:00",
                                        "attendees": ["lee@example.com", "omar@example.com"]},
              {"event_id": "evt_6013", "status": "created", "invitations_sent": 2}),
    ], "Booked 'Roadmap sync' tomorrow 1:30-2:00pm with Lee and Omar; invitations are out."),
    _task("cancel_budget_review", "calendar",
          "Cancel the budget review on March 12 and tell everyone it moves to next quarter.", [
        _call("list_calendar_events", {"date": "2025-03-12"},
              {"events": [{"event_id": "evt_5988", "title": "Budget review", "start": "2025-03-12T11:00",
                           "end": "2025-03-12T12:00", "attendees": ["cfo@example.com", "ops@example.com"]}]}),
        _call("cancel_calendar_event", {"event_id": "evt_5988", "message": "Moving to next quarter."},
              {"event_id": "evt_5988", "status": "cancelled", "notified": 2}),
    ], "The March 12 budget review is cancelled and both attendees were told it moves to next quarter."),
    _task("add_to_design_review", "calendar", "Add jo.kim@example.com to Thursday's design review (March 13).", [
        _call("list_calendar_events", {"date": "2025-03-13"},
              {"events": [{"event_id": "evt_6002", "title": "Design review", "start": "2025-03-13T14:00",
                           "end": "2025-03-13T15:00", "attendees": ["ux@example.com"]}]}),
        _call("add_event_attendee", {"event_id": "evt_6002", "email": "jo.kim@example.com"},
              {"event_id": "evt_6002", "attendees": ["ux@example.com", "jo.kim@example.com"]}),
    ], "Jo Kim is now invited to Thursday's design review (2-3pm)."),
    _task("flight_block", "calendar",
          "Call create_calendar_event to put 'Flight to Berlin' on March 20 from 07:05 to 09:10, then add my "
          "assistant sam@example.com to it.", [
        _call("create_calendar_event", {"title": "Flight to Berlin", "start": "2025-03-20T07:05",
                                        "end": "2025-03-20T09:10"},
              {"event_id": "evt_6120", "status": "created", "invitations_sent": 0}),
        _call("add_event_attendee", {"event_id": "evt_6120", "email": "sam@example.com"},
              {"event_id": "evt_6120", "attendees": ["sam@example.com"]}),
    ], "'Flight to Berlin' is on your calendar for March 20, 07:05-09:10, and Sam is invited."),
    _task("capital", "calendar", "What's the capital of Australia?", [],
          "The capital of Australia is Canberra."),
]

_NOTES_TASKS = [
    _task("renovation_budget", "notes", "What did I write down about the kitchen renovation budget?", [
        _call("search_notes", {"query": "kitchen renovation budget"},
              {"hits": [{"note_id": "nt_1193", "title": "Kitchen reno", "snippet": "Budget: cabinets 6k, ..."}]}),
        _call("read_note", {"note_id": "nt_1193"},
              {"note_id": "nt_1193", "title": "Kitchen reno",
               "body": "Budget: cabinets 6k, worktops 2.5k, labour 4k, 10% contingency. Quote from Hale & Co "
                       "pending."}),
    ], "Your 'Kitchen reno' note budgets 6k for cabinets, 2.5k for worktops and 4k for labour, plus 10% "
       "contingency; the Hale & Co quote is still pending."),
    _task("grocery_list", "notes", "Add oat milk and coffee filters to my grocery list.", [
        _call("search_notes", {"query": "grocery list"},
              {"hits": [{"note_id": "nt_0042", "title": "Grocery list", "snippet": "- eggs\n- spinach"}]}),
        _call("append_to_note", {"note_id": "nt_0042", "text": "- oat milk\n- coffee filters"},
              {"note_id": "nt_0042", "status": "appended", "length": 58}),
    ], "Added oat milk and coffee filters to your grocery list."),
    _task("tag_okrs", "notes", "Tag my Q3 OKRs note as work and urgent.", [
        _call("search_notes", {"query": "Q3 OKRs"},
              {"hits": [{"note_id": "nt_0871", "title": "Q3 OKRs", "snippet": "Objective 1: ship billing v2"}]}),
        _call("tag_note", {"note_id": "nt_0871", "tags": ["work", "urgent"]},
              {"note_id": "nt_0871", "tags": ["work", "urgent"]}),
    ], "Your 'Q3 OKRs' note is now tagged work and urgent."),
    _task("standup_summary", "notes",
          "Turn my notes from Monday's standup into a short summary note called 'Standup summary - Mar 10'.", [
        _call("search_notes", {"query": "standup Monday March 10"},
              {"hits": [{"note_id": "nt_1302", "title": "Standup 2025-03-10", "snippet": "Ana: billing bug..."}]}),
        _call("read_note", {"note_id": "nt_1302"},
              {"note_id": "nt_1302", "title": "Standup 2025-03-10",
               "body": "Ana: billing bug fixed, deploy Tue. Ben: blocked on API keys. Chen: demo prep for Fri."}),
        _call("create_note", {"title": "Standup summary - Mar 10",
                              "body": "- Billing fix deploys Tuesday\n- Ben blocked on API keys\n- Demo Friday"},
              {"note_id": "nt_1310", "status": "created"}),
    ], "Created 'Standup summary - Mar 10': billing fix deploys Tuesday, Ben is blocked on API keys, demo Friday."),
    _task("delete_wifi", "notes", "Use search_notes to find the note called 'old wifi password' and delete it.", [
        _call("search_notes", {"query": "old wifi password"},
              {"hits": [{"note_id": "nt_0310", "title": "old wifi password", "snippet": "network: casa-5g"}]}),
        _call("delete_note", {"note_id": "nt_0310"}, {"note_id": "nt_0310", "status": "trashed"}),
    ], "Moved the 'old wifi password' note to the trash."),
]

_SHOP_TASKS = [
    _task("earbuds", "shop", "Find wireless earbuds under $50 and add the best-rated pair to my cart.", [
        _call("search_catalog", {"query": "wireless earbuds", "max_price": 50},
              {"results": [{"product_id": "P-30411", "name": "Soundcore A20", "price": 39.99, "rating": 4.6},
                           {"product_id": "P-29870", "name": "JLab Go Air", "price": 24.99, "rating": 4.2}]}),
        _call("add_to_cart", {"product_id": "P-30411", "quantity": 1},
              {"cart_items": 1, "cart_total": 39.99}),
    ], "Added the Soundcore A20 ($39.99, rated 4.6) to your cart."),
    _task("aeropress", "shop", "Is the AeroPress Go in stock near 94110? If it is, put one in my cart.", [
        _call("search_catalog", {"query": "AeroPress Go"},
              {"results": [{"product_id": "P-11876", "name": "AeroPress Go Travel Coffee Press", "price": 39.95,
                            "rating": 4.8}]}),
        _call("check_stock", {"product_id": "P-11876", "postcode": "94110"},
              {"product_id": "P-11876", "online": True,
               "stores": [{"store": "Mission St", "distance_km": 1.2, "quantity": 4}]}),
        _call("add_to_cart", {"product_id": "P-11876", "quantity": 1}, {"cart_items": 1, "cart_total": 39.95}),
    ], "Yes, the Mission St store has 4 in stock; one AeroPress Go is in your cart ($39.95)."),
    _task("spring_coupon", "shop", "Apply coupon SPRING15 and check out with my saved card.", [
        _call("apply_coupon", {"code": "SPRING15"}, {"code": "SPRING15", "discount": 12.3, "new_total": 69.7}),
        _call("checkout_cart", {"payment_method": "saved_card"},
              {"order_id": "SO-552190", "charged": 69.7, "status": "placed"}),
    ], "SPRING15 saved you $12.30; order SO-552190 is placed and $69.70 was charged to your saved card."),
    _task("cart_with_code", "shop", "What's in my cart, and how much would it be with the code WELCOME10?", [
        _call("view_cart", {}, {"items": [{"name": "Yoga mat", "quantity": 1, "price": 28.0},
                                          {"name": "Foam roller", "quantity": 1, "price": 19.0}], "total": 47.0}),
        _call("apply_coupon", {"code": "WELCOME10"}, {"code": "WELCOME10", "discount": 4.7, "new_total": 42.3}),
    ], "Your cart has a yoga mat ($28) and a foam roller ($19): $47, or $42.30 with WELCOME10."),
    _task("kindle_returns", "shop",
          "How long is the return window on the Kindle Paperwhite, and can I get it online right now?", [
        _call("search_catalog", {"query": "Kindle Paperwhite"},
              {"results": [{"product_id": "P-70215", "name": "Kindle Paperwhite 16 GB", "price": 159.99,
                            "rating": 4.7}]}),
        _call("get_catalog_item", {"product_id": "P-70215"},
              {"product_id": "P-70215", "name": "Kindle Paperwhite 16 GB", "price": 159.99,
               "specs": {"screen": "7 in", "storage": "16 GB"}, "return_window_days": 30}),
        _call("check_stock", {"product_id": "P-70215"}, {"product_id": "P-70215", "online": True, "stores": []}),
    ], "The Kindle Paperwhite has a 30-day return window, and it is in stock online."),
    _task("usb_chargers", "shop", "Find a USB-C charger under $30, add two to my cart and check out with PayPal.", [
        _call("search_catalog", {"query": "USB-C charger", "max_price": 30},
              {"results": [{"product_id": "P-44102", "name": "Anker Nano 30W", "price": 19.99, "rating": 4.7}]}),
        _call("add_to_cart", {"product_id": "P-44102", "quantity": 2}, {"cart_items": 2, "cart_total": 39.98}),
        _call("checkout_cart", {"payment_method": "paypal"},
              {"order_id": "SO-552207", "charged": 39.98, "status": "placed"}),
    ], "Ordered two Anker Nano 30W chargers for $39.98 with PayPal (order SO-552207)."),
    _task("joke", "shop", "Tell me a joke about shopping carts.", [],
          "Why did the shopping cart go to therapy? It had too many issues to handle on its own."),
]

_FILES_TASKS = [
    _task("share_deck", "files", "Share the Q2 board deck with investor@northwind.vc, view only.", [
        _call("search_drive", {"query": "Q2 board deck"},
              {"results": [{"file_id": "f_8812", "name": "Q2 Board Deck.pptx", "type": "presentation",
                            "folder": "Board"}]}),
        _call("share_file", {"file_id": "f_8812", "email": "investor@northwind.vc", "role": "viewer"},
              {"file_id": "f_8812", "shared_with": "investor@northwind.vc", "role": "viewer"}),
    ], "Shared 'Q2 Board Deck.pptx' with investor@northwind.vc as a viewer."),
    _task("taxes_folder", "files", "Make a folder called 'Taxes 2024' and move my W-2 PDF into it.", [
        _call("create_folder", {"name": "Taxes 2024"}, {"folder_id": "fd_301", "name": "Taxes 2024"}),
        _call("search_drive", {"query": "W-2 pdf"},
              {"results": [{"file_id": "f_7730", "name": "W-2 2024.pdf", "type": "pdf", "folder": "Downloads"}]}),
        _call("move_file", {"file_id": "f_7730", "folder_id": "fd_301"},
              {"file_id": "f_7730", "folder": "Taxes 2024"}),
    ], "Created 'Taxes 2024' and moved 'W-2 2024.pdf' into it."),
    _task("checklist_editor", "files", "Who last edited the onboarding checklist, and when?", [
        _call("search_drive", {"query": "onboarding checklist"},
              {"results": [{"file_id": "f_2044", "name": "Onboarding checklist", "type": "document",
                            "folder": "People"}]}),
        _call("get_file_metadata", {"file_id": "f_2044"},
              {"file_id": "f_2044", "owner": "hr@example.com", "size_kb": 84,
               "modified": "2025-03-07T16:42", "last_modified_by": "Marta Ruiz"}),
    ], "Marta Ruiz last edited the onboarding checklist, on 7 March at 16:42."),
    _task("rename_budget", "files",
          "Rename 'Untitled spreadsheet' to 'Team budget 2025' and give finance@example.com edit access.", [
        _call("search_drive", {"query": "Untitled spreadsheet"},
              {"results": [{"file_id": "f_9921", "name": "Untitled spreadsheet", "type": "spreadsheet",
                            "folder": "My Drive"}]}),
        _call("rename_file", {"file_id": "f_9921", "new_name": "Team budget 2025"},
              {"file_id": "f_9921", "name": "Team budget 2025"}),
        _call("share_file", {"file_id": "f_9921", "email": "finance@example.com", "role": "editor"},
              {"file_id": "f_9921", "shared_with": "finance@example.com", "role": "editor"}),
    ], "Renamed it to 'Team budget 2025' and gave finance@example.com edit access."),
]

ZERO_SHOT_TASKS: tuple[Episode, ...] = (*_WEATHER_TASKS, *_CRM_TASKS, *_CALENDAR_TASKS, *_NOTES_TASKS,
                                        *_SHOP_TASKS, *_FILES_TASKS)
"""The suite's tasks, gold paths included; ``metadata["toolset"]`` names each one's toolset."""


# --------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class ZeroShotDecision:
    """One decision of a task: what was gold, what the chooser put first, how it scores."""

    task_id: str
    toolset: str
    step: int
    """Index of the decision's step in the task's steps."""
    gold: str
    chosen: str | None
    """The top choice (``None`` for an expectation, which chooses nothing)."""
    correct: float
    """1.0 or 0.0 (or, for an expectation, the probability of being right)."""
    tool_correct: float | None
    """When the gold is a tool: whether the best-ranked tool, FINISH left out, is it; ``None`` else."""
    repeat: float | None
    """After a successful call: whether the top choice is that tool again; ``None`` elsewhere."""
    confidence: float | None = None
    """A policy's calibrated probability of its top choice (``None`` for a chooser that reports none)."""


@dataclass(frozen=True)
class ZeroShotScores:
    """The suite's metrics over some tasks (all, or one toolset's)."""

    step_accuracy: float
    tool_accuracy: float | None
    """Over the decisions whose gold is a tool (``None`` when there is none)."""
    task_exact: float
    repeat_rate: float | None
    """``None`` when no decision followed a successful call."""
    n_tasks: int
    n_decisions: int
    n_after_success: int
    """Decisions right after a successful call: the repeat rate's denominator."""


@dataclass
class ZeroShotReport:
    """What :func:`evaluate_zero_shot` measured for one chooser."""

    chooser: str
    overall: ZeroShotScores
    per_toolset: dict[str, ZeroShotScores]
    decisions: list[ZeroShotDecision] = field(default_factory=list)
    calibration: CalibrationReport | None = None
    """Of the top choices' reported probabilities, over every decision (a policy's report only)."""

    def to_json(self) -> dict[str, Any]:
        """Return the report as a JSON-ready dict: metrics overall, per toolset, every decision, calibration."""
        return {"chooser": self.chooser, "overall": asdict(self.overall),
                "per_toolset": {name: asdict(scores) for name, scores in self.per_toolset.items()},
                "decisions": [asdict(decision) for decision in self.decisions],
                "calibration": None if self.calibration is None else self.calibration.to_json()}

    def write_json(self, path: str | Path) -> None:
        """Write :meth:`to_json` to ``path``."""
        Path(path).write_text(json.dumps(self.to_json(), indent=2, ensure_ascii=False))


def _toolset(task: Episode) -> str:
    """Return a task's toolset name (its id when it has none)."""
    return str(task.metadata.get("toolset") or task.id)


def _score(decisions: Sequence[ZeroShotDecision]) -> ZeroShotScores:
    """Aggregate decisions into step accuracy, task exact match and repeat rate."""
    by_task: dict[str, list[float]] = {}
    for decision in decisions:
        by_task.setdefault(decision.task_id, []).append(decision.correct)
    repeats = [decision.repeat for decision in decisions if decision.repeat is not None]
    tools = [decision.tool_correct for decision in decisions if decision.tool_correct is not None]
    return ZeroShotScores(
        step_accuracy=sum(d.correct for d in decisions) / max(len(decisions), 1),
        tool_accuracy=sum(tools) / len(tools) if tools else None,
        # The product is "all right" for 0/1 outcomes and its probability for an expectation.
        task_exact=sum(math.prod(hits) for hits in by_task.values()) / max(len(by_task), 1),
        repeat_rate=sum(repeats) / len(repeats) if repeats else None,
        n_tasks=len(by_task), n_decisions=len(decisions), n_after_success=len(repeats))


def _report(chooser: str, decisions: list[ZeroShotDecision]) -> ZeroShotReport:
    """Build a report: overall and per toolset, toolsets in order of first appearance, and calibration."""
    toolsets = list(dict.fromkeys(d.toolset for d in decisions))
    scored = [(d.confidence, d.correct == 1.0) for d in decisions if d.confidence is not None]
    calibration = calibration_report([c for c, _ in scored], [ok for _, ok in scored]) if scored else None
    return ZeroShotReport(chooser=chooser, overall=_score(decisions),
                          per_toolset={name: _score([d for d in decisions if d.toolset == name])
                                       for name in toolsets},
                          decisions=decisions, calibration=calibration)


def _after_success(steps: Sequence[Step], index: int) -> str | None:
    """Return the tool of the step before ``index`` if it was a successful call, else ``None``."""
    previous = steps[index - 1] if index > 0 else None
    if previous is not None and previous.kind == "tool_call" and not previous.error:
        return previous.tool
    return None


def evaluate_zero_shot(chooser_or_policy: Chooser | ToolPolicy, tasks: Sequence[Episode] = ZERO_SHOT_TASKS, *,
                       name: str | None = None) -> ZeroShotReport:
    """Replay every task with its gold history and score the chooser's top choice at each decision.

    A :class:`~evoharness_agent.policy.ToolPolicy` is wrapped in
    :class:`~evoharness_agent.evaluation.choosers.PolicyChooser`; the candidates at each
    decision are the tools available there (the whole toolset) plus FINISH, as in a live run.
    A chooser whose sessions report their confidence (a policy's: a
    :class:`~evoharness_agent.evaluation.choosers.ConfidentSession`) keeps each top choice's probability.
    """
    chooser: Chooser = (PolicyChooser(chooser_or_policy) if isinstance(chooser_or_policy, ToolPolicy)
                        else chooser_or_policy)
    decisions: list[ZeroShotDecision] = []
    for task in tasks:
        session = chooser.session(task.task, task.tools)
        for index, (step, available) in enumerate(zip(task.steps, task.availability(), strict=True)):
            if step.is_decision:
                ranked, confidence = _ranked(session, frozenset(available))
                chosen = ranked[0] if ranked else FINISH
                best_tool = next((action for action in ranked if action != FINISH), None)
                previous = _after_success(task.steps, index)
                decisions.append(ZeroShotDecision(
                    task_id=task.id, toolset=_toolset(task), step=index, gold=step.action, chosen=chosen,
                    correct=float(chosen == step.action),
                    tool_correct=None if step.action == FINISH else float(best_tool == step.action),
                    repeat=None if previous is None else float(chosen == previous), confidence=confidence))
            session.observe(step)
    return _report(name or chooser.name, decisions)


def _ranked(session: ChooserSession, available: Collection[str]) -> tuple[list[str], float | None]:
    """Return the actions best first and, from a :class:`ConfidentSession`, the probability of the first."""
    if isinstance(session, ConfidentSession):
        return session.rank_with_confidence(available)
    return session.rank(available), None


def random_expectation(tasks: Sequence[Episode] = ZERO_SHOT_TASKS, *,
                       name: str = "random (expected)") -> ZeroShotReport:
    """Return the exact expected report of a uniformly random choice among the tools and FINISH."""
    decisions: list[ZeroShotDecision] = []
    for task in tasks:
        for index, (step, available) in enumerate(zip(task.steps, task.availability(), strict=True)):
            if not step.is_decision:
                continue
            chance = 1.0 / len(_candidates(available))
            previous = _after_success(task.steps, index)
            tool_chance = 1.0 / len(available) if step.action in available else 0.0
            decisions.append(ZeroShotDecision(
                task_id=task.id, toolset=_toolset(task), step=index, gold=step.action, chosen=None,
                correct=chance if step.action in _candidates(available) else 0.0,
                tool_correct=None if step.action == FINISH else tool_chance,
                repeat=None if previous is None else (chance if previous in available else 0.0)))
    return _report(name, decisions)


def _candidates(available: Collection[str]) -> set[str]:
    """Return the actions ranked at a decision: the available tools and FINISH."""
    return {*available, FINISH}


def _cell(value: float | None) -> str:
    """Format a metric for the table (a dash when undefined)."""
    return "-" if value is None else f"{value:.3f}"


def print_zero_shot(reports: Sequence[ZeroShotReport], console: Console | None = None,
                    title: str = "zero-shot suite") -> None:
    """Print reports as one rich table: a section per toolset (all first), a row per chooser, the first in bold."""
    console = console or Console()
    if not reports:
        console.print(f"{title}: no reports")
        return
    overall = reports[0].overall
    table = Table(title=f"{title}: {overall.n_tasks} tasks, {overall.n_decisions} decisions "
                        f"({overall.n_after_success} right after a successful call)")
    for column in ("toolset", "chooser"):
        table.add_column(column, overflow="fold")
    # Numbers never fold or get cut: a narrow terminal folds the names instead.
    for column in ("tasks", "decisions", "step acc", "tool acc", "task exact", "repeat"):
        table.add_column(column, justify="right", no_wrap=True, min_width=len(column))
    toolsets = ["all", *dict.fromkeys(name for report in reports for name in report.per_toolset)]
    for toolset in toolsets:
        for k, report in enumerate(reports):
            scores = report.overall if toolset == "all" else report.per_toolset.get(toolset)
            if scores is None:
                continue
            counts = [str(scores.n_tasks), str(scores.n_decisions)] if k == 0 else ["", ""]
            table.add_row(toolset if k == 0 else "", report.chooser, *counts, _cell(scores.step_accuracy),
                          _cell(scores.tool_accuracy), _cell(scores.task_exact), _cell(scores.repeat_rate),
                          style="bold" if k == 0 else None, end_section=k == len(reports) - 1)
    console.print(table)
    for report in reports:
        if report.calibration is not None:
            calibration = report.calibration
            console.print(f"{report.chooser}: reported probability of its top choice {calibration.mean_confidence:.3f} "
                          f"on average, right {calibration.accuracy:.3f}; {ece_reading(calibration.to_json())}, "
                          f"coverage at 95% accuracy {calibration.coverage_at_95:.3f}")
