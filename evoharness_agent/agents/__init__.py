"""LangChain agents driven by the policy: the executor, the v1 middleware, guardrails and the LLM calls."""
