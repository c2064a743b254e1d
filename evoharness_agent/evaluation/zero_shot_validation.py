"""Zero-shot validation suite: the held-out twin of the reported suite, for choosing hyperparameters.

:mod:`evoharness_agent.evaluation.zero_shot` is a reported figure, so nothing may be tuned on
it. This module is the suite to tune on instead: same kind, same style, disjoint content. Five
toolsets of this project's own invention (travel, a smart home, an issue tracker, banking, HR;
:data:`VALIDATION_TOOLSETS`), none sharing a theme or a tool name with the reported suite or
with any tool name in the bundled data, and 30 tasks over them (:data:`VALIDATION_TASKS`),
each a native :class:`~evoharness_agent.schema.Episode` with a gold path of 1-4 tool calls
then a reply, with plausible arguments and dict observations. Most calls need an id that an
earlier call returned (``find_employee_record`` -> ``employee_id`` -> ``get_leave_allowance``),
some requests name the tool they want, two calls fail and are retried, and three tasks are
answered at once (small talk, no tool fits). :data:`VALIDATION_FIRST_REQUESTS` adds 50 first
requests over the same toolsets, one decision each: whether a request is for a tool at all.

Score a chooser on it with :func:`~evoharness_agent.evaluation.zero_shot.evaluate_zero_shot`
(``tasks=VALIDATION_TASKS``) or ``benchmarks/zero_shot.py --suite validation``. Use it to
choose hyperparameters for zero-shot transfer; never report it as the zero-shot figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from evoharness_agent.evaluation.zero_shot import _call, _param, _task, _tool
from evoharness_agent.schema import Episode, Step, ToolSpec

__all__ = ["VALIDATION_FIRST_REQUESTS", "VALIDATION_TASKS", "VALIDATION_TOOLSETS"]


# --------------------------------------------------------------------------- toolsets


def _date(description: str) -> dict[str, Any]:
    """Return a YYYY-MM-DD date property."""
    return _param("string", f"{description}, YYYY-MM-DD.", format="date")


TRAVEL = (
    _tool("search_flight_offers", "Search one-way flight offers between two airports on a date; returns offer_id, "
          "airline, flight number, departure and arrival times, stops and fare in EUR.",
          {"origin": _param("string", "Departure airport, a 3-letter IATA code such as 'LHR'."),
           "destination": _param("string", "Arrival airport, a 3-letter IATA code such as 'LIS'."),
           "departure_date": _date("Day of departure")},
          {"cabin": _param("string", "Cabin class.", enum=["economy", "premium_economy", "business"]),
           "max_stops": _param("integer", "Most stops allowed; 0 for nonstop only.", minimum=0)}),
    _tool("get_flight_offer_details", "Get a flight offer's fare rules: baggage allowance, change fee, refundability "
          "and seat selection.",
          {"offer_id": _param("string", "The offer's id, from search_flight_offers.")}),
    _tool("purchase_flight_offer", "Book a flight offer for one passenger and charge the saved card; returns the "
          "booking_id and the airline's record locator.",
          {"offer_id": _param("string", "The offer's id, from search_flight_offers."),
           "passenger_name": _param("string", "Passenger's full name as on the passport.")}),
    _tool("search_hotel_stays", "Search hotel stays in a city for check-in and check-out dates; returns stay_id, "
          "hotel, nightly rate in EUR, guest rating and distance to the centre.",
          {"city": _param("string", "City name, e.g. 'Berlin'."),
           "check_in": _date("Check-in day"), "check_out": _date("Check-out day")},
          {"max_nightly_rate": _param("number", "Only stays at or under this nightly rate, in EUR.")}),
    _tool("reserve_hotel_stay", "Reserve a hotel stay for a guest with the saved card; returns the booking_id.",
          {"stay_id": _param("string", "The stay's id, from search_hotel_stays."),
           "guest_name": _param("string", "Name the room is booked under.")}),
    _tool("list_my_trips", "List the user's upcoming flight and hotel bookings with booking_id, type, route or "
          "hotel, dates and status.",
          optional={"from_date": _date("Only trips starting on or after this day")}),
    _tool("cancel_trip_booking", "Cancel a flight or hotel booking; returns the refund or travel credit due under "
          "its fare or rate rules.",
          {"booking_id": _param("string", "The booking's id, from list_my_trips, purchase_flight_offer or "
                                          "reserve_hotel_stay.")}),
)

_COMMANDS = ["turn_on", "turn_off", "set_brightness", "set_temperature", "lock", "unlock"]
_DAYS = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]

SMART_HOME = (
    _tool("list_home_devices", "List the smart-home devices, optionally in one room, with device_id, type, name "
          "and room.",
          optional={"room": _param("string", "Only devices in this room, e.g. 'kitchen'.")}),
    _tool("get_device_status", "Get a device's current state: on or off, brightness, temperature, lock state, "
          "battery and whether it is online.",
          {"device_id": _param("string", "The device's id, from list_home_devices.")}),
    _tool("set_thermostat_target", "Set a thermostat's target temperature in Celsius, optionally with a mode.",
          {"device_id": _param("string", "The thermostat's device_id, from list_home_devices."),
           "target_c": _param("number", "Target temperature in Celsius.", minimum=5, maximum=30)},
          {"mode": _param("string", "Heating mode.", enum=["heat", "cool", "auto", "off"])}),
    _tool("switch_light", "Turn a light on or off, optionally at a brightness.",
          {"device_id": _param("string", "The light's device_id, from list_home_devices."),
           "on": _param("boolean", "True to turn it on, false to turn it off.")},
          {"brightness": _param("integer", "Brightness in percent.", minimum=1, maximum=100)}),
    _tool("set_lock_state", "Lock or unlock a smart door lock.",
          {"device_id": _param("string", "The lock's device_id, from list_home_devices."),
           "locked": _param("boolean", "True to lock, false to unlock.")}),
    _tool("create_home_routine", "Create a routine that runs device commands at a time of day on chosen days; "
          "returns the routine_id.",
          {"name": _param("string", "Routine name."),
           "time": _param("string", "Time of day, HH:MM (24-hour).", pattern="^[0-2][0-9]:[0-5][0-9]$"),
           "actions": {"type": "array", "description": "The commands to run, in order.", "minItems": 1,
                       "items": {"type": "object", "required": ["device_id", "command"], "properties": {
                           "device_id": _param("string", "The device's id, from list_home_devices."),
                           "command": _param("string", "What to do.", enum=_COMMANDS),
                           "value": _param("number", "Brightness in percent or temperature in Celsius.")}}}},
          {"days": {"type": "array", "items": {"type": "string", "enum": _DAYS},
                    "description": "Days it runs on; every day if omitted."}}),
    _tool("get_energy_report", "Get the energy a device, or the whole home, used over a period, in kWh with a "
          "cost estimate.",
          {"period": _param("string", "Period to report on.", enum=["day", "week", "month"])},
          {"device_id": _param("string", "The device's id, from list_home_devices; the whole home if omitted.")}),
)

_ISSUE_STATUSES = ["open", "in_progress", "in_review", "done"]

ISSUES = (
    _tool("search_tracker_issues", "Search the project tracker's issues by words; returns issue_id, title, status "
          "and assignee per hit.",
          {"query": _param("string", "Words to look for in titles and descriptions.")},
          {"status": _param("string", "Only issues in this status.", enum=_ISSUE_STATUSES),
           "project": _param("string", "Only this project, by key, e.g. 'WEB'.")}),
    _tool("get_tracker_issue", "Get an issue's full details: description, status, priority, assignee, reporter, "
          "labels and comments.",
          {"issue_id": _param("string", "The issue's id, e.g. 'WEB-1423', from search_tracker_issues or "
                                        "list_sprint_board.")}),
    _tool("open_tracker_issue", "Create an issue in a project; returns its issue_id.",
          {"project": _param("string", "Project key, e.g. 'MOBILE'."),
           "title": _param("string", "One-line summary."),
           "issue_type": _param("string", "Kind of issue.", enum=["bug", "task", "story"])},
          {"description": _param("string", "Details, steps to reproduce (Markdown)."),
           "priority": _param("string", "Priority.", enum=["low", "medium", "high", "critical"])}),
    _tool("assign_tracker_issue", "Assign an issue to a teammate by username.",
          {"issue_id": _param("string", "The issue's id, from search_tracker_issues, list_sprint_board or "
                                        "open_tracker_issue."),
           "assignee": _param("string", "The teammate's username, e.g. 'priya.s'.")}),
    _tool("comment_on_tracker_issue", "Post a comment on an issue; @username mentions notify that teammate.",
          {"issue_id": _param("string", "The issue's id, from search_tracker_issues or list_sprint_board."),
           "body": _param("string", "Comment text (Markdown).")}),
    _tool("transition_tracker_issue", "Move an issue to another status, optionally with a resolution note.",
          {"issue_id": _param("string", "The issue's id, from search_tracker_issues or list_sprint_board."),
           "status": _param("string", "The new status.", enum=_ISSUE_STATUSES)},
          {"resolution": _param("string", "Why it is done, e.g. 'Fixed' or 'Duplicate of WEB-1423'.")}),
    _tool("list_sprint_board", "List the issues on a project's current sprint board by column, with issue_id, "
          "title, assignee and story points.",
          {"project": _param("string", "Project key, e.g. 'WEB'.")},
          {"sprint": _param("string", "A sprint's name; the current sprint if omitted.")}),
)

BANKING = (
    _tool("list_bank_accounts", "List the user's bank accounts with account_id, type (checking or savings), "
          "nickname and the last 4 digits."),
    _tool("get_account_balance", "Get an account's current and available balance.",
          {"account_id": _param("string", "The account's id, from list_bank_accounts.")}),
    _tool("list_account_transactions", "List an account's transactions, newest first, with transaction_id, date, "
          "merchant, amount and the card_id used.",
          {"account_id": _param("string", "The account's id, from list_bank_accounts.")},
          {"since": _date("Only transactions on or after this day"),
           "merchant": _param("string", "Only transactions whose merchant matches this.")}),
    _tool("transfer_between_accounts", "Move money between two of the user's own accounts; returns a transfer_id.",
          {"from_account_id": _param("string", "The account to take the money from, from list_bank_accounts."),
           "to_account_id": _param("string", "The account to pay into, from list_bank_accounts."),
           "amount": _param("number", "Amount in the accounts' currency.", exclusiveMinimum=0)},
          {"memo": _param("string", "A note shown on both statements.")}),
    _tool("dispute_card_charge", "Open a dispute on a card transaction that is unrecognised, duplicated, wrong or "
          "was never delivered; returns a dispute_id.",
          {"transaction_id": _param("string", "The transaction's id, from list_account_transactions."),
           "reason": _param("string", "Why it is disputed.",
                            enum=["unrecognised", "duplicate", "not_received", "wrong_amount"])},
          {"details": _param("string", "What happened, in the user's words.")}),
    _tool("list_payment_cards", "List the user's debit and credit cards with card_id, type, last 4 digits and "
          "status."),
    _tool("freeze_payment_card", "Temporarily freeze a card so it declines new payments; it can be unfrozen later.",
          {"card_id": _param("string", "The card's id, from list_payment_cards or list_account_transactions.")}),
)

HR = (
    _tool("find_employee_record", "Look up employees by name or work email; returns employee_id, job title, "
          "department and manager per match.",
          {"query": _param("string", "A name or a work email address.")}),
    _tool("get_leave_allowance", "Get an employee's leave for the year: annual and sick days allowed, carried "
          "over, taken, booked and remaining.",
          {"employee_id": _param("string", "The employee's id, from find_employee_record or list_direct_reports.")},
          {"year": _param("integer", "Leave year; the current one if omitted.", minimum=2000)}),
    _tool("submit_leave_request", "Submit a leave request for an employee; returns the leave_request_id and who "
          "must approve it.",
          {"employee_id": _param("string", "The employee's id, from find_employee_record."),
           "leave_type": _param("string", "Kind of leave.", enum=["annual", "sick", "parental", "unpaid"]),
           "start_date": _date("First day off"), "end_date": _date("Last day off")},
          {"note": _param("string", "A note for the approver.")}),
    _tool("get_payslip_summary", "Get an employee's payslip for a month: gross pay, tax, pension, net pay and "
          "pay date.",
          {"employee_id": _param("string", "The employee's id, from find_employee_record."),
           "month": _param("string", "The month, YYYY-MM.", pattern="^[0-9]{4}-[0-9]{2}$")}),
    _tool("update_home_address", "Change the home address on an employee's record.",
          {"employee_id": _param("string", "The employee's id, from find_employee_record."),
           "street": _param("string", "House number and street."),
           "city": _param("string", "Town or city."),
           "postcode": _param("string", "Postcode.")},
          {"country": _param("string", "Country; unchanged if omitted.")}),
    _tool("list_direct_reports", "List the people who report to a manager, with employee_id, name, title and "
          "start date.",
          {"manager_id": _param("string", "The manager's employee_id, from find_employee_record.")}),
)

VALIDATION_TOOLSETS: dict[str, tuple[ToolSpec, ...]] = {
    "travel": TRAVEL, "smart_home": SMART_HOME, "issues": ISSUES, "banking": BANKING, "hr": HR,
}
"""The validation suite's toolsets by name: made up for it, disjoint from the reported suite's."""


# --------------------------------------------------------------------------- tasks


def _vtask(task_id: str, toolset: str, request: str, calls: Sequence[Step], answer: str) -> Episode:
    """Return a validation task over ``toolset`` whose gold path is ``calls`` then the reply ``answer``."""
    return _task(task_id, toolset, request, calls, answer, toolsets=VALIDATION_TOOLSETS,
                 suite="zero_shot_validation")


_TRAVEL_TASKS = [
    _vtask("lisbon_nonstop", "travel",
           "Book me the cheapest nonstop flight from London Heathrow to Lisbon on April 4. Passenger: Claire Dubois.", [
        _call("search_flight_offers", {"origin": "LHR", "destination": "LIS", "departure_date": "2025-04-04",
                                       "max_stops": 0},
              {"offers": [{"offer_id": "OF-7HX21", "airline": "TAP", "flight": "TP1363", "departs": "06:35",
                           "arrives": "09:10", "stops": 0, "fare": 142.0},
                          {"offer_id": "OF-7HX35", "airline": "British Airways", "flight": "BA500",
                           "departs": "11:20", "arrives": "13:55", "stops": 0, "fare": 168.0}]}),
        _call("purchase_flight_offer", {"offer_id": "OF-7HX21", "passenger_name": "Claire Dubois"},
              {"booking_id": "BK-40917", "record_locator": "TQ8ZP2", "status": "confirmed", "charged": 142.0}),
    ], "Booked TAP TP1363 on April 4, 06:35 from Heathrow, arriving Lisbon 09:10, for Claire Dubois: EUR 142, "
       "booking BK-40917 (airline reference TQ8ZP2)."),
    _vtask("iata_retry", "travel", "Find me a business-class flight from Paris to New York on May 12.", [
        _call("search_flight_offers", {"origin": "Paris", "destination": "New York", "departure_date": "2025-05-12",
                                       "cabin": "business"},
              "Error: ValueError: origin and destination must be 3-letter IATA airport codes, e.g. 'CDG', 'JFK'",
              error=True),
        _call("search_flight_offers", {"origin": "CDG", "destination": "JFK", "departure_date": "2025-05-12",
                                       "cabin": "business"},
              {"offers": [{"offer_id": "OF-9CJ04", "airline": "Air France", "flight": "AF006", "departs": "10:30",
                           "arrives": "12:45", "stops": 0, "fare": 2890.0},
                          {"offer_id": "OF-9CJ11", "airline": "Delta", "flight": "DL263", "departs": "13:15",
                           "arrives": "15:40", "stops": 0, "fare": 2645.0}]}),
    ], "Two nonstop business fares Paris CDG to New York JFK on May 12: Delta DL263 at 13:15 for EUR 2,645, or "
       "Air France AF006 at 10:30 for EUR 2,890."),
    _vtask("madrid_rome_rules", "travel",
           "Does the 07:40 Iberia flight from Madrid to Rome on March 28 include a checked bag, and is it "
           "refundable?", [
        _call("search_flight_offers", {"origin": "MAD", "destination": "FCO", "departure_date": "2025-03-28"},
              {"offers": [{"offer_id": "OF-2MR08", "airline": "Iberia", "flight": "IB3230", "departs": "07:40",
                           "arrives": "10:05", "stops": 0, "fare": 96.0},
                          {"offer_id": "OF-2MR19", "airline": "ITA Airways", "flight": "AZ61", "departs": "09:55",
                           "arrives": "12:20", "stops": 0, "fare": 118.0}]}),
        _call("get_flight_offer_details", {"offer_id": "OF-2MR08"},
              {"offer_id": "OF-2MR08", "checked_bags": 0, "cabin_bag": "1 x 10 kg", "refundable": False,
               "change_fee": 70.0, "seat_selection": "paid"}),
    ], "No: Iberia IB3230 (07:40, EUR 96) includes only a 10 kg cabin bag, and the fare is non-refundable; "
       "changes cost EUR 70."),
    _vtask("berlin_hotel", "travel",
           "I need a hotel in Berlin from April 9 to 11 for Jonas Weber, under 150 euros a night and close to "
           "the centre.", [
        _call("search_hotel_stays", {"city": "Berlin", "check_in": "2025-04-09", "check_out": "2025-04-11",
                                     "max_nightly_rate": 150},
              {"stays": [{"stay_id": "ST-55120", "hotel": "Hotel Amano Mitte", "nightly_rate": 129.0,
                          "rating": 4.4, "distance_km": 0.8},
                         {"stay_id": "ST-55187", "hotel": "Motel One Alexanderplatz", "nightly_rate": 99.0,
                          "rating": 4.3, "distance_km": 1.4}]}),
        _call("reserve_hotel_stay", {"stay_id": "ST-55120", "guest_name": "Jonas Weber"},
              {"booking_id": "BK-41002", "status": "confirmed", "nights": 2, "total": 258.0}),
    ], "Booked Hotel Amano Mitte, 0.8 km from the centre, for Jonas Weber, April 9-11: 2 nights at EUR 129, "
       "EUR 258 in all (booking BK-41002)."),
    _vtask("cancel_rome_hotel", "travel", "Cancel my hotel in Rome and tell me how much I get back.", [
        _call("list_my_trips", {},
              {"bookings": [{"booking_id": "BK-39871", "type": "flight", "route": "MAD-FCO IB3230",
                             "dates": "2025-03-28", "status": "confirmed"},
                            {"booking_id": "BK-39880", "type": "hotel", "hotel": "Hotel Artemide, Rome",
                             "dates": "2025-03-28 to 2025-03-31", "status": "confirmed"}]}),
        _call("cancel_trip_booking", {"booking_id": "BK-39880"},
              {"booking_id": "BK-39880", "status": "cancelled", "refund": 312.0, "currency": "EUR"}),
    ], "Your Hotel Artemide stay (March 28-31) is cancelled; EUR 312 will be refunded to your card. The flight "
       "to Rome is still booked."),
    _vtask("april_trips", "travel",
           "Use list_my_trips to see what I have booked from April 1, then cancel the flight to Lisbon.", [
        _call("list_my_trips", {"from_date": "2025-04-01"},
              {"bookings": [{"booking_id": "BK-40917", "type": "flight", "route": "LHR-LIS TP1363",
                             "dates": "2025-04-04", "status": "confirmed"},
                            {"booking_id": "BK-41002", "type": "hotel", "hotel": "Hotel Amano Mitte, Berlin",
                             "dates": "2025-04-09 to 2025-04-11", "status": "confirmed"}]}),
        _call("cancel_trip_booking", {"booking_id": "BK-40917"},
              {"booking_id": "BK-40917", "status": "cancelled", "refund": 0.0, "travel_credit": 142.0,
               "currency": "EUR"}),
    ], "From April you had the Lisbon flight (April 4) and the Berlin hotel (April 9-11). The flight is "
       "cancelled: no cash refund on that fare, but EUR 142 of travel credit. The Berlin hotel stays booked."),
]

_SMART_HOME_TASKS = [
    _vtask("front_door", "smart_home", "Is the front door locked? If not, lock it.", [
        _call("list_home_devices", {"room": "hallway"},
              {"devices": [{"device_id": "dev_lock_01", "type": "lock", "name": "Front door", "room": "hallway"},
                           {"device_id": "dev_light_07", "type": "light", "name": "Hallway ceiling",
                            "room": "hallway"}]}),
        _call("get_device_status", {"device_id": "dev_lock_01"},
              {"device_id": "dev_lock_01", "locked": False, "battery": 64, "online": True}),
        _call("set_lock_state", {"device_id": "dev_lock_01", "locked": True},
              {"device_id": "dev_lock_01", "locked": True}),
    ], "It was unlocked; the front door is locked now. Its battery is at 64%."),
    _vtask("bedroom_21", "smart_home", "Make the bedroom 21 degrees.", [
        _call("list_home_devices", {"room": "bedroom"},
              {"devices": [{"device_id": "dev_thermo_02", "type": "thermostat", "name": "Bedroom thermostat",
                            "room": "bedroom"},
                           {"device_id": "dev_light_03", "type": "light", "name": "Bedside lamp",
                            "room": "bedroom"}]}),
        _call("set_thermostat_target", {"device_id": "dev_thermo_02", "target_c": 21, "mode": "heat"},
              {"device_id": "dev_thermo_02", "target_c": 21, "current_c": 18.5, "mode": "heat"}),
    ], "The bedroom thermostat is heating to 21 °C; it's 18.5 °C in there now."),
    _vtask("weekday_morning", "smart_home",
           "Set up a weekday routine at 6:45 that turns the kitchen pendant on at 60% and sets the living-room "
           "thermostat to 20.", [
        _call("list_home_devices", {},
              {"devices": [{"device_id": "dev_light_11", "type": "light", "name": "Kitchen pendant",
                            "room": "kitchen"},
                           {"device_id": "dev_thermo_01", "type": "thermostat", "name": "Living room thermostat",
                            "room": "living room"},
                           {"device_id": "dev_lock_01", "type": "lock", "name": "Front door", "room": "hallway"},
                           {"device_id": "dev_plug_09", "type": "plug", "name": "Garage heater", "room": "garage"}]}),
        _call("create_home_routine", {"name": "Weekday morning", "time": "06:45",
                                      "days": ["mon", "tue", "wed", "thu", "fri"],
                                      "actions": [{"device_id": "dev_light_11", "command": "set_brightness",
                                                   "value": 60},
                                                  {"device_id": "dev_thermo_01", "command": "set_temperature",
                                                   "value": 20}]},
              {"routine_id": "rt_3306", "status": "active", "next_run": "2025-03-12T06:45"}),
    ], "Done: 'Weekday morning' runs Monday to Friday at 06:45, putting the kitchen pendant on at 60% and the "
       "living room at 20 °C. First run tomorrow."),
    _vtask("garage_heater_energy", "smart_home",
           "Use get_energy_report to tell me how much the garage heater used this week.", [
        _call("list_home_devices", {"room": "garage"},
              {"devices": [{"device_id": "dev_plug_09", "type": "plug", "name": "Garage heater", "room": "garage"}]}),
        _call("get_energy_report", {"period": "week", "device_id": "dev_plug_09"},
              {"device_id": "dev_plug_09", "period": "week", "kwh": 38.4, "cost_estimate": 11.52,
               "currency": "EUR"}),
    ], "The garage heater used 38.4 kWh this week, about EUR 11.52."),
    _vtask("porch_light_retry", "smart_home", "Turn off the porch light.", [
        _call("list_home_devices", {"room": "porch"},
              {"devices": [{"device_id": "dev_light_21", "type": "light", "name": "Porch light", "room": "porch"}]}),
        _call("switch_light", {"device_id": "dev_light_21", "on": False},
              "Error: DeviceTimeout: dev_light_21 did not answer within 5 s; try again", error=True),
        _call("switch_light", {"device_id": "dev_light_21", "on": False}, {"device_id": "dev_light_21", "on": False}),
    ], "The porch light is off (it took a second try to reach it)."),
    _vtask("good_night", "smart_home", "Thanks, that's all for tonight!", [],
           "You're welcome, good night!"),
]

_ISSUE_TASKS = [
    _vtask("safari_blocker", "issues",
           "There's an issue about the checkout page crashing on Safari. Assign it to priya.s and tell her it "
           "blocks the 4.2 release.", [
        _call("search_tracker_issues", {"query": "checkout crash Safari"},
              {"hits": [{"issue_id": "WEB-1423", "title": "Checkout page crashes on Safari 17", "status": "open",
                         "assignee": None}]}),
        _call("assign_tracker_issue", {"issue_id": "WEB-1423", "assignee": "priya.s"},
              {"issue_id": "WEB-1423", "assignee": "priya.s"}),
        _call("comment_on_tracker_issue", {"issue_id": "WEB-1423",
                                           "body": "@priya.s this blocks the 4.2 release, please prioritise."},
              {"issue_id": "WEB-1423", "comment_id": "c_90211"}),
    ], "WEB-1423 (checkout crashes on Safari 17) is assigned to priya.s, with a comment that it blocks 4.2."),
    _vtask("android_push_bug", "issues",
           "Open a high-priority bug in the MOBILE project, 'Push notifications arrive twice on Android 14', and "
           "assign it to dev.marco.", [
        _call("open_tracker_issue", {"project": "MOBILE", "title": "Push notifications arrive twice on Android 14",
                                     "issue_type": "bug", "priority": "high"},
              {"issue_id": "MOBILE-877", "status": "open", "url": "https://tracker.example.com/MOBILE-877"}),
        _call("assign_tracker_issue", {"issue_id": "MOBILE-877", "assignee": "dev.marco"},
              {"issue_id": "MOBILE-877", "assignee": "dev.marco"}),
    ], "Opened MOBILE-877 'Push notifications arrive twice on Android 14' as a high-priority bug, assigned to "
       "dev.marco."),
    _vtask("sprint_todo", "issues",
           "What's still in To Do on the WEB sprint board, and what does the biggest unassigned item say?", [
        _call("list_sprint_board", {"project": "WEB"},
              {"sprint": "WEB Sprint 31", "columns": {
                  "to_do": [{"issue_id": "WEB-1450", "title": "Migrate search to the v2 API", "assignee": None,
                             "points": 8},
                            {"issue_id": "WEB-1447", "title": "Fix footer links", "assignee": None, "points": 1},
                            {"issue_id": "WEB-1439", "title": "Dark-mode toggle", "assignee": "lena.k",
                             "points": 3}],
                  "in_progress": [{"issue_id": "WEB-1423", "title": "Checkout page crashes on Safari 17",
                                   "assignee": "priya.s", "points": 5}]}}),
        _call("get_tracker_issue", {"issue_id": "WEB-1450"},
              {"issue_id": "WEB-1450", "title": "Migrate search to the v2 API", "status": "open",
               "priority": "medium", "reporter": "omar.h", "labels": ["backend", "tech-debt"],
               "description": "Search still calls /v1/search, deprecated on 30 April. Move to /v2/query and "
                              "update the result mapping.", "comments": []}),
    ], "To Do in WEB Sprint 31: WEB-1450 'Migrate search to the v2 API' (8 points, unassigned), WEB-1447 "
       "'Fix footer links' (1, unassigned) and WEB-1439 'Dark-mode toggle' (3, lena.k). WEB-1450 says search "
       "still calls /v1/search, deprecated on 30 April, and must move to /v2/query."),
    _vtask("close_duplicate", "issues",
           "WEB-1398 is a duplicate of WEB-1423. Close it with that resolution and leave a comment pointing to "
           "WEB-1423.", [
        _call("transition_tracker_issue", {"issue_id": "WEB-1398", "status": "done",
                                           "resolution": "Duplicate of WEB-1423"},
              {"issue_id": "WEB-1398", "status": "done", "resolution": "Duplicate of WEB-1423"}),
        _call("comment_on_tracker_issue", {"issue_id": "WEB-1398",
                                           "body": "Closing as a duplicate of WEB-1423; follow progress there."},
              {"issue_id": "WEB-1398", "comment_id": "c_90230"}),
    ], "WEB-1398 is closed as a duplicate of WEB-1423, with a comment pointing there."),
    _vtask("api_310", "issues",
           "Call get_tracker_issue for API-310 and, if nobody has it yet, assign it to me (lena.k).", [
        _call("get_tracker_issue", {"issue_id": "API-310"},
              {"issue_id": "API-310", "title": "Webhook retries ignore Retry-After", "status": "open",
               "priority": "high", "assignee": None, "reporter": "sam.t", "labels": ["webhooks"],
               "comments": [{"author": "sam.t", "body": "Seen with Stripe 429s."}]}),
        _call("assign_tracker_issue", {"issue_id": "API-310", "assignee": "lena.k"},
              {"issue_id": "API-310", "assignee": "lena.k"}),
    ], "API-310 'Webhook retries ignore Retry-After' (high priority) was unassigned; it's yours now."),
    _vtask("rate_limiter_review", "issues",
           "Move the issue about the rate limiter returning 500s to in review and note that the fix is in "
           "PR #482.", [
        _call("search_tracker_issues", {"query": "rate limiter 500"},
              {"hits": [{"issue_id": "API-298", "title": "Rate limiter returns 500 instead of 429",
                         "status": "in_progress", "assignee": "omar.h"}]}),
        _call("transition_tracker_issue", {"issue_id": "API-298", "status": "in_review"},
              {"issue_id": "API-298", "status": "in_review"}),
        _call("comment_on_tracker_issue", {"issue_id": "API-298", "body": "Fix is in PR #482."},
              {"issue_id": "API-298", "comment_id": "c_90244"}),
    ], "API-298 'Rate limiter returns 500 instead of 429' is in review now, with a comment linking PR #482."),
]

_BANKING_TASKS = [
    _vtask("savings_balance", "banking", "How much do I have in my savings account?", [
        _call("list_bank_accounts", {},
              {"accounts": [{"account_id": "ACC-1174", "type": "checking", "nickname": "Everyday", "last4": "0931"},
                            {"account_id": "ACC-2208", "type": "savings", "nickname": "Rainy day",
                             "last4": "5520"}]}),
        _call("get_account_balance", {"account_id": "ACC-2208"},
              {"account_id": "ACC-2208", "current": 8412.37, "available": 8412.37, "currency": "EUR"}),
    ], "Your 'Rainy day' savings account holds EUR 8,412.37."),
    _vtask("holiday_pot", "banking", "Move 500 from checking into my holiday savings.", [
        _call("list_bank_accounts", {},
              {"accounts": [{"account_id": "ACC-1174", "type": "checking", "nickname": "Everyday", "last4": "0931"},
                            {"account_id": "ACC-2208", "type": "savings", "nickname": "Rainy day", "last4": "5520"},
                            {"account_id": "ACC-3391", "type": "savings", "nickname": "Holiday", "last4": "7704"}]}),
        _call("transfer_between_accounts", {"from_account_id": "ACC-1174", "to_account_id": "ACC-3391",
                                            "amount": 500, "memo": "Holiday savings"},
              {"transfer_id": "TRF-66120", "status": "completed", "amount": 500.0}),
    ], "Moved EUR 500 from Everyday checking to your Holiday savings (transfer TRF-66120)."),
    _vtask("uber_duplicate", "banking",
           "Uber Eats charged my checking account twice on Saturday, March 8. Dispute the duplicate.", [
        _call("list_bank_accounts", {},
              {"accounts": [{"account_id": "ACC-1174", "type": "checking", "nickname": "Everyday", "last4": "0931"},
                            {"account_id": "ACC-2208", "type": "savings", "nickname": "Rainy day",
                             "last4": "5520"}]}),
        _call("list_account_transactions", {"account_id": "ACC-1174", "since": "2025-03-08", "merchant": "Uber Eats"},
              {"transactions": [{"transaction_id": "TX-88121", "date": "2025-03-08", "merchant": "Uber Eats",
                                 "amount": -27.4, "card_id": "CARD-2051"},
                                {"transaction_id": "TX-88120", "date": "2025-03-08", "merchant": "Uber Eats",
                                 "amount": -27.4, "card_id": "CARD-2051"}]}),
        _call("dispute_card_charge", {"transaction_id": "TX-88121", "reason": "duplicate",
                                      "details": "Charged twice for one order on 8 March; TX-88120 is the real one."},
              {"dispute_id": "DSP-4410", "status": "open", "provisional_credit": 27.4}),
    ], "Disputed the second EUR 27.40 Uber Eats charge of March 8 (dispute DSP-4410); EUR 27.40 is credited "
       "back provisionally while it's reviewed."),
    _vtask("lost_card", "banking", "I think I lost my credit card ending 4417. Freeze it.", [
        _call("list_payment_cards", {},
              {"cards": [{"card_id": "CARD-2051", "type": "debit", "last4": "0931", "status": "active"},
                         {"card_id": "CARD-7730", "type": "credit", "last4": "4417", "status": "active"}]}),
        _call("freeze_payment_card", {"card_id": "CARD-7730"},
              {"card_id": "CARD-7730", "status": "frozen"}),
    ], "Your credit card ending 4417 is frozen: new payments will be declined until you unfreeze it."),
    _vtask("concert_tickets", "banking",
           "Use dispute_card_charge on transaction TX-90215: I never received the concert tickets.", [
        _call("dispute_card_charge", {"transaction_id": "TX-90215", "reason": "not_received",
                                      "details": "Paid for concert tickets that never arrived."},
              {"dispute_id": "DSP-4417", "status": "open", "provisional_credit": 0.0,
               "expected_decision": "2025-04-08"}),
    ], "Dispute DSP-4417 is open for TX-90215 (tickets not received); expect a decision by April 8."),
    _vtask("apr_apy", "banking", "Quick question: what's the difference between APR and APY?", [],
           "APR is the yearly rate without compounding; APY includes compounding, so for the same rate APY is "
           "a little higher whenever interest compounds more than once a year."),
]

_HR_TASKS = [
    _vtask("tomas_leave", "hr", "How many days of annual leave does Tomás Herrera have left this year?", [
        _call("find_employee_record", {"query": "Tomás Herrera"},
              {"matches": [{"employee_id": "EMP-1186", "name": "Tomás Herrera", "title": "Data Engineer",
                            "department": "Analytics", "manager": "Sofia Marin"}]}),
        _call("get_leave_allowance", {"employee_id": "EMP-1186"},
              {"employee_id": "EMP-1186", "year": 2025, "annual": {"allowed": 25, "carried_over": 3, "taken": 6,
                                                                   "booked": 5, "remaining": 17},
               "sick": {"taken": 1}}),
    ], "Tomás Herrera has 17 days of annual leave left this year (25 plus 3 carried over; 6 taken, 5 booked)."),
    _vtask("aisha_holiday", "hr",
           "Book annual leave for Aisha Bello from April 14 to April 18, after checking she has enough days.", [
        _call("find_employee_record", {"query": "Aisha Bello"},
              {"matches": [{"employee_id": "EMP-0957", "name": "Aisha Bello", "title": "Product Designer",
                            "department": "Design", "manager": "Hugo Lind"}]}),
        _call("get_leave_allowance", {"employee_id": "EMP-0957"},
              {"employee_id": "EMP-0957", "year": 2025, "annual": {"allowed": 25, "carried_over": 0, "taken": 4,
                                                                   "booked": 0, "remaining": 21},
               "sick": {"taken": 0}}),
        _call("submit_leave_request", {"employee_id": "EMP-0957", "leave_type": "annual",
                                       "start_date": "2025-04-14", "end_date": "2025-04-18"},
              {"leave_request_id": "LR-30215", "days": 5, "status": "pending", "approver": "Hugo Lind"}),
    ], "Aisha had 21 days left, so I requested April 14-18 (5 days) as annual leave: LR-30215, waiting for "
       "Hugo Lind's approval."),
    _vtask("ben_net_pay", "hr", "What was Ben Carter's net pay in February?", [
        _call("find_employee_record", {"query": "Ben Carter"},
              {"matches": [{"employee_id": "EMP-1050", "name": "Ben Carter", "title": "Account Executive",
                            "department": "Sales", "manager": "Nadia Okafor"}]}),
        _call("get_payslip_summary", {"employee_id": "EMP-1050", "month": "2025-02"},
              {"employee_id": "EMP-1050", "month": "2025-02", "gross": 4850.0, "tax": 1032.5, "pension": 242.5,
               "net": 3575.0, "pay_date": "2025-02-28", "currency": "GBP"}),
    ], "Ben Carter's February net pay was GBP 3,575 (gross 4,850, less 1,032.50 tax and 242.50 pension), paid "
       "on 28 February."),
    _vtask("grace_address", "hr", "Grace Liu has moved to 14 Elm Road, Bristol, BS6 5AB. Update her record.", [
        _call("find_employee_record", {"query": "Grace Liu"},
              {"matches": [{"employee_id": "EMP-1402", "name": "Grace Liu", "title": "Support Lead",
                            "department": "Customer Success", "manager": "Nadia Okafor"}]}),
        _call("update_home_address", {"employee_id": "EMP-1402", "street": "14 Elm Road", "city": "Bristol",
                                      "postcode": "BS6 5AB"},
              {"employee_id": "EMP-1402", "status": "updated", "effective": "2025-03-11"}),
    ], "Grace Liu's home address is now 14 Elm Road, Bristol, BS6 5AB."),
    _vtask("sofia_team", "hr",
           "Who reports to Sofia Marin, and how much annual leave does her newest report have left?", [
        _call("find_employee_record", {"query": "Sofia Marin"},
              {"matches": [{"employee_id": "EMP-0412", "name": "Sofia Marin", "title": "Head of Analytics",
                            "department": "Analytics", "manager": "Priyanka Rao"}]}),
        _call("list_direct_reports", {"manager_id": "EMP-0412"},
              {"reports": [{"employee_id": "EMP-1186", "name": "Tomás Herrera", "title": "Data Engineer",
                            "start_date": "2022-06-01"},
                           {"employee_id": "EMP-1733", "name": "Ola Nowak", "title": "Analyst",
                            "start_date": "2025-01-13"}]}),
        _call("get_leave_allowance", {"employee_id": "EMP-1733"},
              {"employee_id": "EMP-1733", "year": 2025, "annual": {"allowed": 23, "carried_over": 0, "taken": 0,
                                                                   "booked": 2, "remaining": 21},
               "sick": {"taken": 0}}),
    ], "Tomás Herrera and Ola Nowak report to Sofia Marin. Ola, who joined on 13 January, has 21 days of annual "
       "leave left (2 already booked)."),
    _vtask("plant_name", "hr", "Our team got a new office plant. Any fun name ideas?", [],
           "How about Fern Gully, Leaf Erickson or Photosynthia?"),
]

VALIDATION_TASKS: tuple[Episode, ...] = (*_TRAVEL_TASKS, *_SMART_HOME_TASKS, *_ISSUE_TASKS, *_BANKING_TASKS,
                                         *_HR_TASKS)
"""The validation tasks, gold paths included; ``metadata["toolset"]`` names each one's toolset."""


# --------------------------------------------------------------------------- first requests


def _first(toolset: str, number: int, request: str, tool: str | None, arguments: dict[str, Any] | None = None,
           answer: str = "") -> Episode:
    """Return a one-decision item: ``request``'s first step over ``toolset``, ``tool`` or (``None``) a reply."""
    step = (Step(kind="assistant", content=answer) if tool is None
            else Step(kind="tool_call", tool=tool, arguments=arguments or {}))
    return Episode(id=f"zero_shot_validation_first_{toolset}_{number}", task=request,
                   tools=list(VALIDATION_TOOLSETS[toolset]), steps=[step], final_answer=answer,
                   metadata={"suite": "zero_shot_validation_first", "toolset": toolset})


_NO_TOOL = "No tool here does that; I can only help with what these tools cover."

_FIRST_REQUESTS = [
    _first("travel", 1, "Any direct flights from Dublin to Boston on Thursday, March 20?", "search_flight_offers",
           {"origin": "DUB", "destination": "BOS", "departure_date": "2025-03-20", "max_stops": 0}),
    _first("travel", 2, "Would I get anything back if I drop the Amsterdam trip?", "list_my_trips"),
    _first("travel", 3, "What have I got coming up in May, travel-wise?", "list_my_trips", {"from_date": "2025-05-01"}),
    _first("travel", 4, "Somewhere to sleep in Porto on June 3 and 4, nothing over 90 a night.", "search_hotel_stays",
           {"city": "Porto", "check_in": "2025-06-03", "check_out": "2025-06-05", "max_nightly_rate": 90}),
    _first("travel", 5, "How much luggage comes with offer OF-5521?", "get_flight_offer_details",
           {"offer_id": "OF-5521"}),
    _first("travel", 6, "Get Nora Lund on the first morning departure from Oslo to Copenhagen on April 2.",
           "search_flight_offers", {"origin": "OSL", "destination": "CPH", "departure_date": "2025-04-02"}),
    _first("travel", 7, "Scrap booking BK-44120, our plans changed.", "cancel_trip_booking",
           {"booking_id": "BK-44120"}),
    _first("travel", 8, "Do Canadians need a visa for a two-week holiday in Japan?", None,
           answer="No: Canadians can visit Japan visa-free for up to 90 days."),
    _first("travel", 9, "Cheers, that sorts it.", None, answer="Glad to help. Have a good trip!"),
    _first("travel", 10, "Could you order me a taxi to the airport for 6am?", None, answer=_NO_TOOL),
    _first("smart_home", 1, "It's freezing in the study, bump it up to 22.", "list_home_devices", {"room": "study"}),
    _first("smart_home", 2, "Did I leave the garage lights on?", "list_home_devices", {"room": "garage"}),
    _first("smart_home", 3, "How much electricity did the house use last month?", "get_energy_report",
           {"period": "month"}),
    _first("smart_home", 4, "Is device th-204 online?", "get_device_status", {"device_id": "th-204"}),
    _first("smart_home", 5, "Please lock lock-07.", "set_lock_state", {"device_id": "lock-07", "locked": True}),
    _first("smart_home", 6, "What's the battery like on the back door lock?", "list_home_devices"),
    _first("smart_home", 7, "Kill every light downstairs.", "list_home_devices"),
    _first("smart_home", 8, "What's a good bedroom temperature for sleeping?", None,
           answer="Around 16-19 °C suits most people."),
    _first("smart_home", 9, "Goodnight!", None, answer="Goodnight!"),
    _first("smart_home", 10, "Can you order more light bulbs?", None, answer=_NO_TOOL),
    _first("issues", 1, "Anything open about login timeouts?", "search_tracker_issues",
           {"query": "login timeout", "status": "open"}),
    _first("issues", 2, "Where are we with MOB-88?", "get_tracker_issue", {"issue_id": "MOB-88"}),
    _first("issues", 3, "File a bug in WEB: the search box ignores accents.", "open_tracker_issue",
           {"project": "WEB", "title": "Search box ignores accents", "issue_type": "bug"}),
    _first("issues", 4, "Give API-512 to marco.r.", "assign_tracker_issue",
           {"issue_id": "API-512", "assignee": "marco.r"}),
    _first("issues", 5, "WEB-1502 is finished, mark it done.", "transition_tracker_issue",
           {"issue_id": "WEB-1502", "status": "done"}),
    _first("issues", 6, "Who's working on what in the MOBILE sprint?", "list_sprint_board", {"project": "MOBILE"}),
    _first("issues", 7, "The dark-mode ticket: can you push it to in progress?", "search_tracker_issues",
           {"query": "dark mode"}),
    _first("issues", 8, "What's the difference between a story and a task in scrum?", None,
           answer="A story is a user-facing piece of value; a task is a piece of work that delivers part of one."),
    _first("issues", 9, "ok thanks!", None, answer="You're welcome!"),
    _first("issues", 10, "Schedule a retro for Friday afternoon.", None, answer=_NO_TOOL),
    _first("banking", 1, "What's left in my current account?", "list_bank_accounts"),
    _first("banking", 2, "Put 200 into savings from checking.", "list_bank_accounts"),
    _first("banking", 3, "Did Netflix take money from my checking this month?", "list_bank_accounts"),
    _first("banking", 4, "My debit card was stolen, block it now.", "list_payment_cards"),
    _first("banking", 5, "Dispute transaction TX-55102, I was charged twice.", "dispute_card_charge",
           {"transaction_id": "TX-55102", "reason": "duplicate"}),
    _first("banking", 6, "Balance on account ACC-2231?", "get_account_balance", {"account_id": "ACC-2231"}),
    _first("banking", 7, "Which cards do I have?", "list_payment_cards"),
    _first("banking", 8, "Should I pay off my credit card before saving?", None,
           answer="Usually yes: card interest is far higher than savings interest."),
    _first("banking", 9, "Thank you so much!", None, answer="You're welcome!"),
    _first("banking", 10, "Apply for a mortgage for me.", None, answer=_NO_TOOL),
    _first("hr", 1, "How many sick days has Lena Fischer taken this year?", "find_employee_record",
           {"query": "Lena Fischer"}),
    _first("hr", 2, "Who's on Omar Haddad's team?", "find_employee_record", {"query": "Omar Haddad"}),
    _first("hr", 3, "Employee EMP-1042 moved to 3 Quay Street, Galway, H91 X2C4.", "update_home_address",
           {"employee_id": "EMP-1042", "street": "3 Quay Street", "city": "Galway", "postcode": "H91 X2C4"}),
    _first("hr", 4, "Payslip for EMP-2210 for March 2025?", "get_payslip_summary",
           {"employee_id": "EMP-2210", "month": "2025-03"}),
    _first("hr", 5, "Put in sick leave for EMP-1187 on May 5 and 6.", "submit_leave_request",
           {"employee_id": "EMP-1187", "leave_type": "sick", "start_date": "2025-05-05", "end_date": "2025-05-06"}),
    _first("hr", 6, "What's Priya Nair's job title?", "find_employee_record", {"query": "Priya Nair"}),
    _first("hr", 7, "Which people report to manager EMP-0900?", "list_direct_reports", {"manager_id": "EMP-0900"}),
    _first("hr", 8, "What's the statutory minimum holiday in the UK?", None,
           answer="28 days a year for a full-time worker, bank holidays included."),
    _first("hr", 9, "Great, that's all.", None, answer="Glad to help!"),
    _first("hr", 10, "Post a job ad for a data engineer.", None, answer=_NO_TOOL),
]

VALIDATION_FIRST_REQUESTS: tuple[Episode, ...] = tuple(_FIRST_REQUESTS)
"""One decision each over the validation toolsets: a request's first step, a tool or a reply (no tool fits).

Whether a request is for these tools at all is decided at a turn's first decision; the 30
tasks test it on three requests. These 50, ten per toolset (seven for a tool, three answered at
once: small talk, a general question of the toolset's field, an ask no tool covers), test it on
more, phrased as users write, often with few of the tools' words; the gold tool is the one the
tasks' paths would start with (the lookup that gives a missing id first). Score them with
``evaluate_zero_shot(policy, VALIDATION_FIRST_REQUESTS)``: each item is one decision.
"""
