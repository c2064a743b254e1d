"""Environments whose rollouts are episodes: the ToolUseEnv base, BFCL, tau-bench airline, the registry."""
