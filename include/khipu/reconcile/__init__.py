"""Final verdicts: late evidence, reconciliation of a window of the trace archive, backfill."""
