"""Which messages a reconciliation run re-decides, what it must read, and how it judges them.

A run reconciles the messages first seen in a window ``[start, end)``. It reads their traces
from the archive up to ``end + horizon`` (default two hours: Inca's 1 % of messages that take
that long), so every message of the window had at least the horizon to show up everywhere. The
hourly run for the data interval ``[S, E)`` reconciles ``[S - horizon, E - horizon)``: the hour
whose horizon has just passed. A backfill names its window; it must lie in the past by the
horizon, and the archive must cover it.

Judging applies the detector's own rules (:func:`khipu.detector.decide.decide`) to all the
message's traces, with the committed offsets from the snapshots: the hours since have let every
group pass the message (or not), so the grace is long over.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Protocol

from khipu.clock import iso_text
from khipu.config import ReconcileSection, default, load
from khipu.detector.decide import Lookups, decide
from khipu.detector.model import DetectorConfig
from khipu.errors import InvalidSetting
from khipu.registry.model import Hop, Stream, TopicRef
from khipu.trace.archive import HOUR_MS, hour_of
from khipu.trace.model import Trace
from khipu.verdicts.model import Verdict, VerdictKind
from khipu.verdicts.settle import Change, Judge, settle

DEFAULT_HORIZON_MS: int = default(ReconcileSection, "horizon_ms")


class ReconcileError(InvalidSetting):
    kind = "reconciliation setting"


def hour_start_ms(hour: str) -> int:
    """The start of an archive hour partition (``2026-11-23-10``), in ms."""
    return int(datetime.strptime(hour, "%Y-%m-%d-%H").replace(tzinfo=UTC).timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class ReconcileWindow:
    start_ms: int  # messages first seen at or after this ...
    end_ms: int  # ... and before this
    horizon_ms: int = DEFAULT_HORIZON_MS
    streams: tuple[str, ...] = ()  # none: every stream

    def __post_init__(self) -> None:
        if self.horizon_ms < 0:
            raise ReconcileError("horizon_ms", self.horizon_ms, "a duration in ms >= 0")
        if self.end_ms <= self.start_ms:
            raise ReconcileError(
                "end", iso_text(self.end_ms), f"a time after the start ({iso_text(self.start_ms)}): the window is empty"
            )

    @property
    def read_to_ms(self) -> int:
        """Traces are read up to here: the window's end plus the horizon."""
        return self.end_ms + self.horizon_ms

    def hours(self) -> list[str]:
        """The archive hours to read: from the window's start to its end plus the horizon."""
        first = self.start_ms // HOUR_MS
        last = (self.read_to_ms - 1) // HOUR_MS
        return [hour_of(h * HOUR_MS) for h in range(first, last + 1)]

    def read_hours(self, now_ms: int) -> list[str]:
        """The archive hours a run reads: from one horizon before the window (a message first seen just before
        it has its earlier traces there) to now (evidence that came after the horizon counts too)."""
        first = (self.start_ms - self.horizon_ms) // HOUR_MS
        last = max(self.read_to_ms - 1, now_ms) // HOUR_MS
        return [hour_of(h * HOUR_MS) for h in range(first, last + 1)]

    def describe(self) -> str:
        streams = ", ".join(self.streams) if self.streams else "every stream"
        return (
            f"messages first seen {iso_text(self.start_ms)} .. {iso_text(self.end_ms)} ({streams}), "
            f"traces read to {iso_text(self.read_to_ms)} (horizon {self.horizon_ms // 60_000} min)"
        )


def parse_time(text: str) -> int:
    """An ISO time (``2026-11-23T10:00:00Z``, with an offset or Z) or milliseconds since the epoch."""
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ReconcileError("time", text, "an ISO time such as 2026-11-23T10:00:00Z, or ms since the epoch") from None
    if moment.tzinfo is None:
        raise ReconcileError("time", text, "a time with its zone (Z or +00:00)")
    return int(moment.timestamp() * 1000)


def hourly_window(interval_start_ms: int, interval_end_ms: int, horizon_ms: int) -> ReconcileWindow:
    """The window an hourly run over ``[interval_start, interval_end)`` reconciles: the same span, ``horizon``
    earlier, so its messages have had the whole horizon. A run triggered by hand has an empty interval at
    its logical date: it stands for the hour that ends there."""
    if interval_end_ms <= interval_start_ms:
        interval_start_ms = interval_end_ms - HOUR_MS
    return ReconcileWindow(interval_start_ms - horizon_ms, interval_end_ms - horizon_ms, horizon_ms)


def first_scheduled_hour_ms(moment_ms: int) -> int:
    """The first hourly run after ``moment_ms``: the next full hour (a run at 11:00 stands for the hour ending there).
    After the install, its window, like the next one or two (the horizon), lies before the install:
    :func:`coverage_problems` finds the archive does not reach back that far, and the run skips it."""
    return (moment_ms // HOUR_MS + 1) * HOUR_MS


def next_scheduled_hour_ms(
    last_run_ms: int | None,
    installed_ms: int | None,
    now_ms: int,
    *,
    not_before_ms: int | None = None,
    catchup: bool = True,
) -> int:
    """The logical date (a full hour) of the hourly reconciliation's next scheduled run.

    ``last_run_ms`` is the logical date of Airflow's latest automated run (scheduled or backfill: Airflow counts
    both; None: none yet), ``installed_ms`` when the store was created (None: unknown), ``not_before_ms`` the DAG's
    start date, ``catchup`` the DAG's. The run is the latest of:

    - the hour after the last run: every hour runs, those missed while Airflow was down too, each once, in order;
    - the first hour after the install (:func:`first_scheduled_hour_ms`): no hour before it is ever scheduled, not
      even after a backfill of earlier hours (which Airflow takes for the latest run), while a DAG that never ran
      starts there however late Airflow first gets to it;
    - with neither known, the next full hour after ``now_ms``;
    - the start date's hour (Airflow's earliest), and without catchup the current hour (only the latest hour due).

    Proven by the numbered cases of tests/unit/reconcile/test_hourly_schedule.py."""
    after = [first_scheduled_hour_ms(known) for known in (last_run_ms, installed_ms) if known is not None]
    candidates = after or [first_scheduled_hour_ms(now_ms)]
    if not_before_ms is not None:
        candidates.append(-(-not_before_ms // HOUR_MS) * HOUR_MS)  # the start date, or the full hour after it
    if not catchup:
        candidates.append(now_ms // HOUR_MS * HOUR_MS)
    return max(candidates)


def horizon_from_env(environ: Mapping[str, str] | None = None) -> int:
    """``KHIPU_RECONCILE_HORIZON_MS`` (:class:`khipu.config.ReconcileSection`; tests use minutes)."""
    return int(load(ReconcileSection, environ, ReconcileError).horizon_ms)


@dataclass(frozen=True, slots=True)
class ArchiveCoverage:
    """What the trace archive holds: its first hour, and up to when the archive query has read the topic."""

    first_hour: str | None  # None: the archive is empty
    read_to_ms: int | None  # None: the archive query never caught up


def coverage_problems(window: ReconcileWindow, coverage: ArchiveCoverage, now_ms: int) -> list[str]:
    """Why the archive cannot answer for the window (empty: it can). Hours without traffic inside the
    covered span are quiet, not missing. The last kind of problem passes by itself (the detector is still
    archiving the last minutes): :func:`archive_behind` tells it apart."""
    problems = []
    if window.read_to_ms > now_ms:
        problems.append(
            f"the window's horizon has not passed: traces are needed up to {iso_text(window.read_to_ms)}, "
            f"it is {iso_text(now_ms)}; end the window at {iso_text(now_ms - window.horizon_ms)} or earlier"
        )
    if coverage.first_hour is None:
        problems.append("the trace archive is empty: the detector has archived nothing yet")
        return problems
    before = [hour for hour in window.hours() if hour < coverage.first_hour]
    if before:
        problems.append(
            f"the archive starts at hour {coverage.first_hour}; missing hours {before[0]} .. {before[-1]} "
            f"({len(before)} h)"
        )
    behind = archive_behind(window, coverage, now_ms)
    if behind:
        problems.append(behind)
    return problems


def archive_behind(window: ReconcileWindow, coverage: ArchiveCoverage, now_ms: int) -> str | None:
    """The detector has not archived the trace topic up to the window's horizon yet (None: it has, or the
    horizon has not passed anyway)."""
    if window.read_to_ms > now_ms or (coverage.read_to_ms is not None and coverage.read_to_ms >= window.read_to_ms):
        return None
    read = "not yet" if coverage.read_to_ms is None else f"up to {iso_text(coverage.read_to_ms)}"
    after = [h for h in window.hours() if coverage.read_to_ms is None or h > hour_of(coverage.read_to_ms)]
    missing = f"; missing hours {after[0]} .. {after[-1]}" if after else ""
    return f"the detector has archived the trace topic {read}, the window needs {iso_text(window.read_to_ms)}{missing}"


class _PassedLongAgo(Mapping[str, int]):
    """The detector's memo of when each group was first seen past a position, for a judge that comes
    hours later: every pass is as old as the message (the grace is long over)."""

    def __init__(self, since_ms: int) -> None:
        self.since_ms = since_ms

    def __getitem__(self, key: str) -> int:
        return self.since_ms

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def get(self, key: str, default: object = None) -> int:  # type: ignore[override]
        return self.since_ms


def rejudge(
    message_id: str,
    stream: Stream,
    traces: Sequence[Trace],
    lookups: Lookups,
    config: DetectorConfig,
    window: ReconcileWindow,
    now_ms: int,
) -> tuple[Verdict, ...]:
    """Every hop of the message judged with all its traces (every one archived up to now), by the detector's
    rules."""
    first_seen = min(t.timestamp_ms for t in traces)
    decision = decide(
        message_id,
        stream,
        traces,
        lookups.committed,
        _PassedLongAgo(first_seen),
        first_seen,
        now_ms,
        config,
        lookups.pointed_at,
        read_to_ms=max(window.read_to_ms, now_ms),
        removed=lookups.removed,
        record=lookups.record,
    )
    return tuple(replace(v, decided_by=Judge.RECONCILIATION.value, first_seen_ms=first_seen) for v in decision.verdicts)


def judge_lead(lead: LeadLike, message_id: str, stream: Stream, now_ms: int) -> tuple[Verdict, ...]:
    """A message none of whose traces arrived, named by the record at a position an emitter says it received
    (:class:`khipu.reconcile.run.Lead`): the group at the emitter's location got it, and the topic's writer
    (when it has one) wrote it; both hops passed, only their traces were lost. What happened after is
    unknown: no verdict is given there."""
    topic, route = TopicRef(lead.cluster, lead.topic), stream.route
    readers = [Hop.read(topic, c.group) for c in route.readers_of(topic) if c.location == lead.location]
    writers = route.writers_of(topic)
    named = f"the record's trace header names it; {lead.location}'s emitter points back to offset {lead.offset}"
    hops = [*readers, *(writers if len(writers) == 1 and readers else ())]
    return tuple(
        Verdict(
            message_id=message_id,
            stream=stream.name,
            hop=hop.id,
            hop_kind=hop.kind.value,
            kind=VerdictKind.TRACE_LOST,
            cause=None,
            count=0,
            topic=lead.topic,
            partition=lead.partition,
            offset=lead.offset,
            group=hop.group,
            location=hop.location,
            observed_ms=None,
            latency_ms=None,
            e2e_latency_ms=None,
            decided_ms=now_ms,
            detail=f"no trace of this message arrived, but {named}",
            first_seen_ms=lead.seen_ms,
            decided_by=Judge.RECONCILIATION.value,
        )
        for hop in hops
    )


class LeadLike(Protocol):
    @property
    def location(self) -> str: ...
    @property
    def cluster(self) -> str: ...
    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def seen_ms(self) -> int: ...


def changes_for(stored: Mapping[str, Verdict], judged: Iterable[Verdict]) -> list[Change]:
    """What reconciliation changes of a message's stored verdicts (by hop id); nothing when it agrees."""
    found = (settle(stored.get(verdict.hop), verdict) for verdict in judged)
    return [change for change in found if change is not None]
