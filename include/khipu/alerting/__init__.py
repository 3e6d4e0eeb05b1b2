"""Alerts: what is worth telling on-call (transitions, offset windows, task failures), and delivery."""
