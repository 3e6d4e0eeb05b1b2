"""Alerts on what the verdicts say: each stream's registry thresholds over a sliding window.

Per stream and hop, the minute metrics of the last ``window_ms`` are added up (counts summed; the
rates recomputed from the sums; latency p99 as the worst minute's, a bound that never hides a
bad minute). A figure above the stream's threshold (``alerts.loss_rate``, ``duplicate_rate``,
``latency_p99_ms`` in the registry) is a breach; the breaches of one stream's figure are one incident,
one alert (:mod:`khipu.alerting.incidents`), resolved when the figure is above nowhere, saying whether it
fell or the window emptied. One alert per transition, never one per minute: whether an alert is firing
comes from the last one stored for its subject.

A window with fewer than ``min_verdicts`` verdicts says nothing (two messages, one lost, is no 50 %
loss rate worth waking anyone for).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from khipu.config import AlertSection, default, load
from khipu.errors import InvalidSetting
from khipu.registry.model import AlertThresholds
from khipu.verdicts.metrics import JUDGED_COUNTS

VERDICT_ALERT_KIND = "verdict_threshold"
LOSSES = ("lost", "confirmed_lost")
# the per-minute counts a window's verdicts are the sum of (a rate's denominator): the alerts, the exporter, the view;
# ABORTED and SUPERSEDED (Kafka's own semantics) are not among them
COUNTED_KINDS = JUDGED_COUNTS


class ThresholdConfigError(InvalidSetting):
    kind = "verdict alert setting"


@dataclass(frozen=True, slots=True)
class ThresholdConfig:
    window_ms: int = default(AlertSection, "window_ms")
    min_verdicts: int = default(AlertSection, "min_verdicts")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ThresholdConfig:
        """``KHIPU_ALERT_WINDOW_MS`` and ``KHIPU_ALERT_MIN_VERDICTS`` (:class:`khipu.config.AlertSection`)."""
        section = load(AlertSection, environ, ThresholdConfigError)
        return cls(section.window_ms, section.min_verdicts)


def window_start_ms(now_ms: int, window_ms: int) -> int:
    """The first minute a window of ``window_ms`` ending now sums: the alerts, the exporter and the view agree."""
    return (now_ms - window_ms) // 60_000 * 60_000


@dataclass(frozen=True, slots=True)
class HopFigures:
    stream: str
    hop: str
    verdicts: int
    lost: int
    duplicate: int
    latency_p99_ms: int | None

    @property
    def loss_rate(self) -> float:
        return self.lost / self.verdicts if self.verdicts else 0.0

    @property
    def duplicate_rate(self) -> float:
        return self.duplicate / self.verdicts if self.verdicts else 0.0


def window_figures(metric_rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], HopFigures]:
    """The window's figures per (stream, hop) from its minute metric rows."""
    counted = COUNTED_KINDS
    figures: dict[tuple[str, str], HopFigures] = {}
    for row in metric_rows:
        key = (str(row["stream"]), str(row["hop"]))
        before = figures.get(key, HopFigures(key[0], key[1], 0, 0, 0, None))
        p99 = row.get("latency_p99_ms")
        worst = max((int(v) for v in (before.latency_p99_ms, p99) if v is not None), default=None)
        figures[key] = HopFigures(
            key[0],
            key[1],
            before.verdicts + sum(int(row.get(name) or 0) for name in counted),
            before.lost + sum(int(row.get(name) or 0) for name in LOSSES),
            before.duplicate + int(row.get("duplicate") or 0),
            worst,
        )
    return figures


@dataclass(frozen=True, slots=True)
class Breach:
    stream: str
    hop: str
    metric: str  # loss_rate | duplicate_rate | latency_p99_ms
    value: float
    threshold: float

    @property
    def subject(self) -> str:
        return f"{self.stream} {self.hop} {self.metric}"


def breaches(
    figures: Mapping[tuple[str, str], HopFigures], thresholds: Mapping[str, AlertThresholds], min_verdicts: int
) -> dict[str, Breach]:
    """Every figure above its stream's threshold, by alert subject (streams without thresholds: none)."""
    found: dict[str, Breach] = {}
    for (stream, hop), figure in sorted(figures.items()):
        limits = thresholds.get(stream)
        if limits is None or figure.verdicts < min_verdicts:
            continue
        checks: list[tuple[str, float, float | None]] = [
            ("loss_rate", figure.loss_rate, limits.loss_rate),
            ("duplicate_rate", figure.duplicate_rate, limits.duplicate_rate),
            (
                "latency_p99_ms",
                float(figure.latency_p99_ms) if figure.latency_p99_ms is not None else 0.0,
                None if limits.latency_p99_ms is None else float(limits.latency_p99_ms),
            ),
        ]
        for metric, value, limit in checks:
            if limit is not None and value > limit:
                breach = Breach(stream, hop, metric, value, limit)
                found[breach.subject] = breach
    return found


def shown(metric: str, value: float) -> str:
    """A figure as an alert writes it: a rate as a percentage, a latency in ms."""
    return f"{value:.0f} ms" if metric == "latency_p99_ms" else f"{100 * value:.2f} %"
