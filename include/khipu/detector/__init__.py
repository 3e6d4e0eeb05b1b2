"""The detector: per-message verdicts from traces, routes and committed offsets (Inca's central idea)."""
