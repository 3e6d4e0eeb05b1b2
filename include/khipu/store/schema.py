"""Tables of the store (SQLAlchemy Core). Times are epoch milliseconds; JSON is kept as text.

A change here needs a migration in ``migrations/versions``; tests/integration/store checks that
the migrated database matches these definitions.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
)

metadata = MetaData()

NAME = 249  # Kafka's limit for topic names; used for every name column

snapshot_runs = Table(
    "snapshot_runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("cluster", String(NAME), nullable=False),
    Column("snapshot_ms", BigInteger, nullable=False),
    Column("groups", Integer, nullable=False),
    Column("partitions", Integer, nullable=False),
    Column("duration_ms", Integer, nullable=False),
    Column("errors", Text, nullable=False),  # JSON list of strings
    UniqueConstraint("cluster", "snapshot_ms", name="uq_snapshot_runs_cluster_time"),
)

offset_snapshots = Table(
    "offset_snapshots",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("cluster", String(NAME), nullable=False),
    Column("group_id", String(NAME), nullable=False),
    Column("topic", String(NAME), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("snapshot_ms", BigInteger, nullable=False),
    Column("committed_offset", BigInteger),
    Column("log_start_offset", BigInteger),
    Column("log_end_offset", BigInteger),
    Column("group_state", String(32)),
    Column("retention_ms", BigInteger),
    Column("committed_changed", Boolean, nullable=False),
    Column("members", Integer),
    Column("assigned", Boolean),
    Column("retention_bytes", BigInteger),
    UniqueConstraint("cluster", "group_id", "topic", "partition", "snapshot_ms", name="uq_offset_snapshots_key_time"),
    Index("ix_offset_snapshots_log", "cluster", "topic", "partition", "snapshot_ms"),
    Index("ix_offset_snapshots_time", "snapshot_ms"),
)

partition_health = Table(
    "partition_health",
    metadata,
    Column("cluster", String(NAME), primary_key=True),
    Column("group_id", String(NAME), primary_key=True),
    Column("topic", String(NAME), primary_key=True),
    Column("partition", Integer, primary_key=True),
    Column("status", String(16), nullable=False),
    Column("since_ms", BigInteger, nullable=False),
    Column("evaluated_ms", BigInteger, nullable=False),
    Column("lag", BigInteger),
    Column("time_lag_ms", BigInteger),
    Column("reason", Text, nullable=False),
    Column("evidence", Text, nullable=False),  # JSON
)

health_transitions = Table(
    "health_transitions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("cluster", String(NAME), nullable=False),
    Column("group_id", String(NAME), nullable=False),
    Column("topic", String(NAME), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("from_status", String(16)),
    Column("to_status", String(16), nullable=False),
    Column("at_ms", BigInteger, nullable=False),
    Column("reason", Text, nullable=False),
    Column("evidence", Text, nullable=False),
    Index("ix_health_transitions_time", "at_ms"),
)

offset_windows = Table(
    "offset_windows",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("cluster", String(NAME), nullable=False),
    Column("group_id", String(NAME), nullable=False),
    Column("topic", String(NAME), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("from_offset", BigInteger, nullable=False),
    Column("to_offset", BigInteger, nullable=False),
    Column("detected_ms", BigInteger, nullable=False),
    Column("previous_committed", BigInteger),
    Column("committed", BigInteger),
    UniqueConstraint("cluster", "group_id", "topic", "partition", "kind", "detected_ms", name="uq_offset_windows"),
    Index("ix_offset_windows_partition", "cluster", "topic", "partition", "from_offset"),
)

alerts = Table(
    "alerts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("alert_key", String(512), nullable=False, unique=True),
    Column("subject", String(1024), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("state", String(16), nullable=False),
    Column("severity", String(16), nullable=False),
    Column("title", Text, nullable=False),
    Column("details", Text, nullable=False),  # JSON
    Column("at_ms", BigInteger, nullable=False),
    Column("delivered_ms", BigInteger),  # null: not yet sent
    Column("deliveries", Text),  # JSON: notifier -> "ok" | error text
    Index("ix_alerts_pending", "delivered_ms"),
    Index("ix_alerts_time", "at_ms"),
)

verdicts = Table(
    "verdicts",
    metadata,
    Column("message_id", String(256), primary_key=True),
    Column("hop", String(520), primary_key=True),
    Column("stream", String(NAME), nullable=False),
    Column("hop_kind", String(8), nullable=False),
    Column("verdict", String(16), nullable=False),
    Column("cause", String(32)),
    Column("count", Integer, nullable=False),
    Column("topic", String(NAME), nullable=False),
    Column("partition", Integer),
    Column("offset", BigInteger),
    Column("group_id", String(NAME)),
    Column("location", String(NAME)),
    Column("observed_ms", BigInteger),
    Column("latency_ms", BigInteger),
    Column("e2e_latency_ms", BigInteger),
    Column("decided_ms", BigInteger, nullable=False),
    Column("detail", Text, nullable=False),
    Column("first_seen_ms", BigInteger),  # when its judge first saw the message (tells a fresh state: late traces)
    Column("decided_by", String(16), nullable=False, server_default="detector"),  # detector | reconciliation
    Column("evidence_kind", String(16)),  # RETRACTED / CONFIRMED_LOST: what the evidence says of the hop
    Column("late_evidence", Boolean, nullable=False, server_default=false()),  # reconciliation re-decides it
    Column("announced_ms", BigInteger),  # a CONFIRMED_LOST: when the confirmed-losses Asset carried it
    Index("ix_verdicts_stream_time", "stream", "decided_ms"),
    Index("ix_verdicts_kind", "verdict", "decided_ms"),
    Index("ix_verdicts_time", "decided_ms"),
)

# Every change of a stored verdict: "LOST at 10:02, RETRACTED at 11:00: RECEIVED trace at 10:58".
verdict_history = Table(
    "verdict_history",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("message_id", String(256), nullable=False),
    Column("hop", String(520), nullable=False),
    Column("stream", String(NAME), nullable=False),
    Column("at_ms", BigInteger, nullable=False),
    Column("from_verdict", String(16)),  # null: the first verdict
    Column("to_verdict", String(16), nullable=False),
    Column("cause", String(32)),
    Column("decided_by", String(16), nullable=False),
    Column("reason", Text, nullable=False),
    Index("ix_verdict_history_message", "message_id", "hop", "at_ms"),
)

verdict_metrics = Table(
    "verdict_metrics",
    metadata,
    Column("stream", String(NAME), primary_key=True),
    Column("hop", String(520), primary_key=True),
    Column("minute_ms", BigInteger, primary_key=True),
    Column("delivered", Integer, nullable=False),
    Column("lost", Integer, nullable=False),
    Column("duplicate", Integer, nullable=False),
    Column("trace_lost", Integer, nullable=False),
    Column("pending", Integer, nullable=False),
    Column("confirmed_lost", Integer, nullable=False, server_default="0"),
    Column("retracted", Integer, nullable=False, server_default="0"),
    Column("aborted", Integer, nullable=False, server_default="0"),  # a transaction aborted: Kafka's own semantics
    Column("superseded", Integer, nullable=False, server_default="0"),  # compacted behind a later record of its key
    Column("reprocessed", Integer, nullable=False, server_default="0"),  # a duplicate not counted (exactly-once)
    Column("false_loss_rate", Float),  # retracted / provisional LOST (LOST + CONFIRMED_LOST + RETRACTED); null: none
    Column("loss_rate", Float, nullable=False),
    Column("duplicate_rate", Float, nullable=False),
    Column("latency_p50_ms", BigInteger),
    Column("latency_p95_ms", BigInteger),
    Column("latency_p99_ms", BigInteger),
    Column("latency_histogram", Text),  # JSON {"bucket": count}; null: a minute stored before migration 0008
    Column("skew_histogram", Text),  # JSON {"bucket": count} of latencies clock skew made impossible; null: none
    Index("ix_verdict_metrics_time", "minute_ms"),
)

# What a minute's metrics are the sum of: one row per (stream, hop, minute) per writer's part (the detector's
# archived verdicts of one micro-batch, the changes of stored verdicts, a seed), each replaceable on its own.
verdict_metric_parts = Table(
    "verdict_metric_parts",
    metadata,
    Column("stream", String(NAME), primary_key=True),
    Column("hop", String(520), primary_key=True),
    Column("minute_ms", BigInteger, primary_key=True),
    Column("part", String(NAME), primary_key=True),  # e.g. detector:<query id>:<batch id>, changes
    Column("delivered", Integer, nullable=False),
    Column("lost", Integer, nullable=False),
    Column("duplicate", Integer, nullable=False),
    Column("trace_lost", Integer, nullable=False),
    Column("pending", Integer, nullable=False),
    Column("confirmed_lost", Integer, nullable=False),
    Column("retracted", Integer, nullable=False),
    Column("aborted", Integer, nullable=False, server_default="0"),
    Column("superseded", Integer, nullable=False, server_default="0"),
    Column("reprocessed", Integer, nullable=False, server_default="0"),
    Column("latency_histogram", Text, nullable=False),  # JSON {"bucket": count}
    Column("skew_histogram", Text),  # JSON {"bucket": count}; null: none
    Index("ix_verdict_metric_parts_part", "part"),
)

quarantine = Table(
    "quarantine",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("source_topic", String(NAME), nullable=False),
    Column("source_partition", Integer, nullable=False),
    Column("source_offset", BigInteger, nullable=False),
    Column("source_line", Integer, nullable=False, server_default="0"),  # the line of a batch record; 0: of one
    Column("reason", Text, nullable=False),
    Column("raw_value", LargeBinary),
    Column("kafka_timestamp_ms", BigInteger),
    Column("quarantined_ms", BigInteger, nullable=False),
    UniqueConstraint("source_topic", "source_partition", "source_offset", "source_line", name="uq_quarantine_record"),
    Index("ix_quarantine_time", "quarantined_ms"),
)

detector_heartbeat = Table(
    "detector_heartbeat",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("query_name", String(64), nullable=False),
    Column("run_id", String(64), nullable=False),
    Column("batch_id", BigInteger, nullable=False),
    Column("at_ms", BigInteger, nullable=False),
    Column("input_rows", BigInteger, nullable=False),
    Column("input_rows_per_s", Float),
    Column("processed_rows_per_s", Float),
    Column("batch_duration_ms", BigInteger),
    Column("state_rows", BigInteger),
    Column("state_bytes", BigInteger),
    Column("caught_up", Boolean, nullable=False),  # the batch read everything the topic held when it started
    Column("read_to_ms", BigInteger),  # every trace written before this time has been read (None: not known)
    # a query that waits out an outage says so: on what (None: it does not wait), since when, how many tries
    Column("waiting", Text),
    Column("waiting_since_ms", BigInteger),
    Column("retries", Integer),
    # the batch's serial part (its writer, foreachBatch, on the driver): the wall time of the Spark job that judged
    # it (collected to the driver), the writer's wall time besides (no task of the query runs then), and the
    # writer thread's CPU (None: a heartbeat of a batch the writer did not finish, or of an earlier release)
    Column("collect_ms", BigInteger),
    Column("driver_ms", BigInteger),
    Column("driver_cpu_ms", BigInteger),
    Index("ix_detector_heartbeat_time", "query_name", "at_ms"),
)

detector_progress = Table(  # the time up to which a query has read the trace topic, set before each batch runs
    "detector_progress",
    metadata,
    Column("query_name", String(64), primary_key=True),
    Column("read_to_ms", BigInteger, nullable=False),
    Column("at_ms", BigInteger, nullable=False),
    # when the query's checkpoint was first started: heartbeats before it are another run's reading
    Column("since_ms", BigInteger, nullable=False, server_default="0"),
    # how far the batch now running will have read it when it ends, set before it runs (None: not known); its own
    # back-pointers are not stored yet (khipu.detector.clock.running_read_to_ms)
    Column("running_read_to_ms", BigInteger),
)

detector_trail = Table(  # how far a query trails each trace-topic partition, as last asked of the broker
    "detector_trail",
    metadata,
    Column("query_name", String(64), primary_key=True),
    Column("partition", Integer, primary_key=True, autoincrement=False),
    Column("read_end", BigInteger, nullable=False),  # where its newest finished batch ended: the next offset it reads
    Column("batch_id", BigInteger, nullable=False),  # that batch
    Column("log_start", BigInteger, nullable=False),
    Column("log_end", BigInteger, nullable=False),
    Column("asked_ms", BigInteger, nullable=False),  # when the log start and end were asked
    # the oldest record still in the log it has not read (max(read_end, log_start)) and its broker timestamp;
    # None: nothing unread when asked, or not fetched
    Column("oldest_unread_offset", BigInteger),
    Column("oldest_unread_ms", BigInteger),
)

detector_skips = Table(  # trace-topic offsets the broker removed before a query read them: it skipped them
    "detector_skips",
    metadata,
    Column("query_name", String(64), primary_key=True),
    Column("partition", Integer, primary_key=True, autoincrement=False),
    Column("from_offset", BigInteger, primary_key=True, autoincrement=False),  # where its batch started
    Column("to_offset", BigInteger, nullable=False),  # the first offset after the skip
    Column("batch_id", BigInteger, nullable=False),  # the batch that skipped them
    Column("detected_ms", BigInteger, nullable=False),
    Column("alerted_ms", BigInteger),  # when an alert said so (None: not yet)
    Index("ix_detector_skips_time", "query_name", "detected_ms"),
)

emitter_progress = Table(
    "emitter_progress",
    metadata,
    Column("emitter_id", String(NAME), primary_key=True),
    Column("location", String(NAME), nullable=False),
    Column("max_seq", BigInteger, nullable=False),  # its newest sequence number seen
    Column("base_seq", BigInteger, nullable=False),  # numbers up to here are folded into the base
    Column("base_ms", BigInteger),
    Column("runs", Text, nullable=False),  # JSON [[first_seq, first_ms, last_seq, last_ms], ...] above the base
    Column("updated_ms", BigInteger, nullable=False),
)

trace_gaps = Table(
    "trace_gaps",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("emitter_id", String(NAME), nullable=False),
    Column("location", String(NAME), nullable=False),
    Column("from_seq", BigInteger, nullable=False),  # first missing sequence number
    Column("to_seq", BigInteger, nullable=False),  # first sequence number after the gap
    Column("after_ms", BigInteger, nullable=False),  # time of the trace before the gap
    Column("before_ms", BigInteger, nullable=False),  # time of the trace after the gap
    Column("noticed_ms", BigInteger, nullable=False),
    Index("ix_trace_gaps_location_time", "location", "before_ms"),
    Index("ix_trace_gaps_emitter", "emitter_id", "from_seq"),
)

# Records an emitter said it received (a back-pointer or a mark) whose own trace was not in the same batch.
trace_pointers = Table(
    "trace_pointers",
    metadata,
    Column("location", String(NAME), primary_key=True),
    Column("cluster", String(NAME), primary_key=True),
    Column("topic", String(NAME), primary_key=True),
    Column("partition", Integer, primary_key=True),
    Column("offset", BigInteger, primary_key=True),
    Column("seen_ms", BigInteger, nullable=False),
    Index("ix_trace_pointers_seen", "seen_ms"),
)

# One row per attempt at resending a confirmed loss (message, hop, attempt): the intent is written before anything is
# produced, so a task killed at any point finds its attempt here and, by the resend id header, in the destination.
resend_ledger = Table(
    "resend_ledger",
    metadata,
    Column("resend_id", String(64), primary_key=True),
    Column("message_id", String(256), nullable=False),
    Column("hop", String(520), nullable=False),
    Column("stream", String(NAME), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("state", String(16), nullable=False),  # intended | produced | unrecoverable | failed
    Column("source_kind", String(8), nullable=False),  # topic | hook | none
    Column("source_position", String(NAME)),  # cluster/topic[partition]@offset of the original, when a record
    Column("destination", String(NAME)),  # cluster/topic produced to
    Column("target_group", String(NAME)),  # a read-hop resend: the only group that takes it
    Column("destination_partition", Integer),  # where the copy goes
    Column("scan_from_offset", BigInteger),  # the partition's end when the intent was written: the copy is after it
    Column("reason", Text, nullable=False),
    Column("intended_ms", BigInteger, nullable=False),
    Column("updated_ms", BigInteger, nullable=False),
    Column("produced_partition", Integer),
    Column("produced_offset", BigInteger),
    Column("error", Text),
    Column("claimed_by", String(64)),  # the run working on an open attempt (no other run touches it) ...
    Column("claimed_until_ms", BigInteger),  # ... until then: a killed run's claim lapses
    UniqueConstraint("message_id", "hop", "attempt", name="uq_resend_attempt"),
    Index("ix_resend_ledger_state", "state", "updated_ms"),
)

# When this Khipu was installed: one row, written by the migration that made the table (0014) when it ran, so the
# store's creation, or the upgrade of an older store. khipu_reconcile's schedule starts at the hour after it.
installation = Table(
    "installation",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),  # always 1: there is one install
    Column("installed_ms", BigInteger, nullable=False),
    CheckConstraint("id = 1", name="ck_installation_one_row"),
)

# The verdict archive's index (khipu.verdicts.archive.DecidedIndex): which micro-batch decided (gave a verdict to)
# each message, and the archive hour its verdicts are in. A row per (message, batch), kept in message order: the
# detector's writer looks up a batch's ids by message (SQLite: the table itself, WITHOUT ROWID), and replaces or
# forgets a batch's rows by ``ix_decided_batch``.
decided = Table(
    "decided",
    metadata,
    Column("message_id", String(256), primary_key=True),
    Column("batch_id", BigInteger, primary_key=True, autoincrement=False),  # the batch's key: epoch_s * 10^8 + id
    Column("first_seen_ms", BigInteger),  # the detector state's: another value is another state
    Column("hour", String(13), nullable=False),  # YYYY-MM-DD-HH (UTC) of the message's verdicts in that batch
    Index("ix_decided_batch", "batch_id"),
    sqlite_with_rowid=False,
)

# Each batch of ``decided`` with its newest hour: pruning goes by it (no index on ``decided.hour`` to keep up).
decided_batches = Table(
    "decided_batches",
    metadata,
    Column("batch_id", BigInteger, primary_key=True, autoincrement=False),
    Column("last_hour", String(13), nullable=False),
)

# An index file of the release before (an SQLite file beside the verdict archive) imported into ``decided``: once,
# whichever process finds it first; the row commits with the rows it brought.
decided_imports = Table(
    "decided_imports",
    metadata,
    Column("source", String(1024), primary_key=True),  # the file, by its absolute path when it was imported
    Column("imported_ms", BigInteger, nullable=False),
    Column("rows", BigInteger, nullable=False),  # (message, batch) rows it brought
)
