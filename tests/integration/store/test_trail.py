"""How far the detector trails the trace topic, and what it skipped, kept in the store (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest

from khipu.store import Store
from khipu.store.heartbeat import PartitionTrail, TraceSkip

pytestmark = pytest.mark.integration
Q = "khipu_detector"


def test_a_batch_replaces_the_trail_and_a_check_refreshes_only_what_no_batch_moved_since(store: Store) -> None:
    hb = store.heartbeat
    hb.record_trail(Q, [PartitionTrail(0, 10, 1, 0, 12, 1_000, 10, 900), PartitionTrail(1, 20, 1, 0, 20, 1_000)])
    hb.record_trail(Q, [PartitionTrail(0, 12, 2, 0, 15, 2_000, 12, 1_500)])  # batch 2 read on partition 0 only
    assert hb.trail(Q) == [PartitionTrail(0, 12, 2, 0, 15, 2_000, 12, 1_500), PartitionTrail(1, 20, 1, 0, 20, 1_000)]
    refreshed = hb.refresh_trail(
        Q,
        [
            PartitionTrail(0, 10, 1, 5, 30, 3_000, 10, 900),  # measured from read end 10: batch 2 moved it since
            PartitionTrail(1, 20, 1, 0, 25, 3_000, 20, 2_500),  # still read to 20: newer bounds and its oldest
        ],
    )
    assert refreshed == 1
    assert hb.trail(Q) == [
        PartitionTrail(0, 12, 2, 0, 15, 2_000, 12, 1_500),
        PartitionTrail(1, 20, 1, 0, 25, 3_000, 20, 2_500),
    ]
    assert hb.refresh_trail(Q, [PartitionTrail(1, 20, 1, 0, 22, 2_500)]) == 0  # an older ask never replaces a newer
    assert hb.trail("another query") == []
    hb.start_over(Q, 4_000)  # a new checkpoint reads from the start: the old trail says nothing of it
    assert hb.trail(Q) == []


def test_a_skip_is_kept_once_grows_when_seen_larger_and_is_told_once(store: Store) -> None:
    hb = store.heartbeat
    hb.record_skips(Q, [TraceSkip(0, 100, 130, 7, 5_000), TraceSkip(1, 40, 41, 7, 5_000)])
    hb.record_skips(Q, [TraceSkip(0, 100, 120, 7, 5_100)])  # a smaller sight of the same skip changes nothing
    assert [(s.partition, s.from_offset, s.to_offset) for s in hb.skips(Q, unalerted=True)] == [
        (0, 100, 130),
        (1, 40, 41),
    ]
    hb.mark_skips_alerted(Q, hb.skips(Q, unalerted=True), 6_000)
    assert hb.skips(Q, unalerted=True) == []
    hb.record_skips(Q, [TraceSkip(0, 100, 150, 8, 7_000)])  # the batch replayed after more was removed
    (grown,) = hb.skips(Q, unalerted=True)
    assert (grown.partition, grown.from_offset, grown.to_offset, grown.offsets, grown.batch_id) == (0, 100, 150, 50, 8)
    assert [s.partition for s in hb.skips(Q, since_ms=6_000)] == [0]  # the window of the exported figure
    assert {s.alerted_ms for s in hb.skips(Q)} == {6_000, None}


def test_retention_drops_old_skips_once_told_and_keeps_one_not_told_yet(store: Store) -> None:
    hb = store.heartbeat
    hb.record_skips(
        Q, [TraceSkip(0, 100, 130, 7, 5_000), TraceSkip(1, 40, 41, 7, 5_000), TraceSkip(2, 9, 10, 8, 9_000)]
    )
    told = [s for s in hb.skips(Q) if s.partition != 1]
    hb.mark_skips_alerted(Q, told, 9_500)
    assert hb.prune_skips(8_000, dry_run=True) == 1 and len(hb.skips(Q)) == 3  # a dry run counts, keeps
    assert hb.prune_skips(8_000) == 1  # partition 0's: old and told; partition 1's is not told yet, 2's is new
    assert sorted(s.partition for s in hb.skips(Q)) == [1, 2]
