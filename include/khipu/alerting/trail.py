"""Alerts on how far the detector trails the trace topic: before the topic's retention can outrun it, and once it has.

The detector reads the trace topic with Spark's Kafka source and ``failOnDataLoss=false`` (it must ride out a trace
topic truncated or recreated without stopping). Records the broker removes before the detector reads them are then
skipped with a warning in the driver's log, and the messages they traced are never judged. So the detector's trail
(:mod:`khipu.detector.trail`: where its newest batch ended on each partition, recorded after every batch) is judged
against the topic's retention every time the detector DAG checks the detector, from the broker's answers then, so
that a detector that is stopped or hung is judged too (:func:`check_trail`).

Per partition (a numbered table in ``tests/unit/alerting/test_trail.py``), the worst rule wins:

1. **removed**: the log start is past where the detector has read to: the broker removed those offsets before it
   read them, and it skips them when it reads on;
2. **retention.ms near**: the oldest record still in the log that the detector has not read is older than
   ``retention.ms`` less the margin. A segment is deleted once its newest record is older than ``retention.ms``, so
   nothing is deleted before it is that old: the margin is time left to act;
3. **retention.bytes near**: the topic has a ``retention.bytes``, the broker has removed records from the partition
   (its log start is past 0: the log has reached a limit and each new segment now pushes the oldest out), and at
   least half the offsets it keeps are not read yet. Kafka clients cannot ask a partition's size in bytes
   (DescribeLogDirs is not in librdkafka), so the share is counted in offsets, as alike as trace records are in size;
4. otherwise nothing. A topic retention removes nothing from (unlimited, or ``cleanup.policy`` without ``delete``)
   has only rule 1.

**The margin** is the larger of half ``retention.ms`` and ``KHIPU_EXPIRY_MARGIN_S`` (10 min, consumer groups'
EXPIRY_RISK margin, :func:`khipu.health.evaluate.at_expiry_risk`): the detector trails by about a batch when well,
so half the retention behind is never normal, and leaves as long again to act (three and a half days on a 7-day
topic, a weekend); the floor leaves a short retention the time the detector DAG needs to notice (it checks every
2 minutes) and a restarted detector to start (``KHIPU_DETECTOR_STARTUP_GRACE_S``, 5 min) and read those records,
which come first in its next batch.

One alert per transition, subject ``detector <query> trailing <topic>`` (kind ``trace_trail``): it **fires** when a
partition is at risk (rules 2 and 3), naming each with its figures; it fires **again** (an update) when records are
then removed unread (rule 1), and it **resolves** when no partition is at risk. Every skip the detector recorded
(what a batch really skipped, exact per partition) raises one more alert, kind ``trace_skip``: an event, never
resolved, naming each partition and the offsets skipped.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import IntEnum
from typing import Any

from khipu.alerting.model import Alert, AlertState, Severity, StoredAlert
from khipu.clock import elapsed_ms
from khipu.detector.trail import TrailFigures, trail_figures, waiting_from, with_oldest_unread
from khipu.health.evaluate import at_expiry_risk
from khipu.kafka import KafkaAdmin, KafkaUnavailable
from khipu.kafka.admin import TopicRetention
from khipu.store import Store
from khipu.store.heartbeat import PartitionTrail, TraceSkip

log = logging.getLogger(__name__)

TRAIL_ALERT_KIND = "trace_trail"
SKIP_ALERT_KIND = "trace_skip"


class TrailStatus(IntEnum):
    """Ordered by severity: a higher value is worse."""

    OK = 0
    RETENTION_BYTES_NEAR = 1
    RETENTION_MS_NEAR = 2
    REMOVED = 3


def trail_margin_ms(retention_ms: int, expiry_margin_ms: int) -> int:
    """How close to ``retention.ms`` the oldest record not read may come before the alert (see the module doc)."""
    return max(retention_ms // 2, expiry_margin_ms)


def removes_by_retention(retention: TopicRetention | None) -> bool:
    """Retention removes this topic's old records (``cleanup.policy`` has ``delete``)."""
    return retention is not None and "delete" in retention.cleanup_policy


def removed(trail: PartitionTrail) -> bool:
    """Rule 1: the broker removed offsets before the detector read them."""
    return trail.removed_unread > 0


def retention_ms_near(trail: PartitionTrail, retention: TopicRetention | None, margin_ms: int, now_ms: int) -> bool:
    """Rule 2: the oldest record in the log not read yet is within ``margin_ms`` of ``retention.ms``."""
    if not removes_by_retention(retention) or trail.oldest_unread_ms is None or waiting_from(trail) is None:
        return False
    assert retention is not None
    return at_expiry_risk(elapsed_ms(trail.oldest_unread_ms, now_ms), retention.retention_ms, margin_ms)


def retention_bytes_near(trail: PartitionTrail, retention: TopicRetention | None) -> bool:
    """Rule 3: ``retention.bytes`` bounds the partition, it has removed records, and half the offsets it keeps or more
    are not read yet."""
    if not removes_by_retention(retention) or retention is None or retention.retention_bytes is None:
        return False
    kept = trail.log_end - trail.log_start
    waiting = trail.log_end - max(trail.read_end, trail.log_start)
    return retention.retention_bytes >= 0 and trail.log_start > 0 and kept > 0 and 2 * waiting >= kept


@dataclass(frozen=True, slots=True)
class PartitionRisk:
    trail: PartitionTrail
    status: TrailStatus
    age_ms: int | None  # of the oldest record in the log not read yet (None: none, or not known)

    def details(self) -> dict[str, Any]:
        t = self.trail
        return {
            "partition": t.partition,
            "status": self.status.name,
            "read_end": t.read_end,
            "log_start": t.log_start,
            "log_end": t.log_end,
            "unread": t.unread,
            "removed_unread": t.removed_unread,
            "oldest_unread_offset": t.oldest_unread_offset,
            "oldest_unread_age_ms": self.age_ms,
        }


@dataclass(frozen=True, slots=True)
class TrailJudgement:
    """How the detector's trail stands against the topic's retention."""

    status: TrailStatus  # the worst partition's
    at_risk: tuple[PartitionRisk, ...]  # partitions not OK, worst first
    figures: TrailFigures | None
    retention: TopicRetention | None
    margin_ms: int | None  # rule 2's (None: the topic has no retention.ms)


def judge_partition(
    trail: PartitionTrail, retention: TopicRetention | None, margin_ms: int, now_ms: int
) -> TrailStatus:
    """The worst rule that holds for one partition (rules 1 to 3 of the module doc)."""
    if removed(trail):
        return TrailStatus.REMOVED
    if retention_ms_near(trail, retention, margin_ms, now_ms):
        return TrailStatus.RETENTION_MS_NEAR
    if retention_bytes_near(trail, retention):
        return TrailStatus.RETENTION_BYTES_NEAR
    return TrailStatus.OK


def judge_trail(
    trails: Sequence[PartitionTrail], retention: TopicRetention | None, expiry_margin_ms: int, now_ms: int
) -> TrailJudgement:
    """Every partition's status and the worst of them (``retention``: the topic's, None when not known)."""
    retention_ms = retention.retention_ms if retention is not None else None
    margin = trail_margin_ms(retention_ms, expiry_margin_ms) if retention_ms is not None and retention_ms >= 0 else None
    risks = []
    for trail in trails:
        status = judge_partition(trail, retention, margin if margin is not None else 0, now_ms)
        if status is not TrailStatus.OK:
            age = None if trail.oldest_unread_ms is None else elapsed_ms(trail.oldest_unread_ms, now_ms)
            risks.append(PartitionRisk(trail, status, age))
    risks.sort(key=lambda risk: (-risk.status, risk.trail.partition))
    worst = risks[0].status if risks else TrailStatus.OK
    return TrailJudgement(worst, tuple(risks), trail_figures(trails), retention, margin)


def trail_subject(query: str, topic: str) -> str:
    return f"detector {query} trailing {topic}"


def trail_alert(
    query: str, topic: str, judgement: TrailJudgement, firing: StoredAlert | None, now_ms: int
) -> Alert | None:
    """The alert to raise now, given the subject's firing alert (None: none fires): fire when at risk; fire again when
    worse than the firing alert said (records removed while it fired for retention near); resolve when no partition is
    at risk; otherwise nothing."""
    subject = trail_subject(query, topic)
    before = TrailStatus[str(firing.details.get("status", "OK"))] if firing is not None else TrailStatus.OK
    details = _details(query, topic, judgement)
    if judgement.status is TrailStatus.OK:
        if firing is None:
            return None
        behind = judgement.figures.records_behind if judgement.figures is not None else 0
        return Alert(
            key=f"trail:{subject}:resolved:{now_ms}",
            subject=subject,
            kind=TRAIL_ALERT_KIND,
            state=AlertState.RESOLVED,
            severity=Severity.INFO,
            title=f"resolved: the detector ({query}) trails trace topic {topic} within its retention again "
            f"({behind} records behind)",
            at_ms=now_ms,
            details=details,
        )
    if firing is not None and judgement.status <= before:
        return None
    update = "updated: " if firing is not None else ""
    since = int(firing.details.get("firing_since_ms", firing.at_ms)) if firing is not None else now_ms
    return Alert(
        key=f"trail:{subject}:{judgement.status.name}:{now_ms}",
        subject=subject,
        kind=TRAIL_ALERT_KIND,
        state=AlertState.FIRING,
        severity=Severity.CRITICAL,
        title=update + _risk_title(query, topic, judgement),
        at_ms=now_ms,
        details={**details, "firing_since_ms": since},
    )


def _details(query: str, topic: str, judgement: TrailJudgement) -> dict[str, Any]:
    retention = judgement.retention
    figures = judgement.figures
    return {
        "query": query,
        "topic": topic,
        "status": judgement.status.name,
        "retention_ms": None if retention is None else retention.retention_ms,
        "retention_bytes": None if retention is None else retention.retention_bytes,
        "margin_ms": judgement.margin_ms,
        "records_behind": None if figures is None else figures.records_behind,
        "removed_unread": None if figures is None else figures.removed_unread,
        "partitions": [risk.details() for risk in judgement.at_risk],
    }


def _risk_title(query: str, topic: str, judgement: TrailJudgement) -> str:
    risks = judgement.at_risk
    where = ", ".join(_partition_said(risk) for risk in risks[:5]) + (
        f" and {len(risks) - 5} more" if len(risks) > 5 else ""
    )
    if judgement.status is TrailStatus.REMOVED:
        removed_total = sum(risk.trail.removed_unread for risk in risks)
        return (
            f"the broker removed {removed_total} offsets of trace topic {topic} before the detector ({query}) read "
            f"them: {where}; it skips them and the messages they traced are never judged"
        )
    retention = judgement.retention
    limits = []
    if retention is not None and retention.retention_ms is not None and retention.retention_ms >= 0:
        limits.append(
            f"retention.ms {_duration(retention.retention_ms)} (alert margin {_duration(judgement.margin_ms)})"
        )
    if retention is not None and retention.retention_bytes is not None and retention.retention_bytes >= 0:
        limits.append(f"retention.bytes {retention.retention_bytes}")
    return (
        f"the detector ({query}) trails trace topic {topic} close to its {' and '.join(limits)}: {where}; restart "
        "or scale the detector, or raise the topic's retention, before the broker removes what it has not read"
    )


def _partition_said(risk: PartitionRisk) -> str:
    t = risk.trail
    if risk.status is TrailStatus.REMOVED:
        return f"partition {t.partition} offsets {t.read_end}..{min(t.log_start, t.log_end) - 1} ({t.removed_unread})"
    age = "" if risk.age_ms is None else f", the oldest {_duration(risk.age_ms)} old"
    kept = t.log_end - t.log_start
    return f"partition {t.partition} {t.unread} of the {kept} offsets it keeps not read{age}"


def skip_alert(query: str, topic: str, skips: Sequence[TraceSkip], now_ms: int) -> Alert | None:
    """One alert for the skips no alert told yet (None: none): each partition and the offsets skipped. Its key comes
    from the skips, so a check run again after a failure does not raise it twice."""
    if not skips:
        return None
    total = sum(skip.offsets for skip in skips)
    listed = ", ".join(
        f"partition {s.partition} offsets {s.from_offset}..{s.to_offset - 1} ({s.offsets})" for s in skips
    )
    digest = hashlib.sha256(
        ";".join(f"{s.partition}:{s.from_offset}:{s.to_offset}" for s in skips).encode()
    ).hexdigest()[:16]
    return Alert(
        key=f"skip:{query}:{topic}:{digest}",
        subject=trail_subject(query, topic),
        kind=SKIP_ALERT_KIND,
        state=AlertState.FIRING,
        severity=Severity.CRITICAL,
        title=f"the detector ({query}) skipped {total} offsets of trace topic {topic} the broker removed before it "
        f"read them: {listed}; the messages they traced are never judged",
        at_ms=now_ms,
        details={
            "query": query,
            "topic": topic,
            "skipped": total,
            "partitions": [{**asdict(s), "skipped": s.offsets} for s in skips],
        },
    )


@dataclass(frozen=True, slots=True)
class TrailCheck:
    """What one check found and raised (counts only, for the DAG's XCom)."""

    status: str
    records_behind: int | None
    seconds_behind: float | None
    alerts: int


def check_trail(
    store: Store, admin: KafkaAdmin, query: str, topic: str, expiry_margin_ms: int, now_ms: int
) -> TrailCheck:
    """Judge the detector's trail now: its read ends as the detector last recorded them, the log's bounds and oldest
    records not read asked of the broker now (recorded too, so the exported figures stay current while the detector
    does not run), the topic's retention asked now; raise the trail alert's transition and one alert for the skips
    not told yet. A query that recorded no trail yet is not judged."""
    stored = store.heartbeat.trail(query)
    alerts = 0
    judgement = None
    if stored:
        try:
            judgement = _judge_now(store, admin, query, topic, stored, expiry_margin_ms, now_ms)
        except KafkaUnavailable as exc:  # an outage of the trace cluster: the detector waits it out and says so
            log.warning("how far the detector trails %s not judged: %s", topic, exc)
    if judgement is not None:
        subject = trail_subject(query, topic)
        firing = next((a for a in store.alerts.firing(TRAIL_ALERT_KIND) if a.subject == subject), None)
        alert = trail_alert(query, topic, judgement, firing, now_ms)
        if alert is not None and store.alerts.add(alert):
            alerts += 1
            log.warning("trail alert: %s", alert.title)
    skips = store.heartbeat.skips(query, unalerted=True)
    told = skip_alert(query, topic, skips, now_ms)
    if told is not None:
        alerts += store.alerts.add(told)
        store.heartbeat.mark_skips_alerted(query, skips, now_ms)
        log.error("skip alert: %s", told.title)
    figures = judgement.figures if judgement is not None else None
    return TrailCheck(
        status=judgement.status.name if judgement is not None else "NOT_JUDGED" if stored else "NOT_RECORDED",
        records_behind=None if figures is None else figures.records_behind,
        seconds_behind=None if figures is None else figures.seconds_behind(now_ms),
        alerts=alerts,
    )


def _judge_now(
    store: Store,
    admin: KafkaAdmin,
    query: str,
    topic: str,
    stored: Sequence[PartitionTrail],
    expiry_margin_ms: int,
    now_ms: int,
) -> TrailJudgement:
    """The stored read ends against the log's bounds, oldest records not read and retention asked now; the fresh trail
    recorded for the exporter. A broker that does not tell every partition's bounds and the topic's retention raises
    :class:`KafkaUnavailable`: nothing is judged, so nothing resolves for want of an answer."""
    marks = admin.watermarks([(topic, trail.partition) for trail in stored])
    bounds = {partition: bound for (_, partition), bound in marks.found.items()}
    if len(bounds) < len(stored):
        raise KafkaUnavailable("; ".join(marks.errors) or f"no log bounds of some partitions of {topic}")
    retention = admin.retention([topic])
    if topic not in retention.found:
        raise KafkaUnavailable("; ".join(retention.errors) or f"no retention of {topic}")
    fresh = [PartitionTrail(t.partition, t.read_end, t.batch_id, *bounds[t.partition], now_ms) for t in stored]
    fresh = with_oldest_unread(admin, topic, fresh, stored)
    store.heartbeat.refresh_trail(query, fresh)
    return judge_trail(fresh, retention.found[topic], expiry_margin_ms, now_ms)


def _duration(ms: int | None) -> str:
    if ms is None:
        return "-"
    seconds = ms / 1000
    for unit_s, unit in ((86_400, "d"), (3_600, "h"), (60, "min")):
        if seconds >= unit_s:
            return f"{seconds / unit_s:.1f} {unit}"
    return f"{seconds:.0f} s"
