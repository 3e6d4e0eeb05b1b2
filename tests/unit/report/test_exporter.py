"""The Prometheus exporter, scraped over HTTP from a real SQLite store seeded as the Khipu view's tests seed it.

Every expected figure is computed here from what the store holds (its rows, read back), never copied
from the seed; the exporter reads the store through its own queries and windows.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.registry import CollectorRegistry
from sqlalchemy import insert

from khipu.alerting.model import Alert, AlertState, Severity
from khipu.alerting.thresholds import ThresholdConfigError, window_start_ms
from khipu.detector.model import DETECTOR_QUERY
from khipu.health.rules import PartitionStatus
from khipu.localstack.processes import free_port
from khipu.report.exporter import (
    LATENCY_BUCKETS_S,
    ExporterConfig,
    ExporterConfigError,
    ExportWindows,
    KhipuCollector,
    run_exporter,
)
from khipu.retention.policy import RetentionPolicy
from khipu.settings import KhipuSettings
from khipu.storage.location import Location
from khipu.store import Store, schema
from khipu.store.heartbeat import PartitionTrail, TraceSkip
from khipu.verdicts.metrics import counts_by_minute, metrics_of
from tests.unit.report.conftest import CLUSTER, NOW_MS, SeededStore, StartExporter
from tests.unit.report.scraping import Labels, labels_of, scrape
from tests.viewdata import STORE_READ, STREAM, a_duplicate, a_latency, judged, verdict

HOUR_MS, MINUTE_MS = 3_600_000, 60_000
TOKEN = "exporter-test-token"


def hop_labels(stream: str, hop: str) -> Labels:
    return labels_of({"stream": stream, "hop": hop})


def decided_since(seeded: SeededStore, since_ms: int) -> list[dict[str, Any]]:
    return [row for row in seeded.store.verdicts.rows() if row["decided_ms"] >= since_ms]


def test_verdicts_count_the_stored_verdicts_decided_in_the_last_hour(
    seeded: SeededStore, start_exporter: StartExporter
) -> None:
    served = scrape(start_exporter(seeded.url).url).series("khipu_verdicts")
    in_hour = decided_since(seeded, window_start_ms(NOW_MS, HOUR_MS))  # whole minutes, as the metrics count them
    expected = Counter(
        labels_of({"stream": r["stream"], "hop": r["hop"], "verdict": r["verdict"], "cause": r["cause"] or ""})
        for r in in_hour
    )
    assert served == {labels: float(count) for labels, count in expected.items()}
    assert sum(served.values()) < len(seeded.store.verdicts.rows())  # the day's older verdicts stay out


@pytest.mark.parametrize("window_ms", [ExportWindows().alert_window_ms, 15 * MINUTE_MS], ids=["default", "15min"])
def test_hop_rates_are_those_of_the_alert_window_in_whole_minutes(
    seeded: SeededStore, start_exporter: StartExporter, window_ms: int
) -> None:
    scraped = scrape(start_exporter(seeded.url, windows=ExportWindows(alert_window_ms=window_ms)).url)
    since = (NOW_MS - window_ms) // MINUTE_MS * MINUTE_MS  # the alert task's window: whole minutes
    in_window = decided_since(seeded, since)
    expected_rates: dict[str, dict[Labels, float]] = {"loss": {}, "duplicate": {}, "verdicts": {}}
    for stream, hop in {(r["stream"], r["hop"]) for r in in_window}:
        rows = judged([r for r in in_window if (r["stream"], r["hop"]) == (stream, hop)])
        lost = sum(r["verdict"] in ("LOST", "CONFIRMED_LOST") for r in rows)
        expected_rates["loss"][hop_labels(stream, hop)] = lost / len(rows) if rows else 0.0
        expected_rates["duplicate"][hop_labels(stream, hop)] = sum(map(a_duplicate, rows)) / len(rows) if rows else 0.0
        expected_rates["verdicts"][hop_labels(stream, hop)] = float(len(rows))
    assert scraped.series("khipu_hop_loss_rate") == pytest.approx(expected_rates["loss"])
    assert scraped.series("khipu_hop_duplicate_rate") == pytest.approx(expected_rates["duplicate"])
    assert scraped.series("khipu_hop_verdicts_window") == expected_rates["verdicts"]
    if window_ms > 10 * MINUTE_MS:  # the window reaches the seeded loss and duplicate
        assert max(scraped.series("khipu_hop_loss_rate").values()) > 0
        assert max(scraped.series("khipu_hop_duplicate_rate").values()) > 0


def test_the_latency_histogram_buckets_the_last_hours_stored_latencies(
    seeded: SeededStore, start_exporter: StartExporter
) -> None:
    scraped = scrape(start_exporter(seeded.url).url)
    buckets = scraped.series("khipu_hop_latency_seconds_bucket")
    in_hour = decided_since(seeded, window_start_ms(NOW_MS, HOUR_MS))
    with_latency = [r for r in in_hour if a_latency(r)]
    hops = {(r["stream"], r["hop"]) for r in with_latency}
    expected_buckets = {}
    for stream, hop in hops:
        latencies_s = [r["latency_ms"] / 1000 for r in with_latency if (r["stream"], r["hop"]) == (stream, hop)]
        for bound in (*LATENCY_BUCKETS_S, float("inf")):
            le = "+Inf" if bound == float("inf") else str(bound)
            labels = labels_of({"stream": stream, "hop": hop, "le": le})
            expected_buckets[labels] = float(sum(latency <= bound for latency in latencies_s))
        assert scraped.series("khipu_hop_latency_seconds_gcount")[hop_labels(stream, hop)] == len(latencies_s)
        assert scraped.series("khipu_hop_latency_seconds_gsum")[hop_labels(stream, hop)] == pytest.approx(
            sum(latencies_s)
        )
    assert buckets == expected_buckets
    assert len({value for value in buckets.values()}) > 1  # the bounds split the latencies


def test_latencies_clock_skew_made_impossible_are_exported_apart_per_hop(
    seeded: SeededStore, start_exporter: StartExporter
) -> None:
    scraped = scrape(start_exporter(seeded.url).url)
    in_hour = decided_since(seeded, window_start_ms(NOW_MS, HOUR_MS))
    negative = [r for r in in_hour if r["latency_ms"] is not None and r["latency_ms"] < 0]
    assert negative  # the seed has one
    expected = Counter(hop_labels(r["stream"], r["hop"]) for r in negative)
    assert scraped.series("khipu_hop_clock_skew_latencies") == {labels: float(n) for labels, n in expected.items()}
    worst = {hop_labels(r["stream"], r["hop"]): r["latency_ms"] for r in negative}
    served_worst = scraped.series("khipu_hop_clock_skew_worst_seconds")
    assert set(served_worst) == set(worst)
    for labels, ms in worst.items():  # as its bucket: three significant digits, never further from zero
        assert ms / 1000 <= served_worst[labels] < ms / 1000 * 0.99


def test_delivered_verdicts_kept_in_the_verdict_archive_are_counted_from_the_minute_metrics(
    seeded: SeededStore, start_exporter: StartExporter
) -> None:
    before = scrape(start_exporter(seeded.url).url)
    # the detector archived three plain DELIVERED verdicts (no SQL rows) and counted them in a part of its own
    archived = [verdict(f"archived-{n}", STORE_READ, "DELIVERED", NOW_MS - 5 * MINUTE_MS + n) for n in range(3)]
    for row, latency_ms in zip(archived, (40, 2_600, 2_600), strict=True):
        row["latency_ms"] = latency_ms
    seeded.store.verdicts.replace_part("detector:q:1", counts_by_minute(archived), metrics_of)
    after = scrape(start_exporter(seeded.url).url)
    delivered = labels_of({"stream": STREAM, "hop": STORE_READ, "verdict": "DELIVERED", "cause": ""})
    assert after.series("khipu_verdicts")[delivered] == before.series("khipu_verdicts")[delivered] + 3
    assert {k: v for k, v in after.series("khipu_verdicts").items() if k != delivered} == {
        k: v for k, v in before.series("khipu_verdicts").items() if k != delivered
    }  # the exceptions are the rows', by cause, as before
    hop = hop_labels(STREAM, STORE_READ)
    assert (
        after.series("khipu_hop_latency_seconds_gcount")[hop]
        == before.series("khipu_hop_latency_seconds_gcount")[hop] + 3
    )
    assert after.series("khipu_hop_latency_seconds_gsum")[hop] == pytest.approx(
        before.series("khipu_hop_latency_seconds_gsum")[hop] + 5.24
    )
    bucket = {le: labels_of({"stream": STREAM, "hop": STORE_READ, "le": le}) for le in ("0.05", "2.5", "5.0", "+Inf")}
    added = {
        le: after.series("khipu_hop_latency_seconds_bucket")[labels]
        - before.series("khipu_hop_latency_seconds_bucket")[labels]
        for le, labels in bucket.items()
    }
    assert added == {"0.05": 1.0, "2.5": 1.0, "5.0": 3.0, "+Inf": 3.0}


def test_consumer_partitions_show_the_stored_lag_time_lag_or_its_bound_and_status_code(
    seeded: SeededStore, start_exporter: StartExporter
) -> None:
    scraped = scrape(start_exporter(seeded.url).url)
    rows = seeded.store.health.current_rows(CLUSTER)

    def key(row: dict[str, Any]) -> Labels:
        return labels_of(
            {
                "cluster": row["cluster"],
                "group": row["group_id"],
                "topic": row["topic"],
                "partition": str(row["partition"]),
            }
        )

    assert scraped.series("khipu_consumer_partition_lag") == {key(r): float(r["lag"]) for r in rows}
    measured = {key(r): r["time_lag_ms"] / 1000 for r in rows if r["time_lag_ms"] is not None}
    assert scraped.series("khipu_consumer_partition_time_lag_seconds") == measured
    # a group keeping up (records written since the previous snapshot, the seed's 60 s bound): its time lag is not
    # measured, so no time-lag sample; the bound is served under its own name, and only there
    bounded = {key(r): 60.0 for r in rows if r["time_lag_ms"] is None}
    assert len(bounded) == 1 and set(bounded).isdisjoint(measured)
    assert scraped.series("khipu_consumer_partition_time_lag_at_most_seconds") == bounded
    statuses = scraped.series("khipu_consumer_partition_status")
    assert statuses == {key(r): float(PartitionStatus[r["status"]].value) for r in rows}
    assert {PartitionStatus(int(code)).name for code in statuses.values()} == {r["status"] for r in rows}


def test_detector_metrics_are_the_newest_heartbeat(seeded: SeededStore, start_exporter: StartExporter) -> None:
    scraped = scrape(start_exporter(seeded.url).url)
    beat = seeded.store.heartbeat.latest(DETECTOR_QUERY)
    assert beat is not None
    query = labels_of({"query": DETECTOR_QUERY})
    expected = {
        "khipu_detector_heartbeat_age_seconds": (NOW_MS - beat["at_ms"]) / 1000,
        "khipu_detector_input_rows_per_second": beat["input_rows_per_s"],
        "khipu_detector_processed_rows_per_second": beat["processed_rows_per_s"],
        "khipu_detector_batch_duration_seconds": beat["batch_duration_ms"] / 1000,
        "khipu_detector_state_rows": beat["state_rows"],
        "khipu_detector_batch_job_seconds": beat["collect_ms"] / 1000,
        "khipu_detector_batch_serial_seconds": (beat["batch_duration_ms"] - beat["collect_ms"]) / 1000,
    }
    for name, value in expected.items():
        assert scraped.series(name) == {query: pytest.approx(value)}, name
    assert beat["batch_duration_ms"] > beat["collect_ms"] > 0  # the seed's: the two parts are told apart


def test_a_heartbeat_without_the_writers_figures_has_no_serial_sample(
    seeded: SeededStore, start_exporter: StartExporter
) -> None:
    """An idle trigger's heartbeat (or one of a release before 0017) says nothing of a batch's parts: no sample,
    not a zero."""
    seeded.store.heartbeat.record(
        {"query_name": DETECTOR_QUERY, "run_id": "view-run", "batch_id": -1, "at_ms": NOW_MS, "input_rows": 0,
         "input_rows_per_s": 0.0, "processed_rows_per_s": 0.0, "batch_duration_ms": 0, "state_rows": None,
         "state_bytes": None, "caught_up": True}
    )  # fmt: skip
    scraped = scrape(start_exporter(seeded.url).url)
    assert scraped.series("khipu_detector_batch_duration_seconds") == {labels_of({"query": DETECTOR_QUERY}): 0.0}
    for name in ("khipu_detector_batch_job_seconds", "khipu_detector_batch_serial_seconds"):
        assert scraped.series(name) == {}, name


def test_how_far_the_detector_trails_the_trace_topic_is_what_its_trail_holds(
    seeded: SeededStore, start_exporter: StartExporter
) -> None:
    server = start_exporter(seeded.url)
    seeded.store.heartbeat.start_over(DETECTOR_QUERY, NOW_MS - 10_000)  # a new checkpoint: no trail recorded yet
    for name in ("khipu_detector_trail_records", "khipu_detector_trail_seconds"):
        assert scrape(server.url).series(name) == {}, name  # no figure, not a 0
    seeded.store.heartbeat.record_trail(
        DETECTOR_QUERY,
        [
            PartitionTrail(0, 120, 9, 0, 150, NOW_MS - 4_000, 120, NOW_MS - 95_000),  # 30 behind, the oldest 95 s old
            PartitionTrail(1, 300, 9, 0, 300, NOW_MS - 4_000),  # read to its end
            PartitionTrail(2, 40, 9, 55, 70, NOW_MS - 4_000, 55, NOW_MS - 20_000),  # 15 removed unread, 15 waiting
        ],
    )
    day_ago = NOW_MS - 86_400_000
    skips = [TraceSkip(2, 10, 40, 8, NOW_MS - 60_000), TraceSkip(0, 5, 7, 3, day_ago - 1)]  # the second: too old
    seeded.store.heartbeat.record_skips(DETECTOR_QUERY, skips)
    scraped = scrape(server.url)
    trails = seeded.store.heartbeat.trail(DETECTOR_QUERY)  # what the store holds, read back
    waiting = [t for t in trails if max(t.read_end, t.log_start) < t.log_end]
    query = labels_of({"query": DETECTOR_QUERY})
    assert scraped.series("khipu_detector_trail_records") == {query: sum(t.log_end - t.read_end for t in trails)}
    oldest = min(t.oldest_unread_ms for t in waiting if t.oldest_unread_ms is not None)
    assert scraped.series("khipu_detector_trail_seconds") == {query: pytest.approx((NOW_MS - oldest) / 1000)}
    assert scraped.series("khipu_detector_trail_removed_offsets") == {
        query: sum(max(0, t.log_start - t.read_end) for t in trails)
    }
    in_day = [s for s in seeded.store.heartbeat.skips(DETECTOR_QUERY) if s.detected_ms >= day_ago]
    assert scraped.series("khipu_detector_skipped_offsets") == {query: sum(s.to_offset - s.from_offset for s in in_day)}
    assert len(in_day) < len(seeded.store.heartbeat.skips(DETECTOR_QUERY))  # the day-old skip is left out


def test_quarantine_and_trace_gaps_are_what_the_trace_channel_holds(
    seeded: SeededStore, start_exporter: StartExporter
) -> None:
    gap = {"after_ms": NOW_MS - 60_000, "before_ms": NOW_MS - 50_000, "noticed_ms": NOW_MS - 40_000}
    with seeded.store.engine.begin() as tx:  # a second emitter at the seeded location, and another location
        tx.execute(
            insert(schema.trace_gaps),
            [
                {"emitter_id": "demo-enricher-e2", "location": "demo-enricher", "from_seq": 5, "to_seq": 7, **gap},
                {"emitter_id": "demo-enricher-e2", "location": "demo-enricher", "from_seq": 9, "to_seq": 10, **gap},
                {"emitter_id": "demo-producer-e1", "location": "demo-producer", "from_seq": 1, "to_seq": 5, **gap},
            ],
        )
    scraped = scrape(start_exporter(seeded.url).url)
    total, _ = seeded.store.channel.quarantine_page(limit=1)
    assert scraped.value("khipu_quarantined_records") == total
    open_gaps: Counter[Labels] = Counter()
    missing: Counter[Labels] = Counter()
    for row in seeded.store.channel.gap_summary():
        open_gaps[labels_of({"location": row["location"]})] += row["gaps"]
        missing[labels_of({"location": row["location"]})] += row["missing"]
    assert scraped.series("khipu_trace_gaps") == {labels: float(n) for labels, n in open_gaps.items()}
    assert scraped.series("khipu_trace_gap_missing_traces") == {labels: float(n) for labels, n in missing.items()}


def test_alerts_firing_counts_the_subjects_whose_last_alert_fired(
    seeded: SeededStore, start_exporter: StartExporter
) -> None:
    server = start_exporter(seeded.url)

    def expected() -> dict[Labels, float]:
        kinds = [dict(labels)["kind"] for labels in scrape(server.url).series("khipu_alerts_firing")]
        return {labels_of({"kind": k}): float(len(seeded.store.alerts.firing_subjects(k))) for k in kinds}

    before = scrape(server.url).series("khipu_alerts_firing")
    assert before == expected() and sum(before.values()) > 0
    (fired,) = [a for a in seeded.store.alerts.read() if a.state == "firing"]
    resolved = Alert(
        key="exporter-resolve-1",
        subject=fired.subject,
        kind=fired.kind,
        state=AlertState.RESOLVED,
        severity=Severity.INFO,
        title="resolved",
        at_ms=NOW_MS - 1_000,
    )
    seeded.store.alerts.add(resolved)
    after = scrape(server.url).series("khipu_alerts_firing")
    assert after == expected()
    assert after[labels_of({"kind": fired.kind})] == before[labels_of({"kind": fired.kind})] - 1


def test_no_label_value_is_a_stored_message_id(seeded: SeededStore, start_exporter: StartExporter) -> None:
    samples = scrape(start_exporter(seeded.url).url).samples()
    message_ids = {row["message_id"] for row in seeded.store.verdicts.rows()}
    label_values = {value for sample in samples for value in sample.labels.values()}
    assert samples and label_values
    assert not label_values & message_ids
    assert not any(message_id in value for value in label_values for message_id in message_ids)


def test_a_set_token_is_required_and_compared_exactly(seeded: SeededStore, start_exporter: StartExporter) -> None:
    server = start_exporter(seeded.url, token=TOKEN)
    refusals = [
        scrape(server.url),
        scrape(server.url, token="wrong"),
        scrape(server.url, token=TOKEN + "x"),
        scrape(server.url, authorization=TOKEN),  # no "Bearer"
        scrape(server.url.replace("/metrics", "/other")),  # every path needs it
    ]
    for refused in refusals:
        assert refused.status == 401
        assert refused.headers["WWW-Authenticate"].startswith("Bearer")
        assert "khipu_" not in refused.body
    allowed = scrape(server.url, token=TOKEN)
    assert allowed.status == 200
    assert allowed.value("khipu_exporter_scrape_error") == 0


def test_paths_other_than_metrics_answer_404(seeded: SeededStore, start_exporter: StartExporter) -> None:
    server = start_exporter(seeded.url)
    for path in ("/", "/metrics/", "/favicon.ico", "/api"):
        answer = scrape(server.url.replace("/metrics", path))
        assert answer.status == 404, path
        assert "/metrics" in answer.body
    assert scrape(server.url).status == 200


def test_an_unmigrated_store_answers_200_with_scrape_error_and_no_store_metrics(
    tmp_path: Path, seeded: SeededStore, start_exporter: StartExporter, caplog: pytest.LogCaptureFixture
) -> None:
    empty_url = f"sqlite:///{tmp_path / 'never-migrated.db'}"
    with caplog.at_level(logging.ERROR, logger="khipu.report.exporter"):
        broken = scrape(start_exporter(empty_url).url)
    healthy = scrape(start_exporter(seeded.url).url)
    assert broken.status == 200 and healthy.status == 200
    assert broken.value("khipu_exporter_scrape_error") == 1 and healthy.value("khipu_exporter_scrape_error") == 0
    assert {s.name for s in broken.samples()} == {
        "khipu_exporter_scrape_error",
        "khipu_exporter_scrape_duration_seconds",
        "khipu_stream_alert_threshold",  # from the registry, not the store
    }
    assert {"khipu_verdicts", "khipu_consumer_partition_lag"} <= {s.name for s in healthy.samples()}
    assert "khipu store migrate" in caplog.text  # the StoreError says what to do


def test_the_store_password_never_reaches_the_log_or_the_scrape(
    start_exporter: StartExporter, caplog: pytest.LogCaptureFixture
) -> None:
    password = "s3cret-store-pw"
    url = f"postgresql+psycopg2://khipu:{password}@127.0.0.1:{free_port()}/khipu"  # nothing listens there
    with caplog.at_level(logging.DEBUG):
        scraped = scrape(start_exporter(url).url)
    assert scraped.status == 200 and scraped.value("khipu_exporter_scrape_error") == 1
    assert "khipu:***@127.0.0.1" in caplog.text  # the error was logged, naming the store safely
    assert password not in caplog.text and password not in scraped.body


def test_the_scrape_duration_is_timed_with_the_given_clock(seeded: SeededStore) -> None:
    ticks = iter([100.0, 100.375])
    collector = KhipuCollector(lambda: Store(seeded.url), CLUSTER, lambda: NOW_MS, elapsed_s=lambda: next(ticks))
    (duration,) = [f for f in collector.collect() if f.name == "khipu_exporter_scrape_duration_seconds"]
    assert [sample.value for sample in duration.samples] == [0.375]


def test_registering_the_collector_reads_nothing_from_the_store() -> None:
    def no_store() -> Store:
        raise AssertionError("describe must not open the store")

    registry = CollectorRegistry()
    registry.register(KhipuCollector(no_store, CLUSTER, lambda: NOW_MS))
    names = {family.name for family in KhipuCollector(no_store, CLUSTER, lambda: NOW_MS).describe()}
    assert {"khipu_verdicts", "khipu_hop_latency_seconds", "khipu_exporter_scrape_error"} <= names


def test_exporter_config_reads_its_environment() -> None:
    assert ExporterConfig.from_env({}) == ExporterConfig(host="127.0.0.1", port=9477, token=None)
    config = ExporterConfig.from_env(
        {
            "KHIPU_EXPORTER_HOST": "0.0.0.0",
            "KHIPU_EXPORTER_PORT": "9500",
            "KHIPU_EXPORTER_TOKEN": TOKEN,
            "KHIPU_ALERT_WINDOW_MS": "600000",
        }
    )
    assert (config.host, config.port, config.token, config.alert_window_ms) == ("0.0.0.0", 9500, TOKEN, 600_000)
    assert TOKEN not in repr(config)
    assert ExporterConfig.from_env({"KHIPU_EXPORTER_TOKEN": ""}).token is None  # empty: unset


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("KHIPU_EXPORTER_PORT", "0", "TCP port number"),  # 1. not a port one can scrape
        ("KHIPU_EXPORTER_PORT", "65536", "TCP port number"),  # 2. above the range
        ("KHIPU_EXPORTER_PORT", "http", "TCP port number"),  # 3. not a number
        ("KHIPU_EXPORTER_HOST", "local host", "host name or IP address"),  # 4. a space (empty is unset)
        ("KHIPU_EXPORTER_HOST", "0.0.0.0:9477", "without a port"),  # 5. the port belongs in KHIPU_EXPORTER_PORT
        ("KHIPU_EXPORTER_HOST", "http://localhost", "without a port or scheme"),  # 6. a URL, not a host
    ],
)
def test_bad_exporter_settings_name_the_variable_the_value_and_what_is_expected(
    variable: str, value: str, expected: str
) -> None:
    with pytest.raises(ExporterConfigError) as raised:
        ExporterConfig.from_env({variable: value})
    assert raised.value.setting == variable and raised.value.value == value
    assert variable in str(raised.value) and repr(value) in str(raised.value) and expected in str(raised.value)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "metrics.internal"])
def test_an_exporter_off_the_loopback_without_a_token_is_refused_by_name(host: str) -> None:
    with pytest.raises(ExporterConfigError) as raised:
        ExporterConfig.from_env({"KHIPU_EXPORTER_HOST": host})
    assert raised.value.setting == "KHIPU_EXPORTER_TOKEN" and f"listens on {host}" in str(raised.value)
    assert "every team's figures" in str(raised.value)
    assert ExporterConfig.from_env({"KHIPU_EXPORTER_HOST": host, "KHIPU_EXPORTER_TOKEN": TOKEN}).host == host
    for loopback in ("127.0.0.1", "::1", "localhost"):  # only this machine reaches it: no token asked for
        assert ExporterConfig.from_env({"KHIPU_EXPORTER_HOST": loopback}).token is None


def test_a_bad_token_is_refused_without_showing_it() -> None:
    token = "two words"
    with pytest.raises(ExporterConfigError) as raised:
        ExporterConfig.from_env({"KHIPU_EXPORTER_TOKEN": token})
    assert raised.value.setting == "KHIPU_EXPORTER_TOKEN" and "without spaces" in str(raised.value)
    assert token not in str(raised.value) and "words" not in str(raised.value)


def test_a_bad_alert_window_is_the_threshold_settings_error() -> None:
    with pytest.raises(ThresholdConfigError) as raised:
        ExporterConfig.from_env({"KHIPU_ALERT_WINDOW_MS": "soon"})
    assert raised.value.setting == "KHIPU_ALERT_WINDOW_MS"


def test_run_exporter_serves_until_sigterm_and_never_prints_the_token(seeded: SeededStore, tmp_path: Path) -> None:
    settings = KhipuSettings.from_env(
        {"KHIPU_STORE_URL": seeded.url, "KHIPU_STATE_DIR": str(tmp_path / "state"), "KHIPU_CLUSTER": CLUSTER}
    )
    config = ExporterConfig(port=free_port(), token=TOKEN)
    said: list[str] = []
    listening = threading.Event()
    answers: dict[str, Any] = {}

    def say(line: str) -> None:
        said.append(line)
        listening.set()

    def scrape_then_stop() -> None:
        if not listening.wait(timeout=60):
            return  # run_exporter failed to start: it raised in the main thread
        try:
            url = f"http://127.0.0.1:{config.port}/metrics"
            answers["refused"], answers["allowed"] = scrape(url).status, scrape(url, token=TOKEN)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    handler_before = signal.getsignal(signal.SIGTERM)
    stopper = threading.Thread(target=scrape_then_stop)
    stopper.start()
    run_exporter(settings, config, say=say)  # returns on SIGTERM
    stopper.join(timeout=60)
    (line,) = said
    assert f"127.0.0.1:{config.port}/metrics" in line and "token" in line and TOKEN not in line
    assert answers["refused"] == 401 and answers["allowed"].status == 200
    assert answers["allowed"].value("khipu_exporter_scrape_error") == 0
    assert signal.getsignal(signal.SIGTERM) == handler_before  # restored


def test_each_streams_registry_thresholds_are_served_for_dashboards(
    seeded: SeededStore, start_exporter: StartExporter
) -> None:
    from khipu.registry.loader import load_registry
    from tests.unit.report.conftest import REGISTRY

    served = scrape(start_exporter(seeded.url).url).series("khipu_stream_alert_threshold")
    expected: dict[Labels, float] = {}
    for name, stream in load_registry(REGISTRY).streams.items():
        expected[labels_of({"stream": name, "metric": "loss_rate"})] = stream.alerts.loss_rate
        expected[labels_of({"stream": name, "metric": "duplicate_rate"})] = stream.alerts.duplicate_rate
        if stream.alerts.latency_p99_ms is not None:
            expected[labels_of({"stream": name, "metric": "latency_p99_seconds"})] = stream.alerts.latency_p99_ms / 1000
    assert served == expected and expected


@pytest.mark.parametrize("given_as", ["path", "location"])
def test_the_archives_disk_use_and_oldest_hour_are_served(seeded: SeededStore, tmp_path: Path, given_as: str) -> None:
    traces, verdicts = tmp_path / "state" / "archive", tmp_path / "state" / "verdicts"
    for hour, size in (("2026-11-20-07", 1_000), ("2026-11-24-10", 2_500)):
        (traces / f"hour={hour}" / "batch_id=1").mkdir(parents=True)
        (traces / f"hour={hour}" / "batch_id=1" / "part-0.parquet").write_bytes(b"x" * size)
    archives = {"trace archive": traces, "verdict archive": verdicts}
    collector = KhipuCollector(
        lambda: Store(seeded.url), CLUSTER, lambda: NOW_MS,
        archives={n: Location.of(p) for n, p in archives.items()} if given_as == "location" else archives,
        policy=RetentionPolicy(disk_free_min_percent=99.99),
    )  # fmt: skip  # the settings give Locations (a local folder here)
    found = {(f.name, tuple(s.labels.values())): s.value for f in collector.collect() for s in f.samples}
    assert found[("khipu_archive_bytes", ("trace_archive",))] == 3_500
    assert {found[("khipu_archive_local", (name,))] for name in ("trace_archive", "verdict_archive")} == {1}
    assert found[("khipu_archive_hours", ("trace_archive",))] == 2
    assert (
        found[("khipu_archive_oldest_hour_seconds", ("trace_archive",))]
        == datetime(2026, 11, 20, 7, tzinfo=UTC).timestamp()
    )
    assert found[("khipu_archive_hours", ("verdict_archive",))] == 0  # not there yet: empty, not an error
    disk = os.statvfs(tmp_path)
    assert found[("khipu_state_disk_size_bytes", ())] == disk.f_blocks * disk.f_frsize
    assert found[("khipu_state_disk_low", ())] == 1  # this disk is not 99.99 % free
    database = seeded.url.removeprefix("sqlite:///")
    files = [Path(database + suffix) for suffix in ("", "-wal", "-shm")]
    assert found[("khipu_store_bytes", ())] == sum(f.stat().st_size for f in files if f.exists())
