"""The real local model with a small context: long tool results are cut to fit, an overflow is retried.

Needs the `local` extra (xllamacpp and the pinned weight-chunk packages); skipped without it.
"""

from __future__ import annotations

import importlib.util

import pytest
from langchain_core.tools import tool

from evoharness_agent.agents.llm_calls import build_messages, fill_arguments
from evoharness_agent.local_llm import MODELS, LocalChatModel

MODEL = "qwen2.5-coder-0.5b"
_MISSING = [m for m in ("xllamacpp", *MODELS[MODEL].chunk_modules) if importlib.util.find_spec(m) is None]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(_MISSING), reason=f"the `local` extra is not installed (missing {_MISSING})"),
]


@tool
def get_order(order_id: str) -> str:
    """Look up an order by its id (like "O-1042")."""
    return "{}"


def _results(n: int) -> list[tuple[str, object, object]]:
    record = ("customer Jane Doe, address 12 Long Street, Springfield; items: kettle, toaster, "
              "two mugs, a teapot; shipped by ground freight, tracking pending; notes: leave at door. ")
    return [("get_order", {"order_id": f"O-{1000 + i}"}, f"order O-{1000 + i}: " + record * 4) for i in range(n)]


def test_long_results_are_cut_to_fit_a_small_context() -> None:
    model = LocalChatModel.from_pretrained(MODEL, n_ctx=1024, max_tokens=48)
    messages = build_messages("Look up order O-1042 for me.", _results(12))  # ~2,500 tokens of results
    model._chars_per_token = 12.0  # a guess far off: llama.cpp refuses the first prompt, and it is fit again
    filled = fill_arguments(model, get_order, messages)
    assert filled.error is None and filled.arguments["order_id"].startswith("O-")
    assert model._chars_per_token < 6.0  # learned from the count llama.cpp reported
    again = fill_arguments(model, get_order, messages)  # fit up front this time
    assert again.error is None
    model.close()
