"""Verdict alerts as incidents: what one cause explains is one alert per stream and figure.

A duplicate (a loss, a slow hop) at one hop shows again at every hop after it: a processor that read its input again
after a rebalance wrote it again, and each sink read both copies (docs/detector.md). One alert per hop above its
threshold made one alert per hop downstream of one cause (issue 38: a burst raised five duplicate-rate alerts). Here
the breaches of one stream's figure (:func:`khipu.alerting.thresholds.breaches`) are one incident, subject
``<stream> <figure>``: it **starts** at the breached hops no other breached hop feeds (the route's feeders, followed
upstream), and **covers** those and every breached hop downstream of them. The cause is told where it starts (the
copies downstream carry their own, e.g. a sink's producer_retry for the processor's replay).

The rules, in order (a numbered table in ``tests/unit/alerting/test_incidents.py``):

1. a stream's figure above its threshold at some hop, no incident of it firing: **fire** one alert naming where it
   starts, the hops it covers, each hop's figure and causes;
2. firing and still above at some hop: nothing, whichever hops it covers now (one alert per transition);
3. firing and above nowhere: **resolve**, saying why, per hop it covered when it fired: its figure **fell** (the hop
   judged at least ``min_verdicts`` verdicts in the window, at or under the threshold), or the **window emptied**
   (fewer: nothing says the figure fell, only that too little was judged to say anything), or both;
4. an alert of one hop from before incidents (subject ``<stream> <hop> <figure>``) still firing: resolved as in 3, or,
   when its stream's figure is above now, **replaced** by the stream's incident, saying so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from khipu.alerting.model import Alert, AlertState, Severity, StoredAlert
from khipu.alerting.thresholds import VERDICT_ALERT_KIND, Breach, HopFigures, ThresholdConfig, shown
from khipu.registry.model import Route, Stream

RATE_FELL, WINDOW_EMPTIED, BOTH, REPLACED = "rate_fell", "window_emptied", "rate_fell_and_window_emptied", "replaced"


@dataclass(frozen=True, slots=True)
class Incident:
    """One stream's figure above its threshold: the hops it starts at and every breached hop it covers."""

    stream: str
    metric: str
    threshold: float
    starts_at: tuple[Breach, ...]  # breached hops no other breached hop feeds, in route order
    covers: tuple[Breach, ...]  # every breached hop, in route order (those it starts at among them)
    upstream: Mapping[str, tuple[str, ...]]  # a covered hop -> the hops it starts at that feed it

    @property
    def subject(self) -> str:
        return incident_subject(self.stream, self.metric)


def incident_subject(stream: str, metric: str) -> str:
    return f"{stream} {metric}"


def incidents(breached: Mapping[str, Breach], streams: Mapping[str, Stream]) -> dict[str, Incident]:
    """The breaches grouped into one incident per stream and figure, by subject."""
    grouped: dict[tuple[str, str], list[Breach]] = {}
    for breach in breached.values():
        grouped.setdefault((breach.stream, breach.metric), []).append(breach)
    found: dict[str, Incident] = {}
    for (stream, metric), hops in sorted(grouped.items()):
        route = streams[stream].route if stream in streams else None
        order = {hop.id: i for i, hop in enumerate(route.hops)} if route is not None else {}
        hops.sort(key=lambda b: (order.get(b.hop, len(order)), b.hop))
        above = {b.hop for b in hops}
        feeding = {b.hop: _hops_before(route, b.hop) & above for b in hops}
        starts = tuple(b for b in hops if not feeding[b.hop])
        upstream = {b.hop: tuple(s.hop for s in starts if s.hop in feeding[b.hop]) for b in hops}
        incident = Incident(stream, metric, hops[0].threshold, starts, tuple(hops), upstream)
        found[incident.subject] = incident
    return found


def _hops_before(route: Route | None, hop_id: str) -> frozenset[str]:
    """The ids of the hops before ``hop_id`` on ``route`` (:meth:`Route.hops_before`); none for a hop the route does
    not have, or a stream the registry does not know."""
    hop = next((h for h in route.hops if h.id == hop_id), None) if route is not None else None
    if route is None or hop is None:
        return frozenset()
    return frozenset(h.id for h in route.hops_before(hop))


def covered_hops(stored: StoredAlert) -> tuple[str, str, tuple[str, ...]]:
    """(stream, figure, hops covered) of a stored verdict alert: an incident's from its details; an alert of one
    hop from before incidents from its subject ``<stream> <hop> <figure>``."""
    stream, _, rest = stored.subject.partition(" ")
    hop, _, metric = rest.rpartition(" ")
    if not hop:  # "<stream> <figure>": an incident
        return stream, metric, tuple(str(h) for h in stored.details.get("hops", ()))
    return stream, metric, (hop,)


def incident_alerts(
    breached: Mapping[str, Breach],
    figures: Mapping[tuple[str, str], HopFigures],
    firing: Iterable[StoredAlert],
    causes: Mapping[tuple[str, str, str], Mapping[str, int]],
    streams: Mapping[str, Stream],
    config: ThresholdConfig,
    now_ms: int,
) -> list[Alert]:
    """The alerts of this check: a resolve for each firing verdict alert its stream's figure no longer needs (why:
    fell, window emptied, replaced), then a fire for each incident not firing yet. ``breached``: the window's
    breaches; ``figures``: the window's figures per (stream, hop); ``firing``: the verdict alerts whose subject's
    newest alert fired; ``causes``: per (stream, hop, figure), the causes of what the figure counts."""
    now = incidents(breached, streams)
    alerts: list[Alert] = []
    still: set[str] = set()
    for stored in sorted(firing, key=lambda a: a.subject):
        if stored.subject in now:
            still.add(stored.subject)
            continue
        stream, metric, hops = covered_hops(stored)
        replacing = now.get(incident_subject(stream, metric))
        limits = streams[stream].alerts if stream in streams else None
        threshold = getattr(limits, metric, None) if limits is not None else None
        alerts.append(_resolve(stored.subject, stream, metric, hops, threshold, replacing, figures, config, now_ms))
    for subject, incident in sorted(now.items()):
        if subject not in still:
            alerts.append(_fire(incident, causes, now_ms))
    return alerts


def _top(counts: Mapping[str, int], n: int = 3) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n])


def _fire(incident: Incident, causes: Mapping[tuple[str, str, str], Mapping[str, int]], now_ms: int) -> Alert:
    metric = incident.metric

    def of(breach: Breach) -> dict[str, int]:
        return _top(causes.get((breach.stream, breach.hop, metric), {}))

    at_start: dict[str, int] = {}
    for breach in incident.starts_at:
        for cause, count in causes.get((breach.stream, breach.hop, metric), {}).items():
            at_start[cause] = at_start.get(cause, 0) + count
    top = _top(at_start)
    starts = incident.starts_at
    below = [b for b in incident.covers if b not in starts]
    if len(starts) == 1:
        where = f"{metric} {shown(metric, starts[0].value)} at {starts[0].hop}"
    else:
        where = f"{metric} at {len(starts)} hops ({_listed(starts)})"
    if below:
        it = "it" if len(starts) == 1 else "them"
        where += f" and {len(below)} hop{'s' if len(below) > 1 else ''} downstream of {it} ({_listed(below)})"
    title = f"{incident.stream}: {where}, above its threshold {shown(metric, incident.threshold)}"
    if top:
        title += f"; top causes{' where it starts:' if below else ''} " + ", ".join(f"{c} {n}" for c, n in top.items())
    return Alert(
        key=f"verdicts:{incident.subject}:{now_ms}",
        subject=incident.subject,
        kind=VERDICT_ALERT_KIND,
        state=AlertState.FIRING,
        severity=Severity.CRITICAL if metric == "loss_rate" else Severity.WARNING,
        title=title,
        at_ms=now_ms,
        details={
            "stream": incident.stream,
            "metric": metric,
            "threshold": incident.threshold,
            "hop": starts[0].hop,  # where it starts (the first, in route order) and its figure
            "value": starts[0].value,
            "top_causes": top,
            "starts_at": [b.hop for b in starts],
            "hops": [b.hop for b in incident.covers],
            "per_hop": [
                {"hop": b.hop, "value": b.value, "top_causes": of(b), "downstream_of": list(incident.upstream[b.hop])}
                for b in incident.covers
            ],
        },
    )


def _listed(breaches: Sequence[Breach]) -> str:
    return ", ".join(f"{b.hop} {shown(b.metric, b.value)}" for b in breaches)


def _value(figure: HopFigures, metric: str) -> float:
    if metric == "latency_p99_ms":
        return float(figure.latency_p99_ms or 0)
    return float(getattr(figure, metric))


def _resolve(
    subject: str,
    stream: str,
    metric: str,
    hops: Sequence[str],
    threshold: float | None,
    replacing: Incident | None,
    figures: Mapping[tuple[str, str], HopFigures],
    config: ThresholdConfig,
    now_ms: int,
) -> Alert:
    per_hop: list[dict[str, Any]] = []
    fell: list[tuple[str, float]] = []
    emptied: list[str] = []
    for hop in hops:
        figure = figures.get((stream, hop), HopFigures(stream, hop, 0, 0, 0, None))
        judged = figure.verdicts >= config.min_verdicts
        value = _value(figure, metric) if judged else None
        per_hop.append({"hop": hop, "verdicts": figure.verdicts, "value": value})
        if value is not None:
            fell.append((hop, value))
        else:
            emptied.append(hop)
    limit = "" if threshold is None else f" {shown(metric, threshold)}"
    few = f"fewer than {config.min_verdicts} verdicts in the last {config.window_ms / 60_000:g} min"
    if replacing is not None:
        why = REPLACED
        title = f"resolved: {subject}: now part of the incident {replacing.subject}"
    elif fell and emptied:
        why = BOTH
        title = (
            f"resolved: {stream}: {metric} back within its threshold{limit} at {', '.join(h for h, _ in fell)}; "
            f"not judged any more at {', '.join(emptied)} ({few}: the window emptied)"
        )
    elif fell:
        why = RATE_FELL
        worst_hop, worst = max(fell, key=lambda hv: hv[1])
        title = (
            f"resolved: {stream}: {metric} back within its threshold{limit} at {_hops(hops)} "
            f"(at most {shown(metric, worst)}, at {worst_hop})"
        )
    else:
        why = WINDOW_EMPTIED
        title = (
            f"resolved: {stream}: {metric} not judged any more, not known to have fallen: the window emptied "
            f"({few} at {_hops(hops)})"
        )
    return Alert(
        key=f"verdicts:{subject}:resolved:{now_ms}",
        subject=subject,
        kind=VERDICT_ALERT_KIND,
        state=AlertState.RESOLVED,
        severity=Severity.INFO,
        title=title,
        at_ms=now_ms,
        details={
            "stream": stream,
            "metric": metric,
            "threshold": threshold,
            "hops": list(hops),
            "resolved_because": why,
            "per_hop": per_hop,
            **({"replaced_by": replacing.subject} if replacing is not None else {}),
        },
    )


def _hops(hops: Sequence[str]) -> str:
    return hops[0] if len(hops) == 1 else f"the {len(hops)} hops it covered"
