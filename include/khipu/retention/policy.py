"""How long Khipu keeps what it writes, and what a retention run may remove now.

Every kind of data has its own age limit (:class:`RetentionPolicy`). A retention run turns the limits
into cutoffs at ``now`` (:func:`plan_retention`), after checking that the limits keep what the rest of
Khipu still needs:

- **reconciliation**: the hourly run for the hour whose horizon just passed reads the trace archive from
  one horizon before that hour, i.e. ``2 x horizon + 1 h`` back; a backfill may reach ``backfill_hours``
  further back. The trace archive is kept at least that long.
- **what reconciliation compares against**: a window it re-decides must still have its verdicts, in the
  verdict archive and the store, or it would take them for first verdicts. Both are kept at least as
  long as the trace archive; so are the minutes of metrics (a change is counted in its own minute).
- **resend**: a confirmed loss still waiting for its resend keeps its verdicts and its traces whatever
  their age (:mod:`khipu.retention.run` leaves them in place); this module only says which verdicts are
  settled enough to go.

Cutoffs are whole hours: an archive is removed an hour folder at a time, and per-minute metrics are
rolled up into whole hours.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from khipu.config import RetentionSection, default, load
from khipu.errors import InvalidSetting
from khipu.trace.archive import HOUR_MS, hour_of
from khipu.verdicts.model import FINAL_KINDS, RECEIPT_KINDS, VerdictKind

DAY_HOURS = 24
DAY_MS = DAY_HOURS * HOUR_MS

# Stored verdicts that nothing will decide again once old: receipts and final kinds. LOST and PENDING wait for
# reconciliation (they are kept at any age: a LOST that outlived the retention means reconciliation is not
# running, and removing it would hide the loss).
REMOVABLE_VERDICTS = frozenset({*RECEIPT_KINDS, *FINAL_KINDS})
UNSETTLED_VERDICTS = frozenset(VerdictKind) - REMOVABLE_VERDICTS


def _default(name: str) -> Any:
    return default(RetentionSection, name)


class RetentionError(InvalidSetting):
    """A retention setting that is out of range, or that would remove what reconciliation or a resend needs."""

    kind = "retention setting"


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """Age limits, one per kind of data. The defaults keep a week of raw traces (about 0.3 TB at 25,000
    traces/s, docs/retention.md), a month of archived DELIVERED verdicts and three months of the store's
    exceptions."""

    # the defaults are RetentionSection's (khipu.config): KHIPU_RETENTION_* and KHIPU_DISK_FREE_MIN_PERCENT
    trace_archive_hours: int = _default("trace_archive_hours")  # raw traces (<state>/archive)
    verdict_archive_hours: int = _default("verdict_archive_hours")  # plain DELIVERED verdicts (<state>/verdicts)
    verdict_days: int = _default("verdict_days")  # the store's verdicts (every exception) and their history
    quarantine_days: int = _default("quarantine_days")  # malformed trace records, and emitter sequence gaps
    heartbeat_days: int = _default("heartbeat_days")  # the detector's heartbeats (each query's newest stays)
    minute_metrics_days: int = _default("minute_metrics_days")  # per-minute metrics; older: rolled into hours
    metrics_days: int = _default("metrics_days")  # the hourly metrics the minutes were rolled into
    backfill_hours: int = _default("backfill_hours")  # how far back (beyond reconciliation's reach) a backfill goes
    disk_free_min_percent: float = _default("disk_free_min_percent")  # an alert fires below this much free

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RetentionPolicy:
        """The limits in force: ``KHIPU_RETENTION_*`` and ``KHIPU_DISK_FREE_MIN_PERCENT`` (khipu settings shows
        them), from the environment and the settings file."""
        section = load(RetentionSection, environ, RetentionError)
        return cls(**{item.name: getattr(section, item.name) for item in fields(cls)})

    def overridden(self, changes: Mapping[str, Any]) -> RetentionPolicy:
        """These limits with some replaced (a manual run's Params; None leaves a limit as it is)."""
        return replace(self, **{name: value for name, value in changes.items() if value is not None})

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name == "disk_free_min_percent":
                if not 0 <= value < 100:
                    raise RetentionError(item.name, value, "a percentage in [0, 100)")
            elif not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise RetentionError(item.name, value, "a whole number >= 1")
        if self.minute_metrics_days > self.metrics_days:
            raise RetentionError(
                "minute_metrics_days",
                self.minute_metrics_days,
                f"at most metrics_days ({self.metrics_days}): minutes are rolled into hours before hours are removed",
            )

    def check(self, horizon_ms: int) -> None:
        """RetentionError when these limits would remove what reconciliation, a backfill or a re-decided window
        still needs, with the reconciliation ``horizon_ms`` in force."""
        needed = reconciliation_reach_hours(horizon_ms) + self.backfill_hours
        if self.trace_archive_hours < needed:
            raise RetentionError(
                "trace_archive_hours",
                self.trace_archive_hours,
                f">= {needed}: the hourly reconciliation reads {reconciliation_reach_hours(horizon_ms)} h back "
                f"(2 x the {horizon_ms // 60_000} min horizon + the hour it reconciles) and a backfill may go "
                f"backfill_hours ({self.backfill_hours}) further",
            )
        if self.verdict_archive_hours < self.trace_archive_hours:
            raise RetentionError(
                "verdict_archive_hours",
                self.verdict_archive_hours,
                f">= trace_archive_hours ({self.trace_archive_hours}): reconciling a window the trace archive "
                "keeps needs its archived verdicts, or it would take them for first verdicts",
            )
        for name in ("minute_metrics_days", "metrics_days"):
            if getattr(self, name) * DAY_HOURS < self.trace_archive_hours:
                raise RetentionError(
                    name,
                    getattr(self, name),
                    f">= {-(-self.trace_archive_hours // DAY_HOURS)} (trace_archive_hours {self.trace_archive_hours} "
                    "in days): a window the trace archive keeps may be reconciled again, and the changes it makes "
                    "are counted in its own minutes",
                )
        if self.verdict_days * DAY_HOURS < self.trace_archive_hours:
            raise RetentionError(
                "verdict_days",
                self.verdict_days,
                f">= {-(-self.trace_archive_hours // DAY_HOURS)} (trace_archive_hours {self.trace_archive_hours} "
                "in days): reconciling a window the trace archive keeps needs its stored verdicts",
            )


@dataclass(frozen=True, slots=True)
class RetentionPlan:
    """What a retention run at ``now_ms`` removes: everything of a kind older than its cutoff (ms, an hour's
    start), except what a pending resend or reconciliation still needs."""

    now_ms: int
    trace_archive_before_ms: int  # trace-archive hours starting before this go
    verdict_archive_before_ms: int  # verdict-archive hours starting before this go
    verdicts_before_ms: int  # settled store verdicts decided before this go, and their history
    quarantine_before_ms: int  # quarantined records and emitter sequence gaps
    heartbeats_before_ms: int  # detector heartbeats (not the newest of a query)
    minutes_before_ms: int  # per-minute metrics before this are rolled up into hours
    metrics_before_ms: int  # metrics (rolled up) before this go

    def cutoffs(self) -> dict[str, int]:
        """Each cutoff by kind, as the run reports them."""
        return {item.name.removesuffix("_before_ms"): getattr(self, item.name) for item in fields(self)[1:]}

    def describe(self) -> list[str]:
        return [f"{kind}: before {hour_of(at)}h UTC" for kind, at in self.cutoffs().items()]


def reconciliation_reach_hours(horizon_ms: int) -> int:
    """How far back, in whole hours, the hourly reconciliation reads the trace archive: the hour it reconciles
    ended one horizon ago, and it reads from one horizon before that hour's start (rounded up, plus the hour a
    read starting mid-hour opens)."""
    return -(-(2 * horizon_ms + HOUR_MS) // HOUR_MS) + 1


def plan_retention(policy: RetentionPolicy, now_ms: int, horizon_ms: int) -> RetentionPlan:
    """The cutoffs of a retention run at ``now_ms``; RetentionError (nothing planned) when the policy would remove
    what reconciliation or a backfill still needs (:meth:`RetentionPolicy.check`)."""
    policy.check(horizon_ms)
    hour = now_ms // HOUR_MS * HOUR_MS  # cutoffs fall on hour starts: whole archive hours, whole rolled-up hours

    def hours_back(hours: int) -> int:
        return hour - hours * HOUR_MS

    return RetentionPlan(
        now_ms=now_ms,
        trace_archive_before_ms=hours_back(policy.trace_archive_hours),
        verdict_archive_before_ms=hours_back(policy.verdict_archive_hours),
        verdicts_before_ms=hours_back(policy.verdict_days * DAY_HOURS),
        quarantine_before_ms=hours_back(policy.quarantine_days * DAY_HOURS),
        heartbeats_before_ms=hours_back(policy.heartbeat_days * DAY_HOURS),
        minutes_before_ms=hours_back(policy.minute_metrics_days * DAY_HOURS),
        metrics_before_ms=hours_back(policy.metrics_days * DAY_HOURS),
    )


def disk_low(free_bytes: int, total_bytes: int, policy: RetentionPolicy) -> bool:
    """Whether the state folder's disk has less free space than the policy allows."""
    return total_bytes > 0 and free_bytes * 100 < policy.disk_free_min_percent * total_bytes
