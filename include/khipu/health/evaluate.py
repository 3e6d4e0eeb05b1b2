"""A partition's health from its snapshot history: status, lag, time lag, expiry risk, new windows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from khipu.clock import elapsed_ms
from khipu.config import HealthSection, default, load
from khipu.errors import InvalidSetting
from khipu.health.rules import Evaluation, OffsetObservation, PartitionStatus, evaluate_partition
from khipu.health.windows import OffsetWindow, detect_windows, typical_advance
from khipu.offsets.model import PartitionKey, PartitionSnapshot


class HealthConfigError(InvalidSetting):
    kind = "health setting"


@dataclass(frozen=True, slots=True)
class HealthConfig:
    """How partitions are judged. Snapshots come once a minute; durations are in ms."""

    window_size: int = default(HealthSection, "window")  # live observations per window (Burrow's "intervals")
    min_window: int = 3  # fewer and movement is not judged
    min_stop_ms: int = 120_000  # silence needed before STOP, whatever the window spans
    recent_log_ends: int = 3  # newest log-end offsets for Burrow's "recently caught up" exception
    skip_factor: float = 10.0  # a forward jump this many times the usual advance is a skip window...
    skip_min_records: int = 1000  # ...and at least this many records
    # EXPIRY_RISK when the oldest unconsumed record is this close to retention
    expiry_margin_ms: int = default(HealthSection, "expiry_margin_s") * 1000

    def __post_init__(self) -> None:
        for name in ("window_size", "min_window", "recent_log_ends", "skip_min_records"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise HealthConfigError(name, getattr(self, name), "an integer >= 1")
        for name in ("min_stop_ms", "expiry_margin_ms"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise HealthConfigError(name, getattr(self, name), "a duration in ms >= 0")
        if not self.skip_factor > 1:
            raise HealthConfigError("skip_factor", self.skip_factor, "a number > 1")


def health_config_from_env(environ: Mapping[str, str] | None = None) -> HealthConfig:
    """``KHIPU_HEALTH_WINDOW`` (observations) and ``KHIPU_EXPIRY_MARGIN_S`` (how close to its retention the oldest
    unconsumed record may come before EXPIRY_RISK; :class:`khipu.config.HealthSection`)."""
    section = load(HealthSection, environ, HealthConfigError)
    return HealthConfig(window_size=section.window, expiry_margin_ms=section.expiry_margin_s * 1000)


@dataclass(frozen=True, slots=True)
class PartitionHealth:
    key: PartitionKey
    status: PartitionStatus
    evaluated_ms: int
    lag: int | None
    time_lag_ms: int | None
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    windows: tuple[OffsetWindow, ...] = ()


@dataclass(frozen=True, slots=True)
class TimeLag:
    """How old the oldest unconsumed record is (the record at the committed offset), as snapshots a minute apart
    can tell: ``age_ms`` when known (to within one snapshot interval: at least this old), else None; then
    ``under_ms``, when something bounds it (None: nothing does)."""

    age_ms: int | None
    under_ms: int | None = None


TIME_LAG_UNDER = "time_lag_under_ms"  # the evidence's key for a time lag's bound when it was not measured


def time_lag_bound_ms(evidence: Mapping[str, Any]) -> int | None:
    """The bound a partition's time lag is under when it was not measured (rule 3 of :func:`time_lag`), from its
    stored evidence; None: there is none (the time lag was measured, or nothing bounds it)."""
    under = evidence.get(TIME_LAG_UNDER)
    return None if under is None else int(under)


def nothing_unconsumed(latest: PartitionSnapshot, previous: PartitionSnapshot | None) -> bool:
    return latest.lag == 0


def written_since_previous_snapshot(latest: PartitionSnapshot, previous: PartitionSnapshot | None) -> bool:
    """The previous snapshot's log end had not reached the committed offset yet: the oldest unconsumed record was
    written since then, and no snapshot saw its age grow."""
    return (
        previous is not None
        and previous.log_end is not None
        and latest.committed is not None
        and previous.log_end <= latest.committed
    )


def time_lag(
    latest: PartitionSnapshot, previous: PartitionSnapshot | None, backlog_started_ms: int | None, now_ms: int
) -> TimeLag:
    """The time lag of a group's partition from its newest snapshot and the one before (None: none), and when the
    log end first passed the committed offset (``backlog_started_ms``, the store's answer; None: not known).

    1. lag unknown (no commit, or no log end): unknown;
    2. lag zero: nothing is unconsumed, 0;
    3. the oldest unconsumed record was written since the previous snapshot: not measured, under the time since
       that snapshot (a consumer keeping up with a small lag; never "0" while records wait);
    4. the backlog started before the newest snapshot: its age since then;
    5. otherwise (the backlog began at the only snapshot there is, or its start is not known): unknown.
    """
    if latest.lag is None:
        return TimeLag(None)
    if nothing_unconsumed(latest, previous):
        return TimeLag(0)
    if written_since_previous_snapshot(latest, previous):
        assert previous is not None  # the rule says there is one
        return TimeLag(None, elapsed_ms(previous.snapshot_ms, now_ms))
    if backlog_started_ms is not None and backlog_started_ms < latest.snapshot_ms:
        return TimeLag(elapsed_ms(backlog_started_ms, now_ms))
    return TimeLag(None)


def at_expiry_risk(time_lag: int | None, retention_ms: int | None, margin_ms: int) -> bool:
    """The oldest unconsumed record is within ``margin_ms`` of ageing out (unlimited retention: never)."""
    if time_lag is None or retention_ms is None or retention_ms < 0:
        return False
    return time_lag >= retention_ms - margin_ms


def evaluate_history(
    history: Sequence[PartitionSnapshot],
    now_ms: int,
    config: HealthConfig,
    backlog_started_ms: int | None = None,
) -> PartitionHealth:
    """Judge one group's partition from its snapshots (oldest first, at least one).

    ``backlog_started_ms`` is when the log end first passed the current committed offset (the
    store finds it; ``None`` when unknown). The time lag is :func:`time_lag`'s; when only a bound of it is
    known, the evidence holds it as ``time_lag_under_ms``.
    """
    latest = history[-1]
    live = [s for s in history if s.live]
    window = [
        OffsetObservation(s.committed, s.snapshot_ms, s.lag)
        for s in live[-config.window_size :]
        if s.committed is not None
    ]
    recent_log_ends = [s.log_end for s in reversed(history[-config.recent_log_ends :]) if s.log_end is not None]
    lag = latest.lag
    evaluation: Evaluation = evaluate_partition(
        window, recent_log_ends, lag or 0, now_ms, min_window=config.min_window, min_stop_ms=config.min_stop_ms
    )
    status, reasons = evaluation.status, [evaluation.reason]
    lagged = time_lag(latest, history[-2] if len(history) >= 2 else None, backlog_started_ms, now_ms)
    age = lagged.age_ms
    retention = latest.retention_ms
    expired = latest.committed is not None and latest.log_start is not None and latest.log_start > latest.committed
    if expired or at_expiry_risk(age, retention, config.expiry_margin_ms):
        status = PartitionStatus.EXPIRY_RISK
        reasons.append(
            f"records {latest.committed}..{latest.log_start} already aged out unread"
            if expired
            else f"oldest unconsumed record is {age} ms old, retention {retention} ms"
        )
    windows: tuple[OffsetWindow, ...] = ()
    if len(history) >= 2:
        windows = tuple(
            detect_windows(
                history[-2],
                latest,
                typical_advance(history[:-1]),
                skip_factor=config.skip_factor,
                skip_min_records=config.skip_min_records,
            )
        )
    evidence = {
        "window": [[o.offset, o.timestamp_ms, o.lag] for o in window],
        "recent_log_ends": recent_log_ends,
        "fired": [s.name for s in evaluation.fired],
        "log_start": latest.log_start,
        "log_end": latest.log_end,
        "committed": latest.committed,
        "group_state": latest.group_state,
        "retention_ms": retention,
    }
    if lagged.under_ms is not None:  # the age is not known, but bounded: the view says "< 1.0 min"
        evidence[TIME_LAG_UNDER] = lagged.under_ms
    return PartitionHealth(latest.key, status, now_ms, lag, age, "; ".join(reasons), evidence, windows)
