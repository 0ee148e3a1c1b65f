"""Decisions without Ray: plans and re-plans, stragglers, checkpoint cadence, recovery policy."""
