"""Sending recorded alerts through the configured notifiers, and remembering how each fared."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from khipu.alerting.model import Alert, alert_from
from khipu.store import Store

log = logging.getLogger(__name__)


class AlertSink(Protocol):
    """Anything that can deliver an alert; raises when it could not."""

    name: str

    def send_alert(self, alert: Alert) -> None: ...


@dataclass(frozen=True, slots=True)
class DispatchReport:
    sent: int
    failed_deliveries: int  # (alert, notifier) pairs that failed
    undelivered: int  # alerts no notifier could deliver: left pending for the next run


def dispatch_pending(store: Store, sinks: Sequence[AlertSink], now_ms: int) -> DispatchReport:
    """Deliver every pending alert to every sink. An alert that at least one sink delivered is done
    (the failures are recorded with it); one that none delivered stays pending and is retried.
    Each alert is claimed first, so two dispatchers running at once never both send it."""
    sent = failed = undelivered = 0
    for stored in store.alerts.pending(now_ms):
        if not store.alerts.claim(stored.key, now_ms):
            continue
        alert = alert_from(stored)
        outcomes: dict[str, str] = {}
        for sink in sinks:
            try:
                sink.send_alert(alert)
                outcomes[sink.name] = "ok"
            except Exception as exc:  # one broken notifier must not stop the others
                outcomes[sink.name] = f"error: {type(exc).__name__}: {exc}"
                failed += 1
                log.warning("notifier %s could not deliver alert %s: %s", sink.name, alert.key, exc)
        if "ok" in outcomes.values():
            store.alerts.mark_delivered(alert.key, outcomes, now_ms)
            sent += 1
        else:
            store.alerts.release(alert.key)
            undelivered += 1
    return DispatchReport(sent, failed, undelivered)
