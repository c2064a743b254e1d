"""The shipped default after a lookup whose result does not spell the identifier out.

A user's ``find_customer`` may answer ``{"id": "C-1042"}``, not ``{"customer_id": ...}``. The
lookup gave ``list_orders`` its ``customer_id`` all the same: the default must list the orders
next, not answer (it did, at p = 0.58, while the id looked missing) nor look the customer up again
by another route.
"""

from __future__ import annotations

from evoharness_agent.demo import SHIPPED_POLICY
from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.policy import ToolPolicy
from evoharness_agent.schema import FINISH, Step, ToolSpec


def _tool(name: str, description: str, argument: str) -> ToolSpec:
    return ToolSpec(name=name, description=description,
                    parameters={"type": "object", "properties": {argument: {"type": "string"}}, "required": [argument]})


TOOLS = [_tool("find_customer", "Look up customers by name.", "name"),
         _tool("find_customer_by_email", "Look up a customer by e-mail address.", "email"),
         _tool("list_orders", "List a customer's orders, newest first.", "customer_id")]


def test_the_default_lists_the_orders_after_the_lookup_whatever_its_result_calls_the_id(
        default_encoder: StateEncoder) -> None:
    policy = ToolPolicy.load(SHIPPED_POLICY, encoder=default_encoder, device="cpu")
    request = "Show me Ann Lee's latest orders."
    assert policy.rank(request, [], TOOLS)[0].tool in {"find_customer", "find_customer_by_email"}  # a lookup first
    for observation in ('[{"id": "C-1042", "name": "Ann Lee", "email": "ann@example.com"}]', ""):
        found = Step(tool="find_customer", arguments={"name": "Ann Lee"}, observation=observation)
        ranking = policy.rank(request, [found], TOOLS)
        assert ranking[0].tool == "list_orders", ranking
        listed = Step(tool="list_orders", arguments={"customer_id": "C-1042"}, observation='[{"order": "W1"}]')
        assert policy.rank(request, [found, listed], TOOLS)[0].tool == FINISH
