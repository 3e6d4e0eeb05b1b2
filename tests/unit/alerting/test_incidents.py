"""Verdict alerts as incidents: what one cause explains is one alert per stream and figure, naming the hops it covers;
its resolve says whether the figure fell or the window emptied. A numbered table of cases, each with its reason.

The route is the demo's (``config/registry.yaml``): demo-producer -> demo.orders -> demo-enricher (a processor) ->
demo.orders-enriched -> demo-sink-store and demo-sink-audit. Issue 38's burst: the enricher read its input again
after a rebalance and wrote it again, so its read, its write and both sinks' reads were duplicates of one cause,
and each hop raised its own duplicate-rate alert.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from khipu.alerting.incidents import incident_alerts
from khipu.alerting.model import Alert, AlertState
from khipu.alerting.thresholds import VERDICT_ALERT_KIND, ThresholdConfig, breaches, window_figures
from khipu.registry.loader import load_registry
from khipu.store import Store

ROOT = Path(__file__).resolve().parents[3]
STREAMS = load_registry(ROOT / "config" / "registry.yaml").streams
S = "demo.orders"  # thresholds: loss 5 %, duplicates 10 %, p99 60 s
PRODUCE = "demo-producer -> local/demo.orders"
ENRICH_READ = "local/demo.orders -> demo-enricher"
ENRICH_WRITE = "demo-enricher -> local/demo.orders-enriched"
STORE = "local/demo.orders-enriched -> demo-sink-store"
AUDIT = "local/demo.orders-enriched -> demo-sink-audit"
CONFIG = ThresholdConfig(window_ms=300_000, min_verdicts=20)
NOW = 1_795_000_000_000


def hop(name: str, delivered: int, duplicate: int = 0, lost: int = 0) -> dict[str, Any]:
    """One minute of a hop's verdict metrics in the window."""
    return {"stream": S, "hop": name, "minute_ms": NOW - 60_000, "delivered": delivered, "duplicate": duplicate,
            "lost": lost, "latency_p99_ms": 200}  # fmt: skip


@dataclass(frozen=True)
class Firing:
    """An incident (or an older per-hop alert) stored and still firing."""

    subject: str
    details: Mapping[str, Any] = field(default_factory=dict)
    key: str = "k"
    kind: str = "verdict_threshold"
    state: str = "firing"
    severity: str = "warning"
    title: str = ""
    at_ms: int = NOW - 600_000


BURST = [hop(PRODUCE, 100), hop(ENRICH_READ, 75, duplicate=25), hop(ENRICH_WRITE, 75, duplicate=25),
         hop(STORE, 75, duplicate=25), hop(AUDIT, 75, duplicate=25)]  # fmt: skip
DUPLICATES = f"{S} duplicate_rate"
COVERED = [ENRICH_READ, ENRICH_WRITE, STORE, AUDIT]


class Case(NamedTuple):
    number: int
    window: list[dict[str, Any]]  # the window's minute metrics
    firing: list[Firing]
    expected: list[tuple[str, str, list[str], str]]  # (state, subject, hops named, why: starts at / resolved because)
    reason: str


# fmt: off
CASES = [
    Case(1, [hop(PRODUCE, 100), hop(AUDIT, 75, duplicate=25)], [],
         [("firing", DUPLICATES, [AUDIT], AUDIT)],
         "one hop above the threshold: one incident of one hop, starting there"),
    Case(2, BURST, [],
         [("firing", DUPLICATES, COVERED, ENRICH_READ)],
         "issue 38's burst: the enricher's read, its write and both sinks, one cause: one alert naming the four hops, "
         "starting at the enricher's read (no breached hop feeds it)"),
    Case(3, [hop(STORE, 75, duplicate=25), hop(AUDIT, 70, duplicate=30)], [],
         [("firing", DUPLICATES, [STORE, AUDIT], f"{STORE}, {AUDIT}")],
         "two sinks that each read twice, nothing above them: one incident of the stream, starting at both"),
    Case(4, [hop(ENRICH_WRITE, 80, lost=20), hop(STORE, 75, duplicate=25)], [],
         [("firing", DUPLICATES, [STORE], STORE),
          ("firing", f"{S} loss_rate", [ENRICH_WRITE], ENRICH_WRITE)],
         "a loss and a duplicate are two figures, each its own incident (a loss's severity is its own)"),
    Case(5, BURST, [Firing(DUPLICATES, {"hops": [STORE]})],
         [("firing", DUPLICATES, COVERED, f"adds {ENRICH_READ}")],
         "fired at the store sink; the enricher replays now, upstream of it: a breach neither covered by nor "
         "downstream of the hops it covered, not news of the same cause: an update naming what it adds, covering "
         "the hops stored and those above now (before, nothing was said until the whole stream recovered)"),
    Case(6, [hop(h, 99, duplicate=1) for h in COVERED], [Firing(DUPLICATES, {"hops": COVERED})],
         [("resolved", DUPLICATES, COVERED, "rate_fell")],
         "every hop it covered judged 100 verdicts at 1 %: back within the threshold, the rate fell"),
    Case(7, [hop(ENRICH_READ, 3), hop(STORE, 2)], [Firing(DUPLICATES, {"hops": COVERED})],
         [("resolved", DUPLICATES, COVERED, "window_emptied")],
         "the burst left the window: 3, 2 and no verdicts at its hops, fewer than 20: not known to have fallen"),
    Case(8, [hop(ENRICH_READ, 99, duplicate=1), hop(STORE, 5)], [Firing(DUPLICATES, {"hops": [ENRICH_READ, STORE]})],
         [("resolved", DUPLICATES, [ENRICH_READ, STORE], "rate_fell_and_window_emptied")],
         "the enricher's read judged 100 at 1 % (fell), the store sink only 5 (emptied): both said"),
    Case(9, BURST, [Firing(f"{S} {AUDIT} duplicate_rate")],
         [("resolved", f"{S} {AUDIT} duplicate_rate", [AUDIT], "replaced"),
          ("firing", DUPLICATES, COVERED, ENRICH_READ)],
         "an alert of one hop from before incidents, its hop still above: replaced by the stream's incident, said so"),
    Case(10, [], [Firing(f"{S} {AUDIT} duplicate_rate")],
         [("resolved", f"{S} {AUDIT} duplicate_rate", [AUDIT], "window_emptied")],
         "an alert of one hop from before incidents, no verdict left in the window: emptied"),
    Case(11, [{**hop(STORE, 100), "latency_p99_ms": 90_000}, {**hop(AUDIT, 100), "latency_p99_ms": 80_000}], [],
         [("firing", f"{S} latency_p99_ms", [STORE, AUDIT], f"{STORE}, {AUDIT}")],
         "both sinks slower than the 60 s p99 threshold: one latency incident"),
    Case(12, BURST, [Firing(DUPLICATES, {"hops": COVERED})], [],
         "firing and still above at the hops it covers: nothing new (one alert per transition)"),
    Case(13, BURST, [Firing(DUPLICATES, {"hops": [ENRICH_READ]})], [],
         "fired at the enricher's read; its write and both sinks above now too, all downstream of it: the same "
         "cause showing further down the route, nothing new"),
    Case(14, [hop(STORE, 99, duplicate=1), hop(AUDIT, 75, duplicate=25)], [Firing(DUPLICATES, {"hops": [STORE]})],
         [("firing", DUPLICATES, [STORE, AUDIT], f"adds {AUDIT}")],
         "fired at the store sink, which fell; the audit sink above now, its sibling (neither it nor downstream of "
         "it): an update, still covering the store sink so the resolve judges both"),
    Case(15, [hop(STORE, 75, duplicate=25), hop(AUDIT, 75, duplicate=25)], [Firing(DUPLICATES, {"hops": COVERED})],
         [], "the burst's incident, now above only at both sinks: hops it covers, nothing new"),
    Case(16, [hop(ENRICH_WRITE, 75, duplicate=25), hop(AUDIT, 75, duplicate=25)],
         [Firing(DUPLICATES, {"hops": [STORE]}), Firing(f"{S} loss_rate", {"hops": [AUDIT]})],
         [("resolved", f"{S} loss_rate", [AUDIT], "rate_fell"),
          ("firing", DUPLICATES, [ENRICH_WRITE, STORE, AUDIT], f"adds {ENRICH_WRITE}")],
         "fired at the store sink; now the enricher's write and the audit sink, which it feeds: one update adding "
         "where the new breach starts (the audit sink is downstream of it); the other figure resolves on its own"),
]
# fmt: on


def why(details: Mapping[str, Any]) -> str:
    """A fire: where it starts; an update of a firing incident: what it adds."""
    if "adds" in details:
        return "adds " + ", ".join(details["adds"])
    return ", ".join(details["starts_at"])


def decided(case: Case) -> list[tuple[str, str, list[str], str]]:
    figures = window_figures(case.window)
    found = breaches(figures, {name: s.alerts for name, s in STREAMS.items()}, CONFIG.min_verdicts)
    causes = {
        (S, ENRICH_READ, "duplicate_rate"): {"rewind_replay": 25},
        (S, STORE, "duplicate_rate"): {"producer_retry": 25},
    }
    alerts = incident_alerts(found, figures, case.firing, causes, STREAMS, CONFIG, NOW)
    return [
        (
            a.state.value,
            a.subject,
            list(a.details["hops"]),
            why(a.details) if a.state is AlertState.FIRING else a.details["resolved_because"],
        )
        for a in alerts
    ]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"case{c.number}")
def test_incidents(case: Case) -> None:
    assert decided(case) == case.expected, case.reason


def test_the_bursts_alert_says_where_it_starts_what_it_covers_and_the_cause_where_it_starts() -> None:
    figures = window_figures(BURST)
    found = breaches(figures, {S: STREAMS[S].alerts}, CONFIG.min_verdicts)
    causes = {
        (S, ENRICH_READ, "duplicate_rate"): {"rewind_replay": 25},
        (S, ENRICH_WRITE, "duplicate_rate"): {"rewind_replay": 25},
        (S, STORE, "duplicate_rate"): {"producer_retry": 25},
        (S, AUDIT, "duplicate_rate"): {"producer_retry": 25},
    }
    (alert,) = incident_alerts(found, figures, [], causes, STREAMS, CONFIG, NOW)
    assert alert.title == (
        f"{S}: duplicate_rate 25.00 % at {ENRICH_READ} and 3 hops downstream of it ({ENRICH_WRITE} 25.00 %, "
        f"{STORE} 25.00 %, {AUDIT} 25.00 %), above its threshold 10.00 %; top causes where it starts: rewind_replay 25"
    )
    assert alert.details["top_causes"] == {"rewind_replay": 25}  # the cause is the first hop's, not the copies'
    per_hop = {h["hop"]: h for h in alert.details["per_hop"]}
    assert per_hop[STORE]["downstream_of"] == [ENRICH_READ] and per_hop[STORE]["top_causes"] == {"producer_retry": 25}
    assert (alert.details["hop"], alert.details["value"], alert.details["stream"]) == (ENRICH_READ, 0.25, S)


def test_a_resolve_says_in_words_why() -> None:
    (fell,) = incident_alerts({}, window_figures([hop(h, 99, duplicate=1) for h in COVERED]),
                              [Firing(DUPLICATES, {"hops": COVERED})], {}, STREAMS, CONFIG, NOW)  # fmt: skip
    assert fell.title == (
        f"resolved: {S}: duplicate_rate back within its threshold 10.00 % at the 4 hops it covered "
        f"(at most 1.00 %, at {ENRICH_READ})"
    )
    (emptied,) = incident_alerts({}, window_figures([hop(ENRICH_READ, 3)]), [Firing(DUPLICATES, {"hops": COVERED})],
                                 {}, STREAMS, CONFIG, NOW)  # fmt: skip
    assert emptied.title == (
        f"resolved: {S}: duplicate_rate not judged any more, not known to have fallen: the window emptied "
        "(fewer than 20 verdicts in the last 5 min at the 4 hops it covered)"
    )


def test_a_breach_apart_from_a_firing_incident_is_sent_as_an_update_and_its_resolve_judges_every_hop(
    tmp_path: Path,
) -> None:
    """The review's case: the incident fired at the audit sink; later the enricher replays. Before, nothing was
    said until the whole stream recovered, and the resolve judged the audit sink alone. Through a real store: what
    it says fires (``AlertRepository.firing``) is the update, so the next check is quiet and the resolve judges the
    four hops."""
    store = Store(f"sqlite:///{tmp_path / 'khipu.db'}")
    store.migrate()
    causes = {(S, ENRICH_READ, "duplicate_rate"): {"rewind_replay": 25}}

    def check(window: list[dict[str, Any]], at_ms: int) -> list[Alert]:
        figures = window_figures(window)
        found = breaches(figures, {name: s.alerts for name, s in STREAMS.items()}, CONFIG.min_verdicts)
        alerts = incident_alerts(found, figures, store.alerts.firing(VERDICT_ALERT_KIND), causes, STREAMS, CONFIG,
                                 at_ms)  # fmt: skip
        assert all(store.alerts.add(alert) for alert in alerts)
        return alerts

    (fired,) = check([hop(PRODUCE, 100), hop(AUDIT, 75, duplicate=25)], NOW)
    assert (fired.state, fired.details["hops"]) == (AlertState.FIRING, [AUDIT])
    (updated,) = check(BURST, NOW + 60_000)
    assert (updated.state, updated.subject, updated.severity) == (AlertState.FIRING, DUPLICATES, fired.severity)
    assert updated.title == (
        f"updated: {S}: also duplicate_rate 25.00 % at {ENRICH_READ} and 2 hops downstream of it "
        f"({ENRICH_WRITE} 25.00 %, {STORE} 25.00 %), above its threshold 10.00 %, neither at nor downstream of "
        f"the hop it covered ({AUDIT}): it covers 4 hops now; top causes where it starts: rewind_replay 25"
    )
    assert updated.details["adds"] == [ENRICH_READ] and updated.details["covered_before"] == [AUDIT]
    assert updated.details["hops"] == COVERED and updated.details["starts_at"] == [ENRICH_READ]
    assert updated.details["firing_since_ms"] == NOW  # when the incident first fired, not this update
    assert check(BURST, NOW + 120_000) == []  # the update is what fires now: nothing new
    (resolved,) = check([hop(h, 99, duplicate=1) for h in COVERED], NOW + 180_000)
    assert (resolved.state, resolved.details["resolved_because"]) == (AlertState.RESOLVED, "rate_fell")
    assert [h["hop"] for h in resolved.details["per_hop"]] == COVERED  # the enricher's hops judged too
    assert [a.state for a in store.alerts.read()] == ["firing", "firing", "resolved"]
    store.close()
