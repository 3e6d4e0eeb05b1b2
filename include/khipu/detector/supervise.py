"""Keeping the detector running: how it is doing, from its heartbeat and its driver process.

The detector's heartbeat (every batch, and every idle trigger) is its sign of life; the driver
process, where it runs on the supervisor's host, tells a hung detector (alive, silent) from a
dead one. Rules, in the style of :mod:`khipu.health.rules` (each a small named predicate; the
first that fires decides, in this order):

1. STARTING   the driver was submitted less than ``startup_grace_ms`` ago, runs, and has not
              reported since: give it time (a JVM, a Spark session, a first batch);
2. NEVER_RAN  no heartbeat was ever stored, no driver runs, and none was ever submitted;
3. DOWN       the driver is known to be gone (its heartbeat may still be fresh: it just died; or it
              died at start, before it ever reported);
4. HUNG       the newest heartbeat is older than ``stale_after_ms`` while the driver still runs
              (or runs elsewhere, where only the heartbeat can be seen);
5. HEALTHY    otherwise.

The supervising DAG restarts the detector on NEVER_RAN, DOWN and HUNG (it resumes from its
checkpoint), and one detector-down alert fires when it goes DOWN or HUNG and resolves when it is
HEALTHY again (:func:`khipu.alerting.decide.detector_alert`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from khipu.clock import elapsed_ms
from khipu.config import SupervisionSection, default, load
from khipu.errors import InvalidSetting


class DetectorState(StrEnum):
    HEALTHY = "healthy"
    STARTING = "starting"
    NEVER_RAN = "never_ran"
    DOWN = "down"  # its driver is gone
    HUNG = "hung"  # its driver runs but has not reported for too long

    @property
    def needs_restart(self) -> bool:
        return self in (DetectorState.NEVER_RAN, DetectorState.DOWN, DetectorState.HUNG)

    @property
    def is_down(self) -> bool:
        """What the detector-down alert is about: a detector that ran and no longer works."""
        return self in (DetectorState.DOWN, DetectorState.HUNG)


class SupervisionConfigError(InvalidSetting):
    kind = "detector supervision setting"


@dataclass(frozen=True, slots=True)
class SupervisionConfig:
    stale_after_ms: int = round(default(SupervisionSection, "stale_after_s") * 1000)  # older: hung or down
    startup_grace_ms: int = round(default(SupervisionSection, "startup_grace_s") * 1000)  # a fresh one's time

    def __post_init__(self) -> None:
        for name in ("stale_after_ms", "startup_grace_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1000:
                raise SupervisionConfigError(name, value, "a duration in ms >= 1000")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SupervisionConfig:
        """``KHIPU_DETECTOR_STALE_AFTER_S`` and ``KHIPU_DETECTOR_STARTUP_GRACE_S`` (seconds;
        :class:`khipu.config.SupervisionSection`)."""
        section = load(SupervisionSection, environ, SupervisionConfigError)
        return cls(round(section.stale_after_s * 1000), round(section.startup_grace_s * 1000))


@dataclass(frozen=True, slots=True)
class DetectorObservation:
    """What the supervisor sees: the detector's last sign of life (the end of its newest batch), and the
    driver it submitted (if any)."""

    last_beat_ms: int | None
    driver_alive: bool | None  # None: not known here (a driver on a cluster)
    submitted_ms: int | None = None


@dataclass(frozen=True, slots=True)
class DetectorHealth:
    state: DetectorState
    last_beat_ms: int | None
    reason: str


def _age_s(now_ms: int, then_ms: int) -> str:
    return f"{elapsed_ms(then_ms, now_ms) / 1000:.0f}s"  # a heartbeat stamped by a clock ahead of ours: 0 s


def starting(seen: DetectorObservation, now_ms: int, config: SupervisionConfig) -> str | None:
    if seen.driver_alive is False or seen.submitted_ms is None:
        return None
    if now_ms - seen.submitted_ms >= config.startup_grace_ms:
        return None
    if seen.last_beat_ms is not None and seen.last_beat_ms >= seen.submitted_ms:
        return None
    grace_s = config.startup_grace_ms // 1000
    return f"submitted {_age_s(now_ms, seen.submitted_ms)} ago, no heartbeat yet (grace {grace_s}s)"


def never_ran(seen: DetectorObservation, now_ms: int, config: SupervisionConfig) -> str | None:
    if seen.last_beat_ms is None and seen.driver_alive is not True and seen.submitted_ms is None:
        return "no heartbeat has ever been stored, and it was never submitted"
    return None


def driver_gone(seen: DetectorObservation, now_ms: int, config: SupervisionConfig) -> str | None:
    if seen.driver_alive is False:
        beat = "never" if seen.last_beat_ms is None else f"{_age_s(now_ms, seen.last_beat_ms)} ago"
        return f"its driver is gone (last heartbeat {beat})"
    return None


def heartbeat_stale(seen: DetectorObservation, now_ms: int, config: SupervisionConfig) -> str | None:
    if seen.last_beat_ms is None:
        return f"its driver runs but never reported (submitted over {config.startup_grace_ms // 1000}s ago)"
    if now_ms - seen.last_beat_ms > config.stale_after_ms:
        return (
            f"last heartbeat {_age_s(now_ms, seen.last_beat_ms)} ago "
            f"(stale after {config.stale_after_ms // 1000}s) while its driver "
            + ("still runs" if seen.driver_alive else "runs elsewhere")
        )
    return None


_RULES: tuple[tuple[Callable[[DetectorObservation, int, SupervisionConfig], str | None], DetectorState], ...] = (
    (starting, DetectorState.STARTING),
    (never_ran, DetectorState.NEVER_RAN),
    (driver_gone, DetectorState.DOWN),
    (heartbeat_stale, DetectorState.HUNG),
)


def judge_detector(seen: DetectorObservation, now_ms: int, config: SupervisionConfig) -> DetectorHealth:
    for rule, state in _RULES:
        reason = rule(seen, now_ms, config)
        if reason is not None:
            return DetectorHealth(state, seen.last_beat_ms, reason)
    assert seen.last_beat_ms is not None  # heartbeat_stale fires on a missing heartbeat
    return DetectorHealth(
        DetectorState.HEALTHY, seen.last_beat_ms, f"last heartbeat {_age_s(now_ms, seen.last_beat_ms)} ago"
    )
