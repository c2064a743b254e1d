"""tau-bench airline tasks as executable environments over the airline JSON database.

:class:`TauAirlineEnvironment` turns one bundled tau-bench airline task (an ``Episode`` of
``evoharness_agent/data/tau_bench/airline_test.jsonl.gz``: the instruction, then the gold calls as replayed by
tau-bench) into a :class:`~evoharness_agent.envs.base.ToolUseEnv`:

* the database is tau-bench's airline DB (``evoharness_agent/data/tau_bench/db/airline/{flights,reservations,
  users}.json.gz``, MIT), fresh for every reset;
* the 14 tools are written here after tau-bench's airline tools (sierra-research/tau-bench
  @59a200c, MIT), with the schemas of ``airline_tools.json`` (the episode's ``tools``); they
  return strings, ``"Error: ..."`` on failure, as tau-bench's do;
* success is tau-bench's state check: once the agent FINISHes, the database equals the one
  obtained by replaying the gold calls on a fresh copy. tau-bench compares
  :func:`db_hash` (its ``get_data_hash``); this env compares the data itself, which is
  equivalent (up to ``1 == 1.0``) and 50 times faster. Tasks that only read (20 of 50)
  succeed unless the agent changes the database; ``check_results=True`` also asks, as BFCL
  does, that every gold call's result appears among the agent's observations.

The task is one turn (the instruction is given in full; no user simulator), so FINISH ends it.
"""

from __future__ import annotations

import ast
import copy
import gzip
import json
import operator
from collections.abc import Callable
from functools import cache
from hashlib import sha256
from typing import Any

from langchain_core.tools import StructuredTool

from evoharness_agent.envs.base import RewardFn, Task, ToolAction, ToolUseEnv
from evoharness_agent.envs.bfcl import BFCLEnvironment
from evoharness_agent.logs.bundled import data_dir
from evoharness_agent.schema import Episode

__all__ = [
    "AIRLINE_TABLES",
    "TauAirlineEnvironment",
    "airline_functions",
    "db_hash",
    "load_airline_db",
    "tau_airline_split",
]

AIRLINE_TABLES = ("flights", "reservations", "users")
_SLACK = 10  # decisions allowed beyond the gold calls


@cache
def _pristine_db() -> str:
    """Return the bundled database as JSON text, read once (each env copies it by parsing)."""
    tables = {}
    for table in AIRLINE_TABLES:
        with gzip.open(data_dir() / "tau_bench" / "db" / "airline" / f"{table}.json.gz", "rt",
                       encoding="utf-8") as handle:
            tables[table] = json.load(handle)
    return json.dumps(tables)


def load_airline_db() -> dict[str, Any]:
    """Return a fresh copy of tau-bench's airline database: ``{"flights", "reservations", "users"}``."""
    return json.loads(_pristine_db())


def _hashable(item: Any) -> Any:
    """tau-bench's ``to_hashable``: dicts as sorted (key, value) tuples, lists as tuples."""
    if isinstance(item, dict):
        return tuple((key, _hashable(value)) for key, value in sorted(item.items()))
    if isinstance(item, list):
        return tuple(_hashable(value) for value in item)
    return item


def db_hash(data: dict[str, Any]) -> str:
    """Hash a database as tau-bench does (``consistent_hash(to_hashable(data))``)."""
    return sha256(str(_hashable(data)).encode("utf-8")).hexdigest()


# ---------------------------------------------------------------------------- the tools

_AIRPORTS = {"SFO": "San Francisco", "JFK": "New York", "LAX": "Los Angeles", "ORD": "Chicago", "DFW": "Dallas",
             "DEN": "Denver", "SEA": "Seattle", "ATL": "Atlanta", "MIA": "Miami", "BOS": "Boston",
             "PHX": "Phoenix", "IAH": "Houston", "LAS": "Las Vegas", "MCO": "Orlando", "EWR": "Newark",
             "CLT": "Charlotte", "MSP": "Minneapolis", "DTW": "Detroit", "PHL": "Philadelphia",
             "LGA": "LaGuardia"}
_OPERATORS: dict[type, Callable[..., float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.UAdd: operator.pos, ast.USub: operator.neg}


def _arithmetic(node: ast.AST) -> float:
    """Evaluate +, -, *, / and parentheses over numbers (tau-bench uses a restricted eval)."""
    if isinstance(node, ast.Expression):
        return _arithmetic(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_arithmetic(node.left), _arithmetic(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_arithmetic(node.operand))
    raise ValueError("unsupported expression")


def _price_flights(data: dict[str, Any], flights: list[dict[str, Any]], cabin: str,
                   passengers: int) -> str | None:
    """Add price, origin and destination to each new flight segment, or return the error."""
    for flight in flights:
        number = flight["flight_number"]
        if number not in data["flights"]:
            return f"Error: flight {number} not found"
        flight_data = data["flights"][number]
        if flight["date"] not in flight_data["dates"]:
            return f"Error: flight {number} not found on date {flight['date']}"
        on_date = flight_data["dates"][flight["date"]]
        if on_date["status"] != "available":
            return f"Error: flight {number} not available on date {flight['date']}"
        if on_date["available_seats"][cabin] < passengers:
            return f"Error: not enough seats on flight {number}"
        flight["price"] = on_date["prices"][cabin]
        flight["origin"] = flight_data["origin"]
        flight["destination"] = flight_data["destination"]
    return None


def _payment_error(data: dict[str, Any], reservation: dict[str, Any], payment_id: str, total: float) -> str | None:
    """Why an update cannot be paid with ``payment_id`` (certificates are refused), or None."""
    methods = data["users"][reservation["user_id"]]["payment_methods"]
    if payment_id not in methods:
        return "Error: payment method not found"
    method = methods[payment_id]
    if method["source"] == "certificate":
        return "Error: certificate cannot be used to update reservation"
    if method["source"] == "gift_card" and method["amount"] < total:
        return "Error: gift card balance is not enough"
    return None


def _pay(data: dict[str, Any], reservation: dict[str, Any], payment_id: str, total: float) -> None:
    """Deduct a gift card's balance and record a non-zero payment on the reservation."""
    method = data["users"][reservation["user_id"]]["payment_methods"][payment_id]
    if method["source"] == "gift_card":
        method["amount"] -= total
    if total != 0:
        reservation["payment_history"].append({"payment_id": payment_id, "amount": total})


def airline_functions(data: dict[str, Any]) -> dict[str, Callable[..., str]]:
    """Return the 14 airline tools acting on ``data`` (mutated in place), by name."""

    def book_reservation(user_id: str, origin: str, destination: str, flight_type: str, cabin: str,
                         flights: list[dict[str, Any]], passengers: list[dict[str, Any]],
                         payment_methods: list[dict[str, Any]], total_baggages: int, nonfree_baggages: int,
                         insurance: str) -> str:
        reservations, users = data["reservations"], data["users"]
        if user_id not in users:
            return "Error: user not found"
        user = users[user_id]
        # As tau-bench: a task books at most three reservations, with these ids.
        reservation_id = next((rid for rid in ("HATHAT", "HATHAU") if rid not in reservations), "HATHAV")
        reservation: dict[str, Any] = {
            "reservation_id": reservation_id, "user_id": user_id, "origin": origin, "destination": destination,
            "flight_type": flight_type, "cabin": cabin, "flights": copy.deepcopy(flights),
            "passengers": passengers, "payment_history": payment_methods, "created_at": "2024-05-15T15:00:00",
            "total_baggages": total_baggages, "nonfree_baggages": nonfree_baggages, "insurance": insurance}
        error = _price_flights(data, reservation["flights"], cabin, len(passengers))
        if error:
            return error
        total = sum(flight["price"] * len(passengers) for flight in reservation["flights"])
        total += 30 * len(passengers) if insurance == "yes" else 0
        total += 50 * nonfree_baggages
        for payment in payment_methods:
            payment_id = payment["payment_id"]
            if payment_id not in user["payment_methods"]:
                return f"Error: payment method {payment_id} not found"
            method = user["payment_methods"][payment_id]
            if method["source"] in ("gift_card", "certificate") and method["amount"] < payment["amount"]:
                return f"Error: not enough balance in payment method {payment_id}"
        paid = sum(payment["amount"] for payment in payment_methods)
        if paid != total:
            return f"Error: payment amount does not add up, total price is {total}, but paid {paid}"
        for payment in payment_methods:
            method = user["payment_methods"][payment["payment_id"]]
            if method["source"] == "gift_card":
                method["amount"] -= payment["amount"]
            elif method["source"] == "certificate":
                del user["payment_methods"][payment["payment_id"]]
        reservations[reservation_id] = reservation
        user["reservations"].append(reservation_id)
        return json.dumps(reservation)

    def calculate(expression: str) -> str:
        if not all(char in "0123456789+-*/(). " for char in expression):
            return "Error: invalid characters in expression"
        try:
            return str(round(float(_arithmetic(ast.parse(expression, mode="eval"))), 2))
        except (SyntaxError, ValueError, ZeroDivisionError) as error:
            return f"Error: {error}"

    def cancel_reservation(reservation_id: str) -> str:
        if reservation_id not in data["reservations"]:
            return "Error: reservation not found"
        reservation = data["reservations"][reservation_id]
        refunds = [{"payment_id": p["payment_id"], "amount": -p["amount"]} for p in reservation["payment_history"]]
        reservation["payment_history"].extend(refunds)
        reservation["status"] = "cancelled"
        return json.dumps(reservation)

    def get_reservation_details(reservation_id: str) -> str:
        if reservation_id in data["reservations"]:
            return json.dumps(data["reservations"][reservation_id])
        return "Error: user not found"  # sic: tau-bench's message

    def get_user_details(user_id: str) -> str:
        if user_id in data["users"]:
            return json.dumps(data["users"][user_id])
        return "Error: user not found"

    def list_all_airports() -> str:
        return json.dumps(_AIRPORTS)

    def search_direct_flight(origin: str, destination: str, date: str) -> str:
        results = []
        for flight in data["flights"].values():
            if flight["origin"] == origin and flight["destination"] == destination and date in flight["dates"] \
                    and flight["dates"][date]["status"] == "available":
                results.append({key: value for key, value in flight.items() if key != "dates"})
                results[-1].update(flight["dates"][date])
        return json.dumps(results)

    def search_onestop_flight(origin: str, destination: str, date: str) -> str:
        results = []
        for first in data["flights"].values():
            if first["origin"] != origin:
                continue
            for second in data["flights"].values():
                if second["destination"] != destination or first["destination"] != second["origin"]:
                    continue
                date2 = f"2024-05-{int(date[-2:]) + 1}" if "+1" in first["scheduled_arrival_time_est"] else date
                if first["scheduled_arrival_time_est"] > second["scheduled_departure_time_est"]:
                    continue
                if date in first["dates"] and date2 in second["dates"] \
                        and first["dates"][date]["status"] == "available" \
                        and second["dates"][date2]["status"] == "available":
                    leg1 = {key: value for key, value in first.items() if key != "dates"}
                    leg1.update(first["dates"][date])
                    leg1["date"] = date
                    leg2 = {key: value for key, value in second.items() if key != "dates"}
                    leg2.update(second["dates"][date])  # sic: tau-bench reads the first leg's date here
                    leg2["date"] = date2
                    results.append([leg1, leg2])
        return json.dumps(results)

    def send_certificate(user_id: str, amount: float) -> str:
        if user_id not in data["users"]:
            return "Error: user not found"
        methods = data["users"][user_id]["payment_methods"]
        for number in (3221322, 3221323, 3221324):
            payment_id = f"certificate_{number}"
            if payment_id not in methods:
                methods[payment_id] = {"source": "certificate", "amount": amount, "id": payment_id}
                return f"Certificate {payment_id} added to user {user_id} with amount {amount}."
        return "Error: too many certificates"

    def think(thought: str) -> str:
        return ""

    def transfer_to_human_agents(summary: str) -> str:
        return "Transfer successful"

    def update_reservation_baggages(reservation_id: str, total_baggages: int, nonfree_baggages: int,
                                    payment_id: str) -> str:
        if reservation_id not in data["reservations"]:
            return "Error: reservation not found"
        reservation = data["reservations"][reservation_id]
        total = 50 * max(0, nonfree_baggages - reservation["nonfree_baggages"])
        error = _payment_error(data, reservation, payment_id, total)
        if error:
            return error
        reservation["total_baggages"] = total_baggages
        reservation["nonfree_baggages"] = nonfree_baggages
        _pay(data, reservation, payment_id, total)
        return json.dumps(reservation)

    def update_reservation_flights(reservation_id: str, cabin: str, flights: list[dict[str, Any]],
                                   payment_id: str) -> str:
        if reservation_id not in data["reservations"]:
            return "Error: reservation not found"
        reservation = data["reservations"][reservation_id]
        passengers = len(reservation["passengers"])
        flights = copy.deepcopy(flights)
        new = []
        for flight in flights:
            kept = [old for old in reservation["flights"] if old["flight_number"] == flight["flight_number"]
                    and old["date"] == flight["date"] and cabin == reservation["cabin"]]
            if kept:  # an unchanged segment keeps its price
                flight.update(price=kept[0]["price"], origin=kept[0]["origin"], destination=kept[0]["destination"])
            else:
                new.append(flight)
        error = _price_flights(data, new, cabin, passengers)
        if error:
            return error
        total = (sum(flight["price"] for flight in flights)
                 - sum(flight["price"] for flight in reservation["flights"])) * passengers
        error = _payment_error(data, reservation, payment_id, total)
        if error:
            return error
        _pay(data, reservation, payment_id, total)
        # sic: tau-bench v1 keeps the reservation's old cabin (the gold final states rely on it).
        reservation["flights"] = flights
        return json.dumps(reservation)

    def update_reservation_passengers(reservation_id: str, passengers: list[dict[str, Any]]) -> str:
        if reservation_id not in data["reservations"]:
            return "Error: reservation not found"
        reservation = data["reservations"][reservation_id]
        if len(passengers) != len(reservation["passengers"]):
            return "Error: number of passengers does not match"
        reservation["passengers"] = passengers
        return json.dumps(reservation)

    functions: list[Callable[..., str]] = [
        book_reservation, calculate, cancel_reservation, get_reservation_details, get_user_details,
        list_all_airports, search_direct_flight, search_onestop_flight, send_certificate, think,
        transfer_to_human_agents, update_reservation_baggages, update_reservation_flights,
        update_reservation_passengers]
    return {function.__name__: function for function in functions}


def _is_error(output: Any) -> bool:
    """tau-bench tools report failures as ``"Error: ..."`` strings."""
    return isinstance(output, str) and output.startswith("Error:")


class TauAirlineEnvironment(ToolUseEnv):
    """One tau-bench airline task as a :class:`~evoharness_agent.envs.base.ToolUseEnv` (see the module docstring)."""

    def __init__(self, episode: Episode, *, max_steps: int | None = None, reward_fn: RewardFn | None = None,
                 check_results: bool = False) -> None:
        # max_steps=1 is a placeholder: _load sets the budget, which depends on the task.
        super().__init__([], success_fn=self._check, reward_fn=reward_fn, max_steps=1, is_error=_is_error)
        self.check_results = check_results
        self._steps_override = max_steps
        self.data: dict[str, Any] = {}
        self._load(episode)

    # The gold-argument rule of BFCL applies unchanged: the k-th call of a tool in the turn
    # gets the arguments of the turn's k-th gold call of that tool.
    gold_action = BFCLEnvironment.gold_action
    gold_actions = BFCLEnvironment.gold_actions

    def _load(self, episode: Episode) -> None:
        """Read the task: its tools' schemas and its gold calls (one turn)."""
        self.episode = episode
        self.specs = list(episode.tools)
        self.gold: list[list[ToolAction]] = [[ToolAction(step.tool, copy.deepcopy(step.arguments))
                                              for step in episode.steps if step.kind == "tool_call" and step.tool]]
        self.default_task = Task(turns=[episode.task], id=episode.id, metadata=copy.deepcopy(episode.metadata))
        self.max_steps = self._steps_override or len(self.gold[0]) + _SLACK
        self._gold_state: tuple[dict[str, Any], list[str]] | None = None

    def reset(self, task: Task | Episode | str | None = None) -> Any:
        """Restart the task (or switch to another airline ``Episode``) on a fresh database."""
        if isinstance(task, Episode):
            self._load(task)
        elif task is not None:
            raise TypeError("a tau-bench airline environment is reset with an airline Episode (or nothing)")
        self.data = load_airline_db()
        functions = airline_functions(self.data)
        self.tools = {spec.name: StructuredTool(name=spec.name, description=spec.description,
                                                args_schema=spec.parameters, func=functions[spec.name])
                      for spec in self.specs if spec.name in functions}
        return super().reset()

    def tool_specs(self) -> list[Any]:
        """Return the task's tool schemas as given (tau-bench's ``airline_tools.json``)."""
        return [spec.model_copy(deep=True) for spec in self.specs]

    def gold_state(self) -> tuple[dict[str, Any], list[str]]:
        """Replay the gold calls on a fresh database; return it and the calls' results (cached)."""
        if self._gold_state is None:
            data = load_airline_db()
            functions = airline_functions(data)
            results = []
            for action in self.gold[0]:
                try:
                    results.append(functions[action.tool](**copy.deepcopy(action.arguments)))
                except Exception as error:  # a failing gold call is recorded like a tool error
                    results.append(f"Error: {error}")
            self._gold_state = (data, results)
        return self._gold_state

    def _check(self, env: ToolUseEnv, turn: int) -> bool:
        """Judge the task: the database equals the gold one (with ``check_results``: all gold results seen)."""
        gold_data, gold_results = self.gold_state()
        if self.data != gold_data:
            return False
        seen = {step.observation for step in self.steps if step.kind == "tool_call"}
        return not self.check_results or all(result in seen for result in gold_results)


def tau_airline_split(episodes: list[Episode], n_test: int = 10) -> tuple[list[Episode], list[Episode]]:
    """Split airline test tasks into (train, test) by task index: the last ``n_test`` are test."""
    # The same cut as datasets.gpt4o_airline_split (tasks 40-49 held out for 50 tasks).
    indices = sorted(int(episode.metadata["task_index"]) for episode in episodes)
    cut = indices[-n_test] if 0 < n_test <= len(indices) else max(indices, default=0) + 1
    train = [episode for episode in episodes if int(episode.metadata["task_index"]) < cut]
    test = [episode for episode in episodes if int(episode.metadata["task_index"]) >= cut]
    return train, test
