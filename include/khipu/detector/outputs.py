"""Where the detector's results go, written per micro-batch (``foreachBatch``), each idempotently.

- verdicts: settled against what is stored (:mod:`khipu.reconcile.settle`: late evidence never makes a
  verdict worse) and upserted by (message id, hop), so a batch replayed after a restart never stores
  a verdict twice, with the verdict's history; LOST verdicts are also produced to the lost-messages topic
  (at-least-once: a replay may repeat one there; consumers key on message id + hop);
- metrics per stream / hop / minute: recomputed from the stored verdicts of the minutes touched
  (:mod:`khipu.verdicts.metrics`);
- the raw-trace archive: Parquet partitioned by hour and batch, overwritten on replay;
- malformed records: the store's quarantine, once per trace-topic position;
- back-pointers: records an emitter says it received whose trace was not in the batch (what
  tells TRACE_LOST from LOST), kept long enough for every message they concern to be decided;
- emitter sequence numbers: their gaps count the traces each emitter lost (channel health;
  :mod:`khipu.detector.gaps`);
- the heartbeat: every query's progress, into the store.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Producer
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.listener import StreamingQueryListener

from khipu.detector.gaps import record_emitter_sequences
from khipu.detector.model import VerdictKind
from khipu.detector.parse import archived, pointers, quarantine_reason, quarantined, sequences
from khipu.kafka import KafkaConnection
from khipu.reconcile.book import VerdictBook, verdict_of, verdict_row
from khipu.store import Store

log = logging.getLogger(__name__)
PRUNE_EVERY_MS = 60_000


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class VerdictWriter:
    """foreachBatch of the verdict query."""

    def __init__(self, store_url: str, lost_topic: str | None, connection: KafkaConnection) -> None:
        self.store_url, self.lost_topic, self.connection = store_url, lost_topic, connection
        self._store: Store | None = None
        self._producer: Producer | None = None

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        rows = [row.asDict() for row in batch.collect()]
        if not rows:
            return
        if self._store is None:
            self._store = Store(self.store_url)
        judged = [verdict_of(row) for row in rows]
        recorded = VerdictBook(self._store.verdicts).record(judged, _now_ms())
        # a LOST this state said and the store keeps goes out, again on a replayed batch (at least once)
        lost = [
            verdict_row(stored)
            for verdict in judged
            if verdict.kind is VerdictKind.LOST
            and (stored := recorded.current.get((verdict.message_id, verdict.hop))) is not None
            and stored.kind is VerdictKind.LOST
            and stored.first_seen_ms == verdict.first_seen_ms
        ]
        if lost and self.lost_topic:
            self._publish_lost(self.lost_topic, lost)
        late = sum(1 for change in recorded.changes if change.verdict.late_evidence)
        log.info(
            "batch %d: %d verdicts, %d stored (%d LOST, %d with late evidence)",
            batch_id,
            len(judged),
            len(recorded.changes),
            len(lost),
            late,
        )

    def _publish_lost(self, topic: str, lost: list[dict[str, Any]]) -> None:
        if self._producer is None:
            self._producer = Producer({**self.connection.client_config(), "enable.idempotence": True, "acks": "all"})
        for row in lost:
            self._producer.produce(topic, key=row["message_id"].encode(), value=json.dumps(row, default=str).encode())
        remaining = self._producer.flush(30)
        if remaining:
            raise RuntimeError(f"{remaining} LOST verdicts not acknowledged by topic {topic!r}")


class ArchiveWriter:
    """foreachBatch of the parse query: valid traces to the archive, malformed records to quarantine."""

    def __init__(
        self, store_url: str, archive_path: str, keep_pointers_ms: int, known_streams: tuple[str, ...]
    ) -> None:
        self.store_url, self.archive_path, self.keep_pointers_ms = store_url, archive_path, keep_pointers_ms
        self.known_streams = known_streams
        self._store: Store | None = None
        self._pruned_ms = 0

    def __call__(self, parsed: DataFrame, batch_id: int) -> None:
        parsed.persist()
        spent: dict[str, float] = {}
        clock = time.perf_counter()

        def lap(step: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            spent[step] = now - clock
            clock = now

        try:
            traces = (
                archived(parsed)
                .withColumn("hour", F.date_format(F.timestamp_millis("timestamp_ms"), "yyyy-MM-dd-HH"))
                .withColumn("batch_id", F.lit(batch_id))
            )
            (
                traces.write.mode("overwrite")
                .option("partitionOverwriteMode", "dynamic")
                .partitionBy("hour", "batch_id")
                .parquet(self.archive_path)
            )
            lap("archive")
            if self._store is None:
                self._store = Store(self.store_url)
            now = _now_ms()
            found = [tuple(row) for row in pointers(parsed).collect()]
            lap("pointers read")
            self._store.channel.record_pointers(found, now)
            if now - self._pruned_ms >= PRUNE_EVERY_MS:
                self._store.channel.prune_pointers(now - self.keep_pointers_ms)
                self._pruned_ms = now
            lap("pointers stored")
            numbered = [tuple(row) for row in sequences(parsed).collect()]
            lap("sequences read")
            gaps = record_emitter_sequences(self._store.channel, numbered, now)
            lap("sequences stored")
            if gaps:
                log.warning("batch %d: %d new gaps in emitter sequences (lost traces)", batch_id, gaps)
            bad = [
                {**row.asDict(), "quarantine_reason": quarantine_reason(row.raw_value, self.known_streams)}
                for row in quarantined(parsed).collect()
            ]
            if bad:
                added = self._store.channel.add_quarantine(bad, _now_ms())
                log.warning("batch %d: %d malformed trace records quarantined (%d new)", batch_id, len(bad), added)
            lap("quarantine")
            log.info(
                "archive batch %d: %d pointers, %d sequence numbers; %s",
                batch_id,
                len(found),
                len(numbered),
                ", ".join(f"{step} {seconds * 1000:.0f} ms" for step, seconds in spent.items()),
            )
        finally:
            parsed.unpersist()


def _offsets(raw: Any) -> Any:
    try:
        return json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return raw


class HeartbeatListener(StreamingQueryListener):  # type: ignore[misc]
    """Every query's progress into the store: last batch time, rates, duration, state rows, and whether
    the batch read everything its source held (what lets verdicts wait for a detector that is behind)."""

    def __init__(self, store_url: str) -> None:
        self.store = Store(store_url)
        self.names: dict[str, str] = {}  # query id -> name (idle events carry only the id)

    def onQueryStarted(self, event: Any) -> None:
        self.names[str(event.id)] = event.name or "detector"
        log.info("query %s started (run %s)", event.name, event.runId)

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        operators = list(progress.stateOperators or [])
        sources = list(progress.sources or [])
        caught_up = bool(sources) and all(
            s.latestOffset is not None and _offsets(s.endOffset) == _offsets(s.latestOffset) for s in sources
        )
        self._record(
            {
                "query_name": progress.name or "detector",
                "run_id": str(progress.runId),
                "batch_id": int(progress.batchId),
                "at_ms": _ms(progress.timestamp),
                "input_rows": int(progress.numInputRows),
                "input_rows_per_s": float(progress.inputRowsPerSecond or 0.0),
                "processed_rows_per_s": float(progress.processedRowsPerSecond or 0.0),
                "batch_duration_ms": int(progress.batchDuration or 0),
                "state_rows": sum(int(op.numRowsTotal) for op in operators),
                "state_bytes": sum(int(op.memoryUsedBytes) for op in operators),
                "caught_up": caught_up,
            }
        )

    def onQueryIdle(self, event: Any) -> None:
        """An idle query has read everything there is: a caught-up heartbeat with no rows."""
        self._record(
            {
                "query_name": self.names.get(str(event.id), "detector"),
                "run_id": str(event.runId),
                "batch_id": -1,
                "at_ms": _ms(event.timestamp),
                "input_rows": 0,
                "input_rows_per_s": 0.0,
                "processed_rows_per_s": 0.0,
                "batch_duration_ms": 0,
                "state_rows": None,
                "state_bytes": None,
                "caught_up": True,
            }
        )

    def onQueryTerminated(self, event: Any) -> None:
        log.info("query %s terminated%s", event.id, f": {event.exception}" if event.exception else "")

    def _record(self, beat: dict[str, Any]) -> None:
        try:
            self.store.heartbeat.record(beat)
        except Exception as exc:  # a heartbeat that cannot be stored must not stop the detector
            log.warning("heartbeat not stored: %s", exc)


def _ms(timestamp: str) -> int:
    return int(datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp() * 1000)
