"""Resending confirmed losses: what, from where, to where (plan), exactly once (the ledger)."""
