"""Measuring a policy: offline next-tool metrics, baseline counts, choosers, online rollouts and collection, reports."""
