"""Verdict-threshold alerts: the window's figures, the breaches, one alert per transition."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from khipu.alerting.incidents import incident_alerts
from khipu.alerting.model import Alert, AlertState
from khipu.alerting.thresholds import ThresholdConfig, ThresholdConfigError, breaches, window_figures
from khipu.registry.model import AlertThresholds

HOP = "local/out -> s1"
LIMITS = {"orders": AlertThresholds(loss_rate=0.01, duplicate_rate=0.05, latency_p99_ms=2_000)}
CONFIG = ThresholdConfig(window_ms=300_000, min_verdicts=20)


def stored(alert: Alert) -> Any:
    """The alert as the store gives it back (state and severity as text)."""
    return SimpleNamespace(**{**alert.payload(), "state": alert.state.value, "severity": alert.severity.value})


def minute(at: int, delivered: int, lost: int = 0, duplicate: int = 0, p99: int | None = 100, **more: int) -> Any:
    return {"stream": "orders", "hop": HOP, "minute_ms": at, "delivered": delivered, "lost": lost,
            "duplicate": duplicate, "latency_p99_ms": p99, **more}  # fmt: skip


def test_the_window_adds_minutes_up_and_keeps_the_worst_p99() -> None:
    (figure,) = window_figures(
        [minute(0, 90, lost=1, p99=300), minute(60_000, 8, confirmed_lost=1, p99=2_500)]
    ).values()
    assert (figure.verdicts, figure.lost, figure.latency_p99_ms) == (100, 2, 2_500)
    assert figure.loss_rate == 0.02


def test_a_crossing_fires_once_with_figure_threshold_and_causes_and_resolves_once() -> None:
    figures = window_figures([minute(0, 97, lost=3)])
    found = breaches(figures, LIMITS, min_verdicts=20)
    assert sorted(found) == [f"orders {HOP} loss_rate"]
    causes = {
        ("orders", HOP, "loss_rate"): {"skipped_by_consumer": 2, "expired": 1},
        ("orders", HOP, "duplicate_rate"): {"rewind_replay": 9},
    }
    (fired,) = incident_alerts(found, figures, [], causes, {}, CONFIG, 5_000)
    assert fired.state is AlertState.FIRING and fired.details["value"] == 0.03 and fired.details["threshold"] == 0.01
    assert "loss_rate 3.00 % at local/out -> s1, above its threshold 1.00 %" in fired.title
    assert "top causes skipped_by_consumer 2, expired 1" in fired.title
    assert incident_alerts(found, figures, [stored(fired)], causes, {}, CONFIG, 6_000) == []  # still above
    fell = window_figures([minute(0, 100)])
    (resolved,) = incident_alerts({}, fell, [stored(fired)], {}, {}, CONFIG, 7_000)  # fell back
    assert resolved.state is AlertState.RESOLVED and resolved.subject == fired.subject
    assert resolved.details["resolved_because"] == "rate_fell"


def test_too_few_verdicts_or_a_stream_without_thresholds_say_nothing() -> None:
    figures = window_figures([minute(0, 5, lost=5)])
    assert breaches(figures, LIMITS, min_verdicts=20) == {}
    assert breaches(figures, {}, min_verdicts=1) == {}


def test_latency_and_duplicates_have_their_own_thresholds_and_causes() -> None:
    figures = window_figures([minute(0, 90, duplicate=10, p99=2_001)])
    found = breaches(figures, LIMITS, min_verdicts=20)
    assert sorted(b.metric for b in found.values()) == ["duplicate_rate", "latency_p99_ms"]
    causes = {
        ("orders", HOP, "loss_rate"): {"skipped_by_consumer": 4},
        ("orders", HOP, "duplicate_rate"): {"rewind_replay": 10},
    }
    fired = {alert.details["metric"]: alert for alert in incident_alerts(found, figures, [], causes, {}, CONFIG, 5_000)}
    assert fired["duplicate_rate"].details["top_causes"] == {"rewind_replay": 10}
    assert fired["latency_p99_ms"].details["top_causes"] == {}


def test_settings_are_read_once_and_checked() -> None:
    assert ThresholdConfig.from_env({"KHIPU_ALERT_WINDOW_MS": "60000"}).window_ms == 60_000
    with pytest.raises(ThresholdConfigError, match="KHIPU_ALERT_MIN_VERDICTS"):
        ThresholdConfig.from_env({"KHIPU_ALERT_MIN_VERDICTS": "0"})
