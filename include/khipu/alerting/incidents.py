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
2. firing and still above, starting only at hops its alert covered or downstream of them: nothing (one alert per
   transition; the same cause showing further down the route is no news);
3. firing, and it starts now at a hop neither covered by its alert nor downstream of one it covered (fired at the
   audit sink; later the enricher replays): **update**, a new firing alert of the same subject saying what it adds;
   it covers the hops its alert covered and those above now, so the next check and the resolve judge them all (the
   newest firing alert of a subject is what the store says fires);
4. firing and above nowhere: **resolve**, saying why, per hop it covered (its newest alert's hops): its figure
   **fell** (the hop judged at least ``min_verdicts`` verdicts in the window, at or under the threshold), or the
   **window emptied** (fewer: nothing says the figure fell, only that too little was judged to say anything), or
   both;
5. an alert of one hop from before incidents (subject ``<stream> <hop> <figure>``) still firing: resolved as in 4, or,
   when its stream's figure is above now, **replaced** by the stream's incident, saying so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from khipu.alerting.model import Alert, AlertState, Severity, StoredAlert
from khipu.alerting.thresholds import VERDICT_ALERT_KIND, Breach, HopFigures, ThresholdConfig, shown
from khipu.registry.model import Route, Stream

RATE_FELL, WINDOW_EMPTIED, BOTH, REPLACED = "rate_fell", "window_emptied", "rate_fell_and_window_emptied", "replaced"
Causes = Mapping[tuple[str, str, str], Mapping[str, int]]  # (stream, hop, figure) -> the causes of what it counts


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
        in_order = _route_order(route)
        hops.sort(key=lambda b: in_order(b.hop))
        above = {b.hop for b in hops}
        feeding = {b.hop: _hops_before(route, b.hop) & above for b in hops}
        starts = tuple(b for b in hops if not feeding[b.hop])
        upstream = {b.hop: tuple(s.hop for s in starts if s.hop in feeding[b.hop]) for b in hops}
        incident = Incident(stream, metric, hops[0].threshold, starts, tuple(hops), upstream)
        found[incident.subject] = incident
    return found


def _route_order(route: Route | None) -> Callable[[str], tuple[int, str]]:
    """A sort key putting hop ids in route order (those the route does not have last, by name)."""
    order = {hop.id: i for i, hop in enumerate(route.hops)} if route is not None else {}
    return lambda hop_id: (order.get(hop_id, len(order)), hop_id)


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
    causes: Causes,
    streams: Mapping[str, Stream],
    config: ThresholdConfig,
    now_ms: int,
) -> list[Alert]:
    """The alerts of this check: a resolve for each firing verdict alert its stream's figure no longer needs (why:
    fell, window emptied, replaced), then a fire for each incident not firing yet and an update for each firing one
    that starts now apart from what its alert covered. ``breached``: the window's
    breaches; ``figures``: the window's figures per (stream, hop); ``firing``: the verdict alerts whose subject's
    newest alert fired; ``causes``: per (stream, hop, figure), the causes of what the figure counts."""
    now = incidents(breached, streams)
    alerts: list[Alert] = []
    still: dict[str, StoredAlert] = {}
    for stored in sorted(firing, key=lambda a: a.subject):
        if stored.subject in now:
            still[stored.subject] = stored
            continue
        stream, metric, hops = covered_hops(stored)
        replacing = now.get(incident_subject(stream, metric))
        limits = streams[stream].alerts if stream in streams else None
        threshold = getattr(limits, metric, None) if limits is not None else None
        alerts.append(_resolve(stored.subject, stream, metric, hops, threshold, replacing, figures, config, now_ms))
    for subject, incident in sorted(now.items()):
        if subject not in still:
            alerts.append(_fire(incident, causes, now_ms))
            continue
        route = streams[incident.stream].route if incident.stream in streams else None
        update = _update(incident, still[subject], route, causes, now_ms)
        if update is not None:
            alerts.append(update)
    return alerts


def apart_from(incident: Incident, covered: Sequence[str], route: Route | None) -> tuple[Breach, ...]:
    """The hops ``incident`` starts at now that are neither among the hops ``covered`` (what its firing alert
    covered) nor downstream of one of them: a breach the firing alert does not explain (rule 3)."""
    before = set(covered)
    return tuple(b for b in incident.starts_at if b.hop not in before and not _hops_before(route, b.hop) & before)


def _top(counts: Mapping[str, int], n: int = 3) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n])


def _top_at(starts: Sequence[Breach], causes: Causes) -> dict[str, int]:
    """The top causes of what the figure counts at ``starts``, added up."""
    at_start: dict[str, int] = {}
    for breach in starts:
        for cause, count in causes.get((breach.stream, breach.hop, breach.metric), {}).items():
            at_start[cause] = at_start.get(cause, 0) + count
    return _top(at_start)


def _where(metric: str, starts: Sequence[Breach], below: Sequence[Breach]) -> str:
    """``<figure> <value> at <hop>`` (or ``at <n> hops (...)``), and the hops downstream of them."""
    if len(starts) == 1:
        where = f"{metric} {shown(metric, starts[0].value)} at {starts[0].hop}"
    else:
        where = f"{metric} at {len(starts)} hops ({_listed(starts)})"
    if below:
        it = "it" if len(starts) == 1 else "them"
        where += f" and {len(below)} hop{'s' if len(below) > 1 else ''} downstream of {it} ({_listed(below)})"
    return where


def _causes_said(top: Mapping[str, int], below: Sequence[Breach]) -> str:
    if not top:
        return ""
    return f"; top causes{' where it starts:' if below else ''} " + ", ".join(f"{c} {n}" for c, n in top.items())


def _severity(metric: str) -> Severity:
    return Severity.CRITICAL if metric == "loss_rate" else Severity.WARNING


def _per_hop(incident: Incident, causes: Causes) -> list[dict[str, Any]]:
    """Each hop above now: its figure, its top causes and the hops it starts at that feed it."""
    return [
        {
            "hop": b.hop,
            "value": b.value,
            "top_causes": _top(causes.get((b.stream, b.hop, b.metric), {})),
            "downstream_of": list(incident.upstream[b.hop]),
        }
        for b in incident.covers
    ]


def _fire(incident: Incident, causes: Causes, now_ms: int) -> Alert:
    metric = incident.metric
    top = _top_at(incident.starts_at, causes)
    starts = incident.starts_at
    below = [b for b in incident.covers if b not in starts]
    limit = shown(metric, incident.threshold)
    title = f"{incident.stream}: {_where(metric, starts, below)}, above its threshold {limit}"
    hops = [b.hop for b in incident.covers]
    return _firing(incident, f"{now_ms}", title + _causes_said(top, below), starts[0], top, hops, causes, now_ms)


def _update(incident: Incident, stored: StoredAlert, route: Route | None, causes: Causes, now_ms: int) -> Alert | None:
    """Rule 3: a firing incident that starts now at hops apart from those it covered (:func:`apart_from`) is sent
    again, a new firing alert of its subject saying what it adds; it covers the hops it covered and those above now,
    so the next check and its resolve judge them all. None when every hop it starts at is explained."""
    _, metric, covered = covered_hops(stored)
    adds = apart_from(incident, covered, route)
    if not adds:
        return None
    added = {b.hop for b in adds}
    below = [
        b
        for b in incident.covers
        if b.hop not in added and b.hop not in covered and set(incident.upstream[b.hop]) & added
    ]
    hops = sorted({*covered, *(b.hop for b in incident.covers)}, key=_route_order(route))
    top = _top_at(adds, causes)
    them = "the hop it covered" if len(covered) == 1 else f"the {len(covered)} hops it covered"
    title = (
        f"updated: {incident.stream}: also {_where(metric, adds, below)}, above its threshold "
        f"{shown(metric, incident.threshold)}, neither at nor downstream of {them} ({', '.join(covered)}): "
        f"it covers {len(hops)} hops now"
    )
    since = int(stored.details.get("firing_since_ms", stored.at_ms))
    extra = {"adds": [b.hop for b in adds], "covered_before": list(covered), "firing_since_ms": since}
    text = title + _causes_said(top, below)
    return _firing(incident, f"updated:{now_ms}", text, adds[0], top, hops, causes, now_ms, extra)


def _firing(
    incident: Incident,
    key: str,
    title: str,
    first: Breach,
    top: dict[str, int],
    hops: list[str],
    causes: Causes,
    now_ms: int,
    extra: Mapping[str, Any] | None = None,
) -> Alert:
    """A firing alert of ``incident``: ``first`` is where it (or what an update adds) starts, the first in route
    order, and its figure; ``hops`` every hop it covers."""
    return Alert(
        key=f"verdicts:{incident.subject}:{key}",
        subject=incident.subject,
        kind=VERDICT_ALERT_KIND,
        state=AlertState.FIRING,
        severity=_severity(incident.metric),
        title=title,
        at_ms=now_ms,
        details={
            "stream": incident.stream,
            "metric": incident.metric,
            "threshold": incident.threshold,
            "hop": first.hop,
            "value": first.value,
            "top_causes": top,
            "starts_at": [b.hop for b in incident.starts_at],
            "hops": hops,
            **(extra or {}),
            "per_hop": _per_hop(incident, causes),
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
