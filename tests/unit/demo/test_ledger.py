"""Folding ledger events into the truth per (message, hop)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from khipu.demo.ledger import LedgerError, LedgerWriter, build_truth, read_ledger
from khipu.registry.model import HopKind

SRC = "p -> local/in"
READ = "local/in -> proc"
OUT = "proc -> local/out"
SINK = "local/out -> sink"


def written(
    mid: str,
    hop: str,
    offset: int,
    *,
    source: bool = False,
    sampled: bool = True,
    topic: str = "in",
    fault: str | None = None,
) -> dict[str, Any]:
    return {
        "event": "written",
        "message_id": mid,
        "hop": hop,
        "topic": topic,
        "partition": 0,
        "offset": offset,
        "sampled": sampled,
        "source": source,
        "fault": fault,
    }


def received(mid: str, hop: str, offset: int, topic: str = "in") -> dict[str, Any]:
    return {"event": "received", "message_id": mid, "hop": hop, "topic": topic, "partition": 0, "offset": offset}


def test_clean_message_passes_every_hop_once_with_one_trace_each() -> None:
    truth = build_truth(
        [
            written("a", SRC, 0, source=True),
            received("a", READ, 0),
            written("a", OUT, 0, topic="out"),
            received("a", SINK, 0, topic="out"),
        ]
    )
    hops = truth.messages["a"].hops
    assert {h: (r.count, r.traces, r.faults) for h, r in hops.items()} == {
        SRC: (1, 1, frozenset()),
        READ: (1, 1, frozenset()),
        OUT: (1, 1, frozenset()),
        SINK: (1, 1, frozenset()),
    }
    assert [h for h, r in hops.items() if r.source] == [SRC]  # the source's write, told from the processor's
    assert truth.expected_trace_counts() == {
        (SRC, "SENT"): 1,
        (READ, "RECEIVED"): 1,
        (OUT, "SENT"): 1,
        (SINK, "RECEIVED"): 1,
    }


def test_unsampled_message_has_true_counts_but_no_traces() -> None:
    truth = build_truth([written("a", SRC, 0, source=True, sampled=False), received("a", READ, 0)])
    assert truth.messages["a"].hops[READ].count == 1
    assert truth.expected_trace_counts() == {}


def test_skipped_offsets_are_resolved_to_the_messages_written_there() -> None:
    truth = build_truth(
        [
            written("a", SRC, 0, source=True),
            written("b", SRC, 1, source=True),
            written("c", SRC, 2, source=True),
            received("a", READ, 0),
            {
                "event": "skipped",
                "hop": READ,
                "topic": "in",
                "partition": 0,
                "from_offset": 1,
                "to_offset": 3,
                "fault": "consumer_skip",
            },
        ]
    )
    assert truth.messages["b"].hops[READ].faults == {"consumer_skip"}
    assert truth.messages["b"].hops[READ].count == 0
    assert truth.messages["c"].hops[READ].kind is HopKind.READ
    assert truth.fault_counts() == {"consumer_skip": 2}


def test_rewind_marks_the_reread_messages_which_count_twice() -> None:
    truth = build_truth(
        [
            written("a", SRC, 0, source=True),
            received("a", READ, 0),
            received("a", READ, 0),
            {
                "event": "rewound",
                "hop": READ,
                "topic": "in",
                "partition": 0,
                "from_offset": 0,
                "to_offset": 1,
                "fault": "offset_rewind",
            },
        ]
    )
    row = truth.messages["a"].hops[READ]
    assert (row.count, row.traces, row.faults) == (2, 2, {"offset_rewind"})
    assert row.reread_traced  # both traces of the re-read offset arrived


def test_which_offsets_the_traces_that_arrived_name_is_kept() -> None:
    """A retried id (two offsets) that a rewinding group read twice each: two of its four traces lost. Whether
    the two that arrived name one offset (a re-read the traces show) or one each (what a retry shows) is kept."""

    def lost(offset: int) -> dict[str, Any]:
        return {"event": "trace_dropped", "message_id": "a", "hop": SINK, "trace_type": "RECEIVED",
                "partition": 0, "offset": offset, "fault": "trace_loss"}  # fmt: skip

    reads = [received("a", SINK, offset, topic="out") for offset in (0, 1, 0, 1)]
    one_each = build_truth([written("a", SRC, 0, source=True), *reads, lost(0), lost(1)])
    one_twice = build_truth([written("a", SRC, 0, source=True), *reads, lost(1), lost(1)])
    unplaced = build_truth([written("a", SRC, 0, source=True), *reads, {**lost(0), "offset": None}])
    assert [t.messages["a"].hops[SINK].reread_traced for t in (one_each, one_twice, unplaced)] == [False, True, None]
    assert one_each.messages["a"].hops[SINK].traces == one_twice.messages["a"].hops[SINK].traces == 2


def test_dropped_in_processor_has_a_write_hop_that_never_happened() -> None:
    truth = build_truth(
        [
            written("a", SRC, 0, source=True),
            received("a", READ, 0),
            {"event": "dropped", "message_id": "a", "hop": OUT, "fault": "rebalance_drop"},
        ]
    )
    row = truth.messages["a"].hops[OUT]
    assert (row.kind, row.count, row.traces, row.faults) == (HopKind.WRITE, 0, 0, {"rebalance_drop"})


def test_lost_trace_lowers_the_trace_count_and_is_recorded_as_a_fault() -> None:
    truth = build_truth(
        [
            written("a", SRC, 0, source=True),
            received("a", READ, 0),
            {"event": "trace_dropped", "message_id": "a", "hop": READ, "trace_type": "RECEIVED", "fault": "trace_loss"},
        ]
    )
    row = truth.messages["a"].hops[READ]
    assert (row.count, row.traces, row.faults) == (1, 0, {"trace_loss"})


def test_producer_retry_counts_two_writes_of_one_id() -> None:
    truth = build_truth([written("a", SRC, 0, source=True), written("a", SRC, 1, source=True, fault="producer_retry")])
    row = truth.messages["a"].hops[SRC]
    assert (row.count, row.traces, row.faults) == (2, 2, {"producer_retry"})


def test_records_of_another_run_are_not_part_of_this_runs_truth() -> None:
    truth = build_truth([written("a", SRC, 0, source=True), received("old-run-msg", READ, 7)])
    assert set(truth.messages) == {"a"}


def test_ledger_round_trips_and_selects_one_run(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    writer = LedgerWriter(path)
    writer.append("run", run_id="r1")
    writer.append("received", message_id="x", hop=READ, topic="in", partition=0, offset=0)
    writer.append("run", run_id="r2")
    writer.append("received", message_id="y", hop=READ, topic="in", partition=0, offset=1)
    writer.close()
    assert [e.get("message_id") for e in read_ledger(path, run_id="r2")] == [None, "y"]
    assert len(read_ledger(path)) == 4


def test_corrupt_ledger_line_is_reported_with_its_line_number(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    path.write_text('{"event": "run", "run_id": "r"}\n{oops\n')
    with pytest.raises(LedgerError, match=r"ledger.jsonl:2: not JSON"):
        read_ledger(path)
