"""The demo pipeline: a traced producer -> processor -> fan-out sinks, with injected faults and a
ground-truth ledger that tests, benchmarks and the detector are scored against."""
